"""One run, from a composed Hydra config to ``results.json``: what ``src/train.py`` hands over to.

The data flows one way: the vocabulary is resolved once (``resolve_vocab``) and passed into the DataModule
and the LightningModule as constructor arguments; the checks (checks.py) come before any work, the Trainer
(trainer.py) after the model; results.json (results.py) is written last, or a failure record in its place.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from bert_repro.convert.safe import safe_torch_load
from bert_repro.lifecycle.callbacks import ProgressLines, Throughput, retain_checkpoints
from bert_repro.lifecycle.checks import (
    TRACEBACK_HINT,
    SweepUsageError,
    UsageError,
    check_inputs,
    resolve_ckpt_path,
    split_batch,
)
from bert_repro.lifecycle.finished import config_summary, scale_reads
from bert_repro.lifecycle.folder import RunFolder
from bert_repro.lifecycle.identity import (
    checkpoint_identity,
    describe,
    head_mismatch,
    resume_refusal,
    run_identity,
)
from bert_repro.lifecycle.keys import science
from bert_repro.lifecycle.locks import FolderInUse, RunFolderLock, is_launcher
from bert_repro.lifecycle.pretrained import (
    SHAPE_KEYS,
    model_name,
    model_on_command_line,
    model_shape,
    resolve_init,
)
from bert_repro.lifecycle.record import RunRecord
from bert_repro.lifecycle.reliability import MachineFault, NonFiniteLoss, Preempted, machine_faults_named
from bert_repro.lifecycle.results import RunResult, failure_record, floats, print_results
from bert_repro.lifecycle.tracking import close_loggers, wandb_run_name
from bert_repro.lifecycle.trainer import build_trainer
from bert_repro.metrics import degenerate_reason
from bert_repro.speed import compile_model

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
    # the speed options a DataModule takes (num_workers, num_proc; padding: GLUE and the demo tasks only)
    accepts = inspect.signature(get_class(cfg.data._target_)).parameters
    loading = {k: cfg.speed[k] for k in cfg.speed if k in accepts}
    vocab_args = {"tokenizer": vocab, "lowercase": lowercase} if vocab is not None else {}
    # the vocabulary goes to the partial: instantiate's own kwargs become OmegaConf nodes, 30k tokens ~7 s
    make = instantiate(cfg.data, batch_size=per_device, _convert_="all", _partial_=True, **loading)
    return make(**vocab_args)


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


def speed_options(cfg: DictConfig) -> dict[str, Any]:
    """The speed node (schema.SpeedOptions) as the module's plain hyper-parameter: how fast, never what."""
    return _plain(cfg.speed)


def _labels(datamodule: L.LightningDataModule, module: L.LightningModule) -> list[str] | None:
    """The task's label names: a GLUE-style task's spec, a tagger's tag set; None for the others."""
    spec = getattr(datamodule, "spec", None)  # GLUE-style tasks; a tagger's data module has its tag set
    labels = getattr(spec, "labels", None) or getattr(datamodule, "labels", None)
    labels = labels or module.hparams.get("labels")
    return [str(label) for label in labels] if labels else None


@dataclass
class RunSetup:
    """What a run, an evaluation and a failure record share: the weights read, the data, the module."""

    init: str | None  # what init= names, after the released default
    datamodule: L.LightningDataModule
    module: L.LightningModule
    model_cfg: dict[str, Any]  # the encoder that runs: the checkpoint's shape unless model= was given
    model: str | None  # its name in results.json
    identity: dict[str, Any]
    missing_heads: list[str]
    init_head_dropped: str | None
    per_device: int
    accumulation: int


def record_model(cfg: DictConfig, model_cfg: dict[str, Any]) -> None:
    """The recorded config (results.json, W&B, the checkpoints' science) says the shape that runs: a run from
    a 6-layer checkpoint with no model= is not recorded as the default's 12 layers."""
    with open_dict(cfg):
        for key in SHAPE_KEYS:
            if key in cfg.model:
                cfg.model[key] = model_cfg[key]


def load_weights(module: L.LightningModule, loaded: Any, identity: dict[str, Any],
                 whole_module: bool) -> tuple[list[str], str | None]:
    """init='s weights into ``module``: (heads left at random, why a trained head was dropped).
    ``whole_module`` (evaluation): our checkpoint of this very task and head brings the trained head too,
    another task's or label set's head is refused; training keeps the encoder and drops any task head, saying
    so."""
    path, saved = loaded.source, loaded.identity
    trained_head = bool(loaded.ignored)  # parameters beyond the encoder and pre-training heads: a task's head
    if whole_module and trained_head:
        mismatch = head_mismatch(saved, identity)
        if mismatch:
            raise UsageError(f"init={path}: {mismatch}; evaluate it with its own task= (or fine-tune it on "
                             f"task={identity['task']} first)")
        if Path(path).suffix == ".ckpt":
            state = safe_torch_load(path, what="a bert_repro Lightning checkpoint")["state_dict"]
            own = module.state_dict()
            if set(state) == set(own) and all(state[k].shape == own[k].shape for k in own):
                module.load_state_dict(state)
                return [], None
    dropped = None
    if trained_head and saved and saved.get("task") not in (None, identity["task"]):
        dropped = f"init={path} was fine-tuned on {describe(saved)}: its encoder is taken, its head dropped"
        log.warning("%s", dropped)
    return module.load_pretrained(loaded), dropped


def _locate(key: str, target: str) -> None:
    """``target`` importable (hydra.utils.get_class would log its own error first, then raise)."""
    module, _, name = target.rpartition(".")
    try:
        found = hasattr(importlib.import_module(module), name) if module else False
    except ImportError as err:
        raise UsageError(f"Error locating target '{target}' ({key}._target_): {err}") from None
    if not found:
        raise UsageError(f"Error locating target '{target}' ({key}._target_): {module or target!r} has no "
                         f"{name!r}")


def setup_run(cfg: DictConfig, training: bool, optim: dict[str, Any] | None = None) -> RunSetup:
    """init= resolved and read, the vocabulary, the DataModule, the module with init='s weights, in that
    order: the one sequence train, evaluate and the failure record share. ``training``: the speed options
    and the global batch split over devices; an evaluation runs model.py's path on one device."""
    from bert_repro.convert.loaders import load_checkpoint

    L.seed_everything(cfg.seed, workers=True)
    for key in ("module", "data"):  # a class that does not exist: refused before a checkpoint or data is read
        _locate(key, cfg[key]._target_)
    init, init_path = resolve_init(cfg)  # init= as from_pretrained reads it; the released one by default
    loaded = load_checkpoint(init_path) if init_path else None
    vocab, lowercase = resolve_vocab(cfg, loaded)
    per_device, accumulation = (split_batch(int(cfg.data.batch_size), cfg.trainer,
                                            cfg.speed.per_device_batch_size)
                                if training else (int(cfg.data.batch_size), 1))
    datamodule = build_data(cfg, vocab, lowercase, per_device)
    datamodule.prepare_tokenizer()
    if vocab is None:  # pre-training from scratch: the WordPiece vocabulary trained on the corpus
        vocab, lowercase = list(datamodule.vocab), bool(datamodule.lowercase)

    configured = {**_plain(cfg.model), "vocab_size": len(vocab)}
    explicit = model_on_command_line()
    model_cfg = model_shape(configured, loaded.config, explicit) if loaded is not None else configured
    name = model_name(configured, model_cfg, explicit)
    record_model(cfg, model_cfg)
    module = instantiate(cfg.module, model=model_cfg, optim=optim or _plain(cfg.optim), lowercase=lowercase,
                         speed=speed_options(cfg) if training else None, _convert_="all",
                         _partial_=True)(vocab=vocab)  # as build_data's: not an OmegaConf node
    module.identity = run_identity(cfg.task.name, module, _labels(datamodule, module),
                                   cfg.data.get("max_seq_length"), science(_plain(cfg)))
    missing, dropped = (load_weights(module, loaded, module.identity, whole_module=not training)
                        if loaded is not None else ([], None))
    return RunSetup(init, datamodule, module, model_cfg, name, module.identity, missing, dropped, per_device,
                    accumulation)


def check_resume(ckpt_path: str | None, found: bool, cfg: DictConfig, identity: dict[str, Any]) -> None:
    """``ckpt_path=`` of another run folder: refused when it is another task's, or another setting's outside
    a schedule it continues (this folder's own last.ckpt is checked by reliability.SameRun)."""
    if ckpt_path is None or found:
        return
    checkpoint = safe_torch_load(ckpt_path, what="a bert_repro Lightning checkpoint")
    why = resume_refusal(ckpt_path, checkpoint_identity(checkpoint), identity,
                         cfg.optim.get("resume_step") is not None)
    if why:
        raise UsageError(why)
    if "optimizer_states" not in checkpoint:  # Lightning would fail deep in its restore with a KeyError
        raise UsageError(f"ckpt_path={ckpt_path} holds weights only (a best.ckpt: "
                         "checkpoint.best_weights_only), not the optimizer state a resume needs; start from "
                         f"its weights with init={ckpt_path}, or resume a last.ckpt")


def train(cfg: DictConfig) -> dict[str, Any]:
    """Build data, model and trainer from ``cfg``, fit, validate the final weights, write results.json."""
    start = time.time()
    output_dir = Path(cfg.paths.output_dir)
    if is_launcher():  # once: DDP's other ranks rerun the command
        log.info("%s", config_summary(cfg))
    check_inputs(cfg, output_dir)
    # +force=true: a finished run (finished.py) reruns from scratch, not from its folder's last.ckpt
    fresh = cfg.get("force") and cfg.ckpt_path == "last"
    ckpt_path, found = resolve_ckpt_path(None if fresh else cfg.ckpt_path, output_dir)
    optim = _plain(cfg.optim)
    if found:  # resuming this run's own progress: phase 2's check of phase 1's final step does not apply
        optim["resume_step"] = None
    run = setup_run(cfg, training=True, optim=optim)
    check_resume(ckpt_path, found, cfg, run.identity)
    module, datamodule = run.module, run.datamodule
    if cfg.test and not hasattr(datamodule, "write_predictions"):
        raise UsageError(f"test=true: task={cfg.task.name} has no test predictions")
    apply_speed(cfg, module)

    trainer = build_trainer(cfg, run.accumulation, output_dir, resume_strict=found, start=start,
                            run_name=wandb_run_name(cfg.task.name, run.model, output_dir.name))
    if ckpt_path is not None:
        log.info("resuming from %s", ckpt_path)
    status = "complete"
    majority = bool(cfg.task.get("predict_majority", False))  # §4.1 WNLI: the majority class, nothing trained
    test_files: dict[str, str] = {}
    try:
        if not majority:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        if _validated_last(trainer):  # Dev of the final weights was the fit's last evaluation: not again
            final = floats({k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")})
        elif majority or not trainer.fast_dev_run:  # one dict per dev set (MNLI: matched, mismatched)
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

    throughput = _callback(trainer, Throughput)
    record = _callback(trainer, RunRecord).totals()  # all attempts
    checkpoint = trainer.checkpoint_callback  # callbacks.best: the first ModelCheckpoint
    best_score = checkpoint.best_model_score if checkpoint is not None else None
    best_path = (checkpoint.best_model_path if checkpoint is not None else None) or None
    results = RunResult(
        status=status, task=cfg.task.name, model=run.model, model_config=run.model_cfg,
        ablation=cfg.ablation.name, scale=cfg.scale.name, seed=cfg.seed, init=run.init,
        identity=run.identity, resumed_from=ckpt_path, missing_heads=run.missing_heads,
        init_head_dropped=run.init_head_dropped, predict_majority=majority, monitor=cfg.task.monitor,
        metrics={"final": final,
                 "best": {cfg.task.monitor: float(best_score) if best_score is not None else None},
                 "best_checkpoint": best_path,
                 "per_epoch": getattr(module, "history", None)},
        degenerate=None if majority else degenerate_reason(final),  # e.g. collapsed onto one class
        data_sizes=_sizes(datamodule), test_predictions=test_files or None,
        global_step=trainer.global_step, global_batch=int(cfg.data.batch_size),
        per_device_batch=run.per_device, accumulation=run.accumulation, world_size=trainer.world_size,
        tokens_per_s=throughput.tokens_per_s if throughput else None,
        sequences_per_s=throughput.sequences_per_s if throughput else None,
        perf=throughput.summary() if throughput else None,  # + model FLOP/s per device and MFU
        wall_time_s=record["wall_time_s"], wall_time_attempt_s=round(time.time() - start, 2),
        resumes=record["resumes"], tokens_trained=record["tokens"], flops_trained=record["flops"],
        config=_plain(cfg),
    )
    folder = RunFolder(output_dir)
    if trainer.is_global_zero:
        folder.write(asdict(results))
        if status == "complete":  # the resumable state and unread step checkpoints served an unfinished run
            kept = cfg.checkpoint
            retain_checkpoints(folder, kept.keep_last, kept.keep_steps)
        print_results(asdict(results), scaled=scale_reads(cfg))
    close_loggers(trainer.loggers, asdict(results), folder.results)  # W&B: results.json as the summary
    return asdict(results)


def _callback(trainer: L.Trainer, kind: type) -> Any:
    """The trainer's callback of ``kind``; RunRecord is always there (trainer.build_callbacks), Throughput
    unless a user removed it (``~callbacks.throughput``): then results.json has no throughput."""
    return next((c for c in trainer.callbacks if isinstance(c, kind)), None)


def _validated_last(trainer: L.Trainer) -> bool:
    """Whether the fit ended with a Dev evaluation of its final weights (ProgressLines saw it)."""
    progress = _callback(trainer, ProgressLines)
    return (not trainer.fast_dev_run and progress is not None and trainer.global_step > 0
            and progress.validated_step == trainer.global_step)


def _sizes(datamodule: L.LightningDataModule) -> dict[str, int] | None:
    return {split: len(d) for split, d in getattr(datamodule, "datasets", {}).items()} or None


# wrong input: a message naming it, not a traceback (InstantiationException: a constructor refused its input)
USER_ERRORS = (UsageError, FileNotFoundError, ValueError, PermissionError, InstantiationException,
               OmegaConfBaseException)


def record_failure(cfg: DictConfig, err: BaseException) -> None:
    """results.json with status "failed" and the reason, so a sweep's collector shows the cell as failed;
    never over a completed run's results, and only on rank 0 (the others' folder is the same)."""
    if not is_launcher():
        return
    try:
        folder = RunFolder(cfg.paths.output_dir)
        if folder.status() != "complete":
            folder.write(asdict(failure_record(cfg, err, _model_choice())))
    except (OSError, OmegaConfBaseException) as write_err:  # e.g. an unwritable folder: the message says why
        log.debug("no failure record written: %s", write_err)


class JobFailed(Exception):
    """One job of a multirun failed: Hydra's launcher records it, runs the others, and fails at the end."""


def _no_tip(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("💡 Tip")


def one_voice() -> None:
    """Each Lightning message once, through Hydra's handlers (the console and the run's log file): the
    ``lightning`` package adds a console handler of its own beside them. Its tips to install more go, and the
    srun hint (SLURM runs go through Hydra's submitit launcher, not srun)."""
    if logging.getLogger().handlers:  # Hydra configured logging
        logging.getLogger("lightning").handlers.clear()
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_no_tip)  # added once however often
    warnings.filterwarnings("ignore", message=r"The `srun` command is available")


def main(cfg: DictConfig) -> float | None:
    one_voice()
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    output_dir = Path(cfg.paths.output_dir)
    places = {"hydra.run.dir": output_dir, "paths.cache_dir": Path(cfg.paths.cache_dir)}
    last = RunFolder(output_dir).last
    # one process per run folder: a multirun job locks its own here; a single run's is held from Hydra's start
    # (hydra_hooks.OutputFolderCheck), before anything was written into it
    try:
        with machine_faults_named(places, last), RunFolderLock(output_dir):
            results = train(cfg)
    except FolderInUse as err:  # another live run's folder: nothing of it is touched, no failure recorded
        log.error("%s", err)
        if multirun:
            raise JobFailed(str(err)) from None
        raise SystemExit(2) from None
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
        log.error("%s %s", err, TRACEBACK_HINT)
        if multirun:
            raise JobFailed(str(err)) from None
        raise SystemExit(2) from None
    except NonFiniteLoss as err:  # the run diverged: failed in results.json, never a number
        record_failure(cfg, err)
        log.error("%s", err)
        if multirun:
            raise JobFailed(str(err)) from None
        raise SystemExit(3) from None
    except MachineFault as err:  # a full disk, a read-only folder: the last good checkpoint is kept
        record_failure(cfg, err)
        log.error("%s", err)
        if multirun:
            raise JobFailed(str(err)) from None
        raise SystemExit(74) from None  # sysexits.h EX_IOERR: the machine's fault, not the input's (2)
    except Exception as err:  # a bug, not an input: keep the traceback, but leave the cell marked failed
        record_failure(cfg, err)
        raise
    return results["metrics"]["final"].get(cfg.task.monitor)
