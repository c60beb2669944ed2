"""GLUE fine-tuning (§3.5, §4.1): every parameter trained end to end with the task's head on top;
cross-entropy over K classes, or the squared error of one output for STS-B's 0-5 scores."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric, SumMetric
from torchmetrics.classification import MulticlassConfusionMatrix

from bert_repro.data.glue import glue_task
from bert_repro.heads import SequenceClassifier
from bert_repro.metrics.glue import glue_metrics
from bert_repro.tasks.base import BertTaskModule


class SequenceClassificationModule(BertTaskModule):
    """One LightningModule for the nine GLUE tasks. ``task`` fixes the dev sets and their metrics
    (``val/<prefix><metric>``, e.g. val/f1, val/mnli_mm_acc); ``num_labels`` = 1 is regression.

    ``predict_majority``: no model, the majority class of the training labels (the paper's WNLI, §4.1).
    Each epoch leaves a row in ``history``: dev metrics and the padding waste of the training batches.
    """

    def __init__(self, model: dict, optim: dict, task: str, num_labels: int, bilstm: bool = False,
                 predict_majority: bool = False, vocab: list[str] | None = None, lowercase: bool = True,
                 speed: dict | None = None):
        super().__init__(model, optim, vocab, lowercase, speed)
        self.save_hyperparameters()
        self.spec = glue_task(task)
        if num_labels != self.spec.num_labels:
            raise ValueError(f"task={task} has {self.spec.num_labels} label(s) "
                             f"({self.spec.labels or 'a score'}); got num_labels={num_labels}")
        if predict_majority and num_labels == 1:
            raise ValueError(f"task={task} is a regression; predict_majority needs classes")
        self.regression = num_labels == 1
        self.predict_majority = predict_majority
        self.majority: int | None = None  # set from the training labels in setup()
        self.model = SequenceClassifier(self.config, num_labels, bilstm, self.speed)
        self.val_metrics = nn.ModuleList(glue_metrics(self.spec.metrics, num_labels, f"val/{prefix}")
                                         for prefix in self.spec.dev.values())
        # example-weighted, synced across ranks
        self.val_loss = nn.ModuleList(MeanMetric() for _ in self.spec.dev)
        # predicted-class counts per dev set, to spot a run that collapsed onto one class
        self.val_predicted = nn.ModuleList(MulticlassConfusionMatrix(num_labels) for _ in self.spec.dev) \
            if not self.regression else None
        # counts of tokens hold no NaN: a check would read the device (a host sync) every step
        self.train_real_tokens, self.train_padded_tokens = (SumMetric(nan_strategy="disable"),
                                                            SumMetric(nan_strategy="disable"))
        self.history: list[dict] = []

    # -- the model ---------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.predict_majority and self.majority is None:
            self.majority = int(self.trainer.datamodule.train_label_counts().argmax())

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Logits (B, K), or scores (B,) for regression."""
        if self.predict_majority:
            logits = F.one_hot(torch.tensor(self.majority, device=self.device), self.spec.num_labels).float()
            return logits.expand(batch["input_ids"].shape[0], -1)
        logits = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        return logits.squeeze(-1) if self.regression else logits

    def _loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        if self.regression:
            return F.mse_loss(logits.float(), labels)
        return F.cross_entropy(logits.float(), labels)  # log softmax(C W^T) (§4.1)

    # -- steps -------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        if self.predict_majority:
            raise RuntimeError("predict_majority trains nothing; run validate/predict only")
        loss = self._loss(self(batch), batch["labels"])
        mask = batch["attention_mask"]
        real = mask.sum()
        self.train_real_tokens.update(real)
        self.train_padded_tokens.update(mask.numel() - real)
        self.log("train/loss", loss, prog_bar=True, batch_size=mask.shape[0])
        return loss

    def on_train_epoch_end(self) -> None:
        # padded / real tokens of this epoch's training batches (the cost of padding, §4.1 batches of 32)
        real, padded = self.train_real_tokens.compute(), self.train_padded_tokens.compute()
        waste = float(padded / real.clamp(min=1))
        self.train_real_tokens.reset()
        self.train_padded_tokens.reset()
        self.log("train/padding_waste", waste, sync_dist=True)  # from synced sums: the same on every rank
        self.record_epoch({"train/padding_waste": waste, "train/real_tokens": int(real),
                           "train/padded_tokens": int(padded)})

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        logits = self(batch)
        labels = batch["labels"]
        prefix = list(self.spec.dev.values())[dataloader_idx]
        metrics = self.val_metrics[dataloader_idx]
        predictions = logits.float() if self.regression else logits.argmax(-1)
        metrics.update(predictions, labels)
        if self.val_predicted is not None:
            self.val_predicted[dataloader_idx].update(predictions, labels)
        B = labels.shape[0]
        self.val_loss[dataloader_idx].update(self._loss(logits, labels), weight=B)
        self.log(f"val/{prefix}loss", self.val_loss[dataloader_idx], batch_size=B, add_dataloader_idx=False)
        self.log_dict(metrics, batch_size=B, add_dataloader_idx=False)

    def on_validation_epoch_end(self) -> None:
        if self.val_predicted is None:
            return
        for prefix, confusion in zip(self.spec.dev.values(), self.val_predicted):
            predicted = confusion.compute().sum(dim=0)  # (K,) how often each class was predicted
            # counts synced: the same on every rank
            share = float(predicted.max() / predicted.sum().clamp(min=1))
            self.log(f"val/{prefix}top_class_share", share, sync_dist=True)
            confusion.reset()

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> dict:
        logits = self(batch)
        predictions = logits.float() if self.regression else logits.argmax(-1)
        return {"split": dataloader_idx, "row": batch["row"].cpu(), "prediction": predictions.cpu()}

    # -- checkpoints carry the majority class as well ----------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["majority"] = self.majority

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.majority = checkpoint.get("majority")
