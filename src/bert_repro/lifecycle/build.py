"""What a run builds from its RunSpec (spec.py), in the order run.py calls them: the DataModule, the task
module with init='s weights, the resume point's checks, and after the fit the test predictions."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from bert_repro.convert.safe import safe_torch_load
from bert_repro.identity import (
    checkpoint_identity,
    describe,
    head_mismatch,
    resume_refusal,
    run_identity,
    vocab_refusal,
)
from bert_repro.lifecycle.callbacks import ProgressLines
from bert_repro.lifecycle.checks import UsageError
from bert_repro.lifecycle.spec import RunSpec
from bert_repro.speed import compile_model

log = logging.getLogger(__name__)


def build_module(spec: RunSpec, datamodule: L.LightningDataModule, training: bool,
                 optim: dict[str, Any] | None = None) -> tuple[L.LightningModule, dict[str, Any]]:
    """The task module on the spec's encoder with init='s weights, its identity set; and the weights' report
    (the encoder config that runs, heads left at random, why a trained head was dropped). ``training``: the
    speed options and torch.compile (an evaluation runs model.py's plain path)."""
    vocab = spec.vocab if spec.vocab is not None else datamodule.vocab  # pre-training: trained on its corpus
    lowercase = spec.lowercase if spec.vocab is not None else bool(datamodule.lowercase)
    encoder = spec.model if "vocab_size" in spec.model else {**spec.model, "vocab_size": len(vocab)}
    cfg = spec.cfg
    speed = OmegaConf.to_container(cfg.speed, resolve=True) if training else None
    module = instantiate(cfg.module, model=encoder, optim=optim or spec.config["optim"], lowercase=lowercase,
                         speed=speed, _convert_="all", _partial_=True)(vocab=list(vocab))  # as build_data's
    module.identity = run_identity(spec.task, module, labels(datamodule, module),
                                   cfg.data.get("max_seq_length"), spec.science)
    missing, dropped = (load_weights(module, spec.loaded, module.identity, whole_module=not training)
                        if spec.loaded is not None else ([], None))
    if training and (device := compiled_on(cfg)):
        compile_model(module.model, device)
    return module, {"model_config": encoder, "missing_heads": missing, "init_head_dropped": dropped}


def compiled_on(cfg: DictConfig) -> str | None:
    """The device type speed.compile compiles the training step for ("cpu", "cuda"); None without it."""
    if not cfg.speed.compile:
        return None
    return "cpu" if cfg.trainer.accelerator == "cpu" or not torch.cuda.is_available() else "cuda"


def build_data(spec: RunSpec) -> L.LightningDataModule:
    """The task's DataModule with the run's vocabulary, its tokenizer ready, and the speed options its
    constructor takes."""
    cfg = spec.cfg
    loading = {k: cfg.speed[k] for k in get_class(cfg.data._target_).speed_keys}  # as the class declares
    if "length_bucket" in loading and compiled_on(cfg) != "cuda":
        loading["length_bucket"] = None  # an eager or CPU step takes any length: pad to the longest
    vocab = {"tokenizer": list(spec.vocab), "lowercase": spec.lowercase} if spec.vocab is not None else {}
    # the vocabulary goes to the partial: instantiate's own kwargs become OmegaConf nodes, slow for 30k tokens
    datamodule = instantiate(cfg.data, batch_size=spec.per_device, _convert_="all", _partial_=True,
                             **loading)(**vocab)
    datamodule.prepare_tokenizer()
    return datamodule


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


def labels(datamodule: L.LightningDataModule, module: L.LightningModule) -> list[str] | None:
    """The task's label names as its DataModule declares them (a tagger's tag set too), else the module's."""
    labels = datamodule.labels or module.hparams.get("labels")
    return [str(label) for label in labels] if labels else None


def load_weights(module: L.LightningModule, loaded: Any, identity: dict[str, Any],
                 whole_module: bool) -> tuple[list[str], str | None]:
    """init='s weights into ``module``: (heads left at random, why a trained head was dropped).
    ``whole_module`` (evaluation): our checkpoint of this very task, head and model brings the trained head
    too, another task's or label set's head and another architecture are refused; training keeps the encoder
    and drops any task head, saying so."""
    path, saved = loaded.source, loaded.identity
    trained_head = bool(loaded.ignored)  # parameters beyond the encoder and pre-training heads: a task's head
    if whole_module and trained_head:
        mismatch = head_mismatch(saved, identity)
        if mismatch:
            raise UsageError(f"init={path}: {mismatch}; evaluate it with its own task= (or fine-tune it on "
                             f"task={identity['task']} first)")
        module.refuse_another_model(loaded)  # the whole state below is loaded as this run's architecture
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


def check_resume(ckpt_path: str | None, found: bool, cfg: DictConfig, identity: dict[str, Any],
                 vocab: list[str] | None = None, vocab_source: str | None = None) -> None:
    """The checkpoint a run resumes: this folder's own (``found``) must be this task's (its other science is
    reliability.SameRun's to check); another folder's is refused when it is another task's, another
    setting's outside the keys a schedule it continues may change (identity.SCHEDULE_KEYS), or trained with
    another ``vocab`` than the run's."""
    if ckpt_path is None:
        return
    checkpoint = safe_torch_load(ckpt_path, what="a bert_repro Lightning checkpoint")
    saved = checkpoint_identity(checkpoint)
    if found:
        if saved is not None and saved.get("task") != identity["task"]:
            raise UsageError(f"{ckpt_path}, this run folder's progress, is a checkpoint of "
                             f"{describe(saved)}, not of this run's {describe(identity)}: the folder holds "
                             "another run's. Run in a folder of its own (hydra.run.dir=...), or move it away")
        return
    why = (resume_refusal(ckpt_path, saved, identity, cfg.optim.get("resume_step") is not None)
           or vocab_refusal(ckpt_path, checkpoint.get("vocab"), vocab, vocab_source))
    if why:
        raise UsageError(why)
    if "optimizer_states" not in checkpoint:  # Lightning would fail deep in its restore with a KeyError
        raise UsageError(f"ckpt_path={ckpt_path} holds weights only (a best.ckpt: "
                         "checkpoint.best_weights_only), not the optimizer state a resume needs; start from "
                         f"its weights with init={ckpt_path}, or resume a last.ckpt")


def callback(trainer: L.Trainer, kind: type) -> Any:
    """The trainer's callback of ``kind``; RunRecord is always there (trainer.build_callbacks), Throughput
    unless a user removed it (``~callbacks.throughput``): then results.json has no throughput."""
    return next((c for c in trainer.callbacks if isinstance(c, kind)), None)


def validated_last(trainer: L.Trainer) -> bool:
    """Whether the fit ended with a Dev evaluation of its final weights (ProgressLines saw it)."""
    progress = callback(trainer, ProgressLines)
    return (not trainer.fast_dev_run and progress is not None and trainer.global_step > 0
            and progress.validated_step == trainer.global_step)


def data_sizes(datamodule: L.LightningDataModule) -> dict[str, int] | None:
    return {split: len(d) for split, d in getattr(datamodule, "datasets", {}).items()} or None
