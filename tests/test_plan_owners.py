"""The plan asks each fact of the code that owns it: change the fact there (a monkeypatch) and the plan
changes; and it checks every job's values before it prints anything."""

import pytest

from bert_repro.tables import __main__ as cli
from bert_repro.tables import plan, runner
from bert_repro.tables.plan import make_plan
from bert_repro.tables.spec import build

ONE = ["grid.optim.epochs=3", "grid.data.batch_size=32"]  # fewer jobs; the same kinds of run


def _totals(plan: dict) -> tuple[float, float, float]:
    return plan["total_flops"], plan["total_disk_gb"], plan["total_prep_hours"]


@pytest.fixture(scope="module")
def table2(tmp_path_factory):
    return build("table2", "budget", tmp_path_factory.mktemp("runs"), inits={"*": "/ckpt/given"})


@pytest.mark.slow
def test_flops_and_parameters_are_the_models(table2, monkeypatch):
    """An inner size of 8H at model.BertConfig (not the paper's 4H) raises the FLOPs; count_parameters
    doubled doubles the checkpoints' bytes."""
    from bert_repro import model

    flops, disk, _ = _totals(make_plan(table2))
    post_init = model.BertConfig.__post_init__

    def wider(self):
        self.intermediate_size = self.intermediate_size or 8 * self.hidden_size
        post_init(self)

    monkeypatch.setattr(model.BertConfig, "__post_init__", wider)
    assert make_plan(table2)["total_flops"] > 1.3 * flops
    monkeypatch.undo()
    counted = model.count_parameters
    monkeypatch.setattr(model, "count_parameters", lambda module: 2 * counted(module))
    assert make_plan(table2)["total_disk_gb"] == pytest.approx(2 * disk, rel=1e-6)


@pytest.mark.slow
def test_kept_checkpoints_are_the_callbacks(table2, monkeypatch, tmp_path):
    """A retention rule that deletes nothing keeps each fine-tuning's last.ckpt (weights and AdamW moments):
    in the plan as in retain_checkpoints, which deletes by the same rule."""
    from bert_repro.lifecycle import callbacks
    from bert_repro.lifecycle.folder import RunFolder

    disk = make_plan(table2)["total_disk_gb"]
    monkeypatch.setattr(callbacks, "unneeded_checkpoints", lambda names, keep_last, keep_steps: [])
    assert make_plan(table2)["total_disk_gb"] == pytest.approx(4 * disk, rel=1e-6)  # 4 + 12 bytes, not 4
    run = RunFolder(tmp_path)
    run.checkpoints.mkdir()
    run.best.touch()
    run.last.touch()
    assert callbacks.retain_checkpoints(run, keep_last=False, keep_steps=[]) == [] and run.last.is_file()


@pytest.mark.slow
def test_the_measured_mfu_is_gpu_checks(table2, monkeypatch):
    """BERT-base at 384 tokens measured at 60% MFU (not the assumed 30%) halves those runs' compute."""
    from bert_repro.benchmarks import gpu_check

    compute = make_plan(table2)["runs"]
    monkeypatch.setattr(gpu_check, "best_mfu", lambda out_dir, conf_dir: {(768, 384): (0.6, "bench (x)")})
    measured = make_plan(table2)
    assert measured["mfu"]["H768/T384"] == (0.6, "bench (x)")
    ratios = sorted(m["compute_hours"] / a["compute_hours"] for m, a in zip(measured["runs"], compute))
    assert ratios == pytest.approx([0.5] * 3 + [1.0] * 3)


@pytest.mark.slow
def test_the_padded_length_is_the_collators(table2, monkeypatch):
    from bert_repro.data.batching import PadCollator

    tokens = sum(r["tokens"] for r in make_plan(table2)["runs"])
    monkeypatch.setattr(PadCollator, "padded_length", lambda self, lengths: 384)  # always the full window
    assert sum(r["tokens"] for r in make_plan(table2)["runs"]) > 1.05 * tokens  # SQuAD: ~340 of 384


@pytest.mark.slow
def test_the_data_caches_are_keyed_as_pretraining_keys_them(tmp_path, monkeypatch):
    """Table 5's three pre-trainings (NSP, No NSP, LTR) each build their instances; a DataModule that keyed
    its rounds on nothing would share one set, and the plan would charge it once."""
    from bert_repro.data import pretraining

    # one fine-tuning column: the instances are the pre-trainings'
    one_column = [f"columns.{column}=null" for column in ("qnli_acc", "mrpc_acc", "sst2_acc", "squad_v1_f1")]
    table = build("table5", "paper", tmp_path, sets=[*ONE, *one_column])
    prep = make_plan(table)["total_prep_hours"]
    monkeypatch.setattr(pretraining, "cache_settings", lambda hp, static: ({}, {}))
    assert make_plan(table)["total_prep_hours"] < prep / 2  # one set of rounds, not six (3 rows x 2 phases)


@pytest.mark.parametrize("key, value", [("optim.lr", "abc"), ("optim.weight_decay", "-1")])
def test_a_wrong_grid_value_fails_the_plan_naming_the_job_and_key(key, value, tmp_path, capsys):
    code = cli.main(["plan", "table2", "--scale", "budget", "--runs-dir", str(tmp_path),
                     "--set", f"grid.{key}={value}"])
    err = capsys.readouterr().err
    assert code == 2 and "finetune/" in err and key in err and "Traceback" not in err
    assert not (tmp_path / "table2").exists()  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize("action", [["plan"], ["run", "--dry-run"], ["rehearse"], ["collect"]],
                         ids=["plan", "dry-run", "rehearse", "collect"])
def test_a_grid_beyond_ten_thousand_runs_asks_for_yes_on_every_path_before_a_job_is_composed(
        action, tmp_path, capsys, monkeypatch):
    """The one gate counts the runs from the grid's sizes (Sweep.count): no job is composed first."""
    def composed(*args, **kwargs):
        raise AssertionError("a job was composed before the gate")

    monkeypatch.setattr(runner, "compose_job", composed)
    monkeypatch.setattr(plan, "compose_job", composed)
    code = cli.main([*action, "table2", "--scale", "budget", "--runs-dir", str(tmp_path / "runs"),
                     "--results-dir", str(tmp_path / "results"), "--set", "grid.seed=range(0,5001)"])
    err = capsys.readouterr().err
    assert code == 2 and "table2: 10,002 runs, more than 10,000" in err and "--yes" in err, err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_heads_bilstm_is_priced_by_its_shape_in_heads(tmp_path, monkeypatch):
    """Table 7's feature-based rows: the BiLSTM's FLOPs come from heads.bilstm_widths, which shapes the
    FeatureTagger's; without a BiLSTM there only the fine-tuned row keeps its price."""
    from bert_repro import heads

    table = build("table7", "budget", tmp_path, inits={"*": "/ckpt/given"})
    priced = {r["name"]: r["flops"] for r in make_plan(table)["runs"]}
    monkeypatch.setattr(heads, "bilstm_widths", lambda *args, **kwargs: [])
    bare = {r["name"]: r["flops"] for r in make_plan(table)["runs"]}
    assert {n for n in priced if bare[n] < priced[n]} == {n for n in priced if "/finetune_all/" not in n}
    assert all(bare[n] == priced[n] for n in priced if "/finetune_all/" in n)


def test_a_plan_says_how_far_it_is_as_it_composes_the_runs(tmp_path, caplog, monkeypatch):
    """A long plan is not silent: a line every few seconds (here every run) while its runs are composed."""
    import logging

    from bert_repro import progress

    monkeypatch.setattr(plan, "counted", lambda items, what, every_s=None: progress.counted(items, what, 0))
    with caplog.at_level(logging.INFO, logger="bert_repro.progress"):
        assert cli.main(["plan", "table2", "--scale", "budget", "--runs-dir", str(tmp_path)]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "bert_repro.progress"]
    assert said[0].startswith("planning: runs composed: 1 so far") and said[-1].endswith("in all"), said


@pytest.mark.slow
def test_a_fine_tuning_is_planned_for_the_steps_the_trainer_takes(tmp_path):
    """Given optim.max_steps and optim.epochs both, the run stops at whichever comes first (Lightning's rule,
    lifecycle.trainer.optimizer_steps): Table 2's 3 epochs of SQuAD (87,599 questions, batch 32) end before
    10,000 steps; 4 accumulated micro-batches of 8 take as many steps, each padded to its own longest."""
    epochs = -(-87_599 // 32) * 3
    runs = {}
    for max_steps, per_device in ((10_000, None), (5_000, None), (10_000, 8)):
        sets = [f"finetune_overrides.optim.max_steps={max_steps}",
                f"finetune_overrides.speed.per_device_batch_size={per_device or 'null'}"]
        table = build("table2", "budget", tmp_path / str(len(runs)), inits={"*": "/ckpt/given"}, sets=sets)
        runs[max_steps, per_device] = make_plan(table)["runs"][0]
    assert [r["steps"] for r in runs.values()] == [epochs, 5_000, epochs]
    assert runs[10_000, 8]["tokens"] < runs[10_000, None]["tokens"]
