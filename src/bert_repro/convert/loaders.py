"""Loaders: a Hugging Face directory, a Google TF checkpoint or our Lightning ``.ckpt`` -> one
``LoadedCheckpoint`` in our parameter names (``load_checkpoint``, the one entry point)."""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from bert_repro.convert.names import HEADS, config_from_hf, hf_to_ours, tf_to_hf
from bert_repro.convert.safe import CheckpointError, _first_line, safe_torch_load
from bert_repro.identity import IDENTITY_KEY, checkpoint_identity, init_identity, unknown_model_refusal
from bert_repro.model import BertConfig, BertForPreTraining

log = logging.getLogger(__name__)


@dataclass
class LoadedCheckpoint:
    config: BertConfig
    state_dict: dict[str, Tensor]  # our BertForPreTraining names: "bert.…", "mlm.…", "nsp.…"
    missing_heads: list[str]  # pre-training heads absent from the file ("mlm", "nsp"), left to random init
    vocab: list[str] | None
    lowercase: bool | None
    source: str
    ignored: list[str] = field(default_factory=list)  # parameters with no place in our model (task heads)
    identity: dict | None = None  # what it was trained as (identity.py): our .ckpt and exported folders
    init_identity: dict | None = None  # our .ckpt's identity and step (identity.init_identity)
    # the task head's tensors under the task module's names (``classifier.weight``): ours and our exports'
    task_head: dict[str, Tensor] = field(default_factory=dict)
    vocab_file: str | None = None  # the vocab.txt beside it that it is read from; None: the file holds it


ENCODER_FIELDS = {f.name for f in fields(BertConfig)}


def _refuse_unknown(path: Path, node: dict | None) -> None:
    """A model node with fields this encoder does not have is another architecture: refused by name."""
    why = unknown_model_refusal(str(path), {k: v for k, v in (node or {}).items() if k not in ENCODER_FIELDS})
    if why:
        raise CheckpointError(why)



def read_tf_checkpoint(prefix: str | Path) -> dict[str, np.ndarray]:
    """Every variable of a TF checkpoint (``.../bert_model.ckpt``, the prefix of its .index/.data files)."""
    try:
        import tensorflow as tf
    except ImportError as err:
        raise ImportError(f"reading the TensorFlow checkpoint {prefix} needs TensorFlow: "
                          "pip install -e '.[tf]' (or pip install tensorflow-cpu)") from err
    reader = tf.train.load_checkpoint(str(prefix))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: cannot read JSON ({err})") from err


def _read_vocab(path: Path) -> list[str] | None:
    if not path.is_file():
        return None
    vocab = path.read_text(encoding="utf-8").splitlines()  # one token a line; token i has id i
    while vocab and not vocab[-1]:
        vocab.pop()
    return vocab


def _read_weights(path: Path) -> dict[str, Tensor]:
    if path.suffix != ".safetensors":
        return safe_torch_load(path)
    try:
        from safetensors.torch import load_file
        return load_file(str(path))
    except Exception as err:  # safetensors raises a zoo of types for a damaged file
        raise CheckpointError(f"{path}: cannot read weights ({_first_line(err)})") from None


def _load_hf_dir(path: Path) -> LoadedCheckpoint:
    hf = _read_json(path / "config.json")
    identity = hf.get(IDENTITY_KEY) if isinstance(hf.get(IDENTITY_KEY), dict) else None
    # our export says its whole model node twice: in its identity, and as bert_repro_<field> keys
    flags = {k.removeprefix("bert_repro_"): v for k, v in hf.items()
             if k.startswith("bert_repro_") and k != IDENTITY_KEY}
    _refuse_unknown(path, {**flags, **((identity or {}).get("science") or {}).get("model", {})})
    config = config_from_hf(hf, path / "config.json")
    files = [path / "model.safetensors", path / "pytorch_model.bin"]
    indexes = [path / f"{f.name}.index.json" for f in files]
    index = next((f for f in indexes if f.is_file()), None)
    if index is not None:  # sharded: {"weight_map": {name: shard file}}
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        weights = {k: v for shard in shards for k, v in _read_weights(path / shard).items()}
    elif file := next((f for f in files if f.is_file()), None):
        weights = _read_weights(file)
    else:
        raise CheckpointError(f"{path}: no weights; expected model.safetensors or pytorch_model.bin")
    lowercase = None
    if (path / "tokenizer_config.json").is_file():
        lowercase = _read_json(path / "tokenizer_config.json").get("do_lower_case")
    state, ignored = _mapped(weights, path)
    loaded = _checked(config, state, ignored, _read_vocab(path / "vocab.txt"), lowercase, path)
    loaded.identity, loaded.vocab_file = identity, str(path / "vocab.txt")
    if identity is not None:  # our export: its head is under the task module's own names
        loaded.task_head = {k: weights[k].float() for k in ignored}
    return loaded


def _load_tf(prefix: Path) -> LoadedCheckpoint:
    config_file = prefix.parent / "bert_config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{prefix}: a TF checkpoint needs bert_config.json beside it ({config_file})")
    config = config_from_hf(_read_json(config_file), config_file)
    try:
        variables = read_tf_checkpoint(prefix)
    except ImportError:
        raise  # the message says what to install
    except Exception as err:
        raise CheckpointError(f"{prefix}: cannot read TF checkpoint ({type(err).__name__}: {err})") from err
    hf, ignored_tf = tf_to_hf(variables)
    state, ignored = _mapped(hf, prefix)
    # Google's release folders say it: uncased_L-12_H-768_A-12, cased_L-12_H-768_A-12.
    folder = prefix.parent.name.lower()
    lowercase = True if "uncased" in folder else False if "cased" in folder else None
    loaded = _checked(config, state, ignored_tf + ignored, _read_vocab(prefix.parent / "vocab.txt"),
                      lowercase, prefix)
    loaded.vocab_file = str(prefix.parent / "vocab.txt")
    return loaded


def _load_lightning(path: Path) -> LoadedCheckpoint:
    ckpt = safe_torch_load(path, what="a readable bert_repro Lightning checkpoint")
    try:
        hparams, weights = ckpt["hyper_parameters"]["model"], ckpt["state_dict"]
    except Exception as err:
        raise CheckpointError(f"{path}: not a bert_repro Lightning checkpoint; expected 'state_dict' and "
                              f"'hyper_parameters.model' ({_first_line(err)})") from None
    if not isinstance(hparams, dict):
        raise CheckpointError(f"{path}: hyper_parameters.model is not a mapping of encoder fields")
    _refuse_unknown(path, hparams)
    try:
        config = BertConfig(**dict(hparams))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: invalid hyper_parameters.model: {err}") from err
    state = {k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")}
    ignored = [k for k in state if k.split(".")[0] not in ("bert", *HEADS)]  # task heads
    head = {k: state.pop(k).float() for k in ignored}
    loaded = _checked(config, state, ignored, ckpt.get("vocab"), ckpt.get("lowercase"), path)
    loaded.identity, loaded.init_identity = checkpoint_identity(ckpt), init_identity(ckpt)
    loaded.task_head = head
    return loaded


def _mapped(weights: dict[str, Tensor], path: Path) -> tuple[dict[str, Tensor], list[str]]:
    try:
        return hf_to_ours(weights)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from err


def _checked(config: BertConfig, state: dict[str, Tensor], ignored: list[str], vocab: list[str] | None,
             lowercase: bool | None, path: Path) -> LoadedCheckpoint:
    """Every encoder tensor present with the configured shape; heads entirely present or entirely absent."""
    with torch.device("meta"):
        expected = {k: v.shape for k, v in BertForPreTraining(config).state_dict().items()}
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise CheckpointError(f"{path}: parameters the encoder does not have: {unknown[:5]}")
    wrong = [f"{k}: {tuple(v.shape)} != expected {tuple(expected[k])}"
             for k, v in state.items() if v.shape != expected[k]]
    if wrong:
        raise CheckpointError(f"{path}: shapes do not match its config ({config}): " + "; ".join(wrong[:5]))
    missing = sorted(set(expected) - set(state))
    encoder_missing = [k for k in missing if k.startswith("bert.")]
    if encoder_missing:
        raise CheckpointError(f"{path}: encoder weights missing: {encoder_missing[:5]}"
                              + (f" (+{len(encoder_missing) - 5} more)" if len(encoder_missing) > 5 else ""))
    missing_heads = []
    for head in HEADS:
        absent = [k for k in missing if k.startswith(head + ".")]
        if absent and len(absent) < sum(k.startswith(head + ".") for k in expected):
            raise CheckpointError(f"{path}: the {head} head is incomplete; missing {absent}")
        if absent:
            missing_heads.append(head)
    if vocab is not None and len(vocab) > config.vocab_size:
        raise CheckpointError(f"{path}: vocabulary has {len(vocab)} tokens, "
                              f"the embeddings {config.vocab_size}")
    state = {k: v.float() for k, v in state.items()}
    return LoadedCheckpoint(config, state, missing_heads, vocab, lowercase, str(path), ignored)


def read_init_identity(path: str | Path) -> dict | None:
    """``LoadedCheckpoint.init_identity`` of our ``.ckpt`` at ``path``, its tensors mapped, not read; None for
    another kind of checkpoint or a file that cannot be read (its run names why)."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".ckpt":
        return None
    stat = path.stat()  # a file written over is read again
    return _init_identity(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)  # a table's jobs from one pre-training ask of the same file
def _init_identity(path: str, mtime_ns: int, size: int) -> dict | None:
    try:
        return init_identity(safe_torch_load(path, mmap=True))
    except CheckpointError:
        return None


def load_checkpoint(path: str | Path) -> LoadedCheckpoint:
    """Read an HF directory, a Google TF checkpoint (prefix or folder) or our Lightning ``.ckpt`` file."""
    path = Path(path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return _load_hf_dir(path)
        if (path / "bert_config.json").is_file():
            prefixes = sorted(p.with_suffix("") for p in path.glob("*.ckpt*.index"))
            if not prefixes:
                raise CheckpointError(f"{path}: has bert_config.json but no TF checkpoint (*.ckpt*.index)")
            preferred = [p for p in prefixes if p.name == "bert_model.ckpt"]
            return _load_tf((preferred or prefixes)[-1])
        raise CheckpointError(f"{path}: not a checkpoint directory; expected config.json + model.safetensors "
                              "(Hugging Face) or bert_config.json + bert_model.ckpt.* (Google TF)")
    if path.name in ("config.json", "model.safetensors", "pytorch_model.bin"):
        return _load_hf_dir(path.parent)
    if path.suffix == ".index" or ".data-" in path.suffix:
        return _load_tf(path.with_suffix(""))
    if path.with_name(path.name + ".index").is_file():
        return _load_tf(path)
    if path.is_file():
        return _load_lightning(path)
    raise CheckpointError(f"{path}: no such file or directory")


# ---------------------------------------------------------------------------------------------- model I/O

def build_model(loaded: LoadedCheckpoint, nsp: bool = True, **config_overrides) -> BertForPreTraining:
    """Our BertForPreTraining with the checkpoint's weights; absent heads keep their initialisation."""
    model = BertForPreTraining(replace(loaded.config, **config_overrides), nsp=nsp)
    state = {k: v for k, v in loaded.state_dict.items() if nsp or not k.startswith("nsp.")}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:
        raise CheckpointError(f"{loaded.source}: does not fit the overridden config: {err}") from err
    allowed = tuple(f"{head}." for head in loaded.missing_heads)
    if unexpected or any(not k.startswith(allowed) for k in missing):
        raise CheckpointError(f"{loaded.source}: missing {missing}, unexpected {unexpected}")
    heads = [h for h in loaded.missing_heads if nsp or h != "nsp"]
    if heads:
        log.warning("%s has no %s head; it is randomly initialised", loaded.source, " or ".join(heads))
    return model


