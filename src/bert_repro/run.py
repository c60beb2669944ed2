"""One run, from a composed Hydra config to ``results.json``: what ``src/train.py`` hands over to."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from bert_repro.callbacks import Throughput
from bert_repro.metrics import degenerate_reason
from bert_repro.results import git_revision, print_results, write_results

log = logging.getLogger(__name__)


class UsageError(Exception):
    """A wrong input (unknown task module, inconsistent batch sizes, missing data): message, exit code 2."""


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def check_task_built(cfg: DictConfig) -> None:
    """A task whose LightningModule or DataModule a later issue builds fails here, clearly, before any work."""
    for key in ("module", "data"):
        target = cfg[key]["_target_"]
        module_path = target.rsplit(".", 1)[0]
        if importlib.util.find_spec(module_path) is None:
            raise UsageError(
                f"task={cfg.task.name} needs {target}, which is not built yet "
                f"(planned in {cfg.task.get('planned_in', 'a later issue')}); no result was produced"
            )


def _world_size(trainer_cfg: DictConfig) -> int:
    devices, nodes = trainer_cfg.devices, int(trainer_cfg.get("num_nodes", 1))
    if isinstance(devices, int):
        count = devices
    elif isinstance(devices, str) and devices.lstrip("-").isdigit():
        count = int(devices)
    elif devices in (-1, "auto") and trainer_cfg.accelerator in ("gpu", "cuda"):
        count = torch.cuda.device_count()
    elif devices == "auto" or devices == -1:
        count = 1
    else:
        count = len(devices)
    return max(1, count) * nodes


def split_batch(global_batch: int, trainer_cfg: DictConfig) -> tuple[int, int]:
    """Global batch is the truth (STYLE 8): per-device x devices x accumulation must equal it."""
    world = _world_size(trainer_cfg)
    per_device = trainer_cfg.get("per_device_batch_size") or global_batch // world
    accumulation = global_batch // max(1, per_device * world)
    if per_device < 1 or per_device * world * accumulation != global_batch:
        raise UsageError(
            f"global batch {global_batch} is not per_device_batch_size ({per_device}) x devices ({world}) x "
            f"an integer accumulation; pick trainer.per_device_batch_size dividing {global_batch // world}"
        )
    return per_device, accumulation


def build_trainer(cfg: DictConfig, accumulation: int, output_dir: Path) -> tuple[L.Trainer, ModelCheckpoint]:
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    checkpoint = ModelCheckpoint(
        dirpath=output_dir / "checkpoints", filename="best", monitor=cfg.task.monitor,
        mode=cfg.task.monitor_mode, save_top_k=1, save_last=True, auto_insert_metric_name=False,
    )
    callbacks = [checkpoint, Throughput()]
    if loggers:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    optim = cfg.optim
    trainer_kwargs = {k: v for k, v in _plain(cfg.trainer).items() if k not in ("per_device_batch_size", "compile")}
    step_interval = isinstance(optim.val_check_interval, int) and optim.val_check_interval > 1
    trainer = instantiate(
        trainer_kwargs,
        max_steps=optim.max_steps,
        max_epochs=optim.epochs if optim.epochs is not None else -1,
        val_check_interval=min(optim.val_check_interval, optim.max_steps) if step_interval and optim.max_steps > 0
        else optim.val_check_interval,
        check_val_every_n_epoch=None if step_interval else 1,
        limit_val_batches=optim.limit_val_batches,
        gradient_clip_val=optim.gradient_clip_val,
        accumulate_grad_batches=accumulation,
        callbacks=callbacks,
        logger=loggers or False,
        default_root_dir=str(output_dir),
    )
    return trainer, checkpoint


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for name, value in metrics.items():
        value = float(value.item() if isinstance(value, torch.Tensor) else value)
        out[name] = value if math.isfinite(value) else None
    return out


def predict_test(trainer: L.Trainer, module: L.LightningModule, datamodule: L.LightningDataModule,
                 out_dir: Path) -> dict[str, str]:
    """Test-set predictions of the module's current weights, written in the task's submission format
    (the GLUE server's files). Returns split -> file; empty on the ranks other than 0."""
    datamodule.setup("predict")  # a no-op after fit; the selection tool predicts from a checkpoint
    if not datamodule.test_splits:
        log.warning("test=true, but task=%s has no test file here; nothing predicted", datamodule.task)
        return {}
    outputs = trainer.predict(module, datamodule=datamodule) or []
    flat = [o for group in outputs for o in (group if isinstance(group, list) else [group])]
    if trainer.world_size > 1:  # each rank predicted its own share of every test set
        gathered: list[Any] = [None] * trainer.world_size
        torch.distributed.all_gather_object(gathered, flat)
        flat = [o for part in gathered for o in part]
    return datamodule.write_predictions(flat, out_dir) if trainer.is_global_zero else {}


def train(cfg: DictConfig) -> dict[str, Any]:
    """Build data, model and trainer from ``cfg``, fit, validate the final weights, write results.json."""
    start = time.time()
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    check_task_built(cfg)
    L.seed_everything(cfg.seed, workers=True)

    loaded = None
    data_overrides: dict[str, Any] = {}
    if cfg.init:
        from bert_repro.convert import load_checkpoint

        loaded = load_checkpoint(cfg.init)
        if loaded.vocab is not None and cfg.data.get("tokenizer", "absent") is None:
            from bert_repro.tokenization import save_vocab, tokenizer_from_vocab

            vocab_path = output_dir / "init_vocab.txt"
            save_vocab(tokenizer_from_vocab(loaded.vocab, bool(loaded.lowercase)), vocab_path)
            data_overrides.update(tokenizer=str(vocab_path), lowercase=bool(loaded.lowercase))

    per_device, accumulation = split_batch(int(cfg.data.batch_size), cfg.trainer)
    datamodule = instantiate(cfg.data, batch_size=per_device, _convert_="all", **data_overrides)
    if cfg.test and not hasattr(datamodule, "write_predictions"):
        raise UsageError(f"test=true: task={cfg.task.name} has no test predictions")
    datamodule.prepare_tokenizer()

    model_cfg = {**_plain(cfg.model), "vocab_size": len(datamodule.vocab)}
    module = instantiate(cfg.module, model=model_cfg, optim=_plain(cfg.optim), _convert_="all")
    module.vocab, module.lowercase = list(datamodule.vocab), bool(datamodule.lowercase)
    missing_heads: list[str] = []
    if loaded is not None:
        missing_heads = module.load_pretrained(loaded)
    if cfg.trainer.get("compile"):
        module.model.compile()

    trainer, checkpoint = build_trainer(cfg, accumulation, output_dir)
    status = "complete"
    majority = bool(cfg.task.get("predict_majority", False))  # §4.1 WNLI: the majority class, nothing trained
    test_files: dict[str, str] = {}
    try:
        if not majority:
            trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
        if majority or not trainer.fast_dev_run:  # one dict per dev set (MNLI: matched, mismatched)
            final = _floats({k: v for d in trainer.validate(module, datamodule=datamodule, verbose=False)
                             for k, v in d.items()})
        else:
            final = _floats(trainer.callback_metrics)
        if trainer.interrupted:
            status = "interrupted"
        elif cfg.test and not trainer.fast_dev_run:
            test_files = predict_test(trainer, module, datamodule, output_dir / "test_predictions")
    finally:
        for logger in trainer.loggers:
            if hasattr(logger, "experiment") and hasattr(logger.experiment, "finish"):
                logger.experiment.finish()  # W&B: close even when the run failed, so a sweep goes on

    throughput = next(c for c in trainer.callbacks if isinstance(c, Throughput))
    best_score = checkpoint.best_model_score
    results = {
        "status": status,
        "task": cfg.task.name,
        "model": HydraConfig.get().runtime.choices.get("model") if HydraConfig.initialized() else None,
        "model_config": model_cfg,
        "ablation": cfg.ablation.name,
        "scale": cfg.scale.name,
        "seed": cfg.seed,
        "init": cfg.init,
        "missing_heads": missing_heads,
        "predict_majority": majority,
        "monitor": cfg.task.monitor,
        "metrics": {"final": final, "best": {cfg.task.monitor: float(best_score) if best_score is not None else None},
                    "best_checkpoint": checkpoint.best_model_path or None,
                    "per_epoch": getattr(module, "history", None)},
        "degenerate": None if majority else degenerate_reason(final),  # e.g. collapsed onto the majority class
        "data_sizes": {split: len(d) for split, d in getattr(datamodule, "datasets", {}).items()} or None,
        "test_predictions": test_files or None,
        "global_step": trainer.global_step,
        "global_batch": int(cfg.data.batch_size),
        "per_device_batch": per_device,
        "accumulation": accumulation,
        "world_size": trainer.world_size,
        "tokens_per_s": throughput.tokens_per_s,
        "sequences_per_s": throughput.sequences_per_s,
        "wall_time_s": round(time.time() - start, 2),
        "git": git_revision(),
        "config": _plain(cfg),
    }
    if trainer.is_global_zero:
        write_results(output_dir / "results.json", results)
        print_results(results)
    return results


def main(cfg: DictConfig) -> float | None:
    try:
        results = train(cfg)
    except (UsageError, FileNotFoundError, ValueError) as err:  # wrong input: a message, not a traceback
        if os.environ.get("BERT_REPRO_TRACEBACK"):
            raise
        log.error("%s (set BERT_REPRO_TRACEBACK=1 for the traceback)", err)
        raise SystemExit(2) from None
    return results["metrics"]["final"].get(cfg.task.monitor)
