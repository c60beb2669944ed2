"""What every task's LightningModule shares: the encoder built from plain hyper-parameters, the
optimizer recipe of the paper, and the vocabulary travelling inside checkpoints."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.fabric.utilities.data import AttributeDict
from torch import nn

from bert_repro.identity import architecture_differences, head_mismatch
from bert_repro.model import BertConfig, Layer
from bert_repro.speed import SpeedOptions

if TYPE_CHECKING:
    from bert_repro.convert.loaders import LoadedCheckpoint

log = logging.getLogger(__name__)


def linear_warmup_decay(warmup_steps: int, total_steps: int):
    """lr factor: linear warm-up to 1 over ``warmup_steps``, then linear decay to 0 at ``total_steps``
    (§3.4)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


def decay_groups(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices (linear weights, embeddings) only; not on LayerNorm or biases (§3.4, released
    code)."""
    decay, no_decay = [], []
    for param in module.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class BertTaskModule(L.LightningModule):
    """Base of the task modules. Subclasses build ``self.model`` in ``__init__`` from ``model`` (a plain
    dict of BertConfig fields), pass ``vocab`` and ``lowercase`` on, and call ``save_hyperparameters()`` so
    ``load_from_checkpoint`` works. ``speed``: SpeedOptions fields from speed/ (how fast, never what is
    computed), passed to the model's constructor; None runs model.py's plain path."""

    def __init__(self, model: dict, optim: dict, vocab: list[str] | None = None, lowercase: bool = True,
                 speed: dict | None = None):
        super().__init__()
        self.config = BertConfig(**model)
        # "kernels": checkpoints written before speed.fast_kernels was the option's one name
        speed = {("fast_kernels" if k == "kernels" else k): v for k, v in (speed or {}).items()}
        self.speed = SpeedOptions(**speed)
        self.optim = dict(optim)
        # the run's vocabulary (run.resolve_vocab): in the hyper-parameters, and in every checkpoint for
        # `init=`
        self.vocab = list(vocab) if vocab is not None else None
        self.lowercase = lowercase
        self.identity: dict[str, Any] | None = None  # what its checkpoints are (identity.run_identity)

    @property
    def hparams_initial(self) -> AttributeDict:  # what loggers record: all but the 30k-token vocabulary
        return AttributeDict({k: v for k, v in super().hparams_initial.items() if k != "vocab"})

    # -- pre-trained weights -------------------------------------------------------------------
    def refuse_another_model(self, loaded: LoadedCheckpoint) -> None:
        """The whole model node must be the checkpoint's but for the fields a run sets for itself
        (identity.RUN_OWN): else refused before any weight is loaded, each difference named."""
        path = loaded.source
        if loaded.config.vocab_size != self.config.vocab_size:
            raise ValueError(
                f"init={path} has a vocabulary of {loaded.config.vocab_size} tokens but the run's tokenizer "
                f"has {self.config.vocab_size}; fine-tune with the checkpoint's own vocab.txt "
                "(data.tokenizer=...)"
            )
        differ = architecture_differences(loaded.config.to_dict(), self.config.to_dict())
        if differ:
            hint = ("use ablation=ltr_no_nsp for a left-to-right (causal) checkpoint"
                    if any(d.startswith("model.causal:") for d in differ) else
                    "choose the model= that matches the checkpoint, or leave model= out to take its shape")
            raise ValueError(f"init={path} is another model than this run's ({'; '.join(differ)}); {hint}")

    def load_pretrained(self, loaded: LoadedCheckpoint) -> list[str]:
        """Load encoder (and matching head) weights read by ``convert.load_checkpoint`` (our .ckpt, an
        HF directory or a TF checkpoint) into this very model (refuse_another_model). Its task head is taken
        when it is this run's (identity.head_mismatch), else named as not taken. Returns the heads left at
        random."""
        self.refuse_another_model(loaded)
        path = loaded.source
        own = self.model.state_dict()
        state = {k: v for k, v in loaded.state_dict.items() if k in own}
        head = loaded.task_head
        fits = (bool(head) and set(head) == {k for k in own if not k.startswith("bert.")}
                and all(v.shape == own[k].shape for k, v in head.items()))
        if (fits and None not in (loaded.identity, self.identity)
                and head_mismatch(loaded.identity, self.identity) is None):
            state.update(head)
        elif loaded.ignored:  # never dropped unsaid: another task's head, or one of unknown provenance
            log.warning("init=%s: its task head (%s) is not this run's head; not loaded", path,
                        ", ".join(loaded.ignored[:4]) + (", ..." if len(loaded.ignored) > 4 else ""))
        missing = sorted(k for k in own if k not in state)
        encoder_missing = [k for k in missing if k.startswith("bert.")]
        if encoder_missing:
            raise ValueError(f"init={path}: encoder weights missing: {encoder_missing[:5]}")
        self.model.load_state_dict(state, strict=False)
        heads = sorted({k.split(".")[0] for k in missing})
        if heads:
            log.warning("init=%s has no weights for %s: randomly initialised", path, ", ".join(heads))
        return heads

    def record_epoch(self, extra: dict[str, Any] | None = None) -> None:
        """Appends this epoch's row to ``history``: the step, the dev metrics logged (``val/``) and
        ``extra``."""
        dev = {k: float(v) for k, v in self.trainer.callback_metrics.items() if k.startswith("val/")}
        self.history.append({"epoch": self.current_epoch, "step": self.global_step, **dev, **(extra or {})})

    # -- checkpoints carry the vocabulary --------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["vocab"] = self.vocab
        checkpoint["lowercase"] = self.lowercase
        checkpoint["identity"] = self.identity
        if hasattr(self, "history"):  # the per-epoch record, so a resumed run reports its whole history
            checkpoint["history"] = list(self.history)

    # also checkpoints without it in hparams
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.vocab = checkpoint.get("vocab", self.vocab)
        self.lowercase = checkpoint.get("lowercase", self.lowercase)
        self.identity = checkpoint.get("identity") or self.identity
        if "history" in checkpoint:
            self.history = list(checkpoint["history"])

    # -- FSDP2 (trainer=fsdp, fsdp_cpu: Lightning's ModelParallelStrategy gives the device mesh) -----------
    def configure_model(self) -> None:
        """One shard unit per encoder layer, gathered only around its own forward and backward, then the
        rest (embeddings, heads) as the root unit; a no-op without a mesh (every other strategy) and on the
        calls after fit's (validate, test), as the module is sharded already."""
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if self.device_mesh is None or isinstance(self, FSDPModule):
            return

        mesh = self.device_mesh["data_parallel"]
        for layer in self.model.modules():
            if isinstance(layer, Layer):
                fully_shard(layer, mesh=mesh)
        fully_shard(self, mesh=mesh)

    # -- the paper's optimizer recipe ------------------------------------------------------------
    def configure_optimizers(self):
        o = self.optim
        groups = decay_groups(self, o["weight_decay"])
        # the fused kernel is the same AdamW update in one pass over the parameters (speed, not science).
        # Lightning's mixed-precision plugin refuses to clip the gradients of an optimizer that unscales them
        # in its own step, as the fused one does: bf16-mixed with gradient_clip_val takes the foreach kernel.
        clips_mixed = bool(self.trainer.gradient_clip_val) and str(self.trainer.precision).endswith("-mixed")
        fused = not clips_mixed and all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                                        for g in groups for p in g["params"])
        optimizer = torch.optim.AdamW(groups, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                                      fused=fused or None)
        # The schedule's length: this run's optimizer steps, or `schedule_steps` when the run is one part of a
        # longer schedule (the two-phase recipe of v2 A.2: phase 1 stops at 90% of it, phase 2 resumes from
        # phase 1's checkpoint, where Lightning restores the step count and this scheduler's position).
        total = int(o.get("schedule_steps") or self.trainer.estimated_stepping_batches)
        max_steps = self.trainer.max_steps
        if o.get("schedule_steps") and max_steps is not None and max_steps > total:
            raise ValueError(f"optim.max_steps={max_steps} runs past optim.schedule_steps={total}, where the "
                             "learning rate is 0; set schedule_steps >= max_steps (or null)")
        warmup = o.get("warmup_steps")
        if warmup is None:
            warmup = int(round((o.get("warmup_ratio") or 0.0) * total))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                     linear_warmup_decay(max(1, int(warmup)), total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
