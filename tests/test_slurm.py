"""Through a real SLURM scheduler (tools/slurm/cluster.sh: munge, slurmctld, two 1-CPU slurmd nodes on this
host, started for this file and stopped after it): a table's runs submitted by Hydra's submitit launcher
end as SLURM jobs with the local launcher's numbers; a job requeued mid-run (`scontrol requeue`), then
signalled before its time limit (--signal), saves a checkpoint each time, is requeued (by SLURM, then by
submitit) and ends with the uninterrupted run's numbers; two SLURM tasks on two nodes
train like one process (Lightning's SLURMEnvironment reads the scheduler's variables). Skipped where
slurm-wlm and munge are not installed, or not as root."""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest

from bert_repro.lifecycle.folder import RunFolder
from bert_repro.lifecycle.reliability import safe_load

from .conftest import REPO, run_py
from .test_preempt import OVERRIDES
from .test_resume import command, final, saved_step

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

CLUSTER = REPO / "tools" / "slurm" / "cluster.sh"
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol")
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
# a port of its own (user clusters default to 6817), so this cluster runs beside one `make slurm-up` started
CTLD_PORT = "16817"
# one CPU a job (a node), one thread a process (same threads, same float sums), 3 requeues at a time limit
JOB = ["hydra/launcher=submitit_slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
       "hydra.launcher.timeout_min=10", "hydra.launcher.max_num_timeout=3"]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """The cluster's environment for clients (SLURM_CONF); stopped after the session."""
    missing = [exe for exe in DAEMONS if shutil.which(exe, path=SBIN) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: the SLURM tests need Debian's slurm-wlm and munge "
                    "(apt-get install slurm-wlm munge, as root; .ci/run installs them)")
    if os.geteuid() != 0:
        pytest.skip("the SLURM tests start slurmd, which runs as root (it starts jobs as their user)")
    state = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "PATH": SBIN, "SLURM_CTLD_PORT": CTLD_PORT, "OMP_NUM_THREADS": "1"}
    up = subprocess.run([str(CLUSTER), "up", str(state)], env=env, capture_output=True, text=True,
                        timeout=120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield {**env, "SLURM_CONF": str(state / "slurm.conf")}
    finally:
        down = subprocess.run([str(CLUSTER), "down", str(state)], env=env, capture_output=True, text=True,
                              timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr


def scontrol(env: dict, *args: str) -> str:
    return subprocess.run(["scontrol", *args], env=env, capture_output=True, text=True, check=True,
                          timeout=30).stdout


def job_ids(sweep: Path) -> list[str]:
    """The SLURM jobs submitit submitted for a sweep (its folders .submitit/<job id>)."""
    folder = sweep / ".submitit"
    return sorted(p.name for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def submitit_log(sweep: Path, job: str) -> str:
    """The job's output and error files (submitit's, rank 0's)."""
    return "".join(p.read_text() for p in sorted((sweep / ".submitit" / job).glob(f"{job}_0_log.*")))


def job_record(env: dict, job: str) -> dict[str, str]:
    """`scontrol show job`'s Key=Value fields (the controller keeps an ended job for MinJobAge)."""
    return dict(re.findall(r"(\w+)=(\S*)", scontrol(env, "show", "job", job)))


def job_ended(env: dict, job: str, timeout: float = 120) -> dict[str, str]:
    """The job's record once it has ended: submitit's waiter returns on the job's result file, while the
    job's batch step may still be running."""
    deadline = time.monotonic() + timeout
    while (record := job_record(env, job))["JobState"] in ("PENDING", "RUNNING", "COMPLETING"):
        assert time.monotonic() < deadline, f"job {job} still {record['JobState']} after {timeout:.0f} s"
        time.sleep(0.5)
    return record


def sweep_of_one(out: Path, env: dict, *overrides: str) -> subprocess.Popen:
    """src/train.py -m of one job into ``out``/run, submitted to SLURM; the submitit waiter's process."""
    cmd = [sys.executable, str(REPO / "src" / "train.py"), "-m", *overrides, *JOB, f"hydra.sweep.dir={out}",
           "hydra.sweep.subdir=run"]
    return start(cmd, out.with_suffix(".log"), env)


def start(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    """``cmd``, its output in the file ``log``: a pipe unread while the test waits would fill and block."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    proc.log = log
    return proc


def ended(proc: subprocess.Popen, timeout: float = 300) -> str:
    proc.wait(timeout=timeout)
    output = proc.log.read_text()
    assert proc.returncode == 0, output[-3000:]
    return output


# -- a table through the scheduler ---------------------------------------------------------------------------
SHRINK = [  # table5_demo cut to one pre-training run and one fine-tuning run
    *(f"parts.demo.rows.{row}=null" for row in ("no_nsp", "ltr_no_nsp", "ltr_no_nsp_bilstm")),
    "pretrain.no_nsp=null", "pretrain.ltr_no_nsp=null", "parts.demo.columns.pydoc_punct_f1=null",
    "parts.demo.comparisons=[]", "pretrain_overrides.optim.max_steps=4",
    "pretrain_overrides.optim.val_check_interval=4", "pretrain_overrides.optim.limit_val_batches=1",
    "pretrain_overrides.data.batch_size=8", "pretrain_overrides.scale.pretrain.dupe_factor=1",
    "pretrain_overrides.scale.pretrain.vocab_size=1000", "finetune_overrides.optim.epochs=1",
    "task_data.pydoc_next.data.train_examples=64", "grid.seed=1",
]


def table(tmp: Path, env: dict, launcher: str) -> subprocess.CompletedProcess:
    """`make demo LAUNCHER=...` shrunk; the launchers share one cache (the WordPiece vocabulary trained once:
    the tokenizers trainer is not deterministic)."""
    flags = [f"--set={s}" for s in SHRINK] + ["--runs-dir", str(tmp / launcher / "runs"),
                                               "--results-dir", str(tmp / launcher / "results")]
    return subprocess.run([sys.executable, "-m", "bert_repro.tables", "run", "table5_demo", "--scale",
                           "smoke", "--launcher", launcher, *flags], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**env, "BERT_REPRO_CACHE": str(tmp / "cache")})


def test_a_table_through_the_scheduler_is_the_local_launchers(slurm, tmp_path):
    for launcher in ("local", "slurm"):
        proc = table(tmp_path, slurm, launcher)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {launcher: sorted((tmp_path / launcher / "runs").rglob("results.json"))
            for launcher in ("local", "slurm")}
    assert [p.relative_to(tmp_path / "local") for p in runs["local"]] == [
        p.relative_to(tmp_path / "slurm") for p in runs["slurm"]] and len(runs["slurm"]) == 2
    for here, there in zip(runs["local"], runs["slurm"]):  # the same arithmetic: the same numbers
        a, b = json.loads(here.read_text()), json.loads(there.read_text())
        assert a["status"] == b["status"] == "complete" and a["metrics"]["final"] == b["metrics"]["final"]
        jobs = job_ids(there.parents[1])  # each ran as a SLURM job of its own, which completed
        assert len(jobs) == 1 and job_ended(slurm, jobs[0])["JobState"] == "COMPLETED"
        assert not job_ids(here.parents[1])
    with (tmp_path / "local" / "results" / "table5_demo.csv").open() as local, \
            (tmp_path / "slurm" / "results" / "table5_demo.csv").open() as scheduled:
        cells = [[{k: v for k, v in row.items() if k != "run"} for row in csv.DictReader(f)]  # but the folder
                 for f in (local, scheduled)]
    assert cells[0] == cells[1] and cells[0][0]["ours"]


# -- preemption through the scheduler ------------------------------------------------------------------------
def uninterrupted(tmp: Path) -> subprocess.Popen:
    """The same run, not interrupted, as a local process beside the SLURM job (test_preempt's settings: 24
    steps, a checkpoint every 5)."""
    return start(command(tmp / "full", tmp / "cache", *OVERRIDES), tmp / "full.log",
                 {**os.environ, "OMP_NUM_THREADS": "1"})


def wait_for(condition, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout:.0f} s"
        time.sleep(0.05)


def pending(pid: int, sig: signal.Signals) -> bool:
    """Whether ``sig`` waits undelivered at the stopped process ``pid`` (its pending masks in /proc)."""
    masks = re.findall(r"^(?:SigPnd|ShdPnd):\s*([0-9a-f]+)$", Path(f"/proc/{pid}/status").read_text(), re.M)
    return any(int(mask, 16) >> (sig - 1) & 1 for mask in masks)


def test_a_job_requeued_mid_run_then_signalled_before_its_time_limit_resumes_each_time_as_uninterrupted(
        slurm, tmp_path):
    """One SLURM job stopped twice, each time saving and resuming from its checkpoint: first requeued mid-run
    (`scontrol requeue`: what a preemption by a higher-priority job does, SIGTERM then requeue); then
    signalled before its time limit (SLURM's --signal: submitit asks for USR2 signal_delay_s before the
    limit), which saves last.ckpt and hands over to submitit, which requeues the job
    (hydra.launcher.max_num_timeout). It ends with the uninterrupted run's numbers."""
    full = uninterrupted(tmp_path)
    # the SLURM job starts once this run has cached the data: one WordPiece vocabulary for both
    wait_for(lambda: saved_step(tmp_path / "full") >= 5 or full.poll() is not None, "the uninterrupted run")
    sweep = tmp_path / "sweep"
    waiter = sweep_of_one(sweep, slurm, *OVERRIDES, "hydra.launcher.signal_delay_s=120",
                          f"paths.cache_dir={tmp_path / 'cache'}")
    run = sweep / "run"
    wait_for(lambda: saved_step(run) >= 5, "a step checkpoint of the SLURM job")
    (job,) = job_ids(sweep)
    scontrol(slurm, "requeue", job)
    stopped = r"SIGTERM received: saved (\S+) at step (\d+) and stopped"
    wait_for(lambda: re.search(stopped, submitit_log(sweep, job)), "the requeued job's checkpoint")
    step = int(re.search(stopped, submitit_log(sweep, job)).group(2))
    # the requeued job resumed: a step checkpoint after the one it stopped at (one every 5 steps)
    wait_for(lambda: saved_step(run) > step, "a step checkpoint of the requeued SLURM job")
    # the training process held (SIGSTOP) until the controller's signal reaches it: the controller looks
    # every 30 s, and a run left going would have to outlast that on any CPU
    pid = json.loads(RunFolder(run).lock.read_text())["pid"]
    os.kill(pid, signal.SIGSTOP)
    ran = sum(int(x) * 60 ** i for i, x in enumerate(reversed(job_record(slurm, job)["RunTime"].split(":"))))
    # the limit 1-2 minutes away: inside signal_delay_s, so the controller signals the job at its next pass
    scontrol(slurm, "update", f"JobId={job}", f"TimeLimit={ran // 60 + 2}")

    def requeued() -> bool:
        with suppress(OSError):  # the process gone: woken by SLURM itself, which sends SIGCONT first
            if pending(pid, signal.SIGUSR2):
                os.kill(pid, signal.SIGCONT)
        return f"Requeued job {job}" in submitit_log(sweep, job) or waiter.poll() is not None

    # our handler saves last.ckpt at the batch's end, then hands over to submitit's, which requeues the job
    wait_for(requeued, "the time limit's signal and the requeue", 120)
    assert waiter.poll() is None, submitit_log(sweep, job)[-3000:]
    scontrol(slurm, "update", f"JobId={job}", "TimeLimit=10")  # the requeued job's own limit, ample again
    output = ended(waiter)
    ended(full)
    resumed, reference = final(run), final(tmp_path / "full")
    assert job_ended(slurm, job)["Restarts"] == "2", output[-3000:]  # one requeue per stop, no other
    log = submitit_log(sweep, job)
    said = re.search(stopped, log)
    assert said and said.group(1) == str(run / "checkpoints" / "last.ckpt"), log[-3000:]
    handed_over = r"SIGUSR2 received: saving a checkpoint.*\n(.*\n)*.*this job is timed-out"
    assert re.search(handed_over, log), log[-3000:]
    assert resumed["status"] == "complete" and resumed["resumes"] == 2 and resumed["resumed_from"]
    assert resumed["global_step"] == reference["global_step"] == 24 > int(said.group(2)) >= 5
    assert resumed["metrics"]["final"] == reference["metrics"]["final"]


# -- two nodes -----------------------------------------------------------------------------------------------
def test_two_slurm_nodes_train_like_one_process_with_the_same_global_batch(slurm, tmp_path, minilm_dir):
    # dropout off: each rank draws its own masks, so only then is the arithmetic the same (tests/test_ddp.py);
    # the demo's pair task, written from the embedded corpus: no data to download or find
    common = ["task=pydoc_next", "model=tiny", "logger=csv", "trainer.enable_progress_bar=false",
              "data.batch_size=16", "data.train_examples=32", "optim.epochs=2", "optim.lr=1e-3",
              "model.hidden_dropout=0", "model.attention_dropout=0", f"data.tokenizer={minilm_dir}",
              "checkpoint.keep_last=true", f"paths.cache_dir={tmp_path / 'cache'}"]
    # the reference, in this process; first: it writes the tokenized cache the two ranks read
    one = run_py(*common, "trainer=cpu", f"hydra.run.dir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    # two SLURM tasks, one a node; their names resolve nowhere, so the rendezvous is their NodeAddr
    two = sweep_of_one(tmp_path / "two", slurm, *common, "trainer=ddp_cpu", "trainer.devices=1",
                       "trainer.num_nodes=2", "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1",
                       "hydra.launcher.setup=['export MASTER_ADDR=127.0.0.1']")
    output = ended(two)
    (job,) = job_ids(tmp_path / "two")
    record = job_ended(slurm, job)
    assert (record["NumNodes"], record["NumTasks"], record["JobState"]) == ("2", "2", "COMPLETED"), \
        output[-3000:]
    a = json.loads((tmp_path / "one" / "results.json").read_text())
    b = json.loads((tmp_path / "two" / "run" / "results.json").read_text())
    assert (a["world_size"], a["per_device_batch"], a["accumulation"]) == (1, 16, 1)
    assert (b["world_size"], b["per_device_batch"], b["accumulation"]) == (2, 8, 1)
    assert a["global_step"] == b["global_step"] == 4
    for x, y in zip(a["metrics"]["per_epoch"], b["metrics"]["per_epoch"], strict=True):
        assert x["train/real_tokens"] == y["train/real_tokens"]
        assert x["val/loss"] == pytest.approx(y["val/loss"], abs=1e-5)
    assert b["metrics"]["final"]["val/acc"] == a["metrics"]["final"]["val/acc"]
    w1 = safe_load(tmp_path / "one" / "checkpoints" / "last.ckpt")["state_dict"]
    w2 = safe_load(tmp_path / "two" / "run" / "checkpoints" / "last.ckpt")["state_dict"]
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-5  # gradients all-reduced = one batch's
