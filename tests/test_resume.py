"""A run killed with SIGKILL mid-epoch and started again with the same command resumes from its
checkpoints/last.ckpt and ends with exactly the uninterrupted run's numbers (CPU, same seed): data order,
dropout, dynamic masking, optimizer and schedule all continue where they stopped."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bert_repro.lifecycle.reliability import AtomicCheckpointIO, safe_load

from .conftest import REPO, in_process
from .helpers import ended, started

PRETRAIN = ["model=tiny", "scale=smoke", "logger=csv", "trainer.enable_progress_bar=false",
            "data.batch_size=8",
            # masks per epoch
            "scale.pretrain.vocab_size=2000", "data.corpus=builtin:pydoc", "data.masking=dynamic",
            "optim.max_steps=24", "optim.val_check_interval=8", "optim.limit_val_batches=2",
            "checkpoint.every_n_steps=1", "checkpoint.keep_recent=1"]


def command(out: Path, cache: Path, *overrides: str) -> list[str]:
    return [sys.executable, str(REPO / "src" / "train.py"), *overrides, f"paths.cache_dir={cache}",
            f"hydra.run.dir={out}"]


def run(cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return in_process(cmd)  # one thread, as start_and_signal's: the same float sums, exact comparisons


def saved_step(out: Path) -> int:
    """The newest step checkpoint's step (recent-<step>.ckpt, written atomically beside last.ckpt)."""
    steps = [int(m.group(1)) for p in (out / "checkpoints").glob("recent-*.ckpt")
             if (m := re.fullmatch(r"recent-(\d+)\.ckpt", p.name))]
    return max(steps, default=0)


def start_and_signal(cmd: list[str], out: Path, at_step: int, signum: int, timeout: float = 400):
    """Start ``cmd`` (helpers.started), send ``signum`` once a checkpoint of step >= ``at_step`` exists: its
    exit status and output."""
    log = out.with_name(out.name + ".log")
    proc, deadline = started(cmd, log), time.monotonic() + timeout
    while saved_step(out) < at_step and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be interrupted:\n" + log.read_text()[-3000:]
    assert saved_step(out) >= at_step, "no checkpoint in time"
    os.kill(proc.pid, signum)
    return ended(proc, log)


def final(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def full_run(tmp: Path, overrides: list[str]) -> tuple[Path, dict]:
    """The uninterrupted run to compare with, in ``tmp``/full: ``tmp`` and its results.json."""
    proc = run(command(tmp / "full", tmp / "cache", *overrides))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, final(tmp / "full")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return full_run(tmp_path_factory.mktemp("resume"), PRETRAIN)


def test_sigkill_mid_epoch_then_same_command_gives_the_same_result(uninterrupted):
    tmp, full = uninterrupted
    out = tmp / "killed"
    cmd = command(out, tmp / "cache", *PRETRAIN)
    code, output = start_and_signal(cmd, out, at_step=10, signum=signal.SIGKILL)
    assert code == -signal.SIGKILL and not (out / "results.json").exists()
    ckpt = safe_load(out / "checkpoints" / "last.ckpt")
    step = ckpt["global_step"]
    assert 9 <= step < 24  # recent-<step>.ckpt is written just before last.ckpt: the kill may fall between
    # the loader's position travelled in the checkpoint: mid-epoch 0, 8 examples per step already handed out
    (loader,) = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert loader["_sampler_iter_state"]["sampler_state"] == {"epoch": 0, "position": 8 * step}
    assert {"torch", "numpy", "python"} <= set(ckpt["callbacks"]["RNGState"])

    proc = run(cmd)  # the same command again
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resumed = final(out)
    assert resumed["resumed_from"] == str(out / "checkpoints" / "last.ckpt")
    assert resumed["global_step"] == full["global_step"] == 24
    assert resumed["metrics"]["final"] == full["metrics"]["final"]  # exactly: not merely close
    assert resumed["metrics"]["best"] == full["metrics"]["best"]


def test_rerunning_a_finished_command_changes_nothing(uninterrupted):
    tmp, full = uninterrupted
    proc = run(command(tmp / "full", tmp / "cache", *PRETRAIN))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "is finished (results.json complete, same settings): nothing run" in proc.stdout + proc.stderr
    assert final(tmp / "full") == full  # not resumed, validated or rewritten (finished.py)


def test_other_settings_do_not_resume_a_folders_checkpoint(uninterrupted):
    """The folder's last.ckpt belongs to its command: a different one landing there is refused, not mixed
    in."""
    tmp, full = uninterrupted
    before = (tmp / "full" / "results.json").read_bytes()
    proc = run(command(tmp / "full", tmp / "cache", *PRETRAIN, "optim.lr=1e-3"))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "optim.lr: was 0.0005, now 0.001" in output, output[-3000:]
    assert "Traceback" not in output and (tmp / "full" / "results.json").read_bytes() == before


@pytest.fixture(scope="module")
def glue_setup(tmp_path_factory, shared_data, minilm_dir):
    """RTE, 64 examples in batches of 16: 4 steps an epoch, 8 in all, every second step's checkpoint kept
    (each is 50 MB: weights and Adam's moments over the 30522-token vocabulary)."""
    tmp = tmp_path_factory.mktemp("resume_glue")
    overrides = ["task=rte", "model=tiny", "logger=csv", "trainer.enable_progress_bar=false",
                 "data.batch_size=16", "data.max_train_examples=64", "optim.epochs=2",
                 f"data.tokenizer={minilm_dir}", f"paths.shared_data={shared_data}",
                 "checkpoint.every_n_steps=2", "checkpoint.keep_recent=4",
                 "checkpoint.keep_last=true"]  # the finished run's step checkpoints stand in for kills
    proc = run(command(tmp / "full", tmp / "cache", *overrides))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, overrides, final(tmp / "full")


@pytest.mark.parametrize("step", [4, 6], ids=["after-last-batch-of-epoch-1", "mid-epoch-2"])
def test_fine_tuning_resumed_from_any_step_gives_the_same_result(glue_setup, step):
    """A kill right after step N leaves step N's checkpoint as last.ckpt: resuming from it, at an epoch's
    end or in the middle of one, finishes with the uninterrupted run's numbers, and its results.json covers
    the whole run: the per-epoch history, tokens and FLOPs over both attempts (record.py), one resume."""
    tmp, overrides, full = glue_setup
    out = tmp / f"from_{step}"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "last.ckpt").write_bytes(
        (tmp / "full" / "checkpoints" / f"recent-{step}.ckpt").read_bytes())
    proc = run(command(out, tmp / "cache", *overrides))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resumed = final(out)
    assert resumed["resumed_from"] and resumed["global_step"] == full["global_step"] == 8
    assert resumed["metrics"]["final"] == full["metrics"]["final"]
    history = {row["epoch"]: row for row in full["metrics"]["per_epoch"]}
    for row in resumed["metrics"]["per_epoch"]:
        same = history[row["epoch"]]
        assert row["step"] == same["step"] and row["val/loss"] == pytest.approx(same["val/loss"], abs=1e-6)
    if step == 6:  # epoch 0's row was in the checkpoint (step 4's is written before epoch 0's evaluation)
        assert [row["epoch"] for row in resumed["metrics"]["per_epoch"]] == [0, 1]
    assert (resumed["resumes"], full["resumes"]) == (1, 0)
    totals = ("tokens_trained", "flops_trained")
    assert [resumed[k] for k in totals] == [full[k] for k in totals]
    assert resumed["wall_time_s"] > resumed["wall_time_attempt_s"]


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    """A save that dies half-way leaves the previous last.ckpt whole and no partial file behind."""
    io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"global_step": 1, "w": torch.ones(3)}, path)

    def dies_half_way(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # e.g. the job is killed while writing

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"global_step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]
    assert io.load_checkpoint(path)["global_step"] == 1


def test_a_named_checkpoint_gives_way_to_the_runs_own_progress(tmp_path):
    """ckpt_path=<phase 1's last.ckpt> starts a run; once the run has its own last.ckpt, rerunning the same
    command continues it (a killed phase 2 is not restarted from phase 1)."""
    from bert_repro.lifecycle.checks import UsageError, resolve_ckpt_path

    named = tmp_path / "phase1" / "last.ckpt"
    named.parent.mkdir()
    named.write_bytes(b"x")
    out = tmp_path / "phase2"
    assert resolve_ckpt_path(str(named), out) == (str(named), False)
    assert resolve_ckpt_path("last", out) == (None, False) and resolve_ckpt_path(None, out) == (None, False)
    own = out / "checkpoints" / "last.ckpt"
    own.parent.mkdir(parents=True)
    own.write_bytes(b"y")
    assert resolve_ckpt_path(str(named), out) == (str(own), True)
    assert resolve_ckpt_path("last", out) == (str(own), True)
    assert resolve_ckpt_path(str(own), out) == (str(own), False)  # named, as it always was
    for folder in (tmp_path / "fresh", out):  # a mistyped name is refused, also beside the run's own progress
        with pytest.raises(UsageError, match="does not exist"):
            resolve_ckpt_path(str(tmp_path / "missing.ckpt"), folder)


def test_phase_two_changes_only_the_declared_keys_and_never_the_vocabulary(tmp_path):
    """Resuming another folder's checkpoint to continue its schedule (optim.resume_step, phase 2): the
    SCHEDULE_KEYS may differ; the objective, the model and the vocabulary's content may not, whatever file the
    vocabulary is read from."""
    from omegaconf import OmegaConf

    from bert_repro.lifecycle.build import check_resume
    from bert_repro.lifecycle.checks import UsageError

    science = {"task": {"name": "pretrain"}, "model": {"num_layers": 2}, "optim": {"max_steps": 6},
               "data": {"max_seq_length": 64, "nsp": True, "tokenizer": None}}
    vocab = ["[PAD]", "[UNK]", "the", "a"]
    saved = {"identity": {"task": "pretrain", "science": science}, "vocab": vocab, "optimizer_states": [{}]}
    ckpt = tmp_path / "phase1" / "last.ckpt"
    ckpt.parent.mkdir()
    torch.save(saved, ckpt)
    phase2 = {**science, "optim": {"max_steps": 10, "resume_step": 6},
              "data": {**science["data"], "max_seq_length": 128, "tokenizer": str(ckpt)}}
    cfg = OmegaConf.create({"optim": {"resume_step": 6}})
    check_resume(str(ckpt), False, cfg, {"task": "pretrain", "science": phase2}, vocab,
                 f"data.tokenizer={ckpt}")

    other = tmp_path / "vocab.txt"  # the same size, its word lines in another order
    with pytest.raises(UsageError, match=rf"ckpt_path={ckpt} was trained with another vocabulary than this "
                                         rf"run's \(data.tokenizer={other}\): id 2 is 'the' there, 'a' here"):
        check_resume(str(ckpt), False, cfg, {"task": "pretrain", "science": phase2},
                     ["[PAD]", "[UNK]", "a", "the"], f"data.tokenizer={other}")
    for key, node in (("data.nsp", {"data": {**phase2["data"], "nsp": False}}),
                      ("model.num_layers", {"model": {"num_layers": 4}})):
        with pytest.raises(UsageError, match=rf"other settings than this run's \({key}: checkpoint"):
            check_resume(str(ckpt), False, cfg, {"task": "pretrain", "science": {**phase2, **node}}, vocab,
                         f"data.tokenizer={ckpt}")
