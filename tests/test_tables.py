"""Table collection and rendering on synthetic results.json files: selection rules, paper values and
differences, failed/missing marks with reasons, md/csv/tex and figures; the runner's skipping and FORCE; clear
errors; how a table spec lies over its scale's defaults."""

import csv
import json
import re
import shlex
import statistics
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from bert_repro.lifecycle.folder import RunFolder
from bert_repro.tables import DEMOS, SCALES, TABLES, runner
from bert_repro.tables import __main__ as cli
from bert_repro.tables.collect import collect, load_reference
from bert_repro.tables.render import write_all
from bert_repro.tables.spec import TableError, build, load_spec

from .conftest import REPO

REFERENCE = load_reference()


def write_results(folder: Path, task: str, metrics: dict, *, seed: int = 1, lr: float = 1e-3,
                  status: str = "complete", monitor: str = "val/acc", model_config: dict | None = None,
                  config: dict | None = None, global_step: int | None = None) -> None:
    """A results.json as run.py writes it, with only the fields the tables read."""
    folder.mkdir(parents=True, exist_ok=True)
    base = {"task": {"name": task, "monitor_mode": "min" if task == "pretrain" else "max"},
            "optim": {"lr": lr, "epochs": 1}, "data": {"batch_size": 16}, "seed": seed}
    results = {"status": status, "task": task, "model": "tiny", "ablation": "none", "scale": "smoke",
               "seed": seed, "init": None, "monitor": monitor, "predict_majority": False,
               "metrics": {"final": metrics}, "model_config": model_config or {"num_layers": 2},
               "config": {**base, **(config or {})}, **({"global_step": global_step} if global_step else {})}
    (folder / "results.json").write_text(json.dumps(results))


def job_dirs(table, sweep_name):
    return {tuple(swept): folder for swept, folder in table.sweeps[sweep_name].jobs()}


def fill(table, values) -> None:
    """Complete runs for every sweep: ``values(sweep, swept) -> metrics``, each with its job's config as
    composed (what collect holds a result to)."""
    configs = runner.job_configs(table)
    for sweep in table.sweeps.values():
        task = sweep.overrides["task"]
        for swept, folder in sweep.jobs():
            args = dict(s.split("=", 1) for s in swept)
            metrics = values(sweep, args)
            if metrics is not None:
                write_results(folder, task, metrics, seed=int(args.get("seed", 1)),
                              lr=float(args.get("optim.lr", 1e-3)),
                              monitor="val/mlm_loss" if task == "pretrain" else next(iter(metrics)),
                              config=configs[folder], global_step=20 if task == "pretrain" else None)


def glue_metrics(sweep, args):
    if sweep.stage == "pretrain":
        return {"val/mlm_loss": 5.0, "val/mlm_ppl": 150.0}
    lr, seed = float(args["optim.lr"]), int(args.get("seed", 1))
    acc = 0.6 + (0.1 if lr == 1e-3 else 0.0) + 0.01 * seed  # lr 1e-3 wins; seeds spread it
    return {"val/acc": acc, "val/f1": acc, "val/mnli_m_acc": acc, "val/mnli_mm_acc": acc - 0.01}


@pytest.fixture
def table5(tmp_path):
    return build("table5", "smoke", tmp_path / "runs", sets=["grid.optim.lr=2e-4,1e-3", "grid.seed=1,2"])


@pytest.mark.slow
def test_best_on_dev_cell_has_ours_paper_difference_and_spread(table5, tmp_path):
    fill(table5, lambda sweep, args: None if "squad" in sweep.name else glue_metrics(sweep, args))
    squad = table5.sweeps["finetune/bert_base/squad_v1"]
    RunFolder(squad.jobs()[0][1]).fail("task=squad_v1 needs bert_repro.tasks.span.SpanExtractionModule, "
                                       "which is not built yet")
    rows = collect(table5, REFERENCE)["main"]
    mrpc = rows[0].cells["mrpc_acc"]
    best = [0.6 + 0.1 + 0.01 * s for s in (1, 2)]
    assert mrpc.value == pytest.approx(100 * max(best)) and mrpc.paper == 86.7
    assert mrpc.diff == pytest.approx(100 * max(best) - 86.7)
    # 2 lrs x 2 seeds searched
    assert mrpc.spread == pytest.approx(100 * statistics.stdev(best)) and mrpc.n == 4
    assert mrpc.run.endswith("/optim.lr-0.001+seed-2")  # the run folder name of the swept values (run_name)
    assert [r.key for r in rows] == ["bert_base", "no_nsp", "ltr_no_nsp", "ltr_no_nsp_bilstm"]
    assert rows[3].cells["mnli_m_acc"].paper == 82.1 and rows[1].cells["sst2_acc"].paper == 92.6
    squad_cell = rows[0].cells["squad_v1_f1"]  # one of four jobs failed, the others never ran
    assert squad_cell.status == "failed" and "not built yet" in squad_cell.reason and squad_cell.value is None


@pytest.mark.slow
def test_mean_over_restarts_picks_hyper_parameters_by_mean_and_reports_std(tmp_path):
    table = build("table6", "smoke", tmp_path / "runs", sets=["grid.optim.lr=1e-4,1e-3"])

    def values(sweep, args):
        if sweep.stage == "pretrain":
            return {"val/mlm_loss": 5.0, "val/mlm_ppl": 40.0 + len(sweep.name)}
        seed, lr = int(args["seed"]), float(args["optim.lr"])
        # lr 1e-4 has the single best run (seed 2) but the lower mean: the mean rule must not take it
        acc = {(1e-4, 1): 0.50, (1e-4, 2): 0.90, (1e-3, 1): 0.75, (1e-3, 2): 0.77}[(lr, seed)]
        return {"val/acc": acc, "val/mnli_m_acc": acc}

    fill(table, values)
    assert "optim.lr" not in table.sweeps["finetune/L3_H768_A12/mrpc"].overrides  # swept, so not also fixed
    row = collect(table, REFERENCE)["main"][0]
    cell = row.cells["mrpc_acc"]
    assert cell.value == pytest.approx(76.0)
    assert cell.spread == pytest.approx(100 * statistics.stdev([0.75, 0.77]))
    assert cell.n == 2 and cell.paper == 79.8
    assert row.cells["lm_ppl"].value == pytest.approx(40.0 + len("pretrain/L3_H768_A12"))
    assert row.cells["lm_ppl"].paper == 5.84
    assert row.cells["layers"].value == 2 and row.cells["layers"].paper == 3


def test_missing_and_failed_cells_show_marks_with_reasons_never_numbers(table5, tmp_path):
    fill(table5, lambda sweep, args: glue_metrics(sweep, args) if "qnli" not in sweep.name else None)
    for _, folder in table5.sweeps["finetune/no_nsp/mrpc"].jobs():  # failed, as run.record_failure writes
        write_results(folder, "mrpc", {}, status="failed")
        record = json.loads((folder / "results.json").read_text())
        record["reason"] = "FileNotFoundError: task=mrpc split dev: /x/dev.tsv does not exist"
        (folder / "results.json").write_text(json.dumps(record))
        (folder / "train.log").write_text("[2026-01-01 00:00:00,000][bert_repro.lifecycle.run][ERROR] - "
                                          "a logged line is not where a failure is read from\n")
    paths = write_all(table5, collect(table5, REFERENCE), REFERENCE, tmp_path / "results")
    md = paths[0].read_text()
    qnli_line = next(line for line in md.splitlines() if line.startswith("| No NSP"))
    cells = [c.strip() for c in qnli_line.strip("|").split("|")]
    assert cells[2].startswith("not run [") and cells[3].startswith("failed [")  # QNLI, MRPC
    assert "/x/dev.tsv does not exist" in md and "not run yet (finetune/no_nsp/qnli: 4 of 4 jobs)" in md
    with paths[1].open() as f:
        records = {(r["row"], r["column"]): r for r in csv.DictReader(f)}
    mrpc, qnli = records[("no_nsp", "mrpc_acc")], records[("no_nsp", "qnli_acc")]
    assert mrpc["status"] == "failed" and mrpc["ours"] == ""
    assert qnli["status"] == "missing" and qnli["paper"] == "84.9"


def test_md_csv_tex_state_scale_checkpoint_and_selection(table5, tmp_path):
    fill(table5, glue_metrics)
    md, csv_path, tex = write_all(table5, collect(table5, REFERENCE), REFERENCE, tmp_path / "results")[:3]
    text = md.read_text()
    assert text.startswith("# Table 5: ablation over the pre-training tasks (Dev) — scale=smoke")
    # the header says what ran, from the spec and the runs: the --set, each pre-training's steps, the seeds
    assert "\nScale: smoke, changed with --set grid.optim.lr=2e-4,1e-3 grid.seed=1,2\n" in text
    assert "tiny BERT" not in text and "best run on Dev over the grid" in text
    assert ("\nRan: scale smoke; pretrain/none 20 steps; pretrain/no_nsp 20 steps; pretrain/ltr_no_nsp 20 "
            "steps; fine-tuning seeds 1, 2\n") in text
    assert "grid: optim.lr in {2e-4,1e-3}, seed in {1,2}" in text  # the grid the runs swept (--set above)
    assert "- Checkpoint, + BiLSTM: our pre-training run pretrain/ltr_no_nsp (tiny), last.ckpt" in text
    assert "| BERT-base (MLM + NSP) | 72.0 ± 0.71 (84.4; -12.4)" in text
    with csv_path.open() as f:
        records = list(csv.DictReader(f))
    assert len(records) == 4 * 5 and {r["scale"] for r in records} == {"smoke"}
    first = records[0]
    cell = (first["row"], first["column"], float(first["ours"]), float(first["paper"]))
    assert cell == ("bert_base", "mnli_m_acc", 72.0, 84.4)
    assert float(first["diff"]) == pytest.approx(72.0 - 84.4) and first["selection"] == "best_on_dev"
    latex = tex.read_text()
    assert r"\begin{tabular}{lrrrrr}" in latex and "72.0 ± 0.71 (84.4; -12.4)" in latex
    assert "SQuAD (F1)" in latex and r"LTR \& No NSP &" in latex and r"\end{tabular}" in latex


def test_paper_only_rows_skipped_rows_and_columns(tmp_path):
    table = build("table2", "smoke", tmp_path / "runs")
    fill(table, lambda sweep, args: {"val/f1": 61.5, "val/exact_match": 50.25})
    rows = {r.key: r for r in collect(table, REFERENCE)["main"]}
    base = rows["bert_base_single"].cells
    assert base["dev_f1"].value == pytest.approx(61.5) and base["dev_f1"].paper == 88.5  # 0-100, scale 1
    assert base["test_f1"].status == "skipped" and "leaderboard" in base["test_f1"].reason
    assert rows["bert_large_single"].cells["dev_em"].status == "skipped"
    ensemble = rows["bert_large_ensemble"].cells["dev_f1"]
    assert ensemble.status == "paper" and ensemble.paper == 91.8
    assert rows["bert_large_ensemble"].label == "BERT-large (ensemble) (paper)"
    assert "finetune/bert_large_single/squad_v1" not in table.sweeps  # a skipped row runs nothing


def test_the_demo_file_says_its_scale_once_and_no_none_and_no_skipped_row_under_the_papers(tmp_path):
    table = build("table5_demo", "smoke", tmp_path / "runs")
    fill(table, lambda sweep, args: {"val/f1": 0.5 + 0.01 * int(args.get("seed", 1)), "val/acc": 0.6,
                                     "val/mlm_loss": 5.0})
    text = write_all(table, collect(table, REFERENCE), REFERENCE, tmp_path / "results")[0].read_text()
    assert text.count("Scale: smoke") == 1 and "None" not in text and "skipped" not in text
    assert "- Paper: none for these tasks;" in text
    assert "- Not run: Ours on these tasks: not in the demo: `make table5 SCALE=smoke`" in text
    assert "| BERT-base (paper) | — (84.4) |" in text


def test_glue_average_only_when_every_column_has_a_number(tmp_path):
    table = build("table1", "smoke", tmp_path / "runs")
    metrics = {"val/acc": 0.8, "val/f1": 0.7, "val/mcc": 0.3, "val/spearman": 0.6, "val/mnli_m_acc": 0.5,
               "val/mnli_mm_acc": 0.4}
    fill(table, lambda sweep, args: metrics if "cola" not in sweep.name else None)
    row = collect(table, REFERENCE)["main"][0]
    assert row.cells["average"].status == "missing" and "cola" in row.cells["average"].reason
    fill(table, lambda sweep, args: metrics)
    row = collect(table, REFERENCE)["main"][0]
    # mnli-m, mm, qqp f1, qnli, sst2, cola, stsb, mrpc f1, rte
    expected = [50, 40, 70, 80, 80, 30, 60, 70, 80]
    average = row.cells["average"]
    assert average.value == pytest.approx(sum(expected) / 9) and average.paper == 79.6


@pytest.mark.slow
def test_figures_are_written_as_png_and_pdf(tmp_path):
    for name in ("figure4", "table6"):
        table = build(name, "smoke", tmp_path / "runs")
        fill(table, lambda sweep, args: {"val/mlm_loss": 4.0, "val/mlm_ppl": 60.0}
             if sweep.stage == "pretrain"
             else {"val/acc": 0.5, "val/mnli_m_acc": 0.4 + 0.1 * ("k300" in sweep.name)})
        paths = write_all(table, collect(table, REFERENCE), REFERENCE, tmp_path / "results")
        figures = [p for p in paths if p.suffix in (".png", ".pdf")]
        assert len(figures) == 2, paths
        for figure in figures:
            head = figure.read_bytes()[:8]
            assert head.startswith(b"\x89PNG" if figure.suffix == ".png" else b"%PDF")
            assert figure.stat().st_size > 5000


def test_malformed_results_json_is_an_error_naming_the_file(table5, tmp_path):
    fill(table5, glue_metrics)
    bad = table5.sweeps["finetune/bert_base/mrpc"].jobs()[0][1] / "results.json"
    bad.write_text('{"status": "complete", "metrics": ')
    named = re.escape(str(bad))  # a run folder's "+" and "." are regex syntax
    with pytest.raises(TableError, match=f"{named} is not a results.json as src/train.py writes it"):
        collect(table5, REFERENCE)
    bad.write_text(json.dumps({"status": "complete", "task": "mrpc"}))
    missing = "missing seed, monitor, metrics, config"
    with pytest.raises(TableError, match=f"{named} is not a results.json .*\\({missing}\\); expected"):
        collect(table5, REFERENCE)


def test_unknown_table_or_scale_is_a_clear_error(capsys, tmp_path):
    with pytest.raises(TableError, match="unknown table 'table9'; expected one of table1, .*figure4"):
        build("table9", "smoke", tmp_path)
    for args, said in ((["--scale", "huge"], "argument --scale: 'huge': expected one of smoke, budget"),
                       (["--set", "no_equals_sign"], "argument --set: 'no_equals_sign': expected KEY=VALUE")):
        with pytest.raises(SystemExit) as refused:  # argparse's refusal, at parse time
            cli.main(["collect", "table5", *args, "--runs-dir", str(tmp_path)])
        assert refused.value.code == 2 and said in capsys.readouterr().err
    # not Hydra override syntax: the item named, no traceback
    assert cli.main(["plan", "table5", "--set", "grid.seed=[1,", "--runs-dir", str(tmp_path)]) == 2
    assert "error: --set 'grid.seed=[1,': " in capsys.readouterr().err


def _leaves(node: dict, path: tuple = ()) -> dict:
    """A YAML node's leaves by their path of keys."""
    out = {}
    for key, value in node.items():
        nested = isinstance(value, dict) and value
        out.update(_leaves(value, (*path, key)) if nested else {(*path, key): value})
    return out


def _yaml(path: Path) -> dict:
    """A YAML file as OmegaConf reads it (``3e-4`` a float, not YAML 1.1's string)."""
    return OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else {}


@pytest.mark.parametrize("name,scale", [(n, s) for n in TABLES for s in SCALES] + [("table5_demo", "smoke")])
@pytest.mark.slow
def test_a_table_spec_is_its_layers_merged_key_by_key_in_the_order_conf_tables_yaml_lists_them(name, scale):
    """The spec Hydra composes (conf/tables.yaml's defaults list) is the YAML layers merged key by key, each
    over the ones before: the scale's `tables:` node, the scale's task data, table_tasks, the table, then the
    table's own file at this scale; a key set to null replaces the node beneath (a row, a column), and a grid
    key set to null is not swept."""
    conf = REPO / "conf"
    data = _yaml(conf / "table_data" / f"{scale}.yaml")
    if "defaults" in data:  # paper: budget's
        data = _yaml(conf / "table_data" / f"{data['defaults'][0]}.yaml")
    tables = [_yaml(conf / "table" / "table_tasks.yaml"), _yaml(conf / "table" / f"{name}.yaml"),
              _yaml(conf / "table_scale" / f"{name}_{scale}.yaml")]
    layers = [_yaml(conf / "scale" / f"{scale}.yaml")["tables"], {"task_data": data},
              *(t.get("table", {}) for t in tables)]
    expected: dict = {}
    for layer in layers:
        for key, value in _leaves(layer).items():  # a value replaces the node beneath it, and the reverse
            expected = {k: v for k, v in expected.items() if k[:len(key)] != key and key[:len(k)] != k}
            expected[key] = value
    expected = {k: v for k, v in expected.items() if not (k[0] == "grid" and v is None)}
    assert _leaves(load_spec(name, scale)) == expected


@pytest.mark.slow
def test_a_grid_key_the_layer_above_sets_to_null_is_not_swept_and_set_adds_or_removes_keys(tmp_path):
    """conf/scale/<scale>.yaml's `tables:` gives the model, grid and fine-tuning overrides; a table's own win,
    and a table that sweeps other keys sets the scale's to null (Table 2's three restarts: no lr x epochs x
    batch grid under them)."""
    scales = {s: yaml.safe_load((REPO / "conf" / "scale" / f"{s}.yaml").read_text())["tables"]
              for s in SCALES}
    for scale in ("budget", "paper"):  # Table 5 declares no grid and no model: §3.5's grid on BERT-base
        mnli = build("table5", scale, tmp_path).sweeps["finetune/bert_base/mnli"]
        assert mnli.params == scales[scale]["grid"] and mnli.overrides["model"] == "base"
        assert build("table2", scale, tmp_path).sweeps["finetune/bert_base_single/squad_v1"].params == {
            "seed": "1,2,3"}  # the table's grid, none of the scale's keys
    for scale in ("budget", "paper"):  # v2 A.3's grid at both: batch 16, 32 and epochs 2, 3, 4
        grid = scales[scale]["grid"]
        assert grid["data.batch_size"] == "16,32" and grid["optim.epochs"] == "2,3,4"
    smoke = build("table5", "smoke", tmp_path).sweeps["finetune/bert_base/mnli"]
    assert smoke.params == {"optim.lr": "1e-3"} and smoke.overrides["model"] == "tiny"
    fixed = {k: smoke.overrides[k] for k in ("optim.epochs", "data.batch_size", "optim.limit_val_batches")}
    assert fixed == {"optim.epochs": 1, "data.batch_size": 16, "optim.limit_val_batches": 13}  # scale, table
    table6 = build("table6", "smoke", tmp_path).sweeps["finetune/L3_H768_A12/mrpc"]  # smoke's grid: seeds
    assert table6.params == {"seed": "1,2"} and table6.overrides["optim.lr"] == 1e-3
    squad = build("table2", "smoke", tmp_path).sweeps["finetune/bert_base_single/squad_v1"]
    assert squad.params == {"optim.lr": "1e-4"}  # conf/table_scale/table2_smoke.yaml: one run, the seeds null
    seeded = build("table5", "smoke", tmp_path, sets=["grid.seed=1,2"]).sweeps["finetune/bert_base/mnli"]
    assert seeded.params == {"optim.lr": "1e-3", "seed": "1,2"}  # --set adds to the grid in use
    sets = ["grid.optim.lr=null", "grid.seed=range(1,3)", "rows.no_nsp=null",
            "finetune_overrides.optim.warmup_ratio=0.2"]
    table = build("table5", "budget", tmp_path, sets=sets)
    mnli = table.sweeps["finetune/bert_base/mnli"]
    assert mnli.params == {"optim.epochs": "2,3,4", "data.batch_size": "16,32", "seed": "range(1,3)"}
    assert len(mnli.jobs()) == 3 * 2 * 2 and mnli.overrides["optim.warmup_ratio"] == 0.2  # a node added
    assert "no_nsp" not in table.parts[0].rows and "finetune/no_nsp/mnli" not in table.sweeps
    with pytest.raises(TableError, match="table5_demo .* runs at SCALE=smoke only"):
        build("table5_demo", "budget", tmp_path)


@pytest.mark.parametrize("scale", SCALES)
def test_no_table_repeats_what_its_scale_gives_every_table(scale):
    """A table's file at a scale (conf/table_scale/<table>_<scale>.yaml) holds only what is its own: no value
    equal to what lies beneath it, from conf/scale/<scale>.yaml's `tables:` or the table's own file."""
    shared = _leaves(_yaml(REPO / "conf" / "scale" / f"{scale}.yaml")["tables"])
    for path in sorted((REPO / "conf" / "table_scale").glob(f"*_{scale}.yaml")):
        top = _leaves(_yaml(REPO / "conf" / "table" / f"{path.stem.removesuffix('_' + scale)}.yaml")["table"])
        own = _leaves(_yaml(path)["table"])
        repeated = {k: v for k, v in own.items() if {**shared, **top}.get(k, object()) == v}
        assert not repeated, f"{path.name} repeats what lies beneath it: {repeated}"
    named = [p.stem.rsplit("_", 1) for p in (REPO / "conf" / "table_scale").glob("*.yaml")
             if p.stem != "rehearsal"]  # ACTION=rehearse's, over any table at budget or paper
    assert not [n for n in named if len(n) != 2 or n[0] not in TABLES + DEMOS or n[1] not in SCALES]


def test_runner_skips_complete_runs_and_relaunches_the_rest(table5, monkeypatch):
    sweep = table5.sweeps["finetune/bert_base/mrpc"]
    launched = []

    def fake_launch(sweep_, swept, launcher, dry_run=False):  # what src/train.py -m would leave behind
        launched.append(list(swept))
        for combo, folder in sweep_.jobs():
            if not swept or all(s in combo for s in swept) or swept == sweep_.params_args():
                write_results(folder, "mrpc", {"val/acc": 0.7})
        return 0, ""

    monkeypatch.setattr(runner, "_launch", fake_launch)
    write_results(sweep.needs.jobs()[0][1], "pretrain", {"val/mlm_loss": 5.0})
    (sweep.needs.jobs()[0][1] / "checkpoints").mkdir()
    sweep.init_path().write_bytes(b"ckpt")
    assert runner.run_sweep(sweep, {}) == {"skipped": 0, "complete": 4, "failed": 0}
    assert launched == [sweep.params_args()]  # the whole grid: one multirun
    launched.clear()
    assert runner.run_sweep(sweep, {}) == {"skipped": 4, "complete": 0, "failed": 0} and launched == []
    (stale := sweep.jobs()[1][1] / "results.json").unlink()
    assert runner.run_sweep(sweep, {}) == {"skipped": 3, "complete": 1, "failed": 0}
    assert launched == [sweep.jobs()[1][0]]  # only the missing job, alone, with its own swept values
    assert stale.is_file()  # --force and a changed science: tests/test_table_rerun.py


def test_fine_tuning_from_a_failed_pre_training_run_is_marked_with_its_reason(table5, monkeypatch):
    monkeypatch.setattr(runner, "_launch", lambda *a, **k: pytest.fail("nothing may be launched"))
    pretrain = table5.sweeps["pretrain/no_nsp"].jobs()[0][1]
    RunFolder(pretrain).fail("CUDA out of memory")
    counts = runner.run_sweep(table5.sweeps["finetune/no_nsp/sst2"], {})
    assert counts == {"skipped": 0, "complete": 0, "failed": 4}
    row = next(r for r in collect(table5, REFERENCE)["main"] if r.key == "no_nsp")
    assert row.cells["sst2_acc"].reason == "pre-training run pretrain/no_nsp failed: CUDA out of memory"


@pytest.mark.slow
def test_sweeps_at_once_run_side_by_side_longest_chain_first_each_after_its_pre_training(table5, monkeypatch):
    """Two slots: never more than two sweeps at once, a fine-tuning only after the pre-training it starts
    from, and the free slot takes the ready sweep with the most work behind it (LTR's pre-training here)."""
    events, lock = [], threading.Lock()

    def fake_launch(sweep, swept, launcher, dry_run=False):
        with lock:
            events.append(("start", sweep.name))
        time.sleep(0.05)
        for _, folder in sweep.jobs():
            write_results(folder, sweep.overrides["task"], {"val/acc": 0.7})
            if sweep.stage == "pretrain":
                (folder / "checkpoints").mkdir()
                (folder / "checkpoints" / "last.ckpt").write_bytes(b"ckpt")
        with lock:
            events.append(("end", sweep.name))
        return 0, ""

    costs = {name: 1.0 for name in table5.sweeps}
    costs.update({"pretrain/none": 10.0, "pretrain/no_nsp": 10.0, "pretrain/ltr_no_nsp": 30.0})
    monkeypatch.setattr(runner, "_launch", fake_launch)
    monkeypatch.setattr(runner, "sweep_costs", lambda plan: costs)
    summary = runner.run_table(table5, {"sweeps_at_once": 2}, plan={"runs": []})
    assert [line["sweep"] for line in summary] == list(table5.sweeps)  # reported in table order
    assert all(line["complete"] == len(table5.sweeps[line["sweep"]].jobs()) for line in summary)
    running, most, ended = set(), 0, set()
    for kind, name in events:
        if kind == "start":
            needs = table5.sweeps[name].needs
            assert needs is None or needs.name in ended, f"{name} started before {needs.name} ended"
            running.add(name)
            most = max(most, len(running))
        else:
            running.remove(name)
            ended.add(name)
    assert most == 2
    # the two slots take the two longest chains (table order would start no_nsp before LTR); which thread
    # records its start first is up to the scheduler
    first_two = [name for kind, name in events if kind == "start"][:2]
    assert set(first_two) == {"pretrain/ltr_no_nsp", "pretrain/none"}


def test_critical_path_is_a_sweeps_cost_plus_its_costliest_chain(table5):
    costs = {name: 1.0 for name in table5.sweeps}
    costs.update({"pretrain/none": 10.0, "finetune/bert_base/squad_v1": 5.0})
    chain = runner.critical_path(table5, costs)
    assert chain["pretrain/none"] == 15.0 and chain["finetune/bert_base/squad_v1"] == 5.0
    assert chain["pretrain/no_nsp"] == 2.0  # its own 1 and one fine-tuning sweep's 1
    plan = {"runs": [{"name": "finetune/a/mrpc/seed-1", "flops": 1.0}, {"name": "finetune/a/mrpc/seed-2",
                                                                         "flops": 2.0}]}
    assert runner.sweep_costs(plan) == {"finetune/a/mrpc": 3.0}  # a sweep's jobs summed


def test_a_launchers_threads_reach_each_process_as_omp_num_threads(table5, monkeypatch):
    seen = []

    def fake_warm(cmd, env=None, **kwargs):  # what a run is started with, warm or not
        seen.append((env.get("OMP_NUM_THREADS"), [c for c in cmd if c.startswith("threads")]))

    def fake_popen(cmd, env=None, **kwargs):
        return real_popen(["true"], **kwargs)

    real_popen = subprocess.Popen
    monkeypatch.setattr(runner.warm, "start", fake_warm)
    monkeypatch.setattr(runner.subprocess, "Popen", fake_popen)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    sweep = table5.sweeps["pretrain/none"]
    runner._launch(sweep, [], runner.stage_launcher({"threads": 1, "common": {"hydra/launcher": "basic"}},
                                                    "pretrain"))
    runner._launch(sweep, [], runner.stage_launcher({}, "pretrain"))
    assert seen == [("1", []), (None, [])]  # an env variable, never a Hydra override


@pytest.mark.slow
def test_dry_run_prints_the_multiruns_and_writes_nothing(capsys, tmp_path):
    assert cli.main(["run", "table5", "--scale", "smoke", "--dry-run",
                     "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "src/train.py --multirun" in line]
    assert len(lines) == 3 + 4 * 5  # three pre-training runs, then four rows x five tasks
    mnli = next(line for line in lines if "task=mnli" in line and "/bert_base/" in line)
    assert "optim.lr=1e-3" in mnli and "data.max_train_examples=256" in mnli
    store = build("table5", "smoke", tmp_path / "runs").sweeps["pretrain/none"].folder  # the shared store
    assert store.parent == tmp_path / "runs" / "pretrain" / "smoke"
    assert f"init={store}/default/checkpoints/last.ckpt" in mnli
    assert "hydra.sweep.subdir" not in mnli and "exclude_keys=[" in mnli  # conf/train.yaml names the jobs
    assert not (tmp_path / "runs").exists()


def test_reference_copy_matches_the_shared_one():
    shared = REPO.parent / "shared" / "paper" / "reference.yaml"
    if not shared.is_file():
        pytest.skip("../shared/paper/reference.yaml is absent on this clone")
    ours = yaml.safe_load((REPO / "experiments" / "reference.yaml").read_text())
    assert ours == yaml.safe_load(shared.read_text())


def test_a_killed_run_is_resumed_in_its_folder_and_one_that_would_not_resume_is_set_aside(table5):
    folder = table5.sweeps["pretrain/none"].jobs()[0][1]
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"step 150")
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text("ckpt_path: last\nseed: 1\n")
    assert RunFolder(folder).in_the_way({}) is None  # resumed there
    (folder / ".hydra" / "config.yaml").write_text("ckpt_path: null\n")  # would start afresh beside them
    assert "would not resume" in RunFolder(folder).in_the_way({})
    aside = RunFolder(folder).set_aside()  # as the runner does before it launches the job
    assert (aside / "checkpoints" / "last.ckpt").read_bytes() == b"step 150"
    assert aside.parent == folder / ".previous" and not (folder / "checkpoints").exists()


@pytest.mark.slow
def test_budget_runs_join_the_tables_wandb_group_with_its_axes_as_tags(tmp_path):
    """Every run of a table composes in the plan (test_tables_plan.py); the W&B keys it leaves out compose
    here."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from bert_repro.tables.spec import CONF_DIR

    table = build("table5", "budget", tmp_path)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            for name in ("pretrain/ltr_no_nsp/phase1", "finetune/ltr_no_nsp_bilstm/mrpc"):
                sweep = table.sweeps[name]
                swept, _ = sweep.jobs()[0]
                cfg = compose("train", overrides=[o for o in sweep.fixed_args() if not o.startswith("hydra")]
                              + swept)
                assert cfg.logger.wandb.group == "table5" and cfg.task.name == sweep.overrides["task"]
                assert list(cfg.logger.wandb.tags) == ["table5", sweep.overrides["task"], "base",
                                                       sweep.overrides["ablation"], "budget"]
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.slow
def test_collected_table_is_logged_as_a_wandb_table_offline(table5, tmp_path, monkeypatch):
    from bert_repro.tables.render import log_wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    fill(table5, glue_metrics)
    collected = collect(table5, REFERENCE)
    written = write_all(table5, collected, REFERENCE, tmp_path / "results")
    run_dir = log_wandb(table5, collected, written, tmp_path / "wandb_runs")
    logged = list(run_dir.rglob("*.table.json"))
    assert run_dir.name.startswith("offline-run-") and logged, sorted(p.name for p in run_dir.rglob("*"))
    content = json.loads(logged[0].read_text())
    assert content["columns"][:5] == ["part", "row", "column", "ours", "paper"]
    assert len(content["data"]) == 4 * 5
    assert ["main", "bert_base", "mnli_m_acc", 72.0, 84.4] == [round(v, 6) if isinstance(v, float) else v
                                                                 for v in content["data"][0][:5]]


@pytest.mark.parametrize("launcher", ["joblib", "slurm"])
@pytest.mark.slow
def test_launcher_settings_compose_with_their_hydra_plugins(launcher, tmp_path):
    """conf/table/table_tasks.yaml's launchers: every key is one the plugin's config has (stage by stage)."""
    from hydra import compose

    from bert_repro.tables.compose import composing, hydra_value

    table = build("table5", "paper", tmp_path)
    settings = table.spec["launchers"][launcher]
    with composing():
        for stage in ("pretrain", "finetune"):
            merged = runner.stage_launcher(settings, stage)
            cfg = compose("train", overrides=[f"{k}={hydra_value(v)}" for k, v in merged.items()],
                          return_hydra_config=True)
            target = cfg.hydra.launcher._target_
            assert ("Joblib" in target) if launcher == "joblib" else ("Slurm" in target), target
            if launcher == "slurm":
                expected = 8 if stage == "pretrain" else 1
                hydra_launcher = cfg.hydra.launcher
                assert hydra_launcher.gpus_per_node == expected and hydra_launcher.tasks_per_node == expected
                assert hydra_launcher.partition == "gpu" and hydra_launcher.mem_gb == 64  # common kept


@pytest.mark.slow
def test_launcher_choice_reaches_every_multirun(capsys, tmp_path):
    one_point = ["--set", "grid.optim.epochs=3", "--set", "grid.data.batch_size=32"]  # a multirun a sweep
    assert cli.main(["run", "table8", "--scale", "paper", "--launcher", "slurm", "--dry-run",
                     "--runs-dir", str(tmp_path), *one_point]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "--multirun" in line]
    pretrain = [line for line in lines if "task=pretrain" in line]
    assert len(pretrain) == 12  # 2 phases each
    assert all("hydra/launcher=submitit_slurm" in line for line in lines)
    # SLURM allocates what the scale's layout trains on (conf/scale/paper.yaml: one node of 8 GPUs)
    assert all("hydra.launcher.nodes=1" in line and "trainer.num_nodes=1" in line for line in pretrain)
    assert all("hydra.launcher.nodes=1" in line and "hydra.launcher.partition=gpu" in line
               for line in lines if line not in pretrain)


@pytest.mark.slow
def test_make_passes_set_to_the_runner_one_override_each(capsys, tmp_path):
    """`make table5 SET='...'`: each override reaches the runner as --set, and the runner applies them."""
    proc = subprocess.run(["make", "-n", "table5", "ACTION=run", "SET=rows.no_nsp=null grid.seed=1,2"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    recipe = proc.stdout.replace("\\\n", " ").splitlines()  # make -n keeps the recipe's continued lines
    line = next(line for line in recipe if "-m bert_repro.tables" in line)
    args = shlex.split(line)
    args = args[args.index("bert_repro.tables") + 1:]
    assert args[args.index("--set"):] == ["--set", "rows.no_nsp=null", "--set", "grid.seed=1,2"]
    assert cli.main([*args, "--dry-run", "--runs-dir", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "--multirun" in line]
    finetune = [line for line in lines if "task=pretrain" not in line]
    assert finetune and not any("ablation=no_nsp " in line for line in finetune)
    assert all("seed=1,2" in line for line in finetune if "task=squad_v1" not in line)  # SQuAD: its own grid
