"""Name maps between the three parameter vocabularies, and the config keys they share.

    TF checkpoint --tf_to_hf--> HF names --hf_to_ours--> our BertForPreTraining names
    our model ----ours_to_hf--> HF names
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from bert_repro.convert.safe import CheckpointError
from bert_repro.model import BertConfig

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
                part, kind = rest.split(".")[2], rest.split(".")[-1]
                qkv[f"bert.encoder.layer.{i}.attention.qkv.{kind}", part] = tensor
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

    e.g. ``bert/encoder/layer_3/attention/self/query/kernel`` ->
    ``bert.encoder.layer.3.attention.self.query.weight``
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


def config_from_hf(cfg: dict, path: Path) -> BertConfig:
    """HF config.json or Google's bert_config.json -> BertConfig; refuses what the encoder cannot compute."""
    act, pos = cfg.get("hidden_act", "gelu"), cfg.get("position_embedding_type", "absolute")
    # HF's "gelu" is the exact erf GELU, which is ours. (google-research/bert's current modeling.py computes
    # a tanh approximation under the same name; HF and we treat its checkpoints as exact GELU.)
    if act != "gelu" or pos != "absolute":
        raise CheckpointError(f"{path}: hidden_act={act!r}, position_embedding_type={pos!r}; "
                              "the encoder computes only 'gelu' (erf) with 'absolute' positions")
    # what a Hub config says about its architecture beyond the shape: another model type, or cross-attention
    # layers, computes something this encoder does not
    if cfg.get("model_type", "bert") != "bert" or cfg.get("add_cross_attention"):
        raise CheckpointError(f"{path}: model_type={cfg.get('model_type')!r}, add_cross_attention="
                              f"{cfg.get('add_cross_attention', False)!r}; the encoder is BERT's (model_type "
                              "'bert') without cross-attention")
    kwargs = {ours: cfg[theirs] for theirs, ours in HF_CONFIG_KEYS.items() if theirs in cfg}
    kwargs["causal"] = bool(cfg.get("bert_repro_causal", cfg.get("is_decoder", False)))
    try:
        return BertConfig(**kwargs)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: invalid model config: {err}") from err



def hf_config(config: BertConfig, architecture: str, pad_token_id: int = 0) -> dict:
    """transformers' config of ``config``; a field transformers' BertModel has no setting for, set away from
    its default (e.g. a pre-LN switch), is refused: the export would compute another model."""
    represented = {*HF_CONFIG_KEYS.values(), "causal"}
    unrepresentable = [f"model.{f.name}={getattr(config, f.name)!r}" for f in fields(config)
                       if f.name not in represented and getattr(config, f.name) != f.default]
    if unrepresentable:
        raise CheckpointError(f"{', '.join(unrepresentable)}: transformers' BERT classes have no such "
                              "setting, so an export would compute another model than the checkpoint's; "
                              "not exported")
    cfg = {theirs: getattr(config, ours) for theirs, ours in HF_CONFIG_KEYS.items()}
    return {"model_type": "bert", "architectures": [architecture], "hidden_act": "gelu", **cfg,
            "position_embedding_type": "absolute", "pad_token_id": pad_token_id, "tie_word_embeddings": True,
            # HF's BertModel masks causally when is_decoder is set; bert_repro_causal is the source of truth
            "is_decoder": config.causal, "bert_repro_causal": config.causal}


