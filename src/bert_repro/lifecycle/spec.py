"""``RunSpec``: the composed config resolved once into what the run is, before anything is built.

What ``init=`` names (after the released default) and the checkpoint it reads, the vocabulary and its source,
the encoder's shape that runs (the checkpoint's unless ``model=`` was given), the task, the run folder, the
global batch split over the devices, and the science (keys.py) of the config as it runs. It is frozen: every
later step reads the spec, and nothing rewrites the composed config (tests/test_run_identity.py freezes it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bert_repro.keys import science
from bert_repro.lifecycle.checks import UsageError, resolve_ckpt_path, split_batch, world_size
from bert_repro.lifecycle.folder import RunFolder
from bert_repro.lifecycle.pretrained import model_name, model_on_command_line, model_shape, resolve_init


@dataclass(frozen=True)
class RunSpec:
    cfg: DictConfig  # the composed config, never written
    folder: RunFolder
    task: str
    init: str | None  # what init= names, after the released default
    loaded: Any  # init's checkpoint as read (convert.LoadedCheckpoint), or None
    vocab: tuple[str, ...] | None  # None: pre-training trains WordPiece on its corpus (the DataModule)
    vocab_source: str | None  # where the vocabulary comes from: init=, data.tokenizer=, or the corpus (None)
    lowercase: bool
    model: dict[str, Any]  # the encoder's shape that runs (vocab_size once the vocabulary is known)
    model_name: str | None  # its name in results.json: the model= choice, or the checkpoint's L.._H.._A..
    config: dict[str, Any]  # the plain config as it runs (the model node is ``model``): results.json's
    science: dict[str, Any]  # its science keys: the run folder's, the checkpoints' and resume's identity
    per_device: int
    accumulation: int
    resume: str | None = None  # the checkpoint fit starts from (checks.resolve_ckpt_path); None: step 0
    resuming: bool = False  # ``resume`` is this run's own progress: its settings must be this run's
    fresh: bool = False  # +force=true: a finished run reruns from scratch, not from its folder's last.ckpt
    majority: bool = False  # §4.1 WNLI: the training run predicts the majority class, nothing trained

    @property
    def monitor(self) -> str:
        return self.cfg.task.monitor


def resolve_vocab(cfg: DictConfig, loaded: Any = None) -> tuple[list[str] | None, bool, str | None]:
    """The run's vocabulary, casing and source: init='s own when data.tokenizer is null, else data.tokenizer's
    (vocab.txt, tokenizer.json, a Hugging Face directory, or one of our .ckpt). None when pre-training trains
    WordPiece on its corpus: the DataModule does, and the module takes it from there."""
    from bert_repro.convert import load_checkpoint
    from bert_repro.tokenization import load_tokenizer, vocab_list

    tokenizer, lowercase = cfg.data.get("tokenizer"), bool(cfg.data.get("lowercase", True))
    if tokenizer is None:
        if loaded is None and cfg.get("init"):
            loaded = load_checkpoint(cfg.init)
        if loaded is not None and loaded.vocab is None and cfg.task.name != "pretrain":
            where = f"no {loaded.vocab_file}" if loaded.vocab_file else "the checkpoint carries none"
            raise ValueError(f"init={cfg.init or loaded.source} has no vocabulary ({where}); fine-tuning "
                             "reads the one the model was pre-trained with: put its vocab.txt there, or give "
                             "it with data.tokenizer=<vocab.txt | tokenizer.json | Hugging Face directory>")
        if loaded is None or loaded.vocab is None:
            return None, lowercase, None
        return list(loaded.vocab), bool(loaded.lowercase), f"init={loaded.source}"
    if str(tokenizer).endswith(".ckpt"):  # e.g. phase 2: phase 1's vocabulary, which its checkpoint carries
        own = load_checkpoint(tokenizer)
        if own.vocab is None:
            raise ValueError(f"data.tokenizer={tokenizer}: the checkpoint carries no vocabulary")
        return (list(own.vocab), bool(own.lowercase if own.lowercase is not None else lowercase),
                f"data.tokenizer={tokenizer}")
    vocab = vocab_list(load_tokenizer(tokenizer, lowercase=lowercase))
    return vocab, lowercase, f"data.tokenizer={tokenizer}"


def locate(key: str, target: str) -> None:
    """``target`` importable (hydra.utils.get_class would log its own error first, then raise)."""
    module, _, name = target.rpartition(".")
    try:
        found = hasattr(importlib.import_module(module), name) if module else False
    except ImportError as err:
        raise UsageError(f"Error locating target '{target}' ({key}._target_): {err}") from None
    if not found:
        raise UsageError(f"Error locating target '{target}' ({key}._target_): {module or target!r} has no "
                         f"{name!r}")


def read_spec(cfg: DictConfig, training: bool = True) -> RunSpec:
    """``cfg`` resolved once, reading init='s checkpoint and the vocabulary's file (``data.tokenizer``): the
    checkpoint it resumes, the vocabulary, the shape, the science, the batch split. ``training``: the global
    batch split over the devices, and a resume; an evaluation runs on one device, from its own checkpoint."""
    from bert_repro.convert.loaders import load_checkpoint

    for key in ("module", "data"):  # a class that does not exist: refused before a checkpoint or data is read
        locate(key, cfg[key]._target_)
    fresh = training and bool(cfg.get("force")) and cfg.ckpt_path == "last"
    resume, resuming = resolve_ckpt_path(cfg.ckpt_path if training and not fresh else None,
                                         cfg.paths.output_dir)
    init, init_path = resolve_init(cfg)  # init= as from_pretrained reads it; the released one by default
    loaded = load_checkpoint(init_path) if init_path else None
    vocab, lowercase, source = resolve_vocab(cfg, loaded)
    per_device, accumulation = (split_batch(int(cfg.data.batch_size), world_size(cfg.trainer),
                                            cfg.speed.per_device_batch_size)
                                if training else (int(cfg.data.batch_size), 1))
    config = OmegaConf.to_container(cfg, resolve=True)
    configured = {**config["model"], "vocab_size": len(vocab)} if vocab is not None else dict(config["model"])
    explicit = model_on_command_line()
    shape = model_shape(configured, loaded.config, explicit) if loaded is not None else configured
    # the recorded config says the shape that runs: a 6-layer checkpoint's run is not the default's 12 layers
    config["model"] = {k: shape.get(k, v) for k, v in config["model"].items()}
    return RunSpec(cfg=cfg, folder=RunFolder(cfg.paths.output_dir), task=cfg.task.name, init=init,
                   loaded=loaded, vocab=tuple(vocab) if vocab is not None else None, vocab_source=source,
                   lowercase=lowercase, model=shape, model_name=model_name(configured, shape, explicit),
                   config=config, science=science(config), per_device=per_device, accumulation=accumulation,
                   resume=resume, resuming=resuming, fresh=fresh,
                   majority=training and bool(cfg.task.get("predict_majority", False)))
