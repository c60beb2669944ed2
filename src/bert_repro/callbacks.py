"""Training-loop measurements that every run records (results.json carries the averages)."""

from __future__ import annotations

import time

import lightning as L


class Throughput(L.Callback):
    """Real (non-padding) tokens/s and sequences/s over the training steps, the first step excluded
    (it pays for warm-up and allocation)."""

    def __init__(self, skip_steps: int = 1):
        self.skip_steps = skip_steps
        self.tokens_per_s: float | None = None
        self.sequences_per_s: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._tokens = self._sequences = self._batches = 0
        self._start: float | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._reset()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._start is None and self._batches >= self.skip_steps:
            self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._batches += 1
        if self._start is None:
            return
        mask = batch["attention_mask"]
        self._tokens += int(mask.sum())
        self._sequences += int(mask.shape[0])
        elapsed = time.perf_counter() - self._start
        if elapsed > 0:
            world = trainer.world_size  # every rank sees its own shard of the global batch
            self.tokens_per_s = self._tokens * world / elapsed
            self.sequences_per_s = self._sequences * world / elapsed
            pl_module.log_dict({"perf/tokens_per_s": self.tokens_per_s, "perf/sequences_per_s": self.sequences_per_s},
                               on_step=True, on_epoch=False, prog_bar=False)
