"""A resumed run's results.json covers the whole run: per-epoch history, wall time, tokens and FLOPs over all
its attempts, and how often it resumed (record.py; the history travels in the module's checkpoints)."""

import json
import signal
import time
from types import SimpleNamespace

import pytest
import torch

from bert_repro.lifecycle.record import RunRecord
from bert_repro.tasks.classification import SequenceClassificationModule

from .conftest import train_py
from .test_resume import command, start_and_signal

TINY = {"vocab_size": 100, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "max_position": 64}
OPTIM = {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01}


def test_totals_carry_over_to_the_attempt_that_resumes(monkeypatch):
    first = RunRecord(start=time.time() - 10.0)  # an attempt that ran 10 s
    trainer = SimpleNamespace(world_size=2)
    batch = {"attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])}
    first.on_train_batch_end(trainer, SimpleNamespace(), None, batch, 0)
    state = first.state_dict()
    assert state["tokens"] == 10 and state["resumes"] == 0 and state["wall_time_s"] >= 10.0

    second = RunRecord()
    second.load_state_dict(state)
    monkeypatch.setattr("bert_repro.lifecycle.record.module_batch_flops", lambda module, b: 100.0)
    second.on_train_batch_end(trainer, SimpleNamespace(), None, batch, 0)
    totals = second.totals()
    assert totals["tokens"] == 20 and totals["flops"] == 200.0 and totals["resumes"] == 1
    assert totals["wall_time_s"] >= 10.0
    third = RunRecord()
    third.load_state_dict(second.state_dict())
    assert third.totals()["resumes"] == 2


def test_the_per_epoch_history_travels_in_the_checkpoint():
    module = SequenceClassificationModule(model=TINY, optim=OPTIM, task="mrpc", num_labels=2)
    module.history = [{"epoch": 0, "step": 38, "val/f1": 0.8}]
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    resumed = SequenceClassificationModule(model=TINY, optim=OPTIM, task="mrpc", num_labels=2)
    resumed.on_load_checkpoint(checkpoint)
    assert resumed.history == module.history


@pytest.mark.slow
def test_a_run_stopped_after_epoch_one_reports_the_whole_run(tmp_path, minilm_dir, shared_data):
    """SIGTERM once epoch 1's checkpoint exists, rerun the command: an uninterrupted run's record."""
    args = ["task=mrpc", "model=tiny", f"data.tokenizer={minilm_dir / 'vocab.txt'}",
            # 10 steps an epoch: the signal, sent at epoch 0's checkpoint, lands with two epochs to go
            "data.max_train_examples=320", "optim.epochs=3", "optim.limit_val_batches=2", "logger=none",
            # recent-<step>.ckpt: epoch 1's checkpoint, the moment to stop
            "trainer.enable_progress_bar=false", "checkpoint.keep_recent=1"]
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    proc = train_py(*args, f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={full}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    code, output = start_and_signal(command(stopped, tmp_path / "cache", *args), stopped, at_step=1,
                                    signum=signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, output[-2000:]
    proc = train_py(*args, f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={stopped}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    once, twice = (json.loads((d / "results.json").read_text()) for d in (full, stopped))
    assert [row["epoch"] for row in twice["metrics"]["per_epoch"]] == [0, 1, 2]
    for row, same in zip(twice["metrics"]["per_epoch"], once["metrics"]["per_epoch"]):
        assert row["step"] == same["step"] and row["val/loss"] == pytest.approx(same["val/loss"], abs=1e-6)
    assert (twice["resumes"], once["resumes"]) == (1, 0)
    totals = ("tokens_trained", "flops_trained")
    assert [twice[k] for k in totals] == [once[k] for k in totals]
    assert twice["wall_time_s"] > twice["wall_time_attempt_s"]
