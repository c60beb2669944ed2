"""W&B carries the whole run: the resolved Hydra config at its start, results.json as its summary at its end,
and a group that gathers a sweep's (or a table's) runs. Offline by default (conf/logger/wandb.yaml).

Names: the task, the model shape that ran and the run folder's name (``mrpc/base/optim.lr-5e-05``), so
the jobs of a sweep differ by the keys they sweep. Groups: a table's name for a table's runs
(``logger.wandb.group`` or ``BERT_REPRO_WANDB_GROUP``, the group its collected table is logged in:
tables.render.log_wandb), else one per sweep: its folder and a hash of its science overrides
(``multirun/mrpc#1a2b3c4d``), since every sweep of a task shares the folder ``multirun/<task>``; else none.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from bert_repro.keys import is_science
from bert_repro.lifecycle.folder import RESULTS

log = logging.getLogger(__name__)

GROUP_ENV = "BERT_REPRO_WANDB_GROUP"
SWEEP_ENV = "BERT_REPRO_WANDB_SWEEP"  # SweepGroup's group, from the sweep's process to its jobs'
WANDB_LOGGER = "lightning.pytorch.loggers.WandbLogger"


def wandb_run_name(task: str, model: str | None, folder_name: str) -> str:
    """``mrpc/base/optim.lr-5e-05``: ``model`` is the shape that ran (results.json's "model": the checkpoint's
    where init= chose it), ``folder_name`` the run folder's (hydra_hooks.run_name: the science overrides)."""
    return "/".join(part for part in (task, model, folder_name) if part)


def sweep_group(sweep_dir: str, overrides: list[str]) -> str:
    """One group per sweep: its folder, and a hash of the science overrides that launched it (sweeps as
    typed), so the sweeps of one task that share ``multirun/<task>`` are told apart, and rerunning a sweep (to
    resume it) continues its group as it continues its folders."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    science = sorted(o.input_line for o in OverridesParser.create().parse_overrides(list(overrides))
                     if is_science(o.key_or_group))
    return f"{sweep_dir}#{hashlib.sha256(chr(10).join(science).encode()).hexdigest()[:8]}"


class SweepGroup(Callback):
    """Only the sweep's own process sees its command whole (a job sees its share of it): it names the group
    here, before the launcher starts the jobs, which inherit the environment (conf/train.yaml
    hydra.callbacks)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # as typed: a value may hold an interpolation (${paths.shared_data}) that Hydra resolves later
        overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        os.environ[SWEEP_ENV] = sweep_group(str(config.hydra.sweep.dir), overrides)


def wandb_group() -> str | None:
    """The runs' group: the table runner's (env), or the sweep's (SweepGroup; its folder where a launcher did
    not pass the environment on), the same for every job of it."""
    if os.environ.get(GROUP_ENV):
        return os.environ[GROUP_ENV]
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return os.environ.get(SWEEP_ENV) or str(HydraConfig.get().sweep.dir)
    return None


def _default_name(cfg: DictConfig) -> str | None:
    """The name where the run did not give one: the model= choice stands for the shape."""
    from hydra.core.hydra_config import HydraConfig

    task = OmegaConf.select(cfg, "task.name")
    if not HydraConfig.initialized() or task is None:
        return None
    runtime = HydraConfig.get().runtime
    return wandb_run_name(task, runtime.choices.get("model"), Path(runtime.output_dir).name)


def logger_kwargs(logger_cfg: DictConfig, cfg: DictConfig, name: str | None = None) -> dict[str, Any]:
    """What a logger's config cannot say itself: for W&B, the run's resolved config, its name (``name``:
    wandb_run_name of the run, else the model= choice's) and its group. The logger's own keys win."""
    if logger_cfg.get("_target_") not in (WANDB_LOGGER, "lightning.pytorch.loggers.wandb.WandbLogger"):
        return {}
    # under its own key: the module's hyper-parameters, logged at fit start, reuse names like "task"
    kwargs: dict[str, Any] = {"config": {"cfg": OmegaConf.to_container(cfg, resolve=True)}}
    name = logger_cfg.get("name") or name or _default_name(cfg)
    group = logger_cfg.get("group") or wandb_group()
    kwargs.update({k: v for k, v in (("name", name), ("group", group)) if v})
    return kwargs


def instantiate_logger(logger_cfg: DictConfig, cfg: DictConfig, name: str | None = None) -> Any:
    """The logger of ``logger_cfg`` (conf/logger/), given what ``logger_kwargs`` adds (``config`` is also the
    first argument of Hydra's instantiate, hence the partial). The others (TensorBoard, MLflow, CSV) get the
    resolved config as hyper-parameters, under ``cfg/`` as W&B's."""
    from hydra.utils import instantiate

    if str(logger_cfg.get("tracking_uri") or "").startswith("file:"):  # MLflow's documented opt-in to a
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")      # local file store (no database needed)
    logger = instantiate(logger_cfg, _partial_=True)(**logger_kwargs(logger_cfg, cfg, name))
    if not _is_wandb(logger):  # W&B has it as its run's config (logger_kwargs)
        logger.log_hyperparams({"cfg": OmegaConf.to_container(cfg, resolve=True)})
    return logger


def close_loggers(loggers: list[Any], results: dict[str, Any] | None = None,
                  results_file: Path | None = None) -> None:
    """Finish every W&B run, with ``results`` (results.json, less the config it already has) as its summary;
    called on failure too (no results), so one failed run does not leave a sweep's next run attached to it."""
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank != 0:  # the other ranks hold Lightning's stand-in experiment: rank 0 owns the run
        return
    for logger in loggers:
        if results is not None and not _is_wandb(logger):
            _summarize(logger, results, results_file)
        run = getattr(logger, "experiment", None) if _is_wandb(logger) else None
        if run is None or not hasattr(run, "finish"):
            continue
        try:
            if results is not None and hasattr(run, "summary"):
                run.summary.update({k: v for k, v in results.items() if k != "config"})
                if results_file is not None and results_file.is_file() and hasattr(run, "save"):
                    run.save(str(results_file), base_path=str(results_file.parent), policy="end")
                if getattr(run, "dir", None):  # the .wandb file is binary: both readable beside it
                    beside = Path(run.dir).parent  # run.dir is its files/, which W&B fills with its own
                    (beside / "config.yaml").write_text(OmegaConf.to_yaml(results.get("config") or {}))
                    (beside / "summary.json").write_text(json.dumps(
                        {k: v for k, v in results.items() if k != "config"}, indent=2, default=str))
        finally:
            run.finish()


def _is_wandb(logger: Any) -> bool:
    return type(logger).__name__ == "WandbLogger"


def _summarize(logger: Any, results: dict[str, Any], results_file: Path | None) -> None:
    """results.json as the summary of a TensorBoard or MLflow run: its final metrics under ``final/`` at the
    last step, and the file itself (MLflow: an artifact; TensorBoard: a text entry)."""
    final = {f"final/{k}": v for k, v in (results.get("metrics", {}).get("final") or {}).items()
             if isinstance(v, int | float)}
    logger.log_metrics(final, step=int(results.get("global_step") or 0))
    if type(logger).__name__ == "MLFlowLogger" and results_file is not None and results_file.is_file():
        logger.experiment.log_artifact(logger.run_id, str(results_file))
    elif type(logger).__name__ == "TensorBoardLogger":
        text = json.dumps({k: v for k, v in results.items() if k != "config"}, indent=2)
        logger.experiment.add_text(RESULTS, f"```\n{text}\n```")
    logger.finalize("success" if results.get("status") == "complete" else results.get("status") or "failed")
