"""From run folders to cells: our number after the table's selection rule (selection.py), the paper's, and
the spread over restarts (collapsed runs counted), or a mark (failed, not run, skipped) with its reason,
never a number; then the paper's comparisons, checked on same-seed differences (stats.py)."""

from __future__ import annotations

from dataclasses import dataclass

import yaml
from omegaconf import OmegaConf

from bert_repro import selection
from bert_repro.lifecycle.folder import LAST, RunFolder
from bert_repro.tables import stats
from bert_repro.tables.compose import composing_jobs
from bert_repro.tables.runner import job_config, job_configs, job_state
from bert_repro.tables.spec import REPO, Part, Sweep, Table, TableError, column_run

REFERENCE = REPO / "experiments" / "reference.yaml"
NOT_RUN = "not run"  # a comparison's verdict while a cell of it has no number
SKIPPED = "skipped"  # a comparison of a row or column the table's spec removes


@dataclass
class Cell:
    value: float | None = None
    paper: float | None = None
    spread: float | None = None  # std over the restarts behind the value
    n: int = 0  # runs behind the value (restarts averaged, or the grid searched)
    status: str = "ok"  # ok | failed | missing | skipped | paper
    reason: str | None = None
    run: str | None = None  # the selected run's folder
    note: str | None = None
    degenerate: str | None = None  # why the selected run collapsed onto one class (marked in the cell)
    seeds: dict[int, float] | None = None  # each restart's value of the selected setting, by seed
    restarts: stats.Spread | None = None
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


def load_reference() -> dict:
    if not REFERENCE.is_file():
        raise TableError(f"{REFERENCE} does not exist (the paper's numbers; a copy of "
                         "../shared/paper/reference.yaml)")
    return yaml.safe_load(REFERENCE.read_text())


def paper_value(reference: dict, reference_name: str | None, row: str, column: str) -> float | None:
    block = reference.get(reference_name) or {}
    return dict(zip(block.get("columns") or [], (block.get("rows") or {}).get(row) or [])).get(column)


def other_settings(sweep: Sweep, states: dict) -> str:
    """What a sweep's results of other science than the spec's (job_state ``other``) ran with instead."""
    other = [why for state, why in states.values() if state == "other"]
    return (f"{len(other)} of {len(states)} jobs of {sweep.name} ran with other settings than the spec's "
            f"({other[0]}); `run` reruns them") if other else ""


def finetune_cell(sweep: Sweep, metric: str, scale: float, configs: dict) -> Cell:
    # reads and checks each result, held to the job's science as composed now, as `run` holds it
    states = {folder: job_state(folder, configs.get(folder)) for _, folder in sweep.jobs()}
    runs, skipped = selection.load_runs([f for f, (state, _) in states.items() if state == "complete"])
    failed = [why or "failed" for state, why in states.values() if state == "failed"] + skipped
    if not runs:
        missing = sum(state in ("missing", "other") for state, _ in states.values())
        return (Cell(status="failed", reason="; ".join(sorted(set(failed)))) if failed else
                Cell(status="missing", reason=other_settings(sweep, states)
                     or f"not run yet ({sweep.name}: {missing} of {len(states)} jobs)"))
    restarts = sweep.selection == "mean_over_restarts"
    entries = selection.select(runs, restarts=restarts, metric=metric)  # selected on what it reports
    if len(entries) != 1:
        raise TableError(f"{sweep.folder}: runs of {len(entries)} different settings in one sweep")
    entry = entries[0]
    if entry["metrics"].get(metric) is None:
        return Cell(status="failed", reason=f"{metric} absent from the selected run {entry['selected']}")
    selected = next(r for r in runs if r["dir"] == entry["selected"])
    group = [r for r in runs if r["science"] == selected["science"] and r["final"].get(metric) is not None]
    seeds = {int(r["seed"]): scale * r["final"][metric] for r in group}  # the restarts of the chosen setting
    spread = stats.spread(list(seeds.values()))
    notes = [f"collapsed: {entry['collapsed']}" if entry["collapsed"] else None,
             f"{len(failed)} of {len(states)} runs failed" if failed else None,
             other_settings(sweep, states) or None]
    return Cell(value=scale * entry["metrics"][metric], run=entry["selected"], spread=spread.std,
                n=spread.n if restarts else len(runs), note="; ".join(filter(None, notes)) or None,
                seeds=seeds, restarts=spread, collapsed=sum(bool(r["degenerate"]) for r in group),
                degenerate=entry["collapsed"])


def pretrain_cell(sweep: Sweep | None, column: dict, configs: dict) -> Cell:
    if sweep is None:
        return Cell(status="skipped", reason="this row has no pre-training run of ours")
    folder = sweep.jobs()[0][1]
    state, reason = job_state(folder, configs.get(folder))
    if state == "other":
        return Cell(status="missing", reason=other_settings(sweep, {folder: (state, reason)}))
    if state != "complete":
        return Cell(status=state, reason=reason or f"not run yet ({sweep.name})")
    results = RunFolder(folder).read()  # checked by job_state
    name = column.get("metric") or column["field"]  # a field is a dotted path: config.data.mask_shares.0
    value = (results["metrics"]["final"].get(name) if "metric" in column
             else OmegaConf.select(OmegaConf.create(results), name))
    if value is None:
        return Cell(status="failed", reason=f"{name} absent from {folder}")
    return Cell(value=float(column.get("scale", 1)) * value, run=str(folder), n=1)


def average_cell(cells: dict[str, Cell], of: list[str]) -> Cell:
    """Table 1's GLUE average: only over numbers."""
    absent = [c for c in of if c not in cells or cells[c].status != "ok"]
    if absent:
        return Cell(status="missing",
                    reason=f"the average needs every one of its columns; no number for {', '.join(absent)}")
    return Cell(value=sum(cells[c].value for c in of) / len(of), n=len(of))


def checkpoint_of(table: Table, part: Part, key: str) -> str:
    row = part.rows[key]
    if row.get("skip"):
        return f"none ({row['skip']})"
    if row.get("pretrain"):
        sweep = table.sweeps[f"pretrain/{row['pretrain']}"]
        ours = {sweep.name, f"{sweep.name}/phase1"}  # two phases: a step checkpoint may be phase 1's
        names = sorted({s.checkpoint for s in table.sweeps.values() if s.needs and s.needs.name in ours})
        names = names or [LAST]
        return f"our pre-training run {sweep.name} ({sweep.overrides.get('model')}), {', '.join(names)}"
    if row.get("init"):
        inits = [s.overrides["init"] for s in table.sweeps.values()
                 if s.name.startswith(f"finetune/{key}/") and s.overrides.get("init")]
        return f"{row['init']}: {inits[0] if inits else 'none given'}"
    return "random initialisation"


def collect(table: Table, reference: dict) -> dict[str, list[Row]]:
    """Every part's rows with their cells; our rows first, then the paper's other systems. A cell is held to
    the spec's science as composed now, as `run` is: a result of other settings is not this cell's."""
    configs = job_configs(table)
    tables: dict[str, list[Row]] = {}
    for part in table.parts:
        rows = []
        for key, row in part.rows.items():
            cells: dict[str, Cell] = {}
            for name, column in part.columns.items():
                found = column_run(name, column)
                if row.get("skip") or column.get("skip"):
                    cell = Cell(status="skipped", reason=row.get("skip") or column["skip"])
                elif column.get("source") == "average":
                    cell = average_cell(cells, column["of"])
                elif found is None:
                    cell = pretrain_cell(table.pretrain_sweep(key, part), column, configs)
                else:
                    cell = finetune_cell(table.finetune_sweep(key, found[0]), column["metric"],
                                         float(column.get("scale", 100)), configs)
                cell.paper = paper_value(reference, part.reference, row.get("paper", key), name)
                cells[name] = cell
            rows.append(Row(key, row.get("label", key), cells, checkpoint_of(table, part, key)))
        for key, label in part.paper_rows.items():
            cells = {name: Cell(status="paper", reason="another system: the paper's number only",
                                paper=paper_value(reference, part.reference, key, name))
                     for name in part.columns}
            rows.append(Row(key, label, cells, "—"))
        tables[part.name] = rows
    return tables


def what_ran(table: Table, tables: dict[str, list[Row]]) -> str:
    """The header's account of what ran, read from the runs (held to the spec's science, as the cells are):
    each pre-training's steps and the fine-tuning seeds behind the numbers."""
    firsts = [(sweep, *sweep.jobs()[0]) for sweep in table.sweeps.values()
              if sweep.stage == "pretrain" and not sweep.name.endswith("/phase1")]
    with composing_jobs():  # the pre-trainings' science alone, not every job's again
        configs = [job_config(sweep, swept, None) for sweep, swept, _ in firsts]
    steps = []
    for (sweep, _, folder), config in zip(firsts, configs):
        if job_state(folder, config)[0] == "complete":
            step = RunFolder(folder).read().get("global_step")
            steps.append(f"{sweep.name} {step:,} steps" if isinstance(step, int) else
                         f"{sweep.name} (its steps not recorded)")
    seeds = sorted({seed for rows in tables.values() for row in rows for cell in row.cells.values()
                    for seed in (cell.seeds or {})})
    tuned = f"fine-tuning seeds {', '.join(map(str, seeds))}" if seeds else "no fine-tuning number"
    return "; ".join([f"scale {table.scale}", *steps, tuned])


def comparisons(table: Table, tables: dict[str, list[Row]], reference: dict) -> dict[str, list[dict]]:
    """Each part's ``comparisons:`` on paired seeds: rows ``a`` - ``b`` on each of ``columns``, or (with
    ``rows:``) columns ``a`` - ``b`` within each row. The paper's difference is ``paper_diff``, else read at
    ``paper_column`` (default: the column). A comparison of a row or column removed (``--set rows.x=null``)
    is listed as skipped, saying so; an unknown name is an error."""
    checked: dict[str, list[dict]] = {}
    for part in table.parts:
        own = (table.spec.get("parts") or {}).get(part.name) or {}
        removed = {k: f"{group}.{k}=null" for node in (table.spec, own) for group in ("rows", "columns")
                   for k, v in (node.get(group) or {}).items() if v is None}
        rows = {row.key: row for row in tables[part.name]}
        found = []
        for spec in part.comparisons:
            a, b, along = spec.get("a"), spec.get("b"), spec.get("rows")
            pairs = [((r, a), (r, b)) for r in along] if along else \
                [((a, c), (b, c)) for c in spec.get("columns") or [spec.get("column")]]
            for (ra, ca), (rb, cb) in (p for p in pairs if {*p[0], *p[1]} & removed.keys()):
                gone = ", ".join(removed[k] for k in sorted({ra, ca, rb, cb} & removed.keys()))
                address, label = (({"a": ca, "b": cb, "column": None, "row": ra}, f"{ra}: {ca} vs {cb}")
                                  if along else ({"a": ra, "b": rb, "column": ca}, f"{ra} vs {rb}, {ca}"))
                why = f"not compared: this table's spec removes it ({gone})"
                found.append({"part": part.name, **address, "label": label, **stats.compare({}, {}, None),
                              "verdict": SKIPPED, "why": why})
            pairs = [p for p in pairs if not {*p[0], *p[1]} & removed.keys()]
            unknown = {str(k) for pair in pairs for r, c in pair
                       for k, ok in ((r, r in part.rows), (c, c in part.columns)) if not ok}
            if unknown:
                raise TableError(f"part {part.name}: comparison {spec} names {', '.join(sorted(unknown))}; "
                                 f"expected rows among {', '.join(part.rows)} and columns among "
                                 f"{', '.join(part.columns)}")
            for (ra, ca), (rb, cb) in pairs:
                paper = [paper_value(reference, part.reference or table.spec.get("reference"),
                                     part.rows[r].get("paper", r), spec.get("paper_column", c))
                         for r, c in ((ra, ca), (rb, cb))]
                paper_diff = spec.get("paper_diff", None if None in paper else round(paper[0] - paper[1], 4))
                cell_a, cell_b = rows[ra].cells[ca], rows[rb].cells[cb]
                result = stats.compare(cell_a.seeds or {}, cell_b.seeds or {}, paper_diff)
                if cell_a.status != "ok" or cell_b.status != "ok":  # no verdict over runs that never ran
                    result["verdict"] = NOT_RUN
                name_a, name_b = (part.columns[c].get("label", c) for c in (ca, cb))
                address, label = (({"a": ca, "b": cb, "column": None, "row": ra},
                                   f"{rows[ra].label}: {name_a} vs {name_b}") if along else
                                  ({"a": ra, "b": rb, "column": ca}, f"{rows[ra].label} vs {rows[rb].label}, "
                                                                     f"{name_a}"))
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
    if result["verdict"] == NOT_RUN:
        absent = [c for c in (a, b) if c.status != "ok"]
        return (f"{len(absent)} of its 2 cells have no number: "
                + "; ".join(c.reason or c.status for c in absent))
    if result["paper_diff"] is None:
        return "the paper reports no number for one of the rows here"
    if result["n"] < 2:
        return (f"{result['n']} seed(s) ran in both rows: no interval "
                "(sweep seeds, e.g. --set grid.seed=1,2,3)")
    if result["verdict"] == "inconclusive":
        return "the 95% interval holds 0: the difference is within the spread over seeds at this budget"
    return "the interval excludes 0 on the other side of the paper's difference"
