"""From run folders to cells: each cell is our number (after the table's selection rule), the paper's number,
and the spread over restarts (mean, std, 95% CI, collapsed runs counted), or an explicit mark (failed, not
run, skipped) with the reason, never a number; then the paper's comparisons, checked on same-seed
differences."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bert_repro import selection
from bert_repro.lifecycle.folder import LAST, RunFolder
from bert_repro.tables import stats
from bert_repro.tables.runner import job_state
from bert_repro.tables.spec import REPO, Part, Sweep, Table, TableError, column_run

REFERENCE = REPO / "experiments" / "reference.yaml"


@dataclass
class Cell:
    value: float | None = None
    paper: float | None = None
    spread: float | None = None  # std over the restarts behind the value
    n: int = 0  # runs behind the value (restarts averaged, or the grid searched)
    status: str = "ok"  # ok | failed | missing | skipped | paper
    reason: str | None = None
    run: str | None = None  # the selected run's folder
    note: str | None = None  # e.g. the selected run collapsed onto one class
    degenerate: str | None = None  # why the selected run collapsed: its number is a constant guess's (marked)
    seeds: dict[int, float] | None = None  # each restart's value (the selected hyper-parameters), by seed
    restarts: stats.Spread | None = None  # mean, std and 95% CI over those restarts
    collapsed: int = 0  # of those restarts, runs that predicted one class (counted in, never dropped)

    @property
    def diff(self) -> float | None:
        return None if self.value is None or self.paper is None else self.value - self.paper


@dataclass
class Row:
    key: str
    label: str
    cells: dict[str, Cell]
    checkpoint: str


def read_results(folder: Path) -> dict:
    """A run folder's result, checked (RunFolder.read): a malformed one is an error that names it."""
    try:
        return RunFolder(folder).read()
    except ValueError as err:
        raise TableError(str(err)) from None


def load_reference(path: Path = REFERENCE) -> dict:
    if not path.is_file():
        raise TableError(f"{path} does not exist (the paper's numbers; a copy of "
                         "../shared/paper/reference.yaml)")
    return yaml.safe_load(path.read_text())


def paper_value(reference: dict, part: Part, row: str, column: str) -> float | None:
    block = reference.get(part.reference or "", {}) or {}
    columns, rows = block.get("columns") or [], block.get("rows") or {}
    values = rows.get(row)
    if column not in columns or values is None:
        return None
    return values[columns.index(column)]


def field(results: dict, path: str) -> Any:
    """``model_config.num_layers`` or ``config.data.mask_shares.0`` in a run's result."""
    node: Any = results
    for key in path.split("."):
        node = node[int(key)] if isinstance(node, list) else (node or {}).get(key)
    return node


@dataclass
class Outcome:
    """What a sweep's folders hold: usable runs (selection.py's records) and the failures with their
    reasons."""

    runs: list[dict]
    failed: list[str]
    missing: int
    jobs: int


def outcome(sweep: Sweep) -> Outcome:
    complete, failed, missing = [], [], 0
    jobs = sweep.jobs()
    for _, folder in jobs:
        state, reason = job_state(folder)
        if state == "complete":
            read_results(folder)
            complete.append(folder)
        elif state == "failed":
            failed.append(reason or "failed")
        else:
            missing += 1
    runs, skipped = selection.load_runs(complete) if complete else ([], [])
    return Outcome(runs, failed + skipped, missing, len(jobs))


def _mark(out: Outcome, sweep: Sweep) -> Cell:
    if out.failed:
        reasons = sorted(set(out.failed))
        return Cell(status="failed", reason="; ".join(reasons))
    return Cell(status="missing", reason=f"not run yet ({sweep.name}: {out.missing} of {out.jobs} jobs)")


def finetune_cell(sweep: Sweep, out: Outcome, metric: str, scale: float) -> Cell:
    if not out.runs:
        return _mark(out, sweep)
    restarts = sweep.selection == "mean_over_restarts"
    entries = selection.select(out.runs, restarts=restarts, metric=metric)  # selected on what it reports
    if len(entries) != 1:
        raise TableError(f"{sweep.folder}: runs of {len(entries)} different settings in one sweep")
    entry = entries[0]
    value = entry["metrics"].get(metric)
    if value is None:
        return Cell(status="failed", reason=f"{metric} absent from the selected run {entry['selected']}")
    selected = next(r for r in out.runs if r["dir"] == entry["selected"])
    group = [r for r in out.runs
             if r["science"] == selected["science"] and r["final"].get(metric) is not None]
    seeds = {int(r["seed"]): scale * r["final"][metric] for r in group}  # the restarts of the chosen setting
    spread = stats.spread(list(seeds.values()))
    degenerate = next((d["reason"] for d in entry["degenerate"] if d["dir"] == entry["selected"]), None)
    cell = Cell(value=scale * value, run=entry["selected"], n=spread.n if restarts else len(out.runs),
                spread=spread.std, note=f"collapsed: {degenerate}" if degenerate else None, seeds=seeds,
                restarts=spread, collapsed=sum(bool(r["degenerate"]) for r in group), degenerate=degenerate)
    if out.failed:
        cell.note = "; ".join(filter(None, [cell.note, f"{len(out.failed)} of {out.jobs} runs failed"]))
    return cell


def pretrain_cell(sweep: Sweep | None, column: dict) -> Cell:
    if sweep is None:
        return Cell(status="skipped", reason="this row has no pre-training run of ours")
    folder = sweep.jobs()[0][1]
    state, reason = job_state(folder)
    if state != "complete":
        return Cell(status=state, reason=reason or f"not run yet ({sweep.name})")
    results = read_results(folder)
    if "metric" in column:
        value = results["metrics"]["final"].get(column["metric"])
    else:
        value = field(results, column["field"])
    if value is None:
        absent = column.get("metric") or column.get("field")
        return Cell(status="failed", reason=f"{absent} absent from {folder}")
    return Cell(value=float(column.get("scale", 1)) * value, run=str(folder), n=1)


def average_cell(cells: list[Cell | None], names: list[str]) -> Cell:
    """The mean of other columns of the row (Table 1's GLUE average), only when every one has a number."""
    absent = [n for n, c in zip(names, cells) if c is None or c.status != "ok"]
    if absent:
        return Cell(status="missing",
                    reason=f"the average needs every one of its columns; no number for {', '.join(absent)}")
    return Cell(value=sum(c.value for c in cells) / len(cells), n=len(cells))


def checkpoint_of(table: Table, part: Part, key: str) -> str:
    row = part.rows[key]
    if row.get("skip"):
        return f"none ({row['skip']})"
    if row.get("pretrain"):
        sweep = table.sweeps[f"pretrain/{row['pretrain']}"]
        names = sorted({s.checkpoint for s in table.sweeps.values() if s.needs is sweep}) or [LAST]
        return f"our pre-training run {sweep.name} ({sweep.overrides.get('model')}), {', '.join(names)}"
    if row.get("init"):
        inits = [s.overrides.get("init") for s in table.sweeps.values()
                 if s.name.startswith(f"finetune/{key}/") and s.overrides.get("init")]
        return f"{row['init']}: {inits[0]}" if inits else f"{row['init']}: none given"
    return "random initialisation"


def collect(table: Table, reference: dict) -> dict[str, list[Row]]:
    """Every part's rows with their cells; our rows first, then the paper's other systems."""
    tables: dict[str, list[Row]] = {}
    outcomes: dict[str, Outcome] = {}
    for part in table.parts:
        rows = []
        for key, row in part.rows.items():
            cells = {}
            for name, column in part.columns.items():
                found = column_run(name, column)
                if row.get("skip") or column.get("skip"):
                    cell = Cell(status="skipped", reason=row.get("skip") or column["skip"])
                elif column.get("source") == "average":
                    cell = average_cell([cells.get(c) for c in column["of"]], column["of"])
                elif found is None:
                    cell = pretrain_cell(table.pretrain_sweep(key, part), column)
                else:
                    sweep = table.finetune_sweep(key, found[0])
                    if sweep.name not in outcomes:
                        outcomes[sweep.name] = outcome(sweep)
                    cell = finetune_cell(sweep, outcomes[sweep.name], column["metric"],
                                         float(column.get("scale", 100)))
                cell.paper = paper_value(reference, part, row.get("paper", key), name)
                cells[name] = cell
            rows.append(Row(key, row.get("label", key), cells, checkpoint_of(table, part, key)))
        for key, label in part.paper_rows.items():
            cells = {name: Cell(status="paper", reason="another system: the paper's number only",
                                paper=paper_value(reference, part, key, name)) for name in part.columns}
            rows.append(Row(key, label, cells, "—"))
        tables[part.name] = rows
    return tables


def comparisons(table: Table, tables: dict[str, list[Row]], reference: dict) -> dict[str, list[dict]]:
    """Each part's ``comparisons:`` checked on paired seeds. An entry compares rows ``a`` - ``b`` on each of
    its ``columns``, or (with ``rows:``) columns ``a`` - ``b`` within each of those rows (a trend along the
    table, e.g. more pre-training steps). The paper's difference is ``paper_diff`` where given, else read from
    the reference at ``paper_column`` (default: the column itself); a demo part uses the table's reference.
    A comparison of a row or column removed with ``--set rows.<key>=null`` is left out; an unknown name is an
    error."""
    checked: dict[str, list[dict]] = {}
    for part in table.parts:
        own = (table.spec.get("parts") or {}).get(part.name) or {}
        removed = {k for node in (table.spec, own) for group in ("rows", "columns")
                   for k, v in (node.get(group) or {}).items() if v is None}
        rows = {row.key: row for row in tables[part.name]}
        block = Part(part.name, part.title, part.reference or table.spec.get("reference"), part.rows,
                     part.columns, part.selection)
        found = []
        for spec in part.comparisons:
            a, b = spec.get("a"), spec.get("b")
            if spec.get("rows"):  # (row, column) of a and of b
                pairs = [((r, a), (r, b)) for r in spec["rows"]]
            else:
                pairs = [((a, c), (b, c)) for c in spec.get("columns") or [spec.get("column")]]
            pairs = [p for p in pairs if not {p[0][0], p[0][1], p[1][0], p[1][1]} & removed]
            unknown = {str(k) for pair in pairs for r, c in pair
                       for k, ok in ((r, r in rows), (c, c in part.columns)) if not ok}
            if unknown:
                raise TableError(f"part {part.name}: comparison {spec} names {', '.join(sorted(unknown))}; "
                                 f"expected rows among {', '.join(rows)} and columns among "
                                 f"{', '.join(part.columns)}")
            for (ra, ca), (rb, cb) in pairs:
                paper = [paper_value(reference, block, part.rows[r].get("paper", r),
                                     spec.get("paper_column", c)) for r, c in ((ra, ca), (rb, cb))]
                paper_diff = spec.get("paper_diff", None if None in paper else round(paper[0] - paper[1], 4))
                cell_a, cell_b = rows[ra].cells[ca], rows[rb].cells[cb]
                result = stats.compare(cell_a.seeds or {}, cell_b.seeds or {}, paper_diff)
                address = ({"a": ca, "b": cb, "column": None, "row": ra} if spec.get("rows") else
                           {"a": ra, "b": rb, "column": ca})
                name_a, name_b = (part.columns[c].get("label", c) for c in (ca, cb))
                label = (f"{rows[ra].label}: {name_a} vs {name_b}" if spec.get("rows") else
                         f"{rows[ra].label} vs {rows[rb].label}, {name_a}")
                found.append({"part": part.name, **address, "label": label, **result,
                              "why": _why(result, cell_a, cell_b, spec.get("why"))})
        checked[part.name] = found
    return checked


def _why(result: dict, a: Cell, b: Cell, given: str | None) -> str | None:
    """One sentence on a comparison that does not agree: the config's reason, else what the numbers show."""
    if result["verdict"] == "agrees":
        return None
    if given:
        return given
    if a.status != "ok" or b.status != "ok":
        return "a cell has no number: " + "; ".join(c.reason or c.status for c in (a, b) if c.status != "ok")
    if result["paper_diff"] is None:
        return "the paper reports no number for one of the rows here"
    if result["n"] < 2:
        return (f"{result['n']} seed(s) ran in both rows: no interval "
                "(sweep seeds, e.g. --set grid.seed=1,2,3)")
    if result["verdict"] == "inconclusive":
        return "the 95% interval holds 0: the difference is within the spread over seeds at this budget"
    return "the interval excludes 0 on the other side of the paper's difference"
