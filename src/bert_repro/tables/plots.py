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
        points = [(part.columns[c]["x"], cell) for c, cell in row.cells.items() if cell.status == "ok"]
        if points:
            xs, cells = zip(*sorted(points, key=lambda p: p[0]))
            ours.errorbar(xs, [c.value for c in cells], yerr=[c.spread or 0 for c in cells], marker="o",
                          capsize=3, label=row.label)
    ours.set(xlabel="pre-training steps (ours)", ylabel="MNLI-m Dev accuracy (%)",
             title=f"ours, scale={table.scale}")
    ours.legend(fontsize=8)
    endpoints = (reference.get(part.reference or "", {}) or {}).get("endpoints_1m_steps") or {}
    names = [part.rows[row.key].get("paper_endpoint") for row in rows]
    shown = [(row.label, endpoints[n]) for row, n in zip(rows, names) if n in endpoints]
    if shown:
        paper.bar([label for label, _ in shown], [v for _, v in shown], color=["C0", "C1"][: len(shown)])
        for i, (_, value) in enumerate(shown):
            paper.annotate(f"{value:.1f}", (i, value), ha="center", va="bottom", fontsize=8)
        paper.set_ylim(min(v for _, v in shown) - 5, 100)
    paper.set(title="paper, 1M steps")
    paper.tick_params(axis="x", labelsize=7, labelrotation=20)
    return _save(fig, out_dir, table.name)


def size(table: Table, part: Part, rows: list[Row], reference: dict, out_dir: Path) -> list[Path]:
    """Held-out MLM perplexity and Dev accuracy per model size: ours solid, the paper's dashed."""
    pretrain = [c for c, spec in part.columns.items()
                if spec.get("source") == "pretrain" and "metric" in spec]
    tasks = [c for c, spec in part.columns.items() if "task" in spec]
    labels = [row.label for row in rows]
    fig, (ppl, acc) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = list(range(len(rows)))
    for axis, columns in ((ppl, pretrain), (acc, tasks)):
        for i, column in enumerate(columns):
            ours = [row.cells[column].value if row.cells[column].status == "ok" else None for row in rows]
            paper = [row.cells[column].paper for row in rows]
            name = part.columns[column].get("label", column)
            axis.plot(x, [float("nan") if v is None else v for v in ours], marker="o", color=f"C{i}",
                      label=f"{name} ours")
            axis.plot(x, [float("nan") if v is None else v for v in paper], marker="s", linestyle="--",
                      color=f"C{i}", alpha=0.6, label=f"{name} paper")
        axis.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
        axis.legend(fontsize=7)
    ppl.set(ylabel="held-out MLM perplexity", yscale="log", title=f"LM perplexity, scale={table.scale}")
    acc.set(ylabel="Dev accuracy (%)", title="fine-tuned Dev accuracy")
    return _save(fig, out_dir, f"{table.name}_size")


PLOTS = {"steps": steps, "size": size}
