"""A collected table as experiments/results/<table>.md, .csv, .tex and .json, and its figures (plots.py): each
part's cells, then the paper's comparisons with their verdicts."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from bert_repro.tables.collect import NOT_RUN, SKIPPED, Cell, Row, comparisons, what_ran
from bert_repro.tables.spec import SELECTIONS, Part, Table

log = logging.getLogger(__name__)

PREVIOUS = ".previous"  # earlier tables set aside by a collect with fewer finished cells
MARKS = {"failed": "failed", "missing": "not run", "skipped": "skipped"}
COLUMNS = ["table", "scale", "part", "row", "column", "ours", "paper", "diff", "spread", "n_runs", "mean",
           "ci_low", "ci_high", "restarts", "collapsed", "status", "reason", "note", "checkpoint",
           "selection", "run"]  # the .csv's, one line a cell
WANDB = ["part", "row", "column", "ours", "paper", "diff", "spread", "n_runs", "status", "reason"]


def _num(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    if signed:
        return f"{value:+.1f}"
    return f"{value:.2f}" if abs(value) < 10 and value != int(value) else f"{value:.1f}"


def cell_text(cell: Cell, notes: list[str]) -> str:
    """``ours ± std (paper; ours - paper) · mean, CI, n, collapsed`` (the mean where the rule took another),
    or ``failed [n]``, ``not run [n]``, ``skipped [n]``: the reason numbered in ``notes``, once each."""
    def ref(reason: str) -> str:
        notes.extend([reason] if reason not in notes else [])
        return f"[{notes.index(reason) + 1}]"

    if cell.status == "paper":
        return f"— ({_num(cell.paper)})"
    if cell.status != "ok":
        return f"{MARKS[cell.status]} {ref(cell.reason or cell.status)}"
    text = _num(cell.value) + (f" ± {_num(cell.spread)}" if cell.spread is not None else "")
    if cell.paper is not None:
        text += f" ({_num(cell.paper)}; {_num(cell.diff, signed=True)})"
    spread = cell.restarts
    if spread is not None and spread.n > 1:
        mean = "" if abs(spread.mean - cell.value) < 1e-9 else f"mean {_num(spread.mean)}, "
        collapsed = f", {cell.collapsed} collapsed" if cell.collapsed else ""
        text += f" · {mean}CI [{_num(spread.ci_low)}, {_num(spread.ci_high)}], n={spread.n}{collapsed}"
    if cell.degenerate:  # in the cell itself: the number is not a fine-tuned model's
        text += " **collapsed**"
    return text + (f" {ref(cell.note)}" if cell.note else "")


def comparison_lines(found: list[dict]) -> list[str]:
    if not found:
        return []
    lines = ["Comparisons (ours: mean same-seed difference a - b, paired 95% t-interval; the verdict says "
             "whether the interval lies on the paper's side of 0):", ""]
    for c in found:
        ci = f"[{_num(c['ci_low'])}, {_num(c['ci_high'])}]" if c["ci_low"] is not None else "no interval"
        lines.append(f"- {c['label']}: paper {_num(c['paper_diff'], signed=True)}, ours "
                     f"{_num(c['ours_diff'], signed=True)} {ci} (n={c['n']}): **{c['verdict']}**"
                     + (f" — {c['why']}" if c["why"] else ""))
    tally = {v: sum(c["verdict"] == v for c in found)
             for v in ("agrees", "disagrees", "inconclusive", NOT_RUN, SKIPPED)}
    # the three verdicts always, so a reader sees what was weighed; a mark only where a comparison has one
    counts = ", ".join(f"{n} {v}" for v, n in tally.items() if n or v not in (NOT_RUN, SKIPPED))
    return [*lines, "", f"Verdicts: {counts}.", ""]


def skipped(row: Row) -> str | None:
    """Why a row that runs nothing is not run: said in a line, not in a row of marks."""
    reasons = {c.reason for c in row.cells.values()}
    return reasons.pop() if len(reasons) == 1 and all(c.status == "skipped" for c in row.cells.values()) \
        else None


def header(table: Table, part: Part, rows: list[Row]) -> list[str]:
    ours = [row for row in rows if row.checkpoint != "—" and skipped(row) is None]
    lines = [f"Checkpoint, {row.label}: {row.checkpoint}" for row in ours]
    if ours:
        grid = ", ".join(f"{k} in {{{v}}}" for k, v in table.spec["grid"].items()) or "no grid"
        lines.append(f"Selection: {SELECTIONS[part.selection]}; grid: {grid}")
        lines += [f"Data: {table.spec['data_note']}"] if table.spec.get("data_note") else []
    paper = f"experiments/reference.yaml `{part.reference}`" if part.reference else "none for these tasks"
    lines.append(f"Paper: {paper}; cells read ours ± std over restarts (paper; ours - paper) · mean, 95% "
                 "t-interval of the mean, restarts n, collapsed" if ours else f"Paper: {paper}")
    return lines + [f"Not run: {row.label}: {skipped(row)}" for row in rows if skipped(row)] + part.notes


def page(table: Table, collected: dict[str, list[Row]], checked: dict[str, list[dict]]) -> list:
    """The table's page in reading order: lines of text, and each part's cells as a DataFrame of their text
    (row labels by column labels), which the .md writes as a pipe table and the .tex as a tabular."""
    note = table.spec.get("scale_note")
    out = [f"# {table.spec.get('title', table.name)} — scale={table.scale}", ""]
    if table.scale == "smoke":
        out += ["A smoke-scale demonstration of the whole path on a CPU, not the paper's numbers.", ""]
    if table.sets:  # the scale's note describes the table as configured, not as shrunk
        out += [f"Scale: {table.scale}, changed with --set {' '.join(table.sets)}", ""]
    else:
        out += [f"Scale: {table.scale}" + (f" ({note})" if note else ""), ""]
    out += [f"Ran: {what_ran(table, collected)}", ""]
    for part in table.parts:
        rows, notes = [row for row in collected[part.name] if not skipped(row)], []
        out += [f"## {part.title}", ""] if len(table.parts) > 1 else []
        out += [f"- {line}" for line in header(table, part, collected[part.name])] + [""]
        out.append(pd.DataFrame([[cell_text(row.cells[c], notes) for c in part.columns] for row in rows],
                                index=[row.label for row in rows],
                                columns=[part.columns[c].get("label", c) for c in part.columns]))
        out += ["", *(f"[{i}] {reason}" for i, reason in enumerate(notes, 1)), ""]
        out += comparison_lines(checked.get(part.name, []))
    return out


def markdown(blocks: list) -> str:
    """The page's blocks (page) as Markdown: its lines, and each part's cells as a pipe table."""
    lines = []
    for block in blocks:
        if isinstance(block, str):
            lines.append(block)
            continue
        lines += ["| | " + " | ".join(block.columns) + " |", "|---" * (len(block.columns) + 1) + "|"]
        lines += [f"| {label} | " + " | ".join(texts) + " |" for label, texts in block.iterrows()]
    return "\n".join(lines).rstrip() + "\n"


def latex(blocks: list) -> str:
    """The .md's tables as booktabs tabulars (pandas escapes the text), its other lines as comments."""
    out = []
    for block in blocks:
        if isinstance(block, pd.DataFrame):
            tabular = block.to_latex(escape=True, column_format="l" + "r" * len(block.columns))
            out.append(re.sub(r"\*\*(.+?)\*\*", r"\\textbf{\1}", tabular))  # the .md's bold: a collapsed run
        elif block:
            out.append(f"% {block}\n")
    return "".join(out)


def records(table: Table, collected: dict[str, list[Row]]) -> pd.DataFrame:
    """One record a cell, in COLUMNS: the .csv's lines and the W&B table's."""
    return pd.DataFrame([[
        table.name, table.scale, part.name, row.key, name, c.value, c.paper, c.diff, c.spread, c.n,
        *((r.mean, r.ci_low, r.ci_high, r.n) if (r := c.restarts) else [None] * 4),
        c.collapsed, c.status, c.reason, c.note, row.checkpoint, part.selection, c.run]
        for part in table.parts for row in collected[part.name] for name, c in row.cells.items()],
        columns=COLUMNS, dtype=object)


def results_json(table: Table, collected: dict[str, list[Row]], checked: dict[str, list[dict]]) -> dict:
    """Every cell (with its restarts by seed) and every comparison: experiments/results/<table>.json."""
    parts = {part.name: {"title": part.title, "selection": part.selection, "rows": [
        {**asdict(row), "cells": {name: {**asdict(c), "diff": c.diff, "seeds": c.seeds or {}}
                                  for name, c in row.cells.items()}} for row in collected[part.name]]}
        for part in table.parts}
    return {"table": table.name, "scale": table.scale, "title": table.spec.get("title", table.name),
            "parts": parts, "comparisons": [c for part in table.parts for c in checked.get(part.name, [])]}


def finished_cells(path: Path) -> int | None:
    """The finished cells of a written <table>.json; None when there is none or it cannot be read."""
    try:
        parts = json.loads(path.read_text())["parts"].values()
        return sum(cell["status"] == "ok" for part in parts for row in part["rows"]
                   for cell in row["cells"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_all(table: Table, collected: dict[str, list[Row]], reference: dict, out_dir: Path) -> list[Path]:
    checked = comparisons(table, collected, reference)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / f"{table.name}.{ext}" for ext in ("md", "csv", "tex", "json")]
    earlier, now = finished_cells(written[3]), sum(c.status == "ok" for rows in collected.values()
                                                    for row in rows for c in row.cells.values())
    if earlier is not None and now < earlier:  # a thinner table never silently takes a fuller one's place
        aside = out_dir / PREVIOUS / time.strftime("%Y%m%d-%H%M%S")
        aside.mkdir(parents=True, exist_ok=True)
        for path in (p for p in written if p.is_file()):
            path.rename(aside / path.name)
        log.warning("%s: %d finished cells, fewer than the %d of the table it replaces; that one is kept "
                    "in %s", written[0], now, earlier, aside)
    blocks = page(table, collected, checked)  # once: its header reads the runs' records
    written[0].write_text(markdown(blocks))
    records(table, collected).to_csv(written[1], index=False)
    written[2].write_text(latex(blocks))
    written[3].write_text(json.dumps(results_json(table, collected, checked), indent=2) + "\n")
    for part in (p for p in table.parts if p.plot):
        from bert_repro.tables.plots import PLOTS  # matplotlib loads only for a table with figures

        written += PLOTS[part.plot](table, part, collected[part.name], reference, out_dir)
    return written


def log_wandb(table: Table, collected: dict[str, list[Row]], written: list[Path], folder: Path) -> Path:
    """The collected table as a W&B table and an artifact of its files, in the table's group; offline unless
    WANDB_MODE says otherwise (`wandb sync` uploads it later). Returns the run's folder."""
    import wandb

    folder.mkdir(parents=True, exist_ok=True)
    with wandb.init(project="bert-repro", group=table.name, job_type="table", dir=str(folder),
                    name=f"{table.name}-{table.scale}", tags=[table.name, table.scale],
                    mode=os.environ.get("WANDB_MODE", "offline"),
                    config={"table": table.name, "scale": table.scale}) as run:  # finished on any exit
        run.log({table.name: wandb.Table(dataframe=records(table, collected)[WANDB])})
        artifact = wandb.Artifact(f"{table.name}-{table.scale}", type="table")
        for path in written:
            artifact.add_file(str(path))
        run.log_artifact(artifact)
        return Path(run.dir).parent
