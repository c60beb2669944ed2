"""Preemption: SIGTERM or SIGUSR1 (SLURM's signals) or Ctrl-C make a run save checkpoints/last.ckpt at the end
of the batch in progress and exit cleanly (no traceback, 128 + the signal's number); the same command then
resumes from that checkpoint and ends with the uninterrupted run's numbers. Before the first step, a signal
ends the run with one line and 128 + n too, nothing written."""

import os
import re
import signal

import lightning as L
import pytest

from bert_repro.lifecycle.reliability import safe_load

from .helpers import ended, started
from .test_resume import PRETRAIN, command, final, full_run, run, start_and_signal

# a step checkpoint every 5 steps only: the signal's checkpoint is the one written on the signal
OVERRIDES = [o for o in PRETRAIN if not o.startswith("checkpoint.")] + ["checkpoint.every_n_steps=5",
                                                                        "checkpoint.keep_recent=5"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return full_run(tmp_path_factory.mktemp("preempt"), OVERRIDES)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT],
                         ids=["SIGTERM", "SIGUSR1", "SIGINT"])
def test_signal_saves_exits_cleanly_and_the_rerun_finishes_the_same(uninterrupted, signum):
    tmp, full = uninterrupted
    out = tmp / signum.name
    cmd = command(out, tmp / "cache", *OVERRIDES)
    code, output = start_and_signal(cmd, out, at_step=5, signum=signum)
    assert code == 128 + signum, output[-3000:]
    assert "Traceback" not in output and not (out / "results.json").exists()
    said = re.search(rf"{signum.name} received: saved (\S+) at step (\d+) and stopped; run the same command "
                     r"again",
                     output)
    assert said, output[-3000:]
    step = int(said.group(2))
    assert said.group(1) == str(out / "checkpoints" / "last.ckpt") and 5 <= step < 24
    assert safe_load(out / "checkpoints" / "last.ckpt")["global_step"] == step  # the state at the signal

    proc = run(cmd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resumed = final(out)
    assert resumed["resumed_from"] and resumed["global_step"] == full["global_step"] == 24
    assert resumed["metrics"]["final"] == full["metrics"]["final"]


def test_under_slurm_lightning_does_not_requeue_too(monkeypatch):
    """Exactly one requeue mechanism: submitit's (the launcher's); Lightning's SLURM auto-requeue is off."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from bert_repro.lifecycle.reliability import slurm_plugins

    assert slurm_plugins() == []  # not under SLURM
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    (env,) = slurm_plugins()
    assert isinstance(env, SLURMEnvironment) and env.auto_requeue is False


class SignalAt(L.Callback):
    """Sends its own process ``signum`` as fit starts: after the set-up and the model summary, before the
    first batch (a scheduler's pre-emption, or Ctrl-C, while a run starts)."""

    def __init__(self, signum: int):
        self.signum = signum

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_before_the_first_step_exits_128_plus_n_and_writes_nothing(tmp_path, signum):
    out = tmp_path / "run"
    cmd = command(out, tmp_path / "cache", *OVERRIDES,
                  f"+callbacks.stop={{_target_: {__name__}.SignalAt, signum: {int(signum)}}}")
    # a process of its own, the signal's boundary; SignalAt is imported from this file
    code, said = ended(started(cmd, tmp_path / "run.log"), tmp_path / "run.log")
    assert code == 128 + signum, said[-3000:]
    assert (f"{signum.name} received in {out}: stopped before its first checkpoint; run the same command "
            "again to start it") in said
    assert "Traceback" not in said and not (out / "results.json").exists()
