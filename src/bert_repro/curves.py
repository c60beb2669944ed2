"""Training curves of one run: ``python -m bert_repro.curves RUN`` (``make curves RUN=...``) draws its loss,
learning rate and Dev metrics against the step from the run's CSV history (Lightning's CSVLogger:
``RUN/csv/metrics.csv``, written with ``logger=csv``) into ``RUN/curves.png``."""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

HISTORY = Path("csv") / "metrics.csv"  # conf/logger/csv.yaml: save_dir the run folder, name csv, version ""
PANELS = ("loss", "learning rate", "Dev")


class CurvesError(ValueError):
    """A run with nothing to draw: said in one line, exit 2."""


def history_file(run: Path) -> Path:
    if not run.is_dir():
        raise CurvesError(f"{run}: no such run folder; expected a run's output folder "
                          "(outputs/<task>/<name>)")
    path = run / HISTORY
    if not path.is_file():
        raise CurvesError(f"{run}: no CSV history ({HISTORY} is missing); expected a run made with "
                          "logger=csv (the default logger=wandb keeps its history in W&B)")
    return path


def read_history(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Column -> (step, value) per row holding it: CSVLogger writes a row per log call, blank elsewhere."""
    series: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = row.get("step")
            for key, value in row.items():
                if key in ("step", "epoch") or not value or not step:
                    continue
                try:
                    number = float(value)
                except ValueError:
                    continue
                if math.isfinite(number):
                    series.setdefault(key, []).append((int(float(step)), number))
    return series


def panel(key: str) -> str | None:
    """Which panel draws ``key``; None: not drawn (throughput, final/ summaries, padding counts)."""
    if key.startswith("lr-"):  # Lightning's LearningRateMonitor
        return "learning rate"
    if key.startswith(("train/", "val/")) and key.endswith("loss"):
        return "loss"
    if key.startswith("val/") and not key.endswith("_ppl"):  # perplexity: exp of a loss drawn above
        return "Dev"
    return None


def draw(run: Path) -> Path:
    """``run``/curves.png; a CurvesError when the run has no history or nothing in it to draw."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window: runs live on servers
    import matplotlib.pyplot as plt

    path = history_file(run)
    series = {k: v for k, v in read_history(path).items() if panel(k)}
    if not series:
        raise CurvesError(f"{path}: no loss, learning-rate (lr-*) or Dev (val/*) values in it; expected the "
                          "history of a run that trained")
    shown = [name for name in PANELS if any(panel(k) == name for k in series)]
    fig, axes = plt.subplots(len(shown), 1, figsize=(8, 3 * len(shown)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], shown):
        for key, points in sorted(series.items()):
            if panel(key) == name:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="." if len(points) < 50 else None, label=key)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(str(run), fontsize="small")
    fig.tight_layout()
    out = run / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.curves", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run's output folder (outputs/<task>/<name>)")
    args = parser.parse_args(argv)
    try:
        print(draw(args.run))
    except CurvesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
