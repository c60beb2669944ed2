"""One run, from a composed Hydra config to ``results.json``: what ``src/train.py`` hands over to."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bert_repro.callbacks import Throughput
from bert_repro.metrics import degenerate_reason
from bert_repro.model import Encoder, compile_model
from bert_repro.pretrained import model_name, model_on_command_line, model_shape, resolve_init
from bert_repro.record import RunRecord
from bert_repro.reliability import (
    AtomicCheckpointIO,
    NonFiniteLoss,
    NonFiniteLossGuard,
    Preempted,
    Preemption,
    RNGState,
    SameRun,
    slurm_plugins,
)
from bert_repro.results import git_revision, print_results, read_status, write_results
from bert_repro.tracking import close_loggers, instantiate_logger

log = logging.getLogger(__name__)


class UsageError(Exception):
    """A wrong input (unknown task module, inconsistent batch sizes, missing data): message, exit code 2."""


class SweepUsageError(UsageError):
    """A wrong input common to every job of a multirun: the whole sweep stops, no job is recorded."""


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def check_task_built(cfg: DictConfig) -> None:
    """A task config naming a LightningModule or DataModule that does not exist (a user's own task with a
    typo, or one planned but not built) fails here, clearly, before any work."""
    for key in ("module", "data"):
        target = cfg[key]["_target_"]
        module_path = target.rsplit(".", 1)[0]
        try:
            found = importlib.util.find_spec(module_path) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            planned = cfg.task.get("planned_in")
            raise UsageError(
                f"task={cfg.task.name} needs {key}._target_={target}, which is not built yet"
                + (f" (planned in {planned})" if planned else "") + "; no result was produced"
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


# keys of trainer/ that are not Trainer arguments
NOT_TRAINER_ARGS = ("per_device_batch_size", "compile", "peak_tflops", "unpad", "activation_checkpointing")
# what a checkpoint found in the run folder must share with the run that resumes it: all but speed and places
NOT_SETTINGS = ("trainer", "logger", "paths", "ckpt_path", "checkpoint", "test")


def run_settings(cfg: DictConfig) -> dict[str, Any]:
    settings = {k: v for k, v in _plain(cfg).items() if k not in NOT_SETTINGS}
    data = settings.get("data")
    if isinstance(data, dict):  # speed or places only
        settings["data"] = {k: v for k, v in data.items() if k not in ("num_workers", "num_proc", "cache_dir")}
    return settings


def build_trainer(cfg: DictConfig, accumulation: int, output_dir: Path,
                  resume_strict: bool = False,
                  start: float | None = None) -> tuple[L.Trainer, ModelCheckpoint]:
    loggers = [instantiate_logger(c, cfg) for c in (cfg.get("logger") or {}).values() if c is not None]
    folder = output_dir / "checkpoints"
    keep = cfg.checkpoint.keep_recent
    # best on Dev (the selection the paper does), and last.ckpt: at each validation, and every
    # checkpoint.every_n_steps optimizer steps (what a kill can lose), with keep_recent older ones beside it
    best = ModelCheckpoint(
        dirpath=folder, filename="best", monitor=cfg.task.monitor, mode=cfg.task.monitor_mode, save_top_k=1,
        auto_insert_metric_name=False, enable_version_counter=False,
    )
    last = ModelCheckpoint(
        dirpath=folder, filename="recent-{step}", monitor="step", mode="max", save_top_k=keep, save_last=True,
        every_n_train_steps=cfg.checkpoint.every_n_steps, auto_insert_metric_name=False, enable_version_counter=False,
    )
    callbacks = [best, last, Throughput(peak_tflops=cfg.trainer.get("peak_tflops")), RNGState(), SameRun(run_settings(cfg), strict=resume_strict),
                 NonFiniteLossGuard(), RunRecord(start),  # before Preemption: the saved batch is counted
                 Preemption(folder / "last.ckpt")]
    if loggers:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    optim = cfg.optim
    trainer_kwargs = {k: v for k, v in _plain(cfg.trainer).items() if k not in NOT_TRAINER_ARGS}
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
        plugins=[AtomicCheckpointIO(), *slurm_plugins()],
    )
    return trainer, best


def resolve_ckpt_path(ckpt_path: str | None, output_dir: Path) -> tuple[str | None, bool]:
    """``last``: this run folder's checkpoints/last.ckpt when it exists (so a killed or preempted run resumes by
    rerunning its command; the folder does not depend on the clock), else a fresh start. A named checkpoint
    (phase 1's, for phase 2) is where the run starts; once this run has its own last.ckpt, rerunning the same
    command continues that instead of starting over. Returns the path and whether it is this run's own (then
    its settings must be this run's)."""
    if ckpt_path in (None, "", "null"):
        return None, False
    own = output_dir / "checkpoints" / "last.ckpt"
    if ckpt_path == "last":
        return (str(own), True) if own.is_file() else (None, False)
    if not Path(ckpt_path).is_file():  # a mistyped path is refused even when the folder has progress of its own
        raise UsageError(f"ckpt_path={ckpt_path} does not exist; expected a Lightning checkpoint (.ckpt) to resume, "
                         "'last' (this run folder's checkpoints/last.ckpt, when there is one) or null")
    if own.is_file() and Path(ckpt_path).resolve() != own.resolve():
        log.info("%s holds this run's progress from an earlier attempt: resuming it, not ckpt_path=%s", own, ckpt_path)
        return str(own), True
    return str(ckpt_path), False


def check_inputs(cfg: DictConfig, output_dir: Path) -> None:
    """Inputs that would otherwise fail late, or not at all: refused before any work, each naming the input."""
    optim = cfg.optim
    for key, value in (("optim.lr", optim.lr), ("data.batch_size", cfg.data.batch_size)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise UsageError(f"{key}={value}: expected a positive number")
    if optim.get("epochs") is not None and (not isinstance(optim.epochs, int) or optim.epochs < 1):
        raise UsageError(f"optim.epochs={optim.epochs}: expected a positive whole number of epochs (or null with "
                         "optim.max_steps)")
    if optim.get("max_steps") is not None and optim.max_steps != -1 and optim.max_steps < 1:
        raise UsageError(f"optim.max_steps={optim.max_steps}: expected a positive number of steps, or -1 (epochs decide)")
    if optim.get("epochs") is None and optim.get("max_steps") in (None, -1):
        raise UsageError("optim.epochs and optim.max_steps are both unset: give one, or the run never ends")
    max_seq, max_position = cfg.data.get("max_seq_length"), cfg.model.get("max_position")
    if max_seq is not None and max_position is not None and max_seq > max_position:
        raise UsageError(f"data.max_seq_length={max_seq} exceeds model.max_position={max_position}: the model has "
                         "no position embedding beyond it; lower data.max_seq_length")
    every, keep = cfg.checkpoint.every_n_steps, cfg.checkpoint.keep_recent
    if every is not None and (not isinstance(every, int) or every < 1):
        raise UsageError(f"checkpoint.every_n_steps={every}: expected a positive number of steps, or null")
    if not isinstance(keep, int) or keep < 0:
        raise UsageError(f"checkpoint.keep_recent={keep}: expected 0 or more")
    if HydraConfig.initialized():
        hydra_cfg = HydraConfig.get()
        launcher = str(hydra_cfg.launcher.get("_target_", ""))
        if hydra_cfg.mode == RunMode.MULTIRUN and _world_size(cfg.trainer) > 1 and "submitit" not in launcher:
            raise SweepUsageError(
                f"a local multirun (-m) with {_world_size(cfg.trainer)} devices: Lightning starts each DDP rank by "
                "rerunning the command line, which would start the sweep again inside every job. Run the sweep "
                "with hydra/launcher=submitit_slurm (one SLURM task per device), or its cells one by one")
    try:  # writable before any work: a run that cannot write its results has nothing to show
        output_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output_dir):
            pass
    except OSError as err:
        raise UsageError(f"output folder {output_dir} is not writable ({err.strerror}); choose another with "
                         "hydra.run.dir=... (or hydra.sweep.dir=... for -m)") from None


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
    check_inputs(cfg, output_dir)
    check_task_built(cfg)
    if cfg.optim.get("resume_step") is not None and str(cfg.ckpt_path) in ("last", "None", ""):
        raise UsageError(f"this run continues a schedule at step {cfg.optim.resume_step} (experiment=pretrain_phase2): "
                         "pass ckpt_path=<phase 1's output dir>/checkpoints/last.ckpt")
    ckpt_path, found = resolve_ckpt_path(cfg.ckpt_path, output_dir)
    L.seed_everything(cfg.seed, workers=True)

    loaded = None
    data_overrides: dict[str, Any] = {}
    init, init_path = resolve_init(cfg)  # init= as from_pretrained reads it; the released one by default
    if init_path:
        from bert_repro.convert import load_checkpoint

        loaded = load_checkpoint(init_path)
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
    model_explicit = model_on_command_line()
    if loaded is not None:  # no model= on the command line: the checkpoint's shape
        model_cfg = model_shape(model_cfg, loaded.config, model_explicit)
    optim = _plain(cfg.optim)
    if found:  # resuming this run's own progress: phase 2's check of phase 1's final step does not apply
        optim["resume_step"] = None
    module = instantiate(cfg.module, model=model_cfg, optim=optim, _convert_="all")
    module.vocab, module.lowercase = list(datamodule.vocab), bool(datamodule.lowercase)
    missing_heads: list[str] = []
    if loaded is not None:
        missing_heads = module.load_pretrained(loaded)
    for encoder in (m for m in module.modules() if isinstance(m, Encoder)):  # speed only: the same function
        encoder.unpad = bool(cfg.trainer.get("unpad"))
        encoder.checkpointing = bool(cfg.trainer.get("activation_checkpointing"))
    if cfg.trainer.get("compile"):
        on_cpu = cfg.trainer.accelerator == "cpu" or not torch.cuda.is_available()
        compile_model(module.model, "cpu" if on_cpu else "cuda")

    if "fsdp" in str(_plain(cfg.trainer.strategy)).lower() and cfg.trainer.accelerator == "cpu":
        raise UsageError("trainer=fsdp needs GPUs: Lightning's FSDPStrategy does not run on CPU; use trainer=cpu "
                         "or trainer=ddp_cpu here, trainer=fsdp on a GPU node")
    trainer, checkpoint = build_trainer(cfg, accumulation, output_dir, resume_strict=found, start=start)
    if ckpt_path is not None:
        log.info("resuming from %s", ckpt_path)
    status = "complete"
    majority = bool(cfg.task.get("predict_majority", False))  # §4.1 WNLI: the majority class, nothing trained
    test_files: dict[str, str] = {}
    try:
        if not majority:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        if majority or not trainer.fast_dev_run:  # one dict per dev set (MNLI: matched, mismatched)
            final = _floats({k: v for d in trainer.validate(module, datamodule=datamodule, verbose=False)
                             for k, v in d.items()})
        else:
            final = _floats(trainer.callback_metrics)
        if trainer.interrupted:
            status = "interrupted"
        elif cfg.test and not trainer.fast_dev_run:
            test_files = predict_test(trainer, module, datamodule, output_dir / "test_predictions")
    except BaseException:
        close_loggers(trainer.loggers)  # W&B: close a failed run too, so a sweep goes on
        raise

    throughput = next(c for c in trainer.callbacks if isinstance(c, Throughput))
    record = next(c for c in trainer.callbacks if isinstance(c, RunRecord)).totals()  # all attempts
    best_score = checkpoint.best_model_score
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


# wrong input: a message naming it, not a traceback (InstantiationException: a constructor refused its arguments)
USER_ERRORS = (UsageError, FileNotFoundError, ValueError, PermissionError, InstantiationException, OmegaConfBaseException)


def record_failure(cfg: DictConfig, err: BaseException) -> None:
    """results.json with status "failed" and the reason, so a sweep's collector shows the cell as failed; never
    over a completed run's results, and only on rank 0 (the others' folder is the same)."""
    ranks = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK")  # torchrun, SLURM, Lightning's DDP children
    if any(int(os.environ.get(name, 0)) != 0 for name in ranks):
        return
    try:
        path = Path(cfg.paths.output_dir) / "results.json"
        if read_status(path) == "complete":
            return
        choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
        write_results(path, {
            "status": "failed", "reason": f"{type(err).__name__}: {err}", "task": cfg.task.name,
            "model": choices.get("model"), "ablation": cfg.ablation.name, "scale": cfg.scale.name, "seed": cfg.seed,
            "init": cfg.init, "monitor": cfg.task.monitor, "metrics": {"final": {}, "best": {}},
            "git": git_revision(), "config": _plain(cfg),
        })
    except (OSError, OmegaConfBaseException) as write_err:  # e.g. the folder is not writable: the message says why
        log.debug("no failure record written: %s", write_err)


class JobFailed(Exception):
    """One job of a multirun failed: Hydra's launcher records it, runs the other jobs, and fails at the end."""


def main(cfg: DictConfig) -> float | None:
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        results = train(cfg)
    except Preempted as err:  # checkpoint saved: rerunning the command resumes; 128 + signal, as a shell reports it
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
