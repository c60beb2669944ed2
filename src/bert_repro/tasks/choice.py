"""Multiple choice for SWAG (§4.4): each of the four sequences [CLS] A [SEP] B_i [SEP] gives C_i, the only new
parameter is a vector V, and softmax over V.C_i is the distribution over the choices."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from bert_repro.heads import SequenceClassifier
from bert_repro.tasks.base import BertTaskModule


class MultipleChoiceModule(BertTaskModule):
    """SWAG's four-way choice. The scorer is the sentence head with one output, Linear(H, 1) on the pooled C_i
    (V, §4.4), applied to the (B x 4) sequences. ``bilstm``: Table 5's "+ BiLSTM" (its final states replace
    the pooled C_i). A causal (§5.1 LTR) encoder is scored at each sequence's last token
    (heads.aggregate_token). Dev metrics: val/acc, val/loss; each epoch leaves a row in ``history``."""

    def __init__(self, model: dict, optim: dict, num_choices: int = 4, bilstm: bool = False,
                 vocab: list[str] | None = None, lowercase: bool = True,
                 speed: dict | None = None):
        super().__init__(model, optim, vocab, lowercase, speed)
        self.save_hyperparameters()
        if num_choices < 2:
            raise ValueError(f"num_choices={num_choices}: a choice needs at least two candidates")
        self.num_choices = num_choices
        # (+ BiLSTM: its states replace the pooled C_i)
        self.model = SequenceClassifier(self.config, 1, bilstm, self.speed)
        self.val_acc = MulticlassAccuracy(num_classes=num_choices, average="micro")
        self.val_loss = MeanMetric()
        self.history: list[dict] = []

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Scores (B, N) of the N candidate sequences of each example, from input_ids (B, N, T)."""
        B, N, T = batch["input_ids"].shape
        if N != self.num_choices:
            raise ValueError(f"batch has {N} choices per example; the module was built for "
                             f"{self.num_choices}")
        flat = {k: batch[k].reshape(B * N, T) for k in ("input_ids", "token_type_ids", "attention_mask")}
        return self.model(flat["input_ids"], flat["token_type_ids"], flat["attention_mask"]).view(B, N)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = F.cross_entropy(self(batch).float(), batch["labels"])  # softmax over the four V.C_i (§4.4)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["labels"].shape[0])
        return loss

    def on_train_epoch_end(self) -> None:
        self.record_epoch()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        scores, labels = self(batch).float(), batch["labels"]
        B = labels.shape[0]
        self.val_acc.update(scores.argmax(-1), labels)
        self.val_loss.update(F.cross_entropy(scores, labels), weight=B)
        self.log("val/acc", self.val_acc, batch_size=B)
        self.log("val/loss", self.val_loss, batch_size=B)

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> dict:
        return {"split": dataloader_idx, "row": batch["row"].cpu(),
                "prediction": self(batch).argmax(-1).cpu()}
