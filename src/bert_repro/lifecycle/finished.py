"""What a run says before any work, with nothing heavier than the config loaded (src/train.py calls it before
torch): the resolved config in a few lines, and whether its folder already holds the finished run.

Finished is finished, as the Hugging Face examples treat a finished output folder: a command whose run folder
holds a complete results.json of the same science (keys.py) prints that result and exits 0, without training
or validating again, or opening another W&B run. ``+force=true`` reruns it from scratch: as its training
starts, the earlier result and checkpoints move aside (RunFolder.set_aside), so a rerun killed half-way leaves
a folder that says it is unfinished. A folder holding the result of other science is never written into.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bert_repro.keys import is_path, is_science
from bert_repro.lifecycle.checks import UsageError
from bert_repro.lifecycle.folder import RunFolder, compared, differences
from bert_repro.lifecycle.pretrained import SHAPE_KEYS, model_on_command_line
from bert_repro.lifecycle.results import print_results

log = logging.getLogger(__name__)


class FolderHoldsOtherResult(UsageError):
    """The run folder holds the finished result of other science: it is never written over."""


def finished_results(cfg: DictConfig) -> dict[str, Any] | None:
    """The complete result of this very run in its folder, or None when the run must go on: none there,
    ``+force``, a ckpt_path= that does not exist, or test predictions asked for that it lacks. A folder whose
    complete result has other science (any key, from the command line or a file) is refused, naming the keys
    that differ: a run never writes over another's result."""
    folder = RunFolder(cfg.paths.output_dir)
    if folder.status() != "complete":
        return None
    try:
        results = folder.read()
    except ValueError as err:  # a damaged file is not a finished run: the run goes on, its resume checks it
        log.warning("%s", err)
        return None
    # a run given init= and no model= records the checkpoint's shape (RunSpec.model), not the default's
    ignore = () if model_on_command_line() else tuple(f"model.{key}" for key in SHAPE_KEYS)
    # init= by its checkpoint's identity and step, as a table's jobs are: a moved checkpoint is the same run
    differ = differences(*compared(results, OmegaConf.to_container(cfg, resolve=True)), ignore)
    if differ:
        raise FolderHoldsOtherResult(
            f"{folder} holds the finished result of other settings ({'; '.join(differ[:4])}"
            f"{'; ...' if len(differ) > 4 else ''}); it is left as it is. Run these settings in a folder of "
            "their own (hydra.run.dir=...), or move that folder away first")
    if cfg.get("force"):
        return None
    if cfg.get("ckpt_path") not in (None, "last") and not Path(cfg.ckpt_path).is_file():
        return None  # a ckpt_path= that is not there is a mistake to name (run.py's checks), not to pass over
    if cfg.test and not results.get("test_predictions"):
        return None
    return results


def report_finished(cfg: DictConfig) -> dict[str, Any] | None:
    """The finished run's results, printed with how to rerun it; None when there is none (the run goes on)."""
    results = finished_results(cfg)
    if results is None:
        return None
    log.info("%s is finished (results.json complete, same settings): nothing run; +force=true reruns it from "
             "scratch", cfg.paths.output_dir)
    print_results(results, scaled=scale_reads(cfg))
    return results


def scale_reads(cfg: DictConfig) -> bool:
    """Whether the scale= choice changes this run: a value outside the scale node interpolates it
    (pre-training's corpus, steps and batch do; a fine-tuning task's settings do not)."""
    def reads(node: Any) -> bool:
        if isinstance(node, dict):
            return any(reads(v) for v in node.values())
        if isinstance(node, list):
            return any(reads(v) for v in node)
        return isinstance(node, str) and "${scale." in node

    plain = OmegaConf.to_container(cfg, resolve=False)
    return any(reads(value) for key, value in plain.items() if key not in ("scale", "hydra"))


def _scalars(node: dict[str, Any], prefix: str) -> str:
    """``node``'s science values, less paths and nested nodes: the values a reader checks at a glance."""
    return " ".join(f"{k}={v}" for k, v in node.items() if not isinstance(v, dict | list) and k != "_target_"
                    and is_science(prefix + k) and not is_path(prefix + k))


def config_summary(cfg: DictConfig) -> str:
    """The resolved config in a few lines (the whole of it is in the run folder's .hydra/config.yaml)."""
    from hydra.core.hydra_config import HydraConfig

    plain = OmegaConf.to_container(cfg, resolve=True)
    lines = [f"run {cfg.paths.output_dir} (whole config: .hydra/config.yaml there)"]
    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        choices = {k: v for k, v in hydra.runtime.choices.items() if "/" not in k and v is not None}
        lines.append("  groups    " + " ".join(f"{k}={v}" for k, v in choices.items()))
        lines.append("  overrides " + (" ".join(hydra.overrides.task) or "none"))
    lines.append(f"  run       seed={cfg.seed} init={cfg.init} ckpt_path={cfg.ckpt_path}")
    for node in ("optim", "data"):
        lines.append(f"  {node:<9} {_scalars(plain.get(node) or {}, node + '.')}")
    return "\n".join(lines)
