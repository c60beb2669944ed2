"""Export to Hugging Face format: a pre-trained encoder (BertModel / BertForPreTraining / ...) or a
fine-tuned task model with its head and label names, loadable by transformers' ``AutoModelFor...``."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from bert_repro.convert.names import ARCHITECTURES, HEADS, hf_config, ours_to_hf
from bert_repro.heads import FeatureTagger, SequenceClassifier, TokenTagger
from bert_repro.identity import IDENTITY_KEY
from bert_repro.model import BertConfig, BertForPreTraining


def _write(out_dir: str | Path, config: dict, weights: dict[str, Tensor], vocab: list[str] | None,
           lowercase: bool, max_position: int) -> Path:
    """config.json, model.safetensors (fp32), and vocab.txt + tokenizer_config.json when there is a vocab."""
    from safetensors.torch import save

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to("cpu", torch.float32).clone().contiguous() for k, v in weights.items()}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # a plain open, not save_file's 0600 temporary file: the model keeps the umask's mode like its neighbours
    (out / "model.safetensors").write_bytes(save(weights, metadata={"format": "pt"}))
    if vocab is not None:
        (out / "vocab.txt").write_text("".join(token + "\n" for token in vocab), encoding="utf-8")
        tok = {"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase,
               "model_max_length": max_position}
        (out / "tokenizer_config.json").write_text(json.dumps(tok, indent=2) + "\n")
    return out


@contextmanager
def fresh_folder(out_dir: str | Path, force: bool = False) -> Iterator[Path]:
    """A new folder beside ``out_dir`` to write a model into, put in its place once written whole: no file of
    an earlier model stays beside the new ones (an old vocab.txt would be read as this model's), and a failed
    export leaves ``out_dir`` as it was. A non-empty ``out_dir`` is refused (FileExistsError) unless
    ``force``, and then replaced with everything in it."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} is a file, not a folder; choose another output folder")
    earlier = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if earlier and not force:
        shown = ", ".join(earlier[:4]) + (", ..." if len(earlier) > 4 else "")
        raise FileExistsError(f"{out} is not empty ({shown}); to-hf writes a whole model folder and will not "
                              "mix one with another's files: choose an empty folder, or pass --force to "
                              "replace this one (everything in it is deleted)")
    out.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.new-"))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(new, out.stat().st_mode if out.is_dir() else 0o777 & ~umask)  # mkdtemp's 0700 is not a model's
    try:
        yield new
        if earlier:  # the old folder steps aside first: a rename cannot replace a folder that holds files
            old = new.with_name(new.name.replace(".new-", ".old-"))
            os.rename(out, old)
            os.rename(new, out)
            shutil.rmtree(old)
        else:
            os.replace(new, out)  # over an empty folder, or where there was none
    finally:
        if new.exists():  # the export failed: its partial files go, out_dir is untouched
            shutil.rmtree(new)


def _pad_id(vocab: list[str] | None) -> int:
    return vocab.index("[PAD]") if vocab and "[PAD]" in vocab else 0


def export_hf(model: BertForPreTraining, out_dir: str | Path, vocab: list[str] | None, lowercase: bool = True,
              missing_heads: list[str] | tuple[str, ...] = (), identity: dict | None = None) -> Path:
    """Write config.json, model.safetensors (HF names), vocab.txt and tokenizer_config.json.

    Heads listed in ``missing_heads`` (random, never trained) are left out rather than passed off as weights.
    ``identity``: what the checkpoint was trained as (identity.py), kept in config.json.
    """
    state = {k: v for k, v in model.state_dict().items() if k.split(".")[0] not in missing_heads}
    has = {h: any(k.startswith(h + ".") for k in state) for h in HEADS}
    config = {**hf_config(model.config, ARCHITECTURES[has["mlm"], has["nsp"]], _pad_id(vocab)),
              **({IDENTITY_KEY: identity} if identity else {})}
    return _write(out_dir, config, ours_to_hf(state), vocab, lowercase, model.config.max_position)


def finetuned_architecture(module: nn.Module) -> str:
    """The transformers class that computes what ``module`` (a fine-tuned task LightningModule) computes,
    or a ValueError saying why none does."""
    net, config = module.model, module.config
    if isinstance(net, FeatureTagger) or getattr(net, "lstm", None) is not None:
        raise ValueError("a model with a BiLSTM head (Table 5's '+ BiLSTM', Table 7's feature-based tagger) "
                         "has no transformers class; export its encoder alone with --encoder-only")
    if hasattr(net, "qa_outputs"):  # tasks.span.SpanExtractor: S and E as one Linear(H, 2), as HF's
        return "BertForQuestionAnswering"
    if isinstance(net, TokenTagger):
        return "BertForTokenClassification"
    if isinstance(net, SequenceClassifier):
        if getattr(module, "predict_majority", False):
            raise ValueError("predict_majority=true predicts the training set's majority class; "
                             "there is no trained model to export")
        if config.causal:  # we read the last real token (heads.aggregate_token); transformers reads [CLS]
            raise ValueError("a left-to-right (causal) classifier reads its last token, not [CLS]; "
                             "transformers' heads read [CLS], so it has no transformers class")
        return "BertForMultipleChoice" if hasattr(module, "num_choices") else "BertForSequenceClassification"
    raise ValueError(f"{type(module).__name__} has no task head that transformers knows")


def _labels(module: nn.Module, architecture: str) -> dict:
    """id2label / label2id / problem_type of the HF config: GLUE's label strings (STS-B: one score, a
    regression), CoNLL's tag set; question answering and multiple choice have no labels."""
    if architecture == "BertForTokenClassification":
        tags = list(module.labels)
        return {"id2label": dict(enumerate(tags)), "label2id": {n: i for i, n in enumerate(tags)}}
    if architecture != "BertForSequenceClassification":
        return {}
    names = list(module.spec.names or module.spec.labels or ["score"])  # MRPC's "equivalent", not its "1"
    return {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)},
            "problem_type": "single_label_classification" if module.spec.labels else "regression"}


def export_finetuned(module: nn.Module, out_dir: str | Path) -> Path:
    """A fine-tuned task module in Hugging Face format: the encoder in HF names, the head under HF's own
    names (ours match: ``classifier``, ``qa_outputs``), the label names, the module's vocabulary."""
    architecture = finetuned_architecture(module)
    config: BertConfig = module.config
    state = module.model.state_dict()
    if architecture in ("BertForTokenClassification", "BertForQuestionAnswering"):  # built without a pooler
        state = {k: v for k, v in state.items() if not k.startswith("bert.pooler.")}
    encoder = ours_to_hf({k: v for k, v in state.items() if k.startswith("bert.")})
    head = {k: v for k, v in state.items() if not k.startswith("bert.")}
    vocab = getattr(module, "vocab", None)
    identity = getattr(module, "identity", None)  # task, head, labels, science: identity.py
    hf = {**hf_config(config, architecture, _pad_id(vocab)), **_labels(module, architecture),
          **({IDENTITY_KEY: identity} if identity else {})}
    return _write(out_dir, hf, encoder | head, vocab, getattr(module, "lowercase", True), config.max_position)
