"""The Lightning Trainer of a run: its arguments from trainer/, its callbacks from callbacks/, the run length
and the schedule's checks from optim, the accumulation that makes up the global batch, and the strategy's
arguments that come from elsewhere (DDP's communication speed: keys, FSDP's mesh over every rank)."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor
from omegaconf import DictConfig, OmegaConf
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from bert_repro.lifecycle.callbacks import ModelSummary, StepCheckpoint
from bert_repro.lifecycle.checks import world_size
from bert_repro.lifecycle.record import RunRecord
from bert_repro.lifecycle.reliability import AtomicCheckpointIO, Preemption, SameRun, slurm_plugins
from bert_repro.lifecycle.spec import RunSpec
from bert_repro.lifecycle.tracking import instantiate_logger, wandb_run_name


def run_length(optim: DictConfig) -> dict[str, int]:
    """optim's length as the Trainer takes it: -1 is no limit (optim.epochs null: the steps alone)."""
    epochs = optim.epochs
    return {"max_steps": int(optim.max_steps), "max_epochs": int(epochs) if epochs is not None else -1}


def optimizer_steps(max_steps: int, max_epochs: int, batches_per_epoch: float, accumulation: int = 1
                    ) -> float:
    """The optimizer steps a Trainer of this length takes over a loader of ``batches_per_epoch`` batches
    (math.inf: an epoch never ends), as its ``estimated_stepping_batches`` counts them for the schedule: it
    stops at whichever of max_steps and max_epochs comes first; an epoch's short last accumulation steps."""
    if max_epochs == -1 or batches_per_epoch == math.inf:
        return math.inf if max_steps == -1 else max_steps
    steps = math.ceil(batches_per_epoch / accumulation) * max(max_epochs, 1)
    return steps if max_steps == -1 else min(steps, max_steps)


def build_callbacks(cfg: DictConfig, science: dict, resume_strict: bool, loggers: list,
                    start: float | None = None) -> list[L.Callback]:
    """callbacks/ (a user's +callbacks.x=... among them), and the two that need the run itself."""
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    # the run's totals over its attempts, before Preemption so the batch saved at a signal is counted
    preempt = next((i for i, c in enumerate(callbacks) if isinstance(c, Preemption)), len(callbacks))
    callbacks.insert(preempt, RunRecord(start))
    # a checkpoint of this folder resumes only under the same science (keys.py), whatever the speed
    callbacks.append(SameRun(science, strict=resume_strict))
    every = (cfg.get("module") or {}).get("checkpoint_every_n_steps")
    if every:  # pre-training's step-<N>.ckpt (§5.3, Figure 4)
        callbacks.append(StepCheckpoint(every))
    if loggers:  # Lightning refuses a learning-rate monitor without a logger
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if cfg.trainer.get("enable_model_summary", True):  # in place of Lightning's own, which would add it
        callbacks.append(ModelSummary())
    return callbacks


# speed.grad_allreduce: torch's DDP communication hook for each dtype (fp32: none, DDP's own all-reduce)
ALLREDUCE_HOOKS = {"fp32": None, "bf16": default_hooks.bf16_compress_hook}


def build_strategy(cfg: DictConfig) -> Any:
    """trainer.strategy with what trainer/ cannot say itself: DDP's bucket size and gradient dtype from
    speed:, FSDP's data-parallel size (every rank: devices x nodes, devices=auto counted here)."""
    strategy = cfg.trainer.strategy
    if not OmegaConf.is_dict(strategy):  # "auto", or a registered name
        return strategy
    if strategy._target_.endswith("DDPStrategy"):
        return instantiate(strategy, bucket_cap_mb=cfg.speed.bucket_cap_mb,
                           ddp_comm_hook=ALLREDUCE_HOOKS[cfg.speed.grad_allreduce])
    if strategy._target_.endswith("ModelParallelStrategy") and strategy.data_parallel_size is None:
        return instantiate(strategy, data_parallel_size=world_size(cfg.trainer))
    return instantiate(strategy)


def build_trainer(spec: RunSpec, resume_strict: bool = False, start: float | None = None) -> L.Trainer:
    """The run's Trainer; W&B names the run by task, the shape that runs and the folder."""
    cfg = spec.cfg
    run_name = wandb_run_name(spec.task, spec.model_name, spec.folder.path.name)
    loggers = [instantiate_logger(c, cfg, run_name) for c in (cfg.get("logger") or {}).values()
               if c is not None]
    optim = cfg.optim
    step_interval = isinstance(optim.val_check_interval, int) and optim.val_check_interval > 1
    every = optim.val_check_interval
    length: dict[str, Any] = dict(
        **run_length(optim),
        val_check_interval=min(every, optim.max_steps) if step_interval and optim.max_steps > 0 else every,
        check_val_every_n_epoch=None if step_interval else 1,
        limit_val_batches=optim.limit_val_batches,
        gradient_clip_val=optim.gradient_clip_val,
    )
    return instantiate(
        cfg.trainer, **length,
        strategy=build_strategy(cfg),
        accumulate_grad_batches=spec.accumulation,
        callbacks=build_callbacks(cfg, spec.science, resume_strict, loggers, start),
        logger=loggers or False,
        default_root_dir=str(spec.folder.path),
        plugins=[AtomicCheckpointIO(), *slurm_plugins()],
    )
