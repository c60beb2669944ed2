"""What a run's record adds up over its attempts: a preempted or killed run resumed from its last.ckpt reports
the whole run (wall time, tokens, FLOPs, how often it resumed), not only its last attempt."""

from __future__ import annotations

import time
from typing import Any

import lightning as L

from bert_repro.lifecycle.callbacks import Tally


class RunRecord(L.Callback):
    """Totals kept in every checkpoint (Lightning saves a callback's ``state_dict``) and carried on by the
    attempt that resumes from it. The time between an attempt's last checkpoint and its end is not counted:
    the resumed attempt does that work again, and counts it then."""

    def __init__(self, start: float | None = None):
        self.start = time.time() if start is None else start  # this attempt's start (run.train's clock)
        self.before = {"wall_time_s": 0.0, "tokens": 0, "flops": 0.0}  # the earlier attempts'
        self.resumes = 0
        self.tally, self.world = Tally(), 1  # this attempt's, of one rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.tally.add(pl_module, batch)
        self.world = trainer.world_size  # every rank sees its own shard of the global batch

    def totals(self) -> dict[str, Any]:
        """The run's totals over its attempts, and this attempt's wall time (``attempt_s``)."""
        attempt = time.time() - self.start
        tokens, flops = self.tally.read()
        return {"wall_time_s": round(self.before["wall_time_s"] + attempt, 2), "attempt_s": round(attempt, 2),
                "tokens": self.before["tokens"] + tokens * self.world,
                "flops": self.before["flops"] + flops * self.world,
                "resumes": self.resumes}

    def state_dict(self) -> dict[str, Any]:
        return self.totals()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.before = {k: state_dict.get(k, 0) for k in self.before}
        self.resumes = int(state_dict.get("resumes", 0)) + 1
