"""One run, from a composed Hydra config to ``results.json``: what ``src/train.py`` hands over to.

The data flows one way: the vocabulary is resolved once (``resolve_vocab``) and passed into the DataModule
and the LightningModule as constructor arguments; the checks (checks.py) come before any work, the Trainer
(trainer.py) after the model; results.json (results.py) is written last, or a failure record in its place.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bert_repro.callbacks import Throughput
from bert_repro.checks import SweepUsageError, UsageError, check_inputs, resolve_ckpt_path, split_batch
from bert_repro.metrics import degenerate_reason
from bert_repro.pretrained import model_name, model_on_command_line, model_shape, resolve_init
from bert_repro.record import RunRecord
from bert_repro.reliability import NonFiniteLoss, Preempted
from bert_repro.results import failure_record, floats, git_revision, print_results, read_status, write_results
from bert_repro.speed import compile_model
from bert_repro.tracking import close_loggers
from bert_repro.trainer import build_trainer

log = logging.getLogger(__name__)

__all__ = ["UsageError", "SweepUsageError", "main", "predict_test", "resolve_vocab", "train"]


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def resolve_vocab(cfg: DictConfig, loaded: Any = None) -> tuple[list[str] | None, bool]:
    """The run's vocabulary and casing, resolved once: init='s own when data.tokenizer is null, else
    data.tokenizer's (vocab.txt, tokenizer.json, a Hugging Face directory, or one of our .ckpt). None when
    pre-training trains WordPiece on its corpus: the DataModule does, and the module takes it from there."""
    from bert_repro.convert import load_checkpoint
    from bert_repro.tokenization import load_tokenizer, vocab_list

    tokenizer, lowercase = cfg.data.get("tokenizer"), bool(cfg.data.get("lowercase", True))
    if tokenizer is None:
        if loaded is None and cfg.get("init"):
            loaded = load_checkpoint(cfg.init)
        if loaded is None or loaded.vocab is None:
            return None, lowercase
        return list(loaded.vocab), bool(loaded.lowercase)
    if str(tokenizer).endswith(".ckpt"):  # e.g. phase 2: phase 1's vocabulary, which its checkpoint carries
        own = load_checkpoint(tokenizer)
        if own.vocab is None:
            raise ValueError(f"data.tokenizer={tokenizer}: the checkpoint carries no vocabulary")
        return list(own.vocab), bool(own.lowercase if own.lowercase is not None else lowercase)
    return vocab_list(load_tokenizer(tokenizer, lowercase=lowercase)), lowercase


def build_data(cfg: DictConfig, vocab: list[str] | None, lowercase: bool,
               per_device: int) -> L.LightningDataModule:
    """The task's DataModule with the run's vocabulary, and the speed options its constructor takes."""
    # padding: GLUE and the demo tasks only
    accepts = inspect.signature(get_class(cfg.data._target_)).parameters
    loading = {k: cfg.speed[k] for k in ("num_workers", "num_proc", "padding") if k in accepts}
    vocab_args = {"tokenizer": vocab, "lowercase": lowercase} if vocab is not None else {}
    return instantiate(cfg.data, batch_size=per_device, _convert_="all", **loading, **vocab_args)


def apply_speed(cfg: DictConfig, module: L.LightningModule) -> None:
    """speed.compile: torch.compile the encoder (the other speed options are constructor arguments)."""
    if cfg.speed.compile:
        on_cpu = cfg.trainer.accelerator == "cpu" or not torch.cuda.is_available()
        compile_model(module.model, "cpu" if on_cpu else "cuda")


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


def _model_choice() -> str | None:
    return HydraConfig.get().runtime.choices.get("model") if HydraConfig.initialized() else None


def train(cfg: DictConfig) -> dict[str, Any]:
    """Build data, model and trainer from ``cfg``, fit, validate the final weights, write results.json."""
    start = time.time()
    output_dir = Path(cfg.paths.output_dir)
    check_inputs(cfg, output_dir)
    ckpt_path, found = resolve_ckpt_path(cfg.ckpt_path, output_dir)
    L.seed_everything(cfg.seed, workers=True)

    loaded = None
    init, init_path = resolve_init(cfg)  # init= as from_pretrained reads it; the released one by default
    if init_path:
        from bert_repro.convert.loaders import load_checkpoint

        loaded = load_checkpoint(init_path)
    vocab, lowercase = resolve_vocab(cfg, loaded)
    per_device, accumulation = split_batch(int(cfg.data.batch_size), cfg.trainer,
                                           cfg.speed.per_device_batch_size)
    datamodule = build_data(cfg, vocab, lowercase, per_device)
    if cfg.test and not hasattr(datamodule, "write_predictions"):
        raise UsageError(f"test=true: task={cfg.task.name} has no test predictions")
    datamodule.prepare_tokenizer()
    if vocab is None:  # pre-training from scratch: the WordPiece vocabulary trained on the corpus
        vocab, lowercase = list(datamodule.vocab), bool(datamodule.lowercase)

    model_cfg = {**_plain(cfg.model), "vocab_size": len(vocab)}
    model_explicit = model_on_command_line()
    if loaded is not None:  # no model= on the command line: the checkpoint's shape
        model_cfg = model_shape(model_cfg, loaded.config, model_explicit)
    optim = _plain(cfg.optim)
    if found:  # resuming this run's own progress: phase 2's check of phase 1's final step does not apply
        optim["resume_step"] = None
    speed = {"kernels": bool(cfg.speed.fast_kernels), "unpad": bool(cfg.speed.unpad),
             "activation_checkpointing": bool(cfg.speed.activation_checkpointing),
             "pack": bool(cfg.speed.pack),
             "attention": str(cfg.speed.attention)}  # speed.SpeedOptions: how fast, never what is computed
    module = instantiate(cfg.module, model=model_cfg, optim=optim, vocab=vocab, lowercase=lowercase,
                         speed=speed, _convert_="all")
    missing_heads = module.load_pretrained(loaded) if loaded is not None else []
    apply_speed(cfg, module)

    trainer = build_trainer(cfg, accumulation, output_dir, resume_strict=found, start=start)
    if ckpt_path is not None:
        log.info("resuming from %s", ckpt_path)
    status = "complete"
    majority = bool(cfg.task.get("predict_majority", False))  # §4.1 WNLI: the majority class, nothing trained
    test_files: dict[str, str] = {}
    try:
        if not majority:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        if majority or not trainer.fast_dev_run:  # one dict per dev set (MNLI: matched, mismatched)
            final = floats({k: v for d in trainer.validate(module, datamodule=datamodule, verbose=False)
                            for k, v in d.items()})
        else:
            final = floats(trainer.callback_metrics)
        if trainer.interrupted:
            status = "interrupted"
        elif cfg.test and not trainer.fast_dev_run:
            test_files = predict_test(trainer, module, datamodule, output_dir / "test_predictions")
    except BaseException:
        close_loggers(trainer.loggers)  # W&B: close a failed run too, so a sweep goes on
        raise

    throughput = next(c for c in trainer.callbacks if isinstance(c, Throughput))
    record = next(c for c in trainer.callbacks if isinstance(c, RunRecord)).totals()  # all attempts
    checkpoint = trainer.checkpoint_callback  # callbacks.best: the first ModelCheckpoint
    best_score = checkpoint.best_model_score if checkpoint is not None else None
    best_path = (checkpoint.best_model_path if checkpoint is not None else None) or None
    results = {
        "status": status,
        "task": cfg.task.name,
        "model": model_name(_plain(cfg.model), model_cfg, model_explicit),
        "model_config": model_cfg,
        "ablation": cfg.ablation.name,
        "scale": cfg.scale.name,
        "seed": cfg.seed,
        "init": init,
        "resumed_from": ckpt_path,
        "missing_heads": missing_heads,
        "predict_majority": majority,
        "monitor": cfg.task.monitor,
        "metrics": {"final": final,
                    "best": {cfg.task.monitor: float(best_score) if best_score is not None else None},
                    "best_checkpoint": best_path,
                    "per_epoch": getattr(module, "history", None)},
        "degenerate": None if majority else degenerate_reason(final),  # e.g. collapsed onto one class
        "data_sizes": {split: len(d) for split, d in getattr(datamodule, "datasets", {}).items()} or None,
        "test_predictions": test_files or None,
        "global_step": trainer.global_step,
        "global_batch": int(cfg.data.batch_size),
        "per_device_batch": per_device,
        "accumulation": accumulation,
        "world_size": trainer.world_size,
        "tokens_per_s": throughput.tokens_per_s,
        "sequences_per_s": throughput.sequences_per_s,
        "perf": throughput.summary(),  # + model FLOP/s per device and MFU against the peak it names
        "wall_time_s": record["wall_time_s"],  # the whole run, over its attempts (record.py)
        "wall_time_attempt_s": round(time.time() - start, 2),
        "resumes": record["resumes"],
        "tokens_trained": record["tokens"],
        "flops_trained": record["flops"],
        "git": git_revision(),
        "config": _plain(cfg),
    }
    if trainer.is_global_zero:
        write_results(output_dir / "results.json", results)
        print_results(results)
    close_loggers(trainer.loggers, results, output_dir / "results.json")  # W&B: results.json as the summary
    return results


# wrong input: a message naming it, not a traceback (InstantiationException: a constructor refused its input)
USER_ERRORS = (UsageError, FileNotFoundError, ValueError, PermissionError, InstantiationException,
               OmegaConfBaseException)


def record_failure(cfg: DictConfig, err: BaseException) -> None:
    """results.json with status "failed" and the reason, so a sweep's collector shows the cell as failed;
    never over a completed run's results, and only on rank 0 (the others' folder is the same)."""
    ranks = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK")  # torchrun, SLURM, Lightning's DDP children
    if any(int(os.environ.get(name, 0)) != 0 for name in ranks):
        return
    try:
        path = Path(cfg.paths.output_dir) / "results.json"
        if read_status(path) != "complete":
            write_results(path, failure_record(cfg, err, _model_choice()))
    except (OSError, OmegaConfBaseException) as write_err:  # e.g. an unwritable folder: the message says why
        log.debug("no failure record written: %s", write_err)


class JobFailed(Exception):
    """One job of a multirun failed: Hydra's launcher records it, runs the others, and fails at the end."""


def main(cfg: DictConfig) -> float | None:
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        results = train(cfg)
    except Preempted as err:  # checkpoint saved: rerunning the command resumes; 128 + signal, as a shell says
        log.warning("%s", err)
        raise SystemExit(128 + int(err.signum)) from None
    except SweepUsageError as err:  # a SystemExit is not a job failure to Hydra: the sweep stops here
        log.error("%s", err)
        raise SystemExit(2) from None
    except USER_ERRORS as err:
        if multirun:
            record_failure(cfg, err)
        if os.environ.get("BERT_REPRO_TRACEBACK"):
            raise
        log.error("%s (set BERT_REPRO_TRACEBACK=1 for the traceback)", err)
        if multirun:
            raise JobFailed(str(err)) from None
        raise SystemExit(2) from None
    except NonFiniteLoss as err:  # the run diverged: failed in results.json, never a number
        record_failure(cfg, err)
        log.error("%s", err)
        if multirun:
            raise JobFailed(str(err)) from None
        raise SystemExit(3) from None
    except Exception as err:  # a bug, not an input: keep the traceback, but leave the cell marked failed
        record_failure(cfg, err)
        raise
    return results["metrics"]["final"].get(cfg.task.monitor)
