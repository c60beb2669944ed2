"""Training-loop measurements that every run records (results.json carries the averages)."""

from __future__ import annotations

import logging
import time

import lightning as L
import torch

from bert_repro.flops import measured_peak_flops

log = logging.getLogger(__name__)


class Throughput(L.Callback):
    """Real (non-padding) tokens/s, sequences/s and model FLOPs utilisation over the training steps, the
    first ``skip_steps`` excluded (they pay for warm-up, allocation and compilation).

    MFU = the model FLOPs of the steps (the task module's ``batch_flops``, see flops.py) per second and
    device, over ``peak_tflops`` (the accelerator's dense peak from trainer/, e.g. 989 for H100/H200 bf16).
    Without a configured peak, a CPU run measures one with a matmul probe (``peak_source`` says which);
    an accelerator without one reports no MFU rather than a guessed one.
    """

    def __init__(self, skip_steps: int = 1, peak_tflops: float | None = None):
        self.skip_steps = skip_steps
        self.peak_flops = peak_tflops * 1e12 if peak_tflops else None
        self.peak_source = "config" if peak_tflops else None
        self.tokens_per_s: float | None = None
        self.sequences_per_s: float | None = None
        self.flops_per_s: float | None = None  # model FLOP/s of one device
        self.mfu: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._tokens = self._sequences = self._batches = 0
        self._flops = 0.0
        self._start: float | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._reset()
        if self.peak_flops is None and pl_module.device.type == "cpu":
            self.peak_flops, self.peak_source = measured_peak_flops("cpu"), "measured fp32 matmul"
        elif self.peak_flops is None:
            log.warning("no speed.peak_tflops for %s: MFU is not reported", pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._start is None and self._batches >= self.skip_steps:
            self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._batches += 1
        if self._start is None:
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()  # the step's kernels are done before the clock reads
        mask = batch["attention_mask"]
        self._tokens += int(mask.sum())
        self._sequences += int(mask.shape[0])
        batch_flops = getattr(pl_module, "batch_flops", None)
        if batch_flops is not None:
            self._flops += batch_flops(batch)
        elapsed = time.perf_counter() - self._start
        if elapsed <= 0:
            return
        world = trainer.world_size  # every rank sees its own shard of the global batch
        self.tokens_per_s = self._tokens * world / elapsed
        self.sequences_per_s = self._sequences * world / elapsed
        metrics = {"perf/tokens_per_s": self.tokens_per_s, "perf/sequences_per_s": self.sequences_per_s}
        if self._flops:
            self.flops_per_s = self._flops / elapsed
            metrics["perf/tflops_per_device"] = self.flops_per_s / 1e12
            if self.peak_flops:
                self.mfu = self.flops_per_s / self.peak_flops
                metrics["perf/mfu"] = self.mfu
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=False)

    def summary(self) -> dict:
        """The run's averages, for results.json."""
        return {"tokens_per_s": self.tokens_per_s, "sequences_per_s": self.sequences_per_s,
                "tflops_per_device": self.flops_per_s / 1e12 if self.flops_per_s else None,
                "peak_tflops": self.peak_flops / 1e12 if self.peak_flops else None,
                "peak_source": self.peak_source, "mfu": self.mfu}
