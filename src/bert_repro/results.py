"""results.json: written once, atomically, so an interrupted or failed write never replaces a good file."""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table


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


def write_results(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(results, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def read_status(path: Path) -> str | None:
    """The ``status`` of an existing results.json; None when there is none or it cannot be read."""
    try:
        return json.loads(Path(path).read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def print_results(results: dict[str, Any], console: Console | None = None) -> None:
    scale = results.get("scale")
    caption = ("scale=smoke: a smoke-scale demonstration of the whole path, not the paper's numbers"
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
    (console or Console()).print(table)


def floats(metrics: dict[str, Any]) -> dict[str, float | None]:
    """Metric values as plain floats; a non-finite one is None (JSON has no NaN)."""
    out = {}
    for name, value in metrics.items():
        value = float(value.item() if hasattr(value, "item") else value)
        out[name] = value if math.isfinite(value) else None
    return out


def failure_record(cfg: DictConfig, err: BaseException, model: str | None) -> dict[str, Any]:
    """results.json of a run that failed: the reason, so a sweep's collector shows the cell as failed."""
    return {
        "status": "failed", "reason": f"{type(err).__name__}: {err}", "task": cfg.task.name, "model": model,
        "ablation": cfg.ablation.name, "scale": cfg.scale.name, "seed": cfg.seed, "init": cfg.init,
        "monitor": cfg.task.monitor, "metrics": {"final": {}, "best": {}}, "git": git_revision(),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
