"""Token tagging for CoNLL-2003 NER (v1 §4.3): fine-tuned end to end (§3.5), or feature-based with BERT
frozen under a two-layer BiLSTM (§5.4, Table 7). Scored at the entity level (bert_repro.metrics.conll)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from bert_repro.data.conll import CONLL2003_LABELS, IGNORE
from bert_repro.heads import FeatureTagger, TokenTagger
from bert_repro.metrics.conll import EntityF1
from bert_repro.tasks.base import BertTaskModule


class TokenTaggingModule(BertTaskModule):
    """NER over CoNLL-2003's labels. ``features`` (an ``ablation=feature_*`` node: layers, combine,
    lstm_hidden) selects the feature-based approach of §5.4; null fine-tunes every parameter with a Linear(H,
    K) per token.
    ``bilstm``: Table 5's "+ BiLSTM" on a fine-tuned encoder. Dev metrics: val/precision, val/recall, val/f1,
    val/token_acc, val/loss; each epoch leaves a row in ``history``."""

    def __init__(self, model: dict, optim: dict, features: dict | None = None, bilstm: bool = False,
                 labels: list[str] | None = None,  # the task's tag set (task.labels); null = CoNLL-2003's
                 vocab: list[str] | None = None, lowercase: bool = True,
                 speed: dict | None = None):
        super().__init__(model, optim, vocab, lowercase, speed)
        self.save_hyperparameters()
        if features is not None and bilstm:
            raise ValueError("ablation.bilstm=true adds a BiLSTM to a fine-tuned encoder; the "
                             "feature-based ablation (features=...) already reads the frozen encoder through "
                             "its own BiLSTM")
        self.labels = tuple(labels) if labels else CONLL2003_LABELS
        K = len(self.labels)
        self.model = (FeatureTagger(self.config, K, **features, speed=self.speed) if features is not None
                      else TokenTagger(self.config, K, bilstm, self.speed))
        self.val_entities = EntityF1(self.labels)
        self.val_loss = MeanMetric()
        self.history: list[dict] = []

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Logits (B, T, K)."""
        return self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    def _loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(self(batch), batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["labels"].shape[0])
        return loss

    def on_train_epoch_end(self) -> None:
        self.record_epoch()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits, labels = self(batch), batch["labels"]
        scored = batch["word"] >= 0  # first pieces of words
        sentence = batch["sentence"][:, None].expand_as(labels)
        self.val_entities.update(sentence[scored], batch["word"][scored], logits.argmax(-1)[scored],
                                 labels[scored])
        words = int(scored.sum())
        self.val_loss.update(self._loss(logits, labels), weight=max(1, words))
        self.log("val/loss", self.val_loss, batch_size=labels.shape[0])

    def on_validation_epoch_end(self) -> None:
        scores = self.val_entities.compute()  # synced over ranks: the same numbers everywhere
        self.val_entities.reset()
        self.log_dict({f"val/{name}": value for name, value in scores.items()})

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> dict:
        scored = batch["word"] >= 0
        sentence = batch["sentence"][:, None].expand_as(scored)
        return {"split": dataloader_idx, "sentence": sentence[scored].cpu(),
                "word": batch["word"][scored].cpu(), "prediction": self(batch).argmax(-1)[scored].cpu()}
