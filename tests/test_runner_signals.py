"""The table runner owns its children: SIGTERM or SIGINT to `python -m bert_repro.tables run` stops its sweeps
(each gets SIGTERM once: src/train.py saves a checkpoint and stops), leaves no process behind, marks nothing
failed and exits non-zero saying so; a relaunch redoes no finished job. A folder a live process sweeps into is
neither moved nor launched into, even with --force. A failed job is read from its results.json; the runner's
failed.json holds only what it decides, with the launch's own error.

The quick tests run the runner on a stand-in for src/train.py (a few lines of Python, no torch); the last
one on the real src/train.py, a tiny Table 5 (a 2-step pre-training, an MRPC sweep of two)."""

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bert_repro.lifecycle.locks import live_processes
from bert_repro.tables import __main__ as cli
from bert_repro.tables import runner
from bert_repro.tables.spec import TableError, build
from bert_repro.tables.warm import WarmProcess

from .conftest import shared_data_dir
from .helpers import ended, held_by_another_process, started
from .test_table_rerun import TINY
from .test_tables_e2e import SHRINK

# the table CLI with runner.TRAIN replaced by the stand-in (argv[1]) and the variables of argv[2] set; a
# script (helpers.started forks it warm), its work under __main__: the runner's forkserver imports it
DRIVER = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    if __name__ == "__main__":
        from bert_repro.tables import runner, __main__ as cli
        os.environ.update(json.loads(sys.argv[2]))
        runner.TRAIN = Path(sys.argv[1])
        sys.exit(cli.main(sys.argv[3:]))
""")

# a sweep that waits: records its pid and session, starts a grandchild in its group, and logs the signals it
# gets; on SIGTERM it exits as src/train.py does after its checkpoint (128 + 15), leaving the grandchild
STAND_IN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from pathlib import Path
    sweep = Path(next(a for a in sys.argv if a.startswith("hydra.sweep.dir=")).split("=", 1)[1])
    sweep.mkdir(parents=True, exist_ok=True)
    def note(signum, frame):
        with open(sweep / "signals", "a") as f:
            f.write(signal.Signals(signum).name + "\\n")
        if signum == signal.SIGTERM and os.environ.get("STAND_IN") != "stubborn":
            sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, note)
    signal.signal(signal.SIGINT, note)
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", str(sweep)])
    (sweep / "child.json").write_text(f'{{"pid": {os.getpid()}, "sid": {os.getsid(0)}, '
                                      f'"grandchild": {grandchild.pid}}}')
    while True:
        time.sleep(0.1)
""")


def group(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def mentioning(text: str) -> list[int]:
    """The processes whose command line mentions ``text`` (a test's folder), from /proc."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def kill_left(tmp_path: Path) -> None:
    """What a failing test left running: every process that names its folder."""
    for pid in mentioning(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(path: Path, proc: WarmProcess | subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not path.is_file():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.2)


@pytest.fixture
def start_runner(tmp_path):
    """Starts the table runner on the stand-in (helpers.started); afterwards, kills what a failing test left
    running."""
    running = []

    def start(mode: str = "", warm: bool = True) -> tuple[WarmProcess | subprocess.Popen, Path, Path]:
        stand_in, driver, log = tmp_path / "train.py", tmp_path / "driver.py", tmp_path / "runner.log"
        stand_in.write_text(STAND_IN)
        driver.write_text(DRIVER)
        # cold (BERT_REPRO_WARM=0): the stand-in started as a plain process, and no forkserver importing torch
        env = {"STAND_IN": mode, **({} if warm else {"BERT_REPRO_WARM": "0"})}
        # Table 5 cut to its first row and MRPC (TINY): the runner composes 3 jobs before the first launch,
        # not 23
        cmd = [sys.executable, str(driver), str(stand_in), json.dumps(env), "run", "table5", "--scale",
               "smoke", "--logger", "none", *(f"--set={s}" for s in TINY), "--runs-dir",
               str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
        proc = started(cmd, log)
        running.append((proc, log))
        # Table 5's `none` pre-training, in the shared store (spec.build: <runs>/pretrain/<scale>/<name>)
        return proc, build("table5", "smoke", tmp_path / "runs", sets=TINY,
                           logger="none").sweeps["pretrain/none"].folder, log

    yield start
    kill_left(tmp_path)
    for proc, log in running:
        ended(proc, log)


@pytest.mark.e2e
def test_ctrl_c_reaches_the_sweep_once_as_sigterm_and_leaves_no_process(start_runner):
    proc, sweep, log = start_runner()
    wait_for(sweep / "child.json", proc, log)
    child = json.loads((sweep / "child.json").read_text())
    assert child["sid"] == child["pid"]  # its own session: a terminal's Ctrl-C reaches the runner alone
    os.kill(proc.pid, signal.SIGINT)
    code, err = ended(proc, log, timeout=60)
    assert code == 128 + signal.SIGINT, err[-3000:]
    assert "SIGINT received" in err and "pretrain/none" in err and "Run the same command again" in err
    assert "Traceback" not in err
    assert (sweep / "signals").read_text() == "SIGTERM\n"  # forwarded once, as src/train.py's stop signal
    assert group(child["pid"]) == []  # the sweep and the grandchild it left are gone
    assert not (sweep / "default").exists()  # nothing marked failed


@pytest.mark.e2e
def test_a_second_signal_kills_a_sweep_that_does_not_stop(start_runner):
    """A cold-started sweep: the stop reaches the runner's other way of starting a run (the Ctrl-C test's
    and the real runs' sweeps are forked warm)."""
    proc, sweep, log = start_runner("stubborn", warm=False)
    wait_for(sweep / "child.json", proc, log)
    child = json.loads((sweep / "child.json").read_text())
    os.kill(proc.pid, signal.SIGTERM)
    deadline = time.time() + 30
    while not (sweep / "signals").is_file() and time.time() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None  # still waiting for its child, which ignored the stop
    os.kill(proc.pid, signal.SIGTERM)
    code, err = ended(proc, log, timeout=60)
    assert code == 128 + signal.SIGTERM and "SIGTERM received" in err, err[-3000:]
    assert group(child["pid"]) == []


@pytest.fixture
def table5(tmp_path):
    return build("table5", "smoke", tmp_path / "runs")


@pytest.mark.slow
def test_a_folder_a_live_process_sweeps_into_is_neither_moved_nor_launched_into(tmp_path, monkeypatch):
    table5 = build("table5", "smoke", tmp_path / "runs", sets=TINY)
    sweep = table5.sweeps["pretrain/none"]
    folder = sweep.jobs()[0][1]
    (folder / ".hydra").mkdir(parents=True)
    (folder / "failed.json").write_text('{"reason": "an earlier attempt"}')
    # an orphaned sweep of a killed runner, as the process table shows it
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             f"hydra.sweep.dir={sweep.folder}"])
    # Popen may return (vfork) before the kernel has set the new program's arguments: /proc shows none yet
    deadline = time.time() + 30
    while not (Path(f"/proc/{live.pid}/cmdline").read_bytes() or time.time() > deadline):
        time.sleep(0.01)
    monkeypatch.setattr(runner, "_launch", lambda *a, **k: pytest.fail("nothing may be launched"))
    try:
        with pytest.raises(TableError, match=f"process {live.pid} is sweeping into {sweep.folder}"):
            runner.run_table(table5, force=True)
    finally:
        live.kill()
        live.wait()
    assert (folder / "failed.json").is_file() and (folder / ".hydra").is_dir()
    # a job folder that a run holds (locks.py), as src/train.py's jobs hold theirs
    with held_by_another_process(folder) as pid:
        with pytest.raises(TableError, match=f"run folder {folder} is in use by pid {pid}"):
            runner.run_table(table5, force=True)
    assert (folder / "failed.json").is_file() and (folder / ".hydra").is_dir()


FAILING = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    job = Path(next(a for a in sys.argv if a.startswith("hydra.sweep.dir=")).split("=", 1)[1]) / "default"
    (job / ".hydra").mkdir(parents=True)
    if "+mode=recorded" in sys.argv:  # run.record_failure's results.json
        (job / "results.json").write_text(json.dumps({
            "status": "failed", "reason": "NonFiniteLoss: training loss is nan at step 3", "task": "pretrain",
            "seed": 1, "monitor": "val/mlm_loss", "metrics": {"final": {}, "best": {}}, "config": {}}))
        sys.exit(1)
    # run.SweepUsageError: logged, and the whole sweep stops before any record
    print("[2026-01-01 00:00:00,000][bert_repro.lifecycle.run][ERROR] - a local multirun with 2 devices: "
          "use submitit")
    sys.exit(2)
""")


@pytest.mark.parametrize("mode, reason, marked", [
    ("recorded", "NonFiniteLoss: training loss is nan at step 3", False),
    ("logged", "a local multirun with 2 devices: use submitit", True)])
@pytest.mark.slow
def test_a_failed_job_is_read_from_its_results_json_and_failed_json_holds_the_launchs_own_error(
        table5, tmp_path, monkeypatch, mode, reason, marked):
    stand_in = tmp_path / "train.py"
    stand_in.write_text(FAILING)
    monkeypatch.setattr(runner, "TRAIN", stand_in)
    monkeypatch.setenv("BERT_REPRO_WARM", "0")  # a plain process: no forkserver importing torch for it
    sweep = table5.sweeps["pretrain/none"]
    folder = sweep.jobs()[0][1]
    assert runner.run_sweep(sweep, {"+mode": mode}) == {"skipped": 0, "complete": 0, "failed": 1}
    assert runner.job_state(folder) == ("failed", reason)
    assert (folder / "failed.json").is_file() == marked  # written only where no results.json says it


def mtimes(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("results.json"))}


@pytest.mark.e2e
@pytest.mark.slow
def test_sigterm_mid_sweep_stops_the_real_runs_and_a_relaunch_redoes_no_finished_job(tmp_path, monkeypatch):
    if shared_data_dir() is None:
        pytest.skip("../shared/data (MRPC) is absent on this clone; set BERT_REPRO_SHARED_DATA")
    sets = [s for s in SHRINK if not s.startswith("columns.qnli_acc")] + ["columns.qnli_acc=null"]
    own = {"OMP_NUM_THREADS": "1", "BERT_REPRO_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "bert_repro.tables", "run", "table5", "--scale", "smoke", "--logger", "none",
           *(f"--set={s}" for s in sets), "--runs-dir", str(tmp_path / "runs"),
           "--results-dir", str(tmp_path / "results")]
    runs = tmp_path / "runs"
    root = runs / "table5" / "smoke"
    mrpc = root / "finetune" / "bert_base" / "mrpc"
    # the pre-training run is in the shared store, outside the table's folder (spec.build)
    store = build("table5", "smoke", runs, sets=sets, logger="none").sweeps["pretrain/none"].folder
    pretrained = f"{store.relative_to(runs)}/default/results.json"
    for key, value in own.items():  # the runner's, and the relaunch's below in this process
        monkeypatch.setenv(key, value)
    log = tmp_path / "runner.log"
    proc = started(cmd, log)
    deadline = time.time() + 600
    while not list(mrpc.glob("*/results.json")):  # one MRPC job finished, the other starting or training
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    sweeps = live_processes(mrpc)
    assert sweeps, "the MRPC sweep ended before the signal"
    os.kill(proc.pid, signal.SIGTERM)
    try:
        code, err = ended(proc, log, timeout=300)
    finally:  # a failing test leaves nothing running either
        kill_left(tmp_path)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert "SIGTERM received" in err and "finetune/bert_base/mrpc" in err and "Traceback" not in err
    assert all(group(pid) == [] for pid in sweeps)  # no orphan left to write into the folders
    assert not list(mrpc.rglob("failed.json"))  # stopped, not failed
    finished = mtimes(runs)
    assert len(finished) == 2 and pretrained in finished  # and one MRPC job

    # the relaunch in this process: its runs forked warm (tables/warm.py)
    monkeypatch.delenv("BERT_REPRO_WANDB_GROUP", raising=False)  # set by the runner
    assert cli.main(cmd[3:]) == 0
    assert {k: v for k, v in mtimes(runs).items() if k in finished} == finished  # not rerun
    summary = {s["sweep"]: s for s in json.loads((root / "summary.json").read_text())["sweeps"]}
    assert summary["pretrain/none"]["skipped"] == 1
    assert [summary["finetune/bert_base/mrpc"][k] for k in ("skipped", "complete", "failed")] == [1, 1, 0]
    with (tmp_path / "results" / "table5.csv").open() as f:
        cells = {row["column"]: row for row in csv.DictReader(f)}
    assert cells["mrpc_acc"]["status"] == "ok" and cells["mrpc_acc"]["ours"]  # the table came out whole


# the table CLI with one of its steps (argv[1]) sending the runner argv[2] first, then doing its work; a
# script, which helpers.started forks warm
SIGNALLED = textwrap.dedent("""
    import os, sys
    if __name__ == "__main__":
        from bert_repro.tables import __main__ as cli
        name, signum = sys.argv[1], int(sys.argv[2])
        step = getattr(cli, name)
        setattr(cli, name, lambda *a, **k: (os.kill(os.getpid(), signum), step(*a, **k))[1])
        sys.exit(cli.main(sys.argv[3:]))
""")


@pytest.mark.parametrize(("step", "signum"), [("build", signal.SIGINT), ("write_plan", signal.SIGTERM)])
def test_a_signal_at_the_runners_start_up_is_one_line_and_128_plus_n_and_files_are_whole(tmp_path, step,
                                                                                          signum):
    """Ctrl-C while the table is planned (before any run) and SIGTERM while plan.json is written: the one
    line, 128 + n, and the plan written whole or not at all."""
    script, log = tmp_path / "signalled.py", tmp_path / "output.log"
    script.write_text(SIGNALLED)
    code, said = ended(started([sys.executable, str(script), step, str(int(signum)), "plan", "table5",
                                "--scale", "smoke", *(f"--set={s}" for s in TINY), "--runs-dir",
                                str(tmp_path)], log), log, timeout=300)
    assert code == 128 + signum, said[-3000:]
    assert (f"error: {signum.name} received during `python -m bert_repro.tables`: stopped; what finished is "
            "kept, run the same command again to go on") in said
    assert "Traceback" not in said
    plan = tmp_path / "table5" / "smoke" / "plan.json"
    assert (json.loads(plan.read_text())["runs"] if step == "write_plan" else not plan.exists())
