"""Pre-training (§3.3): masked LM + next sentence prediction, and the objective ablations of §5.1."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from bert_repro.model import BertForPreTraining
from bert_repro.speed import kernels
from bert_repro.tasks.base import BertTaskModule

IGNORE = -100  # F.cross_entropy's ignore_index: a position that predicts nothing


class PretrainModule(BertTaskModule):
    """loss = mean MLM cross-entropy at the chosen positions + mean NSP cross-entropy (§3.3, A.2).

    ``nsp=False`` drops the NSP head and loss (Table 5 "No NSP"); ``ltr=True`` trains a left-to-right
    LM that predicts every next token (Table 5 "LTR & No NSP": needs ``model.causal``).
    ``checkpoint_every_n_steps`` keeps ``checkpoints/step-<N>.ckpt`` every N optimizer steps, for the
    fine-tuning-vs-steps curve (§5.3, Figure 4); each loads as ``init=`` like ``last.ckpt``. The run's trainer
    writes them (lifecycle/callbacks.StepCheckpoint): where they go is the run folder's to say.
    """

    def __init__(self, model: dict, optim: dict, nsp: bool = True, ltr: bool = False,
                 checkpoint_every_n_steps: int | None = None, vocab: list[str] | None = None,
                 lowercase: bool = True, speed: dict | None = None):
        super().__init__(model, optim, vocab, lowercase, speed)
        self.save_hyperparameters()
        if ltr and (nsp or not self.config.causal):
            raise ValueError("ltr=True is the left-to-right LM: it needs model.causal=true and nsp=false "
                             "(use ablation=ltr_no_nsp)")
        if checkpoint_every_n_steps is not None and checkpoint_every_n_steps < 1:
            raise ValueError(f"checkpoint_every_n_steps={checkpoint_every_n_steps}: expected a positive step "
                             "count or null")
        self.nsp, self.ltr = nsp, ltr
        self.model = BertForPreTraining(self.config, nsp=nsp, speed=self.speed)
        for split in ("train", "val"):
            # the training step's checks of NaNs and labels would read the device (a host sync) every step
            checks = {"nan_strategy": "disable"} if split == "train" else {}
            setattr(self, f"{split}_mlm_loss", MeanMetric(**checks))
            setattr(self, f"{split}_mlm_acc", MeanMetric(**checks))
            if nsp:
                setattr(self, f"{split}_nsp_acc", MulticlassAccuracy(num_classes=2, average="micro",
                                                                     validate_args=split != "train"))

    def on_train_start(self) -> None:
        # Phase 2 of the two-phase schedule (v2 A.2) must continue phase 1's final state, not an earlier one.
        expected = self.optim.get("resume_step")
        if expected is not None and self.trainer.global_step != expected:
            raise ValueError(f"ckpt_path={self.trainer.ckpt_path} resumes at step "
                             f"{self.trainer.global_step}; phase 2 starts at step {expected}, where phase 1 "
                             "ends: pass phase 1's final checkpoint (its checkpoints/last.ckpt), or "
                             "optim.resume_step=null to resume this one anyway")

    def _predictions(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Positions (B, P) to predict, and which of them are real (B, P): the masked ones (§3.3.1),
        or for the left-to-right LM every position whose next token is real."""
        if self.ltr:  # position t predicts token t + 1
            B, T = batch["input_ids"].shape
            positions = torch.arange(T - 1, device=self.device).expand(B, -1)  # (B, T-1)
            return positions, batch["attention_mask"][:, 1:].bool()
        return batch["masked_lm_positions"], batch["masked_lm_weights"] > 0

    def _step(self, batch: dict[str, Tensor], split: str) -> Tensor:
        positions, real = self._predictions(batch)
        ids = batch["input_ids"][:, 1:] if self.ltr else batch["masked_lm_ids"]  # (B, P)
        # the eager CPU step picks the N real predictions out, for its fused decoder + loss; elsewhere all
        # B x P stay and the others are ignored: picking them out would wait for the device (N is the data's)
        picked = kernels.eager_cpu(real)
        targets = ids[real] if picked else ids.masked_fill(~real, IGNORE)  # (N,) or (B, P)
        # speed.fast_kernels may fuse the decoder with the loss (model.MLMHead.loss): then no logits come back
        out = self.model(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"],
                         masked_positions=positions, prediction_mask=real if picked else None,
                         mlm_targets=targets if picked else None)
        if out.mlm_loss is not None:
            mlm_loss, correct = out.mlm_loss, out.mlm_correct
        else:
            logits = out.mlm_logits  # (N, V) or (B, P, V)
            mlm_loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=IGNORE)
            correct = (logits.argmax(-1) == targets).sum()  # an ignored target matches no argmax
        loss = mlm_loss
        n = real.sum()
        getattr(self, f"{split}_mlm_loss").update(mlm_loss.detach(), weight=n)
        getattr(self, f"{split}_mlm_acc").update(correct.float() / n, weight=n)
        metrics = {f"{split}/mlm_loss": getattr(self, f"{split}_mlm_loss"),
                   f"{split}/mlm_acc": getattr(self, f"{split}_mlm_acc")}
        if self.nsp:
            nsp_logits = out.nsp_logits  # (B, 2)
            labels = batch["next_sentence_labels"]
            nsp_loss = F.cross_entropy(nsp_logits.float(), labels)
            loss = loss + nsp_loss
            getattr(self, f"{split}_nsp_acc").update(nsp_logits.argmax(-1), labels)
            metrics[f"{split}/nsp_acc"] = getattr(self, f"{split}_nsp_acc")
            self.log(f"{split}/nsp_loss", nsp_loss, batch_size=len(labels), sync_dist=split == "val")
        on_step = split == "train"
        # weighs the Dev loss's mean; a training step's values are per step (reading n would wait for it)
        size = len(real) if on_step else max(int(n), 1)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=size)
        self.log(f"{split}/loss", loss, prog_bar=True, on_step=on_step, on_epoch=not on_step,
                 batch_size=size,
                 sync_dist=not on_step)  # the Dev loss is the mean over every rank's batches
        return loss

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        # held-out masked-LM perplexity (Table 6 "LM (ppl)"): exp of the prediction-weighted mean loss
        self.log("val/mlm_ppl", math.exp(min(float(self.val_mlm_loss.compute()), 50.0)))
