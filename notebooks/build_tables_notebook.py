"""Writes notebooks/tables.ipynb (without outputs): `python notebooks/build_tables_notebook.py`.

The notebook is generated so that its cells stay plain Python that ruff and a diff can read; edit the cells
here and regenerate rather than editing the .ipynb by hand."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    ("md", """# A table: ours beside the paper, the runs behind each cell, the figures

Reads what `make <table> SCALE=<scale>` (`python -m bert_repro.tables run <table>`) left behind: the collected
table `experiments/results/<table>.csv` and every run folder under `experiments/runs/<table>/<scale>/`.
It runs nothing and writes nothing into those folders. A failed, missing or skipped cell is shown as such with
its reason, never as a number."""),
    ("md", """## Parameters

Environment variables choose the table, so the notebook runs unchanged on any results
(`BERT_REPRO_TABLE=table6 jupyter lab notebooks/tables.ipynb`). `BERT_REPRO_SET` repeats the `--set` overrides the
table was run with (space-separated, shell quoting), so that the notebook looks for the same sweeps."""),
    ("code", """import os
import shlex
from pathlib import Path

from bert_repro.tables.spec import REPO

TABLE = os.environ.get("BERT_REPRO_TABLE", "table5")
SCALE = os.environ.get("BERT_REPRO_SCALE", "smoke")
RUNS_DIR = Path(os.environ.get("BERT_REPRO_RUNS_DIR", REPO / "experiments" / "runs")).resolve()
RESULTS_DIR = Path(os.environ.get("BERT_REPRO_RESULTS_DIR", REPO / "experiments" / "results")).resolve()
SETS = shlex.split(os.environ.get("BERT_REPRO_SET", ""))
print(f"table={TABLE} scale={SCALE}\\nruns: {RUNS_DIR / TABLE / SCALE}\\nresults: {RESULTS_DIR}\\nset: {SETS}")""",
     ["parameters"]),
    ("code", """import io
import json

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Image, Markdown, display

from bert_repro import selection
from bert_repro.tables.collect import collect, load_reference
from bert_repro.tables.plots import PLOTS
from bert_repro.tables.render import MARKS
from bert_repro.tables.runner import job_state
from bert_repro.tables.spec import build, column_run

pd.set_option("display.max_columns", None)
pd.set_option("display.max_colwidth", None)  # reasons are read in full
pd.set_option("display.width", 100_000)


def show(fig):
    \"\"\"As a PNG output: the project's plots module selects the Agg backend, which displays nothing itself.\"\"\"
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    display(Image(buffer.getvalue()))


def num(value, signed=False):
    return "—" if value is None or pd.isna(value) else (f"{value:+.2f}" if signed else f"{value:.2f}")""", []),
    ("md", """## The collected table

`experiments/results/<table>.md` as the collector rendered it (cells read `ours ± std (paper; ours - paper)`, then
the mean, the 95% t-interval over restarts, their number and the collapsed ones; `failed [n]` / `not run [n]` /
`skipped [n]` with the reason in note [n]; the paper's comparisons with their verdicts under each table), then the
same cells from the `.csv`, one per line. In the `ours` column a cell without a number reads `failed`, `not run` or `skipped` (the paper's other
systems read `paper only`)."""),
    ("code", """display(Markdown((RESULTS_DIR / f"{TABLE}.md").read_text()))""", []),
    ("code", """csv = pd.read_csv(RESULTS_DIR / f"{TABLE}.csv", keep_default_na=False, na_values=[""])
assert (csv["table"] == TABLE).all() and (csv["scale"] == SCALE).all(), f"{TABLE}.csv holds another table or scale"


def ours_text(cell):
    if cell["status"] == "ok":
        return num(cell["ours"])
    return "paper only" if cell["status"] == "paper" else MARKS[cell["status"]]


cells = csv.assign(ours=csv.apply(ours_text, axis=1), paper=csv["paper"].map(num),
                   diff=csv["diff"].map(lambda v: num(v, signed=True)), spread=csv["spread"].map(num),
                   mean=csv["mean"].map(num), ci_low=csv["ci_low"].map(num), ci_high=csv["ci_high"].map(num))
cells = cells[["part", "row", "column", "ours", "paper", "diff", "spread", "mean", "ci_low", "ci_high", "restarts",
               "collapsed", "n_runs", "status", "reason", "note"]]
display(cells.astype(object).fillna(""))""", ["table"]),
    ("md", """## The paper's comparisons

From `experiments/results/<table>.json`: row a minus row b (or column a minus column b within a row) on paired
seeds, the 95% t-interval of the mean difference, and the verdict: `agrees` when the interval lies on the paper's
side of 0, `disagrees` on the other side, `inconclusive` when it holds 0 or fewer than two seeds pair up."""),
    ("code", """saved = json.loads((RESULTS_DIR / f"{TABLE}.json").read_text())
compared = pd.DataFrame(saved["comparisons"], columns=["part", "label", "paper_diff", "ours_diff", "ci_low", "ci_high",
                                                       "n", "verdict", "why"])
display(compared.astype(object).fillna(""))""", ["comparisons"]),
    ("md", """## The runs behind each cell

The table's sweeps as `bert_repro.tables.spec.build` lays them out, each job folder's state from the runner
(`job_state`: complete, failed with its reason, or missing), and each complete run read by `bert_repro.selection`
(its Dev metric and whether it collapsed onto one class, which the selection leaves out while another run
exists). `selected` marks the run the table's cell reports."""),
    ("code", """table = build(TABLE, SCALE, RUNS_DIR, sets=SETS)
chosen = {(r.part, r.row, r.column): r.run for r in csv.itertuples() if isinstance(r.run, str)}
records = []
for part in table.parts:
    for row_key, row in part.rows.items():
        for name, column in part.columns.items():
            found = column_run(name, column)
            if found is None:  # a pre-training or average column: one number, shown in the table above
                continue
            base = {"part": part.name, "row": row_key, "column": name}
            sweep = table.finetune_sweep(row_key, found[0])
            if sweep is None:
                records.append({**base, "state": "skipped", "reason": row.get("skip") or column.get("skip")})
                continue
            for _, folder in sweep.jobs():
                state, reason = job_state(folder)
                record = {**base, "job": folder.name, "state": state, "reason": reason}
                if state == "missing":
                    record["reason"] = sweep.skip or "not run yet"
                elif state == "complete":
                    runs, unusable = selection.load_runs([folder])
                    if not runs:
                        record.update(state="failed", reason="; ".join(unusable))
                    else:
                        run = runs[0]
                        value = run["final"].get(column["metric"])
                        record.update(seed=run["seed"], degenerate=run["degenerate"],
                                      dev=None if value is None else float(column.get("scale", 100)) * value,
                                      selected=str(folder) == chosen.get((part.name, row_key, name)))
                        if value is None:
                            record.update(state="failed", reason=f"{column['metric']} absent from results.json")
                records.append(record)
spread = pd.DataFrame(records, columns=["part", "row", "column", "job", "seed", "state", "dev", "degenerate",
                                        "selected", "reason"])
display(spread.assign(dev=spread["dev"].map(num)).astype(object).fillna(""))""", ["spread"]),
    ("md", """Per cell, the Dev metric of every complete run (a box once there are several), crosses for runs that
collapsed onto one class, a ring around the run the table reports, and a short bar at the paper's number. A cell
with no complete run reads `failed` / `not run` / `skipped` at the bottom instead of a point."""),
    ("code", """paper = {(r.part, r.row, r.column): r.paper for r in csv.itertuples()}
groups = list(spread.groupby(["part", "row", "column"], sort=False))
if groups:
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(groups)), 4))
    for i, ((part_name, row_key, name), jobs) in enumerate(groups):
        done = jobs[jobs["state"] == "complete"]
        if len(done) > 1:
            ax.boxplot(done["dev"], positions=[i], widths=0.5, showfliers=False)
        for run in done.itertuples():
            ax.scatter(i, run.dev, marker="x" if run.degenerate else "o", color="C3" if run.degenerate else "C0", zorder=3)
            if run.selected:
                ax.scatter(i, run.dev, s=160, facecolors="none", edgecolors="k", zorder=4)
        if not pd.isna(paper.get((part_name, row_key, name))):
            ax.hlines(paper[(part_name, row_key, name)], i - 0.3, i + 0.3, colors="C2", linewidth=2)
        if done.empty:
            state = "failed" if (jobs["state"] == "failed").any() else jobs["state"].iloc[0]
            ax.annotate(MARKS.get(state, state), (i, 0), ha="center", va="bottom", color="C3", rotation=90)
    ax.set_xticks(range(len(groups)), [f"{r} / {c}" for (_, r, c), _ in groups], rotation=40, ha="right", fontsize=7)
    ax.set(ylabel="Dev metric (x column scale)", title=f"{TABLE}, scale={SCALE}: every run per cell "
           "(o run, x collapsed, ring selected, green bar paper)")
    ax.set_ylim(bottom=0)
    show(fig)""", []),
    ("md", """## Figures

A table with a figure (Figure 4's steps, Table 6's size trend) is drawn by `bert_repro.tables.plots` from the
collected rows, into a temporary folder; any other table gets a bar chart of ours against the paper per cell, the
cells without a number marked as such."""),
    ("code", """import tempfile

reference = load_reference()
collected = collect(table, reference)
drawn = False
for part in table.parts:
    if part.plot:
        out_dir = Path(tempfile.mkdtemp())
        for path in PLOTS[part.plot](table, part, collected[part.name], reference, out_dir):
            if path.suffix == ".png":
                display(Image(filename=str(path)))
                drawn = True
if not drawn:
    ours_rows = csv[csv["status"] != "paper"].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(ours_rows)), 4))
    x = range(len(ours_rows))
    ok = ours_rows["status"] == "ok"
    ax.bar([i - 0.2 for i in x if ok[i]], ours_rows["ours"][ok], width=0.4, label="ours",
           yerr=ours_rows["spread"][ok].fillna(0), capsize=3)
    ax.bar([i + 0.2 for i in x], ours_rows["paper"].fillna(0), width=0.4, label="paper", color="C2", alpha=0.6)
    for i in x:
        if not ok[i]:
            ax.annotate(MARKS[ours_rows["status"][i]], (i - 0.2, 0), ha="center", va="bottom", color="C3", rotation=90)
    ax.set_xticks(list(x), [f"{r.row} / {r.column}" for r in ours_rows.itertuples()], rotation=40, ha="right",
                  fontsize=7)
    ax.set(ylabel="Dev metric (x column scale)", title=f"{TABLE}, scale={SCALE}: ours against the paper")
    ax.legend()
    show(fig)""", ["figures"]),
]


def notebook() -> nbformat.NotebookNode:
    cells = []
    for kind, source, *tags in CELLS:
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        if tags and tags[0]:
            cell.metadata["tags"] = tags[0]
        cells.append(cell)
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


if __name__ == "__main__":
    path = Path(__file__).with_name("tables.ipynb")
    nbformat.write(notebook(), path)
    print(f"wrote {path}")
