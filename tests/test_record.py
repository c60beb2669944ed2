"""A resumed run's results.json covers the whole run: per-epoch history, wall time, tokens and FLOPs over all
its attempts, and how often it resumed (record.py; the history travels in the module's checkpoints). A real
resumed run's results.json is checked end to end by tests/test_resume.py's fine-tuning resumes."""

import time
from types import SimpleNamespace

import torch

from bert_repro.lifecycle.record import RunRecord
from bert_repro.tasks.classification import SequenceClassificationModule

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
    monkeypatch.setattr("bert_repro.lifecycle.callbacks.training_flops", lambda *counts: 100.0)
    second.on_train_batch_end(trainer, SimpleNamespace(config="a BertConfig"), None, batch, 0)
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
