"""Pre-training (§3.3): masked LM + next sentence prediction, and the objective ablations of §5.1."""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from bert_repro.model import BertForPreTraining
from bert_repro.tasks.base import BertTaskModule


class PretrainModule(BertTaskModule):
    """loss = mean MLM cross-entropy at the chosen positions + mean NSP cross-entropy (§3.3, A.2).

    ``nsp=False`` drops the NSP head and loss (Table 5 "No NSP"); ``ltr=True`` trains a left-to-right
    LM that predicts every next token (Table 5 "LTR & No NSP": needs ``model.causal``).
    """

    def __init__(self, model: dict, optim: dict, nsp: bool = True, ltr: bool = False):
        super().__init__(model, optim)
        self.save_hyperparameters()
        if ltr and (nsp or not self.config.causal):
            raise ValueError("ltr=True is the left-to-right LM: it needs model.causal=true and nsp=false "
                             "(use ablation=ltr_no_nsp)")
        self.nsp, self.ltr = nsp, ltr
        self.model = BertForPreTraining(self.config, nsp=nsp)
        for split in ("train", "val"):
            setattr(self, f"{split}_mlm_loss", MeanMetric())
            setattr(self, f"{split}_mlm_acc", MeanMetric())
            if nsp:
                setattr(self, f"{split}_nsp_acc", MulticlassAccuracy(num_classes=2, average="micro"))

    def _mlm_targets(self, batch: dict[str, Tensor], seq: Tensor) -> tuple[Tensor, Tensor]:
        """Hidden states (N, H) at the predicted positions and their targets (N,), padding dropped."""
        if self.ltr:  # position t predicts token t + 1, wherever t + 1 is a real token
            keep = batch["attention_mask"][:, 1:].bool()  # (B, T-1)
            return seq[:, :-1][keep], batch["input_ids"][:, 1:][keep]
        positions, keep = batch["masked_lm_positions"], batch["masked_lm_weights"] > 0  # (B, P)
        index = positions.unsqueeze(-1).expand(-1, -1, seq.shape[-1])  # (B, P, H)
        return seq.gather(1, index)[keep], batch["masked_lm_ids"][keep]  # (N, H), (N,)

    def _step(self, batch: dict[str, Tensor], split: str) -> Tensor:
        out = self.model.bert(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"])
        seq = out.last_hidden_state  # (B, T, H)
        hidden, targets = self._mlm_targets(batch, seq)
        logits = self.model.mlm(hidden, self.model.bert.embeddings.word_embeddings.weight)  # (N, V)
        mlm_loss = F.cross_entropy(logits.float(), targets)
        loss = mlm_loss
        n = targets.numel()
        getattr(self, f"{split}_mlm_loss").update(mlm_loss.detach(), weight=n)
        getattr(self, f"{split}_mlm_acc").update((logits.argmax(-1) == targets).float().mean(), weight=n)
        metrics = {f"{split}/mlm_loss": getattr(self, f"{split}_mlm_loss"),
                   f"{split}/mlm_acc": getattr(self, f"{split}_mlm_acc")}
        if self.nsp:
            nsp_logits = self.model.nsp(self.model.bert.pooler(seq))  # (B, 2)
            labels = batch["next_sentence_labels"]
            nsp_loss = F.cross_entropy(nsp_logits.float(), labels)
            loss = loss + nsp_loss
            getattr(self, f"{split}_nsp_acc").update(nsp_logits.argmax(-1), labels)
            metrics[f"{split}/nsp_acc"] = getattr(self, f"{split}_nsp_acc")
            self.log(f"{split}/nsp_loss", nsp_loss, batch_size=len(labels))
        on_step = split == "train"
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=max(n, 1))
        self.log(f"{split}/loss", loss, prog_bar=True, on_step=on_step, on_epoch=not on_step, batch_size=max(n, 1))
        return loss

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        # held-out masked-LM perplexity (Table 6 "LM (ppl)"): exp of the prediction-weighted mean loss
        self.log("val/mlm_ppl", math.exp(min(float(self.val_mlm_loss.compute()), 50.0)))
