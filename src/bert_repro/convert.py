"""Checkpoint interop: Hugging Face-format directories, original Google TF checkpoints, our Lightning files.

Everything is funnelled through the Hugging Face parameter vocabulary, then one explicit map to ours:

    TF checkpoint --tf_to_hf--> HF names --hf_to_ours--> our BertForPreTraining names
    our model ----ours_to_hf--> HF names (export_hf)

``python -m bert_repro.convert check SRC`` compares our encoder against ``transformers`` layer by layer;
``python -m bert_repro.convert to-hf SRC OUT`` writes any loadable checkpoint in HF format.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from bert_repro.model import BertConfig, BertForPreTraining

log = logging.getLogger(__name__)

HEADS = ("mlm", "nsp")

# HF name under "bert.encoder.layer.N." -> ours. Query/key/value are fused into one `attention.qkv`
# (weight (3H, H) = cat(q, k, v) rows), handled apart from this table.
LAYER_NAMES = {
    "attention.output.dense.": "attention.dense.",
    "attention.output.LayerNorm.": "attention.LayerNorm.",
    "intermediate.dense.": "intermediate.",
    "output.dense.": "output.",
    "output.LayerNorm.": "LayerNorm.",
}
# Pre-training heads; the MLM decoder is tied to the word embeddings, so only its bias is stored.
HEAD_NAMES = {
    "cls.predictions.transform.dense.": "mlm.dense.",
    "cls.predictions.transform.LayerNorm.": "mlm.LayerNorm.",
    "cls.predictions.bias": "mlm.bias",
    "cls.seq_relationship.": "nsp.",
}
QKV = ("query", "key", "value")
_LAYER = re.compile(r"^bert\.encoder\.layer\.(\d+)\.(.+)$")
_ALWAYS_RECREATED = {"bert.embeddings.position_ids"}  # a buffer older HF versions saved

# HF config.json key -> BertConfig field (google-research/bert's bert_config.json uses the same keys).
HF_CONFIG_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position", "type_vocab_size": "type_vocab_size",
    "hidden_dropout_prob": "hidden_dropout", "attention_probs_dropout_prob": "attention_dropout",
    "layer_norm_eps": "layer_norm_eps", "initializer_range": "initializer_range",
}
# Exported architecture by which heads the model carries: (has mlm, has nsp) -> HF class.
ARCHITECTURES = {(True, True): "BertForPreTraining", (True, False): "BertForMaskedLM",
                 (False, True): "BertForNextSentencePrediction", (False, False): "BertModel"}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the encoder; the message names the path."""


@dataclass
class LoadedCheckpoint:
    config: BertConfig
    state_dict: dict[str, Tensor]  # our BertForPreTraining names: "bert.…", "mlm.…", "nsp.…"
    missing_heads: list[str]  # pre-training heads absent from the file ("mlm", "nsp"), left to random init
    vocab: list[str] | None
    lowercase: bool | None
    source: str
    ignored: list[str] = field(default_factory=list)  # parameters with no place in our model (task heads)


# ---------------------------------------------------------------------------------------------- name maps

def _rename(name: str, table: dict[str, str]) -> str | None:
    for old, new in table.items():
        if name.startswith(old):
            return new + name[len(old):]
    return None


def hf_to_ours(hf: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """HF-named tensors (with or without the ``bert.`` prefix) -> (ours, names that have no place in ours)."""
    ours, ignored, qkv = {}, [], {}
    canonical = {}
    for name, tensor in hf.items():
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if name.split(".")[0] in ("embeddings", "encoder", "pooler"):  # a bare BertModel file
            name = "bert." + name
        canonical[name] = tensor
    for name, tensor in canonical.items():
        if name in _ALWAYS_RECREATED:
            continue
        if name == "cls.predictions.decoder.weight":  # tied: must be the word embeddings
            word = canonical.get("bert.embeddings.word_embeddings.weight")
            if word is not None and not torch.equal(tensor, word):
                raise CheckpointError("cls.predictions.decoder.weight differs from the word embeddings; "
                                      "our MLM decoder is tied (§3.3.1) and cannot hold an untied one")
            continue
        if name == "cls.predictions.decoder.bias":  # an alias of cls.predictions.bias in HF
            if "cls.predictions.bias" not in canonical:
                ours["mlm.bias"] = tensor
            continue
        if m := _LAYER.match(name):
            i, rest = m.groups()
            if rest.startswith("attention.self."):
                qkv[f"bert.encoder.layer.{i}.attention.qkv.{rest.split('.')[-1]}", rest.split(".")[2]] = tensor
                continue
            new = _rename(rest, LAYER_NAMES)
            ours[f"bert.encoder.layer.{i}.{new}" if new else name] = tensor
        elif name.startswith("bert."):
            ours[name] = tensor  # embeddings and pooler share HF's names
        elif new := _rename(name, HEAD_NAMES):
            ours[new] = tensor
        else:
            ignored.append(name)
    for key in {k for k, _ in qkv}:
        parts = [qkv.get((key, p)) for p in QKV]
        if any(p is None for p in parts):
            raise CheckpointError(f"{key}: query, key and value must all be present")
        ours[key] = torch.cat(parts, dim=0)  # (3H, H) or (3H,)
    return ours, ignored


def ours_to_hf(ours: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our names -> HF BertForPreTraining names; splits the fused qkv back into query/key/value."""
    to_hf_layer = {v: k for k, v in LAYER_NAMES.items()}
    to_hf_head = {v: k for k, v in HEAD_NAMES.items()}
    hf = {}
    for name, tensor in ours.items():
        if m := _LAYER.match(name):
            i, rest = m.groups()
            if rest.startswith("attention.qkv."):
                kind = rest.split(".")[-1]
                for part, chunk in zip(QKV, tensor.chunk(3, dim=0)):
                    hf[f"bert.encoder.layer.{i}.attention.self.{part}.{kind}"] = chunk
                continue
            hf[f"bert.encoder.layer.{i}.{_rename(rest, to_hf_layer)}"] = tensor
        elif name.startswith("bert."):
            hf[name] = tensor
        else:
            hf[_rename(name, to_hf_head)] = tensor
    return hf


_TF_OPTIMIZER = re.compile(r"(/adam_[mv]$|^global_step$)")  # AdamWeightDecayOptimizer slots, step counter


def tf_to_hf(variables: dict[str, np.ndarray]) -> tuple[dict[str, Tensor], list[str]]:
    """google-research/bert variable names -> HF names; Dense kernels are (in, out), so they are transposed.

    e.g. ``bert/encoder/layer_3/attention/self/query/kernel`` -> ``bert.encoder.layer.3.attention.self.query.weight``
    (transposed), ``cls/predictions/output_bias`` -> ``cls.predictions.bias``, ``cls/seq_relationship/
    output_weights`` (2, H) -> ``cls.seq_relationship.weight`` (already (out, in): not transposed).
    """
    hf, ignored = {}, []
    for name, array in variables.items():
        if _TF_OPTIMIZER.search(name):
            continue
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        parts = name.split("/")
        if parts[0] not in ("bert", "cls"):
            ignored.append(name)  # e.g. run_classifier.py's output_weights / output_bias
            continue
        parts = [p.replace("layer_", "layer.") if re.fullmatch(r"layer_\d+", p) else p for p in parts]
        leaf = parts[-1]
        if leaf == "kernel":
            parts[-1], tensor = "weight", tensor.T.contiguous()
        elif leaf in ("gamma", "output_weights"):
            parts[-1] = "weight"
        elif leaf in ("beta", "output_bias"):
            parts[-1] = "bias"
        elif leaf.endswith("_embeddings"):
            parts.append("weight")
        hf[".".join(parts)] = tensor
    return hf, ignored


# ---------------------------------------------------------------------------------------------- readers

def read_tf_checkpoint(prefix: str | Path) -> dict[str, np.ndarray]:
    """Every variable of a TF checkpoint (``.../bert_model.ckpt``, the prefix of its .index/.data files)."""
    try:
        import tensorflow as tf
    except ImportError as err:
        raise ImportError(f"reading the TensorFlow checkpoint {prefix} needs TensorFlow: "
                          "pip install tensorflow-cpu") from err
    reader = tf.train.load_checkpoint(str(prefix))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def config_from_hf(cfg: dict, path: Path) -> BertConfig:
    """HF config.json or Google's bert_config.json -> BertConfig; refuses what our encoder does not compute."""
    act, pos = cfg.get("hidden_act", "gelu"), cfg.get("position_embedding_type", "absolute")
    # HF's "gelu" is the exact erf GELU, which is ours. (google-research/bert's current modeling.py computes
    # a tanh approximation under the same name; HF and we treat its checkpoints as exact GELU.)
    if act != "gelu" or pos != "absolute":
        raise CheckpointError(f"{path}: hidden_act={act!r}, position_embedding_type={pos!r}; "
                              "the encoder computes only 'gelu' (erf) with 'absolute' positions")
    kwargs = {ours: cfg[theirs] for theirs, ours in HF_CONFIG_KEYS.items() if theirs in cfg}
    kwargs["causal"] = bool(cfg.get("bert_repro_causal", cfg.get("is_decoder", False)))
    try:
        return BertConfig(**kwargs)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: invalid model config: {err}") from err


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


def _first_line(err: BaseException) -> str:
    """torch's unpickling errors run to paragraphs of advice; keep the line that says what was refused."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    advice = ("Weights only load failed", "Check the documentation", "Please file an issue")
    reason = next((line for line in lines if not line.startswith(advice)), lines[0] if lines else "")
    return f"{type(err).__name__}: {reason}"


def safe_torch_load(path: str | Path, map_location="cpu", what: str = "loadable") -> dict:
    """``torch.load`` with ``weights_only=True`` only: tensors and plain containers, never pickled code (a
    checkpoint from elsewhere may carry a payload that unpickling would run). Refusals name the file."""
    try:
        return torch.load(path, weights_only=True, map_location=map_location)
    except FileNotFoundError:
        raise
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError ... for a bad file
        raise CheckpointError(f"{path}: not {what} with torch.load(weights_only=True), which accepts only tensors "
                              f"and plain containers ({_first_line(err)})") from None


def _read_weights(path: Path) -> dict[str, Tensor]:
    if path.suffix != ".safetensors":
        return safe_torch_load(path)
    try:
        from safetensors.torch import load_file
        return load_file(str(path))
    except Exception as err:  # safetensors raises a zoo of types for a damaged file
        raise CheckpointError(f"{path}: cannot read weights ({_first_line(err)})") from None


def _load_hf_dir(path: Path) -> LoadedCheckpoint:
    config = config_from_hf(_read_json(path / "config.json"), path / "config.json")
    files = [path / "model.safetensors", path / "pytorch_model.bin"]
    index = next((path / f"{f.name}.index.json" for f in files if (path / f"{f.name}.index.json").is_file()), None)
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
    return _checked(config, state, ignored, _read_vocab(path / "vocab.txt"), lowercase, path)


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
    return _checked(config, state, ignored_tf + ignored, _read_vocab(prefix.parent / "vocab.txt"),
                    lowercase, prefix)


def _load_lightning(path: Path) -> LoadedCheckpoint:
    ckpt = safe_torch_load(path, what="a readable bert_repro Lightning checkpoint")
    try:
        hparams, weights = ckpt["hyper_parameters"]["model"], ckpt["state_dict"]
    except Exception as err:
        raise CheckpointError(f"{path}: not a bert_repro Lightning checkpoint; expected 'state_dict' and "
                              f"'hyper_parameters.model' ({_first_line(err)})") from None
    try:
        config = BertConfig(**dict(hparams))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: invalid hyper_parameters.model: {err}") from err
    state = {k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")}
    ignored = [k for k in state if k.split(".")[0] not in ("bert", *HEADS)]  # task heads
    state = {k: v for k, v in state.items() if k not in ignored}
    return _checked(config, state, ignored, ckpt.get("vocab"), ckpt.get("lowercase"), path)


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
        raise CheckpointError(f"{path}: vocabulary has {len(vocab)} tokens, the embeddings {config.vocab_size}")
    state = {k: v.float() for k, v in state.items()}
    return LoadedCheckpoint(config, state, missing_heads, vocab, lowercase, str(path), ignored)


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


def hf_config(config: BertConfig, architecture: str, pad_token_id: int = 0) -> dict:
    cfg = {theirs: getattr(config, ours) for theirs, ours in HF_CONFIG_KEYS.items()}
    return {"model_type": "bert", "architectures": [architecture], "hidden_act": "gelu", **cfg,
            "position_embedding_type": "absolute", "pad_token_id": pad_token_id, "tie_word_embeddings": True,
            # HF's BertModel applies a causal mask when is_decoder is set; bert_repro_causal is the source of truth
            "is_decoder": config.causal, "bert_repro_causal": config.causal}


def export_hf(model: BertForPreTraining, out_dir: str | Path, vocab: list[str] | None, lowercase: bool = True,
              missing_heads: list[str] | tuple[str, ...] = ()) -> Path:
    """Write config.json, model.safetensors (HF names), vocab.txt and tokenizer_config.json.

    Heads listed in ``missing_heads`` (random, never trained) are left out rather than passed off as weights.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v for k, v in model.state_dict().items() if k.split(".")[0] not in missing_heads}
    hf = {k: v.detach().to("cpu", torch.float32).clone().contiguous() for k, v in ours_to_hf(state).items()}
    has = {h: any(k.startswith(h + ".") for k in state) for h in HEADS}
    pad = vocab.index("[PAD]") if vocab and "[PAD]" in vocab else 0
    config = hf_config(model.config, ARCHITECTURES[has["mlm"], has["nsp"]], pad)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(hf, str(out / "model.safetensors"), metadata={"format": "pt"})
    if vocab is not None:
        (out / "vocab.txt").write_text("".join(token + "\n" for token in vocab), encoding="utf-8")
        tok = {"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase,
               "model_max_length": model.config.max_position}
        (out / "tokenizer_config.json").write_text(json.dumps(tok, indent=2) + "\n")
    return out


# ---------------------------------------------------------------------------------------------- CLI

SENTENCES = [
    ("The quick brown fox jumps over the lazy dog.", "It was not amused."),
    ("BERT is pre-trained on BooksCorpus and English Wikipedia.", "Fine-tuning takes an hour on a TPU."),
    ("Paris is the capital of France.", "The Eiffel Tower was completed in 1889."),
    ("Hello world!", "Short."),
]


def _batch(loaded: LoadedCheckpoint) -> dict[str, Tensor]:
    """The sentence pairs through the checkpoint's own vocabulary, right-padded to the longest.

    A checkpoint without a vocabulary gets random ids with the same lengths (and a note saying so).
    """
    from bert_repro.tokenization import tokenizer_from_vocab

    if loaded.vocab is None:
        print(f"note: {loaded.source} has no vocabulary; comparing on random token ids")
        lengths = torch.tensor([7, 16, 12, 5])
        ids = torch.randint(0, loaded.config.vocab_size, (len(lengths), int(lengths.max())),
                            generator=torch.Generator().manual_seed(0))
        mask = (torch.arange(ids.shape[1]) < lengths[:, None]).long()
        return {"input_ids": ids * mask, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}
    tokenizer = tokenizer_from_vocab(loaded.vocab, lowercase=loaded.lowercase is not False)
    tokenizer.enable_padding(pad_id=loaded.vocab.index("[PAD]"))
    encodings = tokenizer.encode_batch(SENTENCES)
    return {"input_ids": torch.tensor([e.ids for e in encodings]),
            "token_type_ids": torch.tensor([e.type_ids for e in encodings]),
            "attention_mask": torch.tensor([e.attention_mask for e in encodings])}


@torch.no_grad()
def compare_with_transformers(loaded: LoadedCheckpoint, hf_dir: Path) -> list[tuple[str, float]]:
    """Max |ours - transformers| at real (non-pad) positions: embeddings, each layer, pooled, heads."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    with_mlm = "mlm" not in loaded.missing_heads
    cls = transformers.BertForPreTraining if with_mlm else transformers.BertModel
    theirs = cls.from_pretrained(str(hf_dir), attn_implementation="eager").eval()
    ours = build_model(loaded, nsp="nsp" not in loaded.missing_heads).eval()
    batch = _batch(loaded)
    real = batch["attention_mask"].bool()
    mine = ours(**batch, output_hidden_states=True)
    ref = theirs(**batch, output_hidden_states=True)
    rows = [(f"layer {i}" if i else "embeddings", (a - b)[real].abs().max().item())
            for i, (a, b) in enumerate(zip(mine.hidden_states, ref.hidden_states, strict=True))]
    base = theirs.bert if with_mlm else theirs
    pooled = base.pooler(ref.hidden_states[-1])
    rows.append(("pooled", (ours.bert.pooler(mine.last_hidden_state) - pooled).abs().max().item()))
    if with_mlm:
        rows.append(("mlm logits", (mine.mlm_logits - ref.prediction_logits)[real].abs().max().item()))
        if mine.nsp_logits is not None:
            rows.append(("nsp logits", (mine.nsp_logits - ref.seq_relationship_logits).abs().max().item()))
    return rows


def _check(src: str, tol: float) -> int:
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("error: `check` compares against the reference implementation: pip install transformers",
              file=sys.stderr)
        return 2
    loaded = load_checkpoint(src)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(src)
        hf_dir = path if path.is_dir() and (path / "config.json").is_file() else None
        if hf_dir is None:  # ours or TF: transformers reads our export of it
            hf_dir = export_hf(build_model(loaded), tmp, loaded.vocab, loaded.lowercase is not False,
                               loaded.missing_heads)
        rows = compare_with_transformers(loaded, hf_dir)
    c = loaded.config
    print(f"{loaded.source}: L={c.num_layers} H={c.hidden_size} A={c.num_heads} V={c.vocab_size}"
          f"{' causal' if c.causal else ''}; missing heads: {', '.join(loaded.missing_heads) or 'none'}")
    print(f"{'output':<12} {'max |diff|':>12}")
    for name, diff in rows:
        print(f"{name:<12} {diff:>12.3e}{'  > tol' if diff > tol else ''}")
    worst = max(diff for _, diff in rows)
    print(f"{'OK' if worst <= tol else 'FAIL'}: max |diff| {worst:.3e} (tol {tol:g})")
    return 0 if worst <= tol else 1


def _to_hf(src: str, out: str) -> int:
    loaded = load_checkpoint(src)
    model = build_model(loaded, nsp="nsp" not in loaded.missing_heads)
    export_hf(model, out, loaded.vocab, loaded.lowercase is not False, loaded.missing_heads)
    print(f"wrote {out} ({ARCHITECTURES['mlm' not in loaded.missing_heads, 'nsp' not in loaded.missing_heads]})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.convert", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="compare our encoder with transformers on real sentences")
    check.add_argument("src", help="HF directory, Google TF checkpoint, or our Lightning .ckpt")
    check.add_argument("--tol", type=float, default=1e-4)
    to_hf = sub.add_parser("to-hf", help="export any loadable checkpoint in Hugging Face format")
    to_hf.add_argument("src")
    to_hf.add_argument("out_dir")
    args = parser.parse_args(argv)
    try:
        return _check(args.src, args.tol) if args.command == "check" else _to_hf(args.src, args.out_dir)
    except (ValueError, ImportError, OSError) as err:  # CheckpointError is a ValueError
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
