"""``init=`` as ``from_pretrained`` reads it: a Hub id, an HF directory, a Google TF checkpoint or our .ckpt.

A fine-tuning run given neither ``init=`` nor ``data.tokenizer=`` starts from Google's released checkpoint
of its model size and the task's casing (BERT-base/large: google-bert/*; the compact sizes: Turc et al.'s
google/bert_uncased_*), fetched with huggingface_hub into its cache. When ``model=`` is not on the command
line, the encoder's shape is the checkpoint's (its config.json or our hyper-parameters).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Google's releases by shape (num_layers, hidden_size, num_heads) -> {lowercase: Hub id}. The paper's 2 sizes
# come cased and uncased (§4.3 NER uses cased); the 24 compact models (Turc et al. 2019) only uncased.
RELEASED: dict[tuple[int, int, int], dict[bool, str]] = {
    (12, 768, 12): {True: "google-bert/bert-base-uncased", False: "google-bert/bert-base-cased"},
    (24, 1024, 16): {True: "google-bert/bert-large-uncased", False: "google-bert/bert-large-cased"},
    **{(layers, hidden, hidden // 64): {True: f"google/bert_uncased_L-{layers}_H-{hidden}_A-{hidden // 64}"}
       for layers in (2, 4, 6, 8, 10) for hidden in (128, 256, 512, 768)},
}
# what a run reads from a Hub repository (convert.load_checkpoint); safetensors first, the .bin if it has none
HUB_FILES = ["config.json", "vocab.txt", "tokenizer_config.json"]
HUB_WEIGHTS = (["model.safetensors", "model.safetensors.index.json", "model-*.safetensors"],
               ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"])
# BertConfig fields that are the checkpoint's shape; dropout, the causal flag and init range stay the run's
SHAPE_KEYS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position",
              "type_vocab_size", "layer_norm_eps")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class InitError(ValueError):
    """An ``init=`` that cannot be resolved (offline and not cached, unknown Hub id): the message says what
    to do."""


def default_init(cfg: Any) -> str | None:
    """The released checkpoint a fine-tuning run starts from when nothing names its weights or vocabulary:
    pre-training, a user's own vocabulary and ablations that change pre-training get none."""
    data, ablation = cfg.data, cfg.ablation
    if cfg.get("init") or cfg.task.name == "pretrain" or data.get("tokenizer", "absent") is not None:
        return None
    pretraining_default = (ablation.nsp and not ablation.ltr and not ablation.causal
                           and list(ablation.mask_shares) == [0.8, 0.1, 0.1] and not ablation.whole_word_mask)
    if not pretraining_default:  # its own pre-training is the point: no released checkpoint stands in for it
        return None
    model = cfg.model
    shape = (model.num_layers, model.hidden_size, model.num_heads)
    lowercase = bool(data.get("lowercase", True))
    hub_id = RELEASED.get(shape, {}).get(lowercase)
    if hub_id is None:
        casing = "uncased" if lowercase else "cased"
        raise InitError(f"task={cfg.task.name} fine-tunes a pre-trained model, and Google released no "
                        f"{casing} checkpoint of L={shape[0]} H={shape[1]} A={shape[2]}; give init=<Hub id | "
                        "HF directory | TF checkpoint | our .ckpt> (or data.tokenizer=... to fine-tune from "
                        "random weights)")
    return hub_id


def is_hub_id(spec: str) -> bool:
    """``org/name`` or ``name`` that is not a local path (a TF prefix is one: its .index exists)."""
    path = Path(spec).expanduser()
    if path.exists() or Path(f"{path}.index").exists() or spec.startswith((".", "/", "~")):
        return False
    return bool(HUB_ID.match(spec)) and not spec.endswith((".ckpt", ".bin", ".safetensors", ".json"))


def download_hint(hub_id: str) -> str:
    return (f"download it where the Hub is reachable: `hf download {hub_id} {' '.join(HUB_FILES)} "
            f"model.safetensors --local-dir <DIR>` and pass init=<DIR> (or fill the Hugging Face cache, "
            f"HF_HOME, with `hf download {hub_id}` and rerun)")


def fetch(hub_id: str) -> Path:
    """The local snapshot of ``hub_id`` in the huggingface_hub cache, downloaded when online."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from bert_repro.network import reaching

    try:
        with reaching(f"init={hub_id}", download_hint(hub_id)):  # network.timeout_s bounds every request
            for weights in HUB_WEIGHTS:
                folder = Path(snapshot_download(hub_id, allow_patterns=HUB_FILES + weights))
                if any(folder.glob(weights[0].split(".")[0] + "*")):
                    return folder
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError) as err:
        raise InitError(f"init={hub_id}: no such Hugging Face Hub model, or it needs access rights "
                        f"({type(err).__name__}); give a Hub id, an HF directory, a TF checkpoint or our "
                        ".ckpt") from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set" if offline else f"the Hub cannot be reached ({type(err).__name__})"
        raise InitError(f"init={hub_id} is not in the Hugging Face cache and {why}; "
                        f"{download_hint(hub_id)}") from None
    raise InitError(f"init={hub_id}: the Hub repository has no model.safetensors or pytorch_model.bin")


def resolve_init(cfg: Any) -> tuple[str | None, str | None]:
    """(what ``init=`` names, after the default; the local path convert.load_checkpoint reads)."""
    spec = cfg.get("init") or default_init(cfg)
    if not spec:
        return None, None
    spec = str(spec)
    if is_hub_id(spec):
        log.info("init=%s: the Hugging Face Hub model (huggingface_hub cache)", spec)
        return spec, str(fetch(spec))
    return spec, str(Path(spec).expanduser())


def model_on_command_line() -> bool:
    """Whether ``model=`` was chosen on the command line (or by a table runner, which passes it there)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return True
    return any(o.split("=", 1)[0].lstrip("+~") == "model" for o in HydraConfig.get().overrides.task)


def with_shape(model_cfg: dict[str, Any], checkpoint_config: Any) -> dict[str, Any]:
    """``model_cfg`` (BertConfig fields) with the checkpoint's shape (SHAPE_KEYS): the one place that says
    which fields a checkpoint decides and which stay the run's."""
    loaded = checkpoint_config.to_dict()
    return {**model_cfg, **{k: loaded[k] for k in SHAPE_KEYS if k in loaded}}


def model_shape(model_cfg: dict[str, Any], checkpoint_config: Any, explicit: bool) -> dict[str, Any]:
    """The run's encoder config: the checkpoint's shape unless ``model=`` was given (a mismatch is refused
    later, in tasks.base.load_pretrained, with a message naming both)."""
    return model_cfg if explicit else with_shape(model_cfg, checkpoint_config)


def shape_name(model_cfg: dict[str, Any]) -> str:
    return f"L{model_cfg['num_layers']}_H{model_cfg['hidden_size']}_A{model_cfg['num_heads']}"


def model_name(configured: dict[str, Any], model_cfg: dict[str, Any], explicit: bool) -> str | None:
    """results.json's ``model``: the model= choice, or the checkpoint's shape (L.._H.._A..) where init= chose
    a shape other than the default choice's."""
    from hydra.core.hydra_config import HydraConfig

    choice = HydraConfig.get().runtime.choices.get("model") if HydraConfig.initialized() else None
    if explicit or choice is None or shape_name(configured) == shape_name(model_cfg):
        return choice
    return shape_name(model_cfg)
