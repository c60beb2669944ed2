"""A table job is complete only when its folder's result has the job's science as composed now: a relaunch
after an edit reruns exactly the jobs whose science changed and those downstream of a pre-training that runs
again; their earlier folders are moved aside, never deleted, and never collected. Every job is composed and
checked before any work; a second runner (a --force among them) is refused. The launches are stand-ins that
write what src/train.py writes, with the composed config (tests/test_tables_e2e.py runs the real ones)."""

import json
import os
import subprocess
import sys
import time

import pytest

from bert_repro.tables import __main__ as cli
from bert_repro.tables import runner
from bert_repro.tables.collect import collect, load_reference
from bert_repro.tables.compose import composing_jobs
from bert_repro.tables.spec import TableError, build

from .test_tables import write_results

TINY = ["rows.no_nsp=null", "rows.ltr_no_nsp=null", "rows.ltr_no_nsp_bilstm=null", "pretrain.no_nsp=null",
        "pretrain.ltr_no_nsp=null", "columns.mnli_m_acc=null", "columns.sst2_acc=null",
        "columns.squad_v1_f1=null", "columns.qnli_acc=null", "grid.optim.lr=1e-3,1e-4"]


def tiny(tmp_path, *sets):
    return build("table5", "smoke", tmp_path / "runs", sets=[*TINY, *sets])


def stand_in(table, monkeypatch, launched):
    """``_launch`` writing each job's complete result with its composed config, as src/train.py would."""
    with composing_jobs():
        configs = {f: runner.job_config(s, swept, tmp) for s in table.sweeps.values()
                   for swept, f in s.jobs() for tmp in [f.parents[1]]}

    def launch(sweep, swept, launcher, dry_run=False):
        launched.append(sweep.name)
        for combo, folder in sweep.jobs():
            if swept == sweep.params_args() or combo == swept:
                write_results(folder, sweep.overrides["task"], {"val/acc": 0.7, "val/mlm_loss": 5.0},
                              config=configs[folder])
                if sweep.stage == "pretrain":
                    (folder / "checkpoints").mkdir(exist_ok=True)
                    (folder / "checkpoints" / "last.ckpt").write_bytes(b"ckpt")
        return 0, ""

    monkeypatch.setattr(runner, "_launch", launch)


@pytest.mark.slow
def test_a_relaunch_after_an_edit_reruns_exactly_the_changed_jobs_and_those_after_a_changed_pre_training(
        tmp_path, monkeypatch, capsys):
    launched = []
    first = tiny(tmp_path)
    stand_in(first, monkeypatch, launched)
    runner.run_table(first)
    assert launched == ["pretrain/none", "finetune/bert_base/mrpc"]
    launched.clear()
    runner.run_table(first)  # the same science: nothing runs
    assert launched == []

    epochs = tiny(tmp_path, "finetune_overrides.optim.epochs=2")  # a key not in the folder names
    stand_in(epochs, monkeypatch, launched)
    runner.run_table(epochs)
    assert launched == ["finetune/bert_base/mrpc"]
    sweep = epochs.sweeps["finetune/bert_base/mrpc"]
    out = capsys.readouterr().out
    assert out.count("optim.epochs: was 1, now 2; moved to") == 2
    for _, folder in sweep.jobs():
        assert json.loads((folder / "results.json").read_text())["config"]["optim"]["epochs"] == 2
        kept = list((folder / ".previous").glob("*/results.json"))  # the earlier result, kept
        assert [json.loads(k.read_text())["config"]["optim"]["epochs"] for k in kept] == [1]
    row = collect(epochs, load_reference())["main"][0]
    assert row.cells["mrpc_acc"].n == 2 and ".previous" not in row.cells["mrpc_acc"].run

    launched.clear()
    pretrain = epochs.sweeps["pretrain/none"].jobs()[0][1]
    (pretrain / "results.json").unlink()  # the pre-training runs again in its store folder
    runner.run_table(epochs)
    assert launched == ["pretrain/none", "finetune/bert_base/mrpc"]
    assert capsys.readouterr().out.count("its pre-training runs again; moved to") == 2

    launched.clear()
    steps = tiny(tmp_path, "finetune_overrides.optim.epochs=2", "pretrain_overrides.optim.max_steps=7")
    assert steps.sweeps["pretrain/none"].folder != pretrain.parent  # a new store entry, the old one kept
    stand_in(steps, monkeypatch, launched)
    runner.run_table(steps)
    assert launched == ["pretrain/none", "finetune/bert_base/mrpc"] and (pretrain / "results.json").is_file()
    assert "init: was" in capsys.readouterr().out  # fine-tuning from the new checkpoint


@pytest.mark.slow
def test_force_moves_earlier_runs_aside_and_a_second_runner_is_refused(tmp_path, monkeypatch):
    launched = []
    table = tiny(tmp_path)
    stand_in(table, monkeypatch, launched)
    runner.run_table(table)
    folder = table.sweeps["pretrain/none"].jobs()[0][1]
    root = table.sweeps["finetune/bert_base/mrpc"].folder.parents[2]
    code = "import sys, time; from bert_repro.lifecycle.locks import RunFolderLock as L\n" \
           "with L(sys.argv[1]):\n print('held', flush=True); time.sleep(60)"
    other = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(TableError, match=f"in use by pid {other.pid} .*: another table runner"):
            runner.run_table(table, force=True)
    finally:
        other.kill()
        other.wait()
    assert (folder / "results.json").is_file() and not (folder / ".previous").exists()  # untouched
    launched.clear()
    runner.run_table(table, force=True)
    assert launched == ["pretrain/none", "finetune/bert_base/mrpc"]
    assert len(list((folder / ".previous").glob("*/results.json"))) == 1  # kept, not deleted


@pytest.mark.parametrize("bad, said", [
    ("columns.mrpc_acc.task=no_such_task",  # the plan, made before a run starts, composes each job first
     "finetune/bert_base/no_such_task optim.lr=0.001: does not compose (In 'train': Could not find "
     "'task/no_such_task'"),
    ("grid.optim.lr=1e-3,abc", "finetune/bert_base/mrpc optim.lr=abc: optim.lr=abc: expected a positive "
     "number"),
    ("task_data.mrpc.data.glue_dir=/no/such/glue", "data.glue_dir=/no/such/glue does not exist"),
    ("finetune_overrides.optim.epochs=0", "optim.epochs=0: expected a positive whole number")])
@pytest.mark.slow
def test_a_wrong_job_stops_the_table_before_any_work_naming_it(tmp_path, monkeypatch, capsys, bad, said):
    monkeypatch.setattr(runner, "_launch", lambda *a, **k: pytest.fail("nothing may be launched"))
    args = ["run", "table5", "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    assert cli.main([*args, *(f"--set={s}" for s in [*TINY, bad])]) == 2
    assert said in capsys.readouterr().err
    assert not list((tmp_path / "runs").rglob("results.json"))


@pytest.mark.slow
def test_failed_jobs_exit_non_zero_and_a_damaged_failure_record_is_named(tmp_path, monkeypatch, capsys):
    def launch(sweep, swept, launcher, dry_run=False):
        return 1, "RuntimeError: out of memory"

    monkeypatch.setattr(runner, "_launch", launch)
    args = ["run", "table5", "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    assert cli.main([*args, *(f"--set={s}" for s in TINY)]) == 1
    assert "error: 3 jobs failed: pretrain/none/default" in capsys.readouterr().err
    folder = tiny(tmp_path).sweeps["pretrain/none"].jobs()[0][1]
    (folder / "failed.json").write_text('{"reason": "CUDA out of')  # cut short
    assert cli.main(["collect", *args[1:], *(f"--set={s}" for s in TINY)]) == 0
    assert runner.job_state(folder) == ("failed", f"{folder / 'failed.json'} is damaged (not the runner's "
                                        "record): a relaunch reruns the job")


@pytest.mark.slow
def test_a_slurm_controller_that_stops_answering_stops_the_table_naming_what_is_left(tmp_path, monkeypatch):
    """tests/test_slurm.py's cluster needs slurm-wlm; here a stand-in ``scontrol`` answers as a stopped
    controller does, and a stand-in src/train.py waits as submitit's waiter would."""
    (tmp_path / "bin").mkdir()
    scontrol = tmp_path / "bin" / "scontrol"
    started = tmp_path / "started"  # the controller stops once the first job waits on it
    scontrol.write_text(f"#!/bin/sh\n[ -f {started} ] || {{ echo 'Slurmctld(primary) at localhost is UP'; "
                        "exit 0; }\necho 'Slurmctld(primary) at localhost is DOWN'\nexit 1\n")
    scontrol.chmod(0o755)
    waiter = tmp_path / "train.py"
    waiter.write_text(f"import time\nopen({str(started)!r}, 'w')\ntime.sleep(120)\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(runner, "TRAIN", waiter)
    monkeypatch.setattr(runner, "PING_S", 0.2)
    monkeypatch.setattr(runner, "SILENT_S", 1.0)
    start = time.monotonic()
    with pytest.raises(TableError, match=r"controller stopped answering for 1 s \(scontrol ping: Slurmctld"
                                         r"\(primary\) at localhost is DOWN\); still queued or running: "
                                         r"pretrain/none/default, finetune/bert_base/mrpc/optim.lr-0.001, "):
        runner.run_table(tiny(tmp_path), {"common": {"hydra/launcher": "submitit_slurm"}})
    assert time.monotonic() - start < 60


def test_collect_holds_each_cell_to_the_specs_science_as_run_does(tmp_path, monkeypatch):
    """A spec edited after its runs (1 epoch ran, the spec now says 2): collect shows no number of the old
    setting as the new one's; the cell is not run, naming the key that differs, as `run` would rerun it."""
    first = tiny(tmp_path)
    stand_in(first, monkeypatch, [])
    runner.run_table(first)
    assert collect(first, load_reference())["main"][0].cells["mrpc_acc"].status == "ok"
    edited = tiny(tmp_path, "finetune_overrides.optim.epochs=2")
    cells = collect(edited, load_reference())["main"][0].cells
    assert cells["mrpc_acc"].status == "missing" and cells["mrpc_acc"].value is None
    assert cells["mrpc_acc"].reason == ("2 of 2 jobs of finetune/bert_base/mrpc ran with other settings than "
                                        "the spec's (optim.epochs: was 1, now 2); `run` reruns them")
