"""Typed configs (Hydra structured configs): a value of the wrong type fails when the config is composed,
with OmegaConf's message naming the key (``optim.lr=abc``), not an hour into a run. A misspelled key
(``optim.lrr=1``) fails there too, as every composed node is closed to new keys. Ranges and relations
between keys are checked at run start (``checks.check_inputs``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class OptimConfig:
    """The optimizer recipe and run length (§3.4, §4): conf/base/finetune.yaml and task/pretrain.yaml."""

    lr: float = 2e-5
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-6
    weight_decay: float = 0.01
    warmup_steps: int | None = None
    warmup_ratio: float | None = None
    max_steps: int = -1
    epochs: int | None = None
    gradient_clip_val: float | None = None
    val_check_interval: Any = 1.0  # a fraction of an epoch, or a number of steps
    limit_val_batches: Any = 1.0  # a fraction, or a number of batches
    schedule_steps: int | None = None  # the two-phase schedule's length (v2 A.2)
    resume_step: int | None = None  # phase 2: the step phase 1 stopped at


@dataclass
class SpeedConfig:
    """How fast a run goes, never what it computes: conf/trainer/cpu.yaml."""

    per_device_batch_size: int | None = None
    compile: bool = False
    unpad: bool = False
    fast_kernels: bool = True
    pack: bool = False
    attention: str = "auto"
    activation_checkpointing: bool = False
    peak_tflops: float | None = None
    num_workers: int = 0
    num_proc: int = 1
    padding: str = "longest"


def register() -> None:
    """conf/ composes /schema/optim and /schema/speed under the YAML that sets their values."""
    store = ConfigStore.instance()
    store.store(group="schema", name="optim", node=OptimConfig)
    store.store(group="schema", name="speed", node=SpeedConfig)
