"""results.json, the one record of a run: its layout (``RunResult``), written once and atomically (an
interrupted or failed write never replaces a good file), and read back checked. Where it lies, and which
folders are runs, is the run folder's to say (folder.py)."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table
from rich.text import Text

log = logging.getLogger(__name__)


def git_revision() -> str | None:
    """HEAD of the checkout the package runs from, with "-dirty" when it has uncommitted changes."""
    root = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}-dirty" if dirty else rev



@dataclass
class RunResult:
    """The layout of results.json, in its key order: what a run (``mode`` train) or an evaluation (``mode``
    evaluate) did, on what, and what it scored. ``identity`` is what its checkpoints carry too
    (``identity.run_identity``)."""

    status: str  # complete | interrupted | failed
    task: str
    model: str | None  # the model= choice, or the checkpoint's shape (L.._H.._A..) where init= chose it
    ablation: str
    scale: str
    seed: int
    init: str | None
    monitor: str | None
    metrics: dict[str, Any]  # final, best, best_checkpoint, per_epoch
    config: dict[str, Any]  # the composed config, model shape as it ran
    mode: str = "train"
    reason: str | None = None  # why it failed
    model_config: dict[str, Any] | None = None
    identity: dict[str, Any] | None = None
    resumed_from: str | None = None
    missing_heads: list[str] = field(default_factory=list)
    init_head_dropped: str | None = None  # init= was fine-tuned on another task: its head was not taken
    init_identity: dict[str, Any] | None = None  # init='s checkpoint, wherever it lies (identity.py)
    predict_majority: bool = False
    degenerate: str | None = None  # e.g. collapsed onto one class
    data_sizes: dict[str, int] | None = None
    test_predictions: dict[str, str] | None = None
    global_step: int = 0
    global_batch: int | None = None
    per_device_batch: int | None = None
    accumulation: int = 1
    world_size: int = 1
    tokens_per_s: float | None = None
    sequences_per_s: float | None = None
    perf: dict[str, Any] | None = None
    wall_time_s: float = 0.0  # the whole run, over its attempts (record.py)
    wall_time_attempt_s: float = 0.0
    resumes: int = 0
    tokens_trained: int = 0
    flops_trained: float = 0.0
    git: str | None = field(default_factory=lambda: git_revision())

    def write(self, path: Path) -> None:
        write_results(path, asdict(self))

    @classmethod
    def read(cls, path: Path) -> RunResult:
        """A results.json, checked: one that is not one is a ValueError naming it and what was expected."""
        return cls(**{k: v for k, v in read_results(path).items() if k in _FIELDS})


_FIELDS = {f.name for f in fields(RunResult)}
REQUIRED = ("status", "task", "seed", "monitor", "metrics", "config")


def plain_file_mode(file: int | str | Path) -> None:
    """The mode a plain ``open(path, "w")`` gives (0666 less the umask) on a file (or descriptor) written by
    way of a temporary file: mkstemp's 0600 would keep a result from colleagues on a shared cluster."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(file, 0o666 & ~umask)


def write_results(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results.", suffix=".json")
    try:
        plain_file_mode(fd)
        with os.fdopen(fd, "w") as f:
            json.dump(results, f, indent=2, sort_keys=False, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException as err:  # a full disk mid-write: the earlier results.json stays, no temporary file
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno is not None and not err.filename:
            raise OSError(err.errno, err.strerror, str(path)) from err  # the message names the file
        raise


def read_results(path: Path) -> dict[str, Any]:
    """A results.json as a dict, checked for the keys every reader needs; a malformed one is a ValueError
    that names the file, what is wrong and what was expected."""
    try:
        results = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a results.json as src/train.py writes it ({type(err).__name__}: "
                         f"{err}); expected JSON with {', '.join(REQUIRED)}. Fix or remove that file (or its "
                         "run folder) and collect again") from None
    missing = [k for k in REQUIRED if k not in results] if isinstance(results, dict) else list(REQUIRED)
    metrics = results.get("metrics") if not missing else None
    if not missing and not (isinstance(metrics, dict) and isinstance(metrics.get("final"), dict)):
        missing = ["metrics.final"]
    if missing:
        raise ValueError(f"{path} is not a results.json as src/train.py writes it (missing "
                         f"{', '.join(missing)}); expected JSON with {', '.join(REQUIRED)}. Fix or remove "
                         "that file (or its run folder) and collect again")
    return results


def print_results(results: dict[str, Any], console: Console | None = None, scaled: bool = True) -> None:
    """``scaled``: whether the scale= choice changed the run (finished.scale_reads); a fine-tuning run's
    numbers are not a smoke-scale demonstration's because scale=smoke was composed beside them."""
    scale = results.get("scale")
    caption = None if not scaled else (
        "scale=smoke: a smoke-scale demonstration of the whole path, not the paper's numbers"
        if scale == "smoke" else f"scale={scale}")
    table = Table(title=f"{results['task']} | model={results.get('model')} | ablation={results['ablation']} "
                        f"| seed={results['seed']}", caption=caption)
    # What a model that learned nothing scores, so a smoke run's numbers can be read at a glance.
    untrained = {"val/mlm_ppl": f"{results['model_config']['vocab_size']} (uniform guess)",
                 "val/nsp_acc": "0.5000 (chance)"} if results["task"] == "pretrain" else {}
    table.add_column("metric")
    table.add_column("final", justify="right")
    table.add_column("untrained", justify="right")
    for name, value in sorted(results["metrics"]["final"].items()):
        if name.startswith(("val/", "test/")):
            table.add_row(name, "n/a" if value is None else f"{value:.4f}", untrained.get(name, ""))
    if results.get("tokens_per_s"):
        table.add_row("train tokens/s", f"{results['tokens_per_s']:.0f}")
    table.add_row("steps", str(results["global_step"]))
    table.add_row("wall time (s)", f"{results['wall_time_s']:.1f}")
    console = console or Console()
    console.print(table)
    if results.get("degenerate"):  # a collapsed fine-tune (§4.1's unstable runs) still prints a number
        warning = (f"{results['task']}: collapsed ({results['degenerate']}); these Dev numbers are a "
                   "constant guess's, not a fine-tuned model's: rerun with another seed or learning rate")
        console.print(Text.assemble(("WARNING ", "bold red"), warning))  # Text: no markup in the reason
        log.warning(warning)


def floats(metrics: dict[str, Any]) -> dict[str, float | None]:
    """Metric values as plain floats; a non-finite one is None (JSON has no NaN)."""
    out = {}
    for name, value in metrics.items():
        value = float(value.item() if hasattr(value, "item") else value)
        out[name] = value if math.isfinite(value) else None
    return out


def failure_record(cfg: DictConfig, err: BaseException, model: str | None) -> RunResult:
    """results.json of a run that failed: the reason, so a sweep's collector shows the cell as failed."""
    return RunResult(status="failed", reason=f"{type(err).__name__}: {err}", task=cfg.task.name, model=model,
                     ablation=cfg.ablation.name, scale=cfg.scale.name, seed=cfg.seed, init=cfg.init,
                     monitor=cfg.task.monitor, metrics={"final": {}, "best": {}},
                     config=OmegaConf.to_container(cfg, resolve=True))
