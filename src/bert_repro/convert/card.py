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


def write_card(out_dir: Path, architecture: str, identity: dict[str, Any] | None,
               results: dict[str, Any] | None) -> Path:
    """README.md in ``out_dir``: metadata the Hub indexes (base model, metrics) and what the run was."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    task = (identity or {}).get("task") or (results or {}).get("task")
    final = {k: v for k, v in ((results or {}).get("metrics", {}).get("final") or {}).items()
             if k.startswith("val/") and v is not None}
    base = (results or {}).get("init")
    data = ModelCardData(
        library_name="transformers", pipeline_tag=_pipeline(architecture), tags=["bert", "bert-repro"],
        base_model=base if base and "/" in base and not Path(base).exists() else None,  # a Hub id only
        model_name=f"bert-repro {task}" if task else "bert-repro",
        eval_results=[EvalResult(task_type=_pipeline(architecture) or "other", dataset_type=task,
                                 dataset_name=f"{task} (Dev)", metric_type=name.removeprefix("val/"),
                                 metric_value=value) for name, value in sorted(final.items())] or None)
    config = (results or {}).get("config") or {}
    trained = {k: config.get(k) for k in ("task", "model", "optim", "data", "seed", "init") if k in config}
    metrics = "\n".join(["| metric | value |", "|---|---|",
                         *(f"| {name} | {value:.4f} |" for name, value in sorted(final.items()))])
    body = f"""
# {data.model_name}

A BERT model ({architecture}) trained with bert-repro for **{task or "pre-training"}**, reproducing Devlin et
al. (2019).

- Base checkpoint: `{base or "none (pre-trained from scratch)"}`
- Labels: {", ".join(map(str, (identity or {}).get("labels") or [])) or "none"}
- Run: status {(results or {}).get("status", "unknown")}, {(results or {}).get("global_step", "?")} steps,
  scale={(results or {}).get("scale", "?")}, seed={(results or {}).get("seed", "?")}

## Dev metrics

{metrics if final else "No results.json beside the checkpoint."}

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
            "BertForMultipleChoice": "multiple-choice"}.get(architecture, "feature-extraction")


def push_to_hub(folder: str | Path, repo_id: str, private: bool = False, message: str | None = None) -> str:
    """Upload an exported folder (``to-hf``'s: config.json, weights, vocabulary, README.md) to ``repo_id``,
    creating the repository when it does not exist. Returns the commit's URL."""
    from huggingface_hub import HfApi

    folder = Path(folder)
    missing = [name for name in ("config.json", "README.md") if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: no {', '.join(missing)}; expected a folder that `python -m "
                                "bert_repro.convert to-hf` wrote (it writes the model card too)")
    api = HfApi()
    api.create_repo(repo_id, private=private, exist_ok=True)
    commit = api.upload_folder(repo_id=repo_id, folder_path=str(folder),
                               commit_message=message or f"bert-repro export of {folder.name}")
    return str(getattr(commit, "commit_url", commit))
