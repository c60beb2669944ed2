"""Every table config (table1 ... table8 and the demo table of `make demo`; Table 5 and Figure 4 run
elsewhere) composed at smoke scale and run through the real multirun path: the runner launches
``src/train.py --multirun`` for one cell of the table (its pre-training run first, when the row has one: 2
steps on a 30-document slice of the corpus; the fine-tuning with ``trainer.fast_dev_run``: one train and one
Dev batch, of 2 sequences), then the collector writes the whole table. Checked: the table file has every row
and column of the config, the cell that ran has our number from its results.json, and every other cell is an
explicit mark, never a number."""

import csv
import json
from dataclasses import replace

import pytest

from bert_repro.tables import DEMOS, TABLES
from bert_repro.tables.collect import collect, load_reference
from bert_repro.tables.render import write_all
from bert_repro.tables.runner import job_state, run_sweep, stage_launcher
from bert_repro.tables.spec import build, column_run

TINY_PRETRAIN = {"optim.max_steps": 2, "optim.val_check_interval": 2, "optim.limit_val_batches": 1,
                 "scale.pretrain.vocab_size": 1000, "scale.pretrain.max_documents": 30,
                 "scale.pretrain.checkpoint_every_n_steps": None, "data.batch_size": 8}
FAST = {"+trainer.fast_dev_run": True, "+trainer.enable_model_summary": False,
        "+trainer.num_sanity_val_steps": 0, "trainer.enable_progress_bar": False,
        # fast_dev_run's one train and one Dev batch, of 2 sequences: Table 7's are 512-token CoNLL windows
        "data.batch_size": 2}
SHARED_DATA_FREE = set(DEMOS)  # the demo's tasks are written from the embedded corpus
# Table 5's smoke config runs end to end in test_tables_e2e.py (the CLI, resumed); Figure 4's path in its
# budget rehearsal (test_tables_plan.py), its smoke checkpoints checked against the schedule by its smoke plan
RUN_ELSEWHERE = ("table5", "figure4")


def one_cell(table):
    """The first row of the first part that runs, and its first column whose run starts from a last.ckpt."""
    part = table.parts[0]
    for row_key, row in part.rows.items():
        if row.get("skip"):
            continue
        for col, column in part.columns.items():
            found = column_run(col, column)
            sweep = found and table.finetune_sweep(row_key, found[0])
            from_last = sweep is not None and (sweep.needs is None or sweep.checkpoint == "last.ckpt")
            if from_last and sweep.skip is None:
                return part, row_key, col, sweep
    raise AssertionError(f"{table.name}: no runnable cell")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.mark.slow
@pytest.mark.parametrize("name", [t for t in TABLES + DEMOS if t not in RUN_ELSEWHERE])
def test_table_config_runs_one_cell_through_hydra_multirun_and_collects_every_row_and_column(
        name, tmp_path, cache, monkeypatch, request):
    if name not in SHARED_DATA_FREE:
        request.getfixturevalue("shared_data")
    request.getfixturevalue("minilm_dir")  # the smoke inits of tables 1-4 and 7 (`inits: {base: minilm}`)
    monkeypatch.setenv("BERT_REPRO_CACHE", str(cache))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    table = build(name, "smoke", tmp_path / "runs")
    launcher = table.spec["launchers"]["local"]
    part, row_key, col, sweep = one_cell(table)

    ran = {}  # the sweeps as they ran, by name
    if sweep.needs is not None:  # the row's own pre-training, cut to 2 steps
        needs = replace(sweep.needs, overrides={**sweep.needs.overrides, **TINY_PRETRAIN})
        ran[needs.name] = needs
        assert run_sweep(needs, stage_launcher(launcher, "pretrain"))["complete"] == 1, job_state(
            needs.jobs()[0][1])
    swept, folder = sweep.jobs()[0]  # the first job of the grid, in the folder the full table expects it
    sweep = replace(sweep, params=dict(item.split("=", 1) for item in swept))
    assert sweep.jobs() == [(swept, folder)]
    assert not set(FAST) & set(sweep.params)  # a swept key would name another folder
    sweep = ran[sweep.name] = replace(sweep, overrides={**sweep.overrides, **FAST})
    counts = run_sweep(sweep, stage_launcher(launcher, "finetune"))
    assert counts["complete"] == 1, job_state(folder)
    record = json.loads((folder / "results.json").read_text())
    assert record["status"] == "complete" and record["task"] == sweep.overrides["task"]
    if sweep.needs is not None:
        assert record["init"] == str(sweep.init_path())

    # the table as it ran (the cell's job shrunk to FAST): collect holds each cell to the science that ran
    full = replace(table, sweeps={**table.sweeps, **ran})
    reference = load_reference()
    collected = collect(full, reference)
    written = write_all(full, collected, reference, tmp_path / "results")
    md = (tmp_path / "results" / f"{name}.md").read_text()
    assert {p.name for p in written} >= {f"{name}.md", f"{name}.csv", f"{name}.tex"}
    assert "scale=smoke" in md
    with (tmp_path / "results" / f"{name}.csv").open() as f:
        cells = list(csv.DictReader(f))
    for p in full.parts:
        for column in p.columns.values():
            assert f" {column.get('label', '')} |" in md or column.get("label") is None
        labels = [r.get("label", k) for k, r in p.rows.items()] + list(p.paper_rows.values())
        for label in labels:  # a row that runs nothing at this scale is said in a line (render.skipped)
            assert f"| {label} |" in md or f"- Not run: {label}: " in md, (name, label)
        mine = [c for c in cells if c["part"] == p.name]
        assert len(mine) == len(labels) * len(p.columns), (name, p.name)
        assert {c["column"] for c in mine} == set(p.columns)
    ran = [c for c in cells if (c["part"], c["row"], c["column"]) == (part.name, row_key, col)]
    assert len(ran) == 1 and ran[0]["status"] == "ok", ran
    metric, scale = part.columns[col]["metric"], float(part.columns[col].get("scale", 100))
    assert float(ran[0]["ours"]) == pytest.approx(scale * record["metrics"]["final"][metric])
    run_name = sweep.name.rsplit("/", 1)[1]
    for c in cells:  # every other cell ran nothing: a mark with a reason, never a number
        if c["status"] != "ok":
            assert c["ours"] == "" and (c["reason"] or c["status"] == "paper"), c
            continue
        column = part.columns.get(c["column"], {}) if c["part"] == part.name else {}
        reads = column_run(c["column"], column) if column else None
        assert c["row"] == row_key and (column.get("source") in ("pretrain", "average")
                                        or (reads is not None and reads[0] == run_name)), c
