"""LAUNCHER=ray on a real Ray instance on this CPU, started with GPUs declared (``num_gpus=4``): Ray places
each job and gives it its own CUDA_VISIBLE_DEVICES; a pre-training's fine-tunings start only after it ended; a
job whose Ray worker is killed is named with its folder and marked failed, and the table's other jobs finish;
Ctrl-C sends each run SIGTERM (it checkpoints), marks nothing failed, and the same command ends them; a second
Ctrl-C kills a run still writing its checkpoint.
The jobs are stand-ins that record what they were given (tests/test_tables_e2e.py runs a real table)."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from bert_repro.tables import TableError, ray_jobs, runner, warm
from bert_repro.tables.progress import TableProgress
from bert_repro.tables.spec import build

from .test_launchers import ONE_TASK
from .test_tables import write_results
from .test_tables_plan import _seconds

pytest.importorskip("ray", reason="LAUNCHER=ray needs Ray: pip install -e '.[ray]'")

# a job's stand-in: what it was given (its Ray worker is its parent) when it started, and when it ended; a
# SIGTERM (the run would checkpoint, for ``hold`` seconds) is recorded beside them. It starts as a run does,
# Hydra writing its config (the ETA's start of the job); it waits (60 s at most) until ``together`` jobs under
# ``root`` have started, so that jobs Ray runs at once overlap on a loaded machine too
JOB = ("import glob, json, os, signal, sys, time; "
       "out, sleep, hold = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]); "
       "root, together = sys.argv[4], int(sys.argv[5]); "
       "os.makedirs(out[:-5] + '/.hydra', exist_ok=True); "
       "open(out[:-5] + '/.hydra/config.yaml', 'w').close(); "
       "signal.signal(signal.SIGTERM, lambda *a: (open(out + '.stopped', 'w').close(), time.sleep(hold), "
       "sys.exit(143))); "
       "seen = {'worker': os.getppid(), 'pid': os.getpid(), "
       "'devices': os.environ.get('CUDA_VISIBLE_DEVICES'), "
       "'start': time.time()}; "
       "json.dump(seen, open(out + '.start', 'w'))\n"
       "while len(glob.glob(root + '/**/*.json.start', recursive=True)) < together "
       "and time.time() < seen['start'] + 60: time.sleep(0.05)\n"
       "time.sleep(sleep); "
       "json.dump({**seen, 'end': time.time()}, open(out, 'w'))")
A_GPU = {"ray": {"num_gpus": 1, "num_cpus": 0}}
# a Ray instance of this module's, owned by a process of its own (it prints its address and holds it until
# its stdin closes): each table connects to it as to a cluster and its ray.shutdown() only disconnects; no
# token, which a second driver here would not have (RAY_AUTH_MODE: a local instance makes one of its own)
OWNER = ("import sys, ray; "
         "info = ray.init(num_cpus=8, num_gpus=4, include_dashboard=False, log_to_driver=False); "
         "print(info.address_info['gcs_address'], flush=True); sys.stdin.read(); ray.shutdown()")


def stand_ins(table, monkeypatch, sleep: dict[str, float], hold: dict[str, float] | None = None,
              together: int = 0):
    """Each job runs JOB for ``sleep[its sweep]`` seconds (0.3 s by default) once ``together`` of the table's
    fine-tunings have started, and checkpoints for ``hold[its sweep]`` seconds on SIGTERM (none by default);
    one that ended gets a result."""
    def command(sweep, swept, launcher, folder=None):
        assert folder is not None, "under Ray each job is a task of its own"
        return [sys.executable, "-c", JOB, f"{folder}.json", str(sleep.get(sweep.name, 0.3)),
                str((hold or {}).get(sweep.name, 0)), str(table.root),
                str(together if sweep.stage == "finetune" else 0)]

    real = runner._ray_launch

    def launch(sweep, batch, launcher):
        outcomes = real(sweep, batch, launcher)
        for _, [(_, folder)] in batch:
            if folder.with_name(folder.name + ".json").is_file():
                write_results(folder, sweep.overrides["task"], {"val/acc": 0.7})
                if sweep.stage == "pretrain":
                    (folder / "checkpoints").mkdir(exist_ok=True)
                    (folder / "checkpoints" / "last.ckpt").write_bytes(b"ckpt")
        return outcomes

    monkeypatch.setattr(runner, "command", command)
    monkeypatch.setattr(runner, "_ray_launch", launch)
    monkeypatch.setattr(runner, "sweep_costs", lambda plan: {})


@pytest.fixture(scope="module")
def on_ray():
    """The launcher block of a table on the module's Ray instance (launchers.ray.ray.address), started once:
    seconds for each ray.init that starts one (the init block: tests/test_tables_e2e.py)."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    try:
        address = owner.stdout.readline().strip()
        assert address, f"Ray did not start (ray.init in a process of its own: exit status {owner.wait()})"
        yield {"ray": {"address": address, "init": {"log_to_driver": False}}, "pretrain": A_GPU,
               "finetune": A_GPU}
    finally:
        owner.stdin.close()
        owner.wait(timeout=120)


def run(table, launcher):
    try:
        return runner.run_table(table, launcher, plan={"runs": []})
    except TableError as err:
        if "Ray did not start" in str(err):
            pytest.skip(str(err))
        raise


def seen(table) -> dict[str, dict]:
    return {name: json.loads(f.with_name(f.name + ".json").read_text()) for name, f in table.jobs().items()
            if f.with_name(f.name + ".json").is_file()}


def test_ray_runs_as_many_of_a_stages_jobs_at_once_as_the_cluster_holds_its_asks():
    assert ray_jobs.fits({"GPU": 4, "CPU": 8}, {"ray.num_gpus": 1, "ray.num_cpus": 0}) == 4
    assert ray_jobs.fits({"GPU": 4, "CPU": 64}, {"ray.num_gpus": 0.25}) == 16  # four share a GPU
    assert ray_jobs.fits({"GPU": 4, "CPU": 8}, {"ray.num_gpus": 0.25}) == 8  # and a CPU each, Ray's default
    assert ray_jobs.fits({"CPU": 2}, {"ray.num_gpus": 0, "ray.num_cpus": 1}) == 2


@pytest.mark.slow
def test_four_fine_tunings_at_once_each_on_its_own_gpu_each_after_its_pre_training(tmp_path, monkeypatch,
                                                                                    capsys, on_ray):
    """And the ETA is told the four places Ray has: once a fine-tuning ended, the others at their ends, it
    reads less than three of them one after another."""
    monkeypatch.delenv("PYTHONBREAKPOINT", raising=False)  # what an earlier Ray driver here left behind
    environment = dict(os.environ)
    table = build("table5", "smoke", tmp_path / "runs", sets=ONE_TASK)
    stand_ins(table, monkeypatch, {n: 3.0 for n in table.sweeps if n.startswith("finetune/")}, together=4)
    told = []  # the ETA's view of the cluster
    monkeypatch.setattr(runner, "TableProgress",
                        lambda *a, **k: told.append(k["on_ray"]) or TableProgress(*a, **k))
    summary = run(table, on_ray)
    assert told == [{"pretrain": 4, "finetune": 4}]
    etas = [eta for done, eta in re.findall(r"\[(\d)/7 jobs\] .*; ETA (\S+)", capsys.readouterr().err)
            if "4" <= done < "7"]  # a fine-tuning ended, and others still running
    assert etas and all(_seconds(eta) < 9 for eta in etas), etas
    assert all(line["complete"] == 1 for line in summary)
    jobs = seen(table)
    fine = [v for name, v in jobs.items() if name.startswith("finetune/")]
    assert len(fine) == 4 and max(v["start"] for v in fine) < min(v["end"] for v in fine)  # all four at once
    assert sorted(v["devices"] for v in fine) == ["0", "1", "2", "3"]
    for name, sweep in table.sweeps.items():
        if sweep.needs is not None:
            before = jobs[f"{sweep.needs.name}/default"]
            assert jobs[f"{name}/{sweep.jobs()[0][1].name}"]["start"] > before["end"], name
    # the variables the Ray driver left in this process start no later run here cold (tables/warm.py)
    assert warm._read_at_import(dict(os.environ)) == warm._read_at_import(environment)


@pytest.mark.slow
def test_a_killed_ray_worker_is_named_with_its_folder_and_the_others_finish(tmp_path, monkeypatch, caplog,
                                                                              on_ray):
    table = build("table5", "smoke", tmp_path / "runs", sets=ONE_TASK)
    victim = table.jobs()["finetune/no_nsp/mrpc/optim.lr-0.001"]
    stand_ins(table, monkeypatch, {"finetune/no_nsp/mrpc": 60.0})

    def kill():  # the victim's Ray worker, once its job started
        started = victim.with_name(victim.name + ".json.start")
        deadline = time.monotonic() + 120
        while not started.is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        os.kill(json.loads(started.read_text())["worker"], signal.SIGKILL)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    start = time.monotonic()
    summary = run(table, on_ray)
    killer.join()
    assert time.monotonic() - start < 60  # the victim's job did not run on to its end
    counts = {line["sweep"]: (line["complete"], line["failed"]) for line in summary}
    assert counts.pop("finetune/no_nsp/mrpc") == (0, 1)
    assert set(counts.values()) == {(1, 0)}
    reason = json.loads((victim / "failed.json").read_text())["reason"]
    assert reason.startswith("its Ray worker died")
    assert f"{victim}: its Ray worker died" in caplog.text


@pytest.mark.slow
def test_ctrl_c_stops_the_ray_jobs_each_run_told_to_checkpoint_and_a_rerun_ends_them(tmp_path, monkeypatch,
                                                                                      on_ray):
    """The first Ctrl-C: each run gets SIGTERM; the second: a run still checkpointing is killed, not waited
    for the grace period (runner.GRACE_S)."""
    table = build("table5", "smoke", tmp_path / "runs", sets=ONE_TASK)
    pretrainings = [n for n in table.sweeps if n.startswith("pretrain/")]
    stand_ins(table, monkeypatch, {n: 60.0 for n in pretrainings}, hold={pretrainings[0]: 120.0})
    started = [f.with_name(f.name + ".json.start") for n, f in table.jobs().items() if n.startswith("pre")]

    def interrupt():  # Ctrl-C once the three pre-trainings run, again once each was told to stop
        deadline = time.monotonic() + 120
        for marks in (started, [s.with_name(s.name.replace(".start", ".stopped")) for s in started]):
            while not all(s.is_file() for s in marks) and time.monotonic() < deadline:
                time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(runner.Interrupted):
        run(table, on_ray)
    assert time.monotonic() - start < 60  # stopped, not run to their end nor waited for the one holding on
    for s in started:
        assert s.with_name(s.name.replace(".start", ".stopped")).is_file(), f"{s} got no SIGTERM"
    with pytest.raises(ProcessLookupError):  # the one still checkpointing was killed
        held = table.jobs()[f"{pretrainings[0]}/default"]
        os.kill(json.loads(held.with_name(held.name + ".json.start").read_text())["pid"], 0)
    assert not any(f.joinpath("failed.json").is_file() for f in table.jobs().values())  # none marked failed
    stand_ins(table, monkeypatch, {})
    assert all(line["complete"] == 1 for line in run(table, on_ray))  # the same command finishes them
