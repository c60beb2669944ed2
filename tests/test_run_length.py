"""lifecycle.trainer.optimizer_steps is the run's length as Lightning counts it: the steps the LR schedule
spans (tasks/base.py reads ``estimated_stepping_batches``) and the plan prices."""

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from bert_repro.lifecycle.trainer import optimizer_steps


class Counted(Exception):
    """Raised once the schedule's length is read, so no step is trained."""


class OneWeight(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.w * batch[0]).sum()

    def configure_optimizers(self):  # where the run's schedule reads it
        raise Counted(self.trainer.estimated_stepping_batches)


class Endless(IterableDataset):
    def __iter__(self):
        while True:
            yield torch.ones(1)


@pytest.mark.parametrize("batches, max_steps, max_epochs, accumulation, expected", [
    (10, 7, -1, 1, 7),  # steps only
    (10, -1, 3, 1, 30),  # epochs only
    (10, 100, 3, 1, 30),  # both, the epochs end first
    (10, 25, 3, 1, 25),  # both, the steps end first
    (10, -1, 2, 3, 8),  # accumulation: each epoch's short last group steps too (4 a epoch)
    (10, 7, 2, 3, 7),
    (math.inf, 12, 2, 1, 12),  # a loader without a length: the steps alone
])
def test_optimizer_steps_are_the_trainers_estimated_stepping_batches(batches, max_steps, max_epochs,
                                                                     accumulation, expected):
    data = Endless() if batches == math.inf else TensorDataset(torch.ones(batches * 2, 1))
    trainer = L.Trainer(max_steps=max_steps, max_epochs=max_epochs, accumulate_grad_batches=accumulation,
                        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(Counted) as counted:
        trainer.fit(OneWeight(), DataLoader(data, batch_size=2))
    assert counted.value.args[0] == expected
    assert optimizer_steps(max_steps, max_epochs, batches, accumulation) == expected
