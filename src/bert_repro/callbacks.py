"""Training-loop measurements that every run records (results.json carries the averages)."""

from __future__ import annotations

import logging
import time

import lightning as L
import torch

from bert_repro.flops import accelerator_peak_flops, batch_flops, measured_peak_flops

log = logging.getLogger(__name__)


def module_batch_flops(pl_module: L.LightningModule, batch: dict) -> float:
    """The training FLOPs of ``batch`` through a task module (flops.batch_flops of its BertConfig); 0 without
    one."""
    config = getattr(pl_module, "config", None)  # the task modules' BertConfig
    if config is None:
        return 0.0
    encoder = getattr(getattr(pl_module, "model", None), "bert", None)
    trained = encoder is None or any(p.requires_grad for p in encoder.parameters())
    ltr = bool(getattr(pl_module, "ltr", False))  # the left-to-right LM predicts every next token
    return batch_flops(config, batch, ltr=ltr, trained=trained)


def compute_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of a Lightning precision setting ("bf16-mixed", "16-mixed", "32-true" ...)."""
    precision = str(precision)
    if "bf16" in precision:
        return torch.bfloat16
    return torch.float16 if precision.startswith("16") else torch.float32


class Throughput(L.Callback):
    """Real (non-padding) tokens/s, sequences/s and model FLOPs utilisation over the training steps, the
    first ``skip_steps`` excluded (they pay for warm-up, allocation and compilation).

    MFU = the model FLOPs of the steps (flops.batch_flops of each batch and the module's BertConfig) per
    second and device, over the accelerator's dense peak: ``peak_tflops`` when given (speed.peak_tflops),
    else Lightning's table of known devices at the run's precision (flops.accelerator_peak_flops), else on
    CPU a matmul probe; ``peak_source`` says which. An unknown accelerator reports no MFU, not a guess.
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
        device = pl_module.device
        if self.peak_flops is None and device.type == "cpu":
            self.peak_flops, self.peak_source = measured_peak_flops("cpu"), "measured fp32 matmul"
        elif self.peak_flops is None and device.type == "cuda":
            dtype = compute_dtype(trainer.precision)
            self.peak_flops, self.peak_source = accelerator_peak_flops(device, dtype)
        if self.peak_flops is None:
            log.warning("no known peak for %s and no speed.peak_tflops: MFU is not reported", device)
            self.peak_source = None

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
        self._flops += module_batch_flops(pl_module, batch)
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
        # on the logger's cadence, as Lightning's ThroughputMonitor: self.log costs 1.5 ms, 6 % of a tiny step
        if trainer._logger_connector.should_update_logs:
            pl_module.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=False)

    def summary(self) -> dict:
        """The run's averages, for results.json."""
        return {"tokens_per_s": self.tokens_per_s, "sequences_per_s": self.sequences_per_s,
                "tflops_per_device": self.flops_per_s / 1e12 if self.flops_per_s else None,
                "peak_tflops": self.peak_flops / 1e12 if self.peak_flops else None,
                "peak_source": self.peak_source, "mfu": self.mfu}
