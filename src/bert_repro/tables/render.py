"""A collected table as experiments/results/<table>.md, .csv, .tex and .json, and its figures as PNG and PDF.

A cell reads ``ours +- std (paper; ours - paper)``, then, where several restarts ran, ``· mean 71.5,
CI [65.1, 77.9], n=5, 1 collapsed`` (the mean only where the selection rule did not take it); a cell without
a number reads ``failed [n]``, ``not run [n]`` or ``skipped [n]``, a number whose selected run collapsed onto
one class ``53.1 (84.0; -30.9) **collapsed** [n]``, and note [n] under the table gives the reason. The
paper's comparisons follow each table with their verdicts (collect.comparisons); the .json holds cells and
comparisons.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

from bert_repro.tables.collect import Cell, Row, comparisons
from bert_repro.tables.spec import SELECTIONS, Part, Table, flatten

MARKS = {"failed": "failed", "missing": "not run", "skipped": "skipped"}


def _num(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    if signed:
        return f"{value:+.1f}"
    return f"{value:.2f}" if abs(value) < 10 and value != int(value) else f"{value:.1f}"


class Notes:
    """Reasons, numbered in order of first use; one number per distinct reason."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def ref(self, reason: str) -> int:
        if reason not in self.reasons:
            self.reasons.append(reason)
        return self.reasons.index(reason) + 1


def cell_text(cell: Cell, notes: Notes, tex: bool = False) -> str:
    pm, dash = (r"$\pm$", "--") if tex else ("±", "—")
    if cell.status == "paper":
        return f"{dash} ({_num(cell.paper)})"
    if cell.status != "ok":
        return f"{MARKS[cell.status]} [{notes.ref(cell.reason or cell.status)}]"
    text = _num(cell.value) + (f" {pm} {_num(cell.spread)}" if cell.spread is not None else "")
    if cell.paper is not None:
        text += f" ({_num(cell.paper)}; {_num(cell.diff, signed=True)})"
    text += restarts_text(cell, r"$\cdot$" if tex else "·")
    if cell.degenerate:  # in the cell itself, not only in a note: the number is not a fine-tuned model's
        text += r" \textbf{collapsed}" if tex else " **collapsed**"
    if cell.note:
        text += f" [{notes.ref(cell.note)}]"
    return text


def restarts_text(cell: Cell, dot: str = "·") -> str:
    """`` · mean m, CI [lo, hi], n=k, c collapsed`` for a cell of several restarts; '' for one run."""
    spread = cell.restarts
    if spread is None or spread.n < 2:
        return ""
    mean = "" if abs(spread.mean - cell.value) < 1e-9 else f"mean {_num(spread.mean)}, "
    collapsed = f", {cell.collapsed} collapsed" if cell.collapsed else ""
    return f" {dot} {mean}CI [{_num(spread.ci_low)}, {_num(spread.ci_high)}], n={spread.n}{collapsed}"


def comparison_lines(found: list[dict]) -> list[str]:
    """The paper's comparisons under a table: difference, paired 95% CI, verdict, and why where it disagrees
    or is inconclusive."""
    if not found:
        return []
    lines = ["Comparisons (ours: mean same-seed difference a - b, paired 95% t-interval; the verdict says "
             "whether the interval lies on the paper's side of 0):", ""]
    for c in found:
        ci = f"[{_num(c['ci_low'])}, {_num(c['ci_high'])}]" if c["ci_low"] is not None else "no interval"
        text = (f"- {c['label']}: paper {_num(c['paper_diff'], signed=True)}, "
                f"ours {_num(c['ours_diff'], signed=True)} {ci} (n={c['n']}): **{c['verdict']}**")
        lines.append(text + (f" — {c['why']}" if c["why"] else ""))
    counts = {v: sum(c["verdict"] == v for c in found) for v in ("agrees", "disagrees", "inconclusive")}
    lines += ["", "Verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + "."]
    return lines + [""]


def scale_line(table: Table) -> str:
    note = table.spec.get("scale_note")
    return f"Scale: {table.scale}" + (f" ({note})" if note else "")


def skipped(row: Row) -> str | None:
    """Why a row that runs nothing is not run: said in a line, not in a row of marks."""
    reasons = {c.reason for c in row.cells.values()}
    alone = all(c.status == "skipped" for c in row.cells.values()) and len(reasons) == 1
    return reasons.pop() if alone else None


def header(table: Table, part: Part, rows: list[Row]) -> list[str]:
    spec = table.spec
    ours = [row for row in rows if row.checkpoint != "—" and skipped(row) is None]
    lines = [f"Checkpoint, {row.label}: {row.checkpoint}" for row in ours]
    if ours:  # the grid flattened: a --set nests its dotted keys
        grid = ", ".join(f"{k} in {{{v}}}" for k, v in flatten(spec.get("grid")).items()) or "no grid"
        lines.append(f"Selection: {SELECTIONS[part.selection]}; grid: {grid}")
        if spec.get("data_note"):
            lines.append(f"Data: {spec['data_note']}")
    paper = f"experiments/reference.yaml `{part.reference}`" if part.reference else "none for these tasks"
    lines.append(f"Paper: {paper}; cells read ours ± std over restarts (paper; ours - paper) · mean, 95% "
                 "t-interval of the mean, restarts n, collapsed" if ours else f"Paper: {paper}")
    lines += [f"Not run: {row.label}: {skipped(row)}" for row in rows if skipped(row)]
    return lines + list(part.notes)


def markdown(table: Table, collected: dict[str, list[Row]],
             checked: dict[str, list[dict]] | None = None) -> str:
    title = table.spec.get("title", table.name)
    out = [f"# {title} — scale={table.scale}", ""]
    if table.scale == "smoke":
        out += ["A smoke-scale demonstration of the whole path on a CPU, not the paper's numbers.", ""]
    out += [scale_line(table), ""]
    for part in table.parts:
        rows, notes = collected[part.name], Notes()
        if len(table.parts) > 1:
            out += [f"## {part.title}", ""]
        out += [f"- {line}" for line in header(table, part, rows)] + [""]
        out.append("| | " + " | ".join(part.columns[c].get("label", c) for c in part.columns) + " |")
        out.append("|---" * (len(part.columns) + 1) + "|")
        for row in (r for r in rows if not skipped(r)):
            cells = [cell_text(row.cells[c], notes) for c in part.columns]
            out.append(f"| {row.label} | " + " | ".join(cells) + " |")
        out += [""] + [f"[{i}] {reason}" for i, reason in enumerate(notes.reasons, 1)] + [""]
        out += comparison_lines((checked or {}).get(part.name, []))
    return "\n".join(out).rstrip() + "\n"


def _tex_escape(text: str) -> str:
    for char, escaped in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"),
                          ("#", r"\#"), ("{", r"\{"), ("}", r"\}"), ("$", r"\$"),
                          ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        text = text.replace(char, escaped)
    return text


def latex(table: Table, collected: dict[str, list[Row]], checked: dict[str, list[dict]] | None = None) -> str:
    out = [f"% {table.spec.get('title', table.name)}; generated by `make {table.name}`",
           f"% {_tex_escape(scale_line(table))}"]
    for part in table.parts:
        rows, notes = collected[part.name], Notes()
        out += [f"% {_tex_escape(line)}" for line in header(table, part, rows)]
        labels = [_tex_escape(part.columns[c].get("label", c)) for c in part.columns]
        out += [r"\begin{tabular}{l" + "r" * len(part.columns) + "}", r"\toprule",
                " & ".join(["", *labels]) + r" \\", r"\midrule"]
        for row in (r for r in rows if not skipped(r)):
            cells = [cell_text(row.cells[c], notes, tex=True) for c in part.columns]
            cells = [c.replace("±", r"$\pm$") for c in cells]
            out.append(" & ".join([_tex_escape(row.label), *cells]) + r" \\")
        out += [r"\bottomrule", r"\end{tabular}"]
        out += [rf"% [{i}] {_tex_escape(reason)}" for i, reason in enumerate(notes.reasons, 1)]
        found = (checked or {}).get(part.name, [])
        out += [f"% {_tex_escape(line)}" for line in comparison_lines(found) if line]
    return "\n".join(out) + "\n"


def write_csv(path: Path, table: Table, collected: dict[str, list[Row]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["table", "scale", "part", "row", "column", "ours", "paper", "diff", "spread",
                         "n_runs", "mean", "ci_low", "ci_high", "restarts", "collapsed",
                         "status", "reason", "note", "checkpoint", "selection", "run"])
        for part in table.parts:
            for row in collected[part.name]:
                for name, cell in row.cells.items():
                    r = cell.restarts
                    writer.writerow([table.name, table.scale, part.name, row.key, name, cell.value,
                                     cell.paper, cell.diff, cell.spread, cell.n, r and r.mean, r and r.ci_low,
                                     r and r.ci_high, r and r.n, cell.collapsed, cell.status, cell.reason,
                                     cell.note, row.checkpoint, part.selection, cell.run])


def results_json(table: Table, collected: dict[str, list[Row]], checked: dict[str, list[dict]]) -> dict:
    """Every cell (with its restarts by seed) and every comparison: experiments/results/<table>.json."""
    def cell(c: Cell) -> dict:
        return {**{k: v for k, v in asdict(c).items() if k not in ("restarts", "seeds")}, "diff": c.diff,
                "restarts": asdict(c.restarts) if c.restarts else None,
                "seeds": {str(k): v for k, v in (c.seeds or {}).items()}}

    parts = {part.name: {"title": part.title, "selection": part.selection, "rows": [
        {"key": row.key, "label": row.label, "checkpoint": row.checkpoint,
         "cells": {name: cell(c) for name, c in row.cells.items()}} for row in collected[part.name]]}
        for part in table.parts}
    return {"table": table.name, "scale": table.scale, "title": table.spec.get("title", table.name),
            "parts": parts, "comparisons": [c for part in table.parts for c in checked.get(part.name, [])]}


def write_all(table: Table, collected: dict[str, list[Row]], reference: dict, out_dir: Path) -> list[Path]:
    checked = comparisons(table, collected, reference)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / f"{table.name}.{ext}" for ext in ("md", "csv", "tex", "json")]
    written[0].write_text(markdown(table, collected, checked))
    write_csv(written[1], table, collected)
    written[2].write_text(latex(table, collected, checked))
    written[3].write_text(json.dumps(results_json(table, collected, checked), indent=2) + "\n")
    for part in table.parts:
        if part.plot:
            from bert_repro.tables.plots import PLOTS

            written += PLOTS[part.plot](table, part, collected[part.name], reference, out_dir)
    return written


def log_wandb(table: Table, collected: dict[str, list[Row]], written: list[Path], folder: Path) -> Path:
    """The collected table as a W&B table (and an artifact with its files), in the table's group; offline
    unless WANDB_MODE says otherwise, so `wandb sync <folder>/wandb/offline-run-*` uploads it later. Returns
    the run's folder."""
    import os

    import wandb

    columns = ["part", "row", "column", "ours", "paper", "diff", "spread", "n_runs", "status", "reason"]
    data = [[part.name, row.key, name, cell.value, cell.paper, cell.diff, cell.spread, cell.n, cell.status,
             cell.reason]
            for part in table.parts for row in collected[part.name] for name, cell in row.cells.items()]
    folder.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project="bert-repro", group=table.name, job_type="table",
                     name=f"{table.name}-{table.scale}", tags=[table.name, table.scale], dir=str(folder),
                     mode=os.environ.get("WANDB_MODE", "offline"),
                     config={"table": table.name, "scale": table.scale})
    try:
        cells = wandb.Table(columns=columns, data=data)
        run.log({table.name: cells})
        artifact = wandb.Artifact(f"{table.name}-{table.scale}", type="table")
        artifact.add(cells, table.name)
        for path in written:
            artifact.add_file(str(path))
        run.log_artifact(artifact)
        return Path(run.dir).parent
    finally:
        run.finish()
