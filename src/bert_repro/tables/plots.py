"""Figure 4 (MNLI Dev accuracy against pre-training steps, §5.3) and Table 6's size trend (§5.2), as PNG and
PDF, the paper's values beside ours."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from bert_repro.tables.collect import Row  # noqa: E402
from bert_repro.tables.spec import Part, Table  # noqa: E402


def _save(fig, out_dir: Path, stem: str) -> list[Path]:
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.pdf"]
    fig.tight_layout()
    for path in paths:
        fig.savefig(path)
    plt.close(fig)
    return paths


def steps(table: Table, part: Part, rows: list[Row], reference: dict, out_dir: Path) -> list[Path]:
    """Ours: a curve per pre-training objective over the checkpoints' steps; the paper: its 1M-step values."""
    fig, (ours, paper) = plt.subplots(1, 2, figsize=(9, 3.6), gridspec_kw={"width_ratios": [3, 1]})
    for row in rows:
        done = sorted((part.x[c], cell.value, cell.spread or 0)
                      for c, cell in row.cells.items() if cell.status == "ok")
        if done:
            xs, values, errors = zip(*done)
            ours.errorbar(xs, values, yerr=errors, marker="o", capsize=3, label=row.label)
    ours.set(xlabel="pre-training steps (ours)", ylabel="MNLI-m Dev accuracy (%)",
             title=f"ours, scale={table.scale}")
    ours.legend(fontsize=8)
    endpoints = (reference.get(part.reference) or {}).get("endpoints_1m_steps") or {}
    shown = {row.label: endpoints[name] for row in rows
             if (name := part.rows[row.key].get("paper_endpoint")) in endpoints}
    if shown:
        bars = paper.bar(list(shown), list(shown.values()), color=[f"C{i}" for i in range(len(shown))])
        paper.bar_label(bars, fmt="%.1f", fontsize=8)
        paper.set_ylim(min(shown.values()) - 5, 100)
    paper.set(title="paper, 1M steps")
    paper.tick_params(axis="x", labelsize=7, labelrotation=20)
    return _save(fig, out_dir, table.name)


def size(table: Table, part: Part, rows: list[Row], reference: dict, out_dir: Path) -> list[Path]:
    """Held-out MLM perplexity and Dev accuracy per model size: ours solid, the paper's dashed."""
    fig, (ppl, acc) = plt.subplots(1, 2, figsize=(10, 3.8))
    pretrain = [c for c, spec in part.columns.items()
                if spec.get("source") == "pretrain" and "metric" in spec]
    tasks = [c for c, spec in part.columns.items() if "task" in spec]
    x = range(len(rows))
    for axis, columns in ((ppl, pretrain), (acc, tasks)):
        for i, column in enumerate(columns):  # matplotlib leaves out a cell without a number (None)
            name, cells = part.columns[column].get("label", column), [row.cells[column] for row in rows]
            axis.plot(x, [c.value for c in cells], "o-", color=f"C{i}", label=f"{name} ours")
            axis.plot(x, [c.paper for c in cells], "s--", color=f"C{i}", alpha=0.6, label=f"{name} paper")
        axis.set_xticks(x, [row.label for row in rows], rotation=30, ha="right", fontsize=7)
        axis.legend(fontsize=7)
    ppl.set(ylabel="held-out MLM perplexity", yscale="log", title=f"LM perplexity, scale={table.scale}")
    acc.set(ylabel="Dev accuracy (%)", title="fine-tuned Dev accuracy")
    return _save(fig, out_dir, f"{table.name}_size")


PLOTS = {"steps": steps, "size": size}
