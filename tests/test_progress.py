"""Progress in every log: the plain lines a run prints where no progress bar draws
(callbacks.ProgressLines)."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from bert_repro.lifecycle.callbacks import ProgressLines, Throughput


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch["input_ids"].float()).pow(2).mean()
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.layer(batch["input_ids"].float()).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(n: int = 16) -> DataLoader:
    x = torch.randint(0, 9, (n, 4))
    rows = [{"input_ids": r, "attention_mask": torch.ones(4, dtype=torch.long)} for r in x]
    return DataLoader(rows, batch_size=2)


def test_lines_at_the_step_interval_with_step_loss_speed_eta_and_dev(tmp_path):
    progress = ProgressLines(every_s=None, every_n_steps=3)
    trainer = L.Trainer(max_epochs=2, accumulate_grad_batches=2, limit_val_batches=1, logger=False,
                        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                        default_root_dir=tmp_path / "mrpc" / "default",
                        callbacks=[Throughput(peak_tflops=1.0), progress])
    trainer.fit(Tiny(), loader(), loader(4))
    steps = [line for line in progress.lines if " | " in line]
    # 8 batches an epoch, 2 a step: 4 steps an epoch, 8 in all; a line at steps 3 and 6, and at the end
    assert [line.split(" | ")[0] for line in steps] == ["mrpc/default: step 3/8", "mrpc/default: step 6/8",
                                                        "mrpc/default: step 8/8"]
    assert "epoch 1/2" in steps[0] and "epoch 2/2" in steps[1]
    assert all("loss " in line and "tokens/s " in line and "MFU " in line for line in steps[:2])
    assert "ETA " in steps[0] and "tokens/s n/a" not in steps[1] and steps[-1].endswith("done")
    dev = [line for line in progress.lines if "Dev at step" in line]  # at each epoch's end
    assert [line.split(":")[1] for line in dev] == [" Dev at step 4", " Dev at step 8"]
    assert dev[-1].endswith(f"val/loss {trainer.callback_metrics['val/loss']:.4f}")
    assert progress.validated_step == 8  # run.py takes these as the final Dev numbers


def test_a_terminal_keeps_the_bar_and_prints_no_lines(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    progress = ProgressLines(every_s=None, every_n_steps=1)
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_model_summary=False,
                        default_root_dir=tmp_path, callbacks=[progress], limit_val_batches=0)
    trainer.fit(Tiny(), loader())
    assert progress.lines == [] and trainer.progress_bar_callback.is_enabled


@pytest.mark.slow
def test_a_piped_run_logs_progress_lines(good):
    """The good run ran with its output piped (tests capture it): its log file holds the lines (a copy taken
    when it ended: the fault cases on the same worker append their own runs' to train.log)."""
    tmp, _, _, _ = good
    log = (tmp / "good.log").read_text()
    lines = [line for line in log.splitlines() if "bert_repro.lifecycle.callbacks" in line]
    assert any("tokens/s" in line and line.endswith("done") for line in lines), lines
    assert any("Dev at step 4" in line for line in lines)
    assert log.count("Seed set to") == 1  # each message once
