"""The scorers as `evaluate` modules: each loads from the installed package with the network off and, given
the predictions of a validation on real dev data (a tiny random encoder, so the predictions vary), computes
what that validation logged."""

import importlib.resources
import json
import re
import socket
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from .conftest import REPO
from .helpers import VARIED

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def load():
    """``evaluate.load`` of one of bert_repro/metrics/modules, with every connection refused."""
    # a src/ on the path (PYTHONPATH=src in a worktree) holds src/evaluate.py, the Hydra entry, under the
    # package's name
    src = str(REPO / "src")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "path", [p for p in sys.path if str(Path(p or ".").resolve()) != src])
        import evaluate
    modules = importlib.resources.files("bert_repro.metrics.modules")

    def refuse(*args, **kwargs):
        raise OSError("the network is off in this test")

    def load_offline(name: str, *config: str):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(socket.socket, "connect", refuse)
            return evaluate.load(str(modules / f"{name}.py"), *config)

    return load_offline


def validate(module, data, folder: Path) -> dict[str, float]:
    trainer = L.Trainer(accelerator="cpu", logger=False, default_root_dir=folder, enable_progress_bar=False,
                        enable_model_summary=False)
    return trainer.validate(module, datamodule=data, verbose=False)[0]


@pytest.mark.parametrize("task,num_labels", [("mrpc", 2), ("stsb", 1)])
def test_glue_module_gives_the_runs_dev_metrics(load, task, num_labels, tmp_path, shared_data, minilm_dir):
    from bert_repro.data.glue import GlueDataModule
    from bert_repro.tasks.classification import SequenceClassificationModule

    data = GlueDataModule(task, glue_dir=str(shared_data / "glue"), tokenizer=str(minilm_dir),
                          cache_dir=str(tmp_path / "cache"), batch_size=64, max_eval_examples=300)
    torch.manual_seed(0)
    module = SequenceClassificationModule(VARIED, {}, task, num_labels)
    logged = validate(module, data, tmp_path)
    with torch.no_grad():
        batches = list(data.val_dataloader())
        outputs = torch.cat([module.eval()(b) for b in batches])
    predictions = outputs if num_labels == 1 else outputs.argmax(-1)
    references = torch.cat([b["labels"] for b in batches])
    assert len(references) == 300 and predictions.unique().numel() > 1  # the predictions vary
    got = load("glue", task).compute(predictions=predictions.tolist(), references=references.tolist())
    assert got == pytest.approx({name: logged[f"val/{name}"] for name in got}, abs=1e-6)
    assert set(got) == {"mrpc": {"acc", "f1"}, "stsb": {"pearson", "spearman"}}[task]


@pytest.mark.parametrize("version", [1, 2])
def test_squad_modules_give_the_runs_dev_metrics(load, version, tmp_path, shared_data, minilm_dir):
    from bert_repro.data.squad import SquadDataModule, read_squad_json
    from bert_repro.tasks.span import SpanExtractionModule

    folder = shared_data / f"squad_v{version}"
    data = SquadDataModule(version, squad_dir=str(folder), tokenizer=str(minilm_dir),
                           cache_dir=str(tmp_path / "cache"), batch_size=16, max_seq_length=64, doc_stride=16,
                           max_query_length=16, max_dev_examples=48, max_train_examples=1)
    torch.manual_seed(0)
    logged = validate(SpanExtractionModule(VARIED, {}, version=version), data, tmp_path)
    nbest = json.loads((tmp_path / "nbest_predictions.json").read_text())
    dev = {row["id"]: row for row in read_squad_json(next(folder.glob("dev-*.json")), version)}
    references = [{"id": q, "answers": dev[q]["answers"]} for q in nbest]
    # the best non-null span: the first text of the n-best list (v2.0 ranks the null answer "" among them)
    predictions = [{"id": q, "prediction_text": next((e["text"] for e in entries if e["text"]), "")}
                   for q, entries in nbest.items()]
    if version == 2:
        odds = json.loads((tmp_path / "null_odds.json").read_text())
        predictions = [{**p, "null_odds": odds[p["id"]]} for p in predictions]
    got = load(f"squad_v{version}").compute(predictions=predictions, references=references)
    assert len(nbest) == 48 and got["f1"] > 0
    assert got == pytest.approx({name: logged[f"val/{name}"] for name in got}, abs=1e-4)  # float32 logs
    assert {"has_ans_f1", "no_ans_f1", "null_threshold"} <= set(got) if version == 2 else set(got) == {
        "exact_match", "f1"}


def test_conll_module_gives_the_runs_dev_metrics(load, tmp_path, shared_data, minilm_dir):
    from bert_repro.data.conll import CONLL2003_LABELS, ConllDataModule
    from bert_repro.tasks.tagging import TokenTaggingModule

    data = ConllDataModule(conll_dir=str(shared_data / "conll2003"), tokenizer=str(minilm_dir),
                           cache_dir=str(tmp_path / "cache"), batch_size=64, max_eval_examples=200)
    torch.manual_seed(0)
    module = TokenTaggingModule(VARIED, {})
    logged = validate(module, data, tmp_path)
    words: dict[tuple[int, int], tuple[str, str]] = {}  # (sentence, word) -> (predicted, gold) tag
    with torch.no_grad():
        for batch in data.val_dataloader():
            predicted, scored = module.eval()(batch).argmax(-1), batch["word"] >= 0
            for row, column in scored.nonzero().tolist():
                key = (int(batch["sentence"][row]), int(batch["word"][row, column]))
                words.setdefault(key, (CONLL2003_LABELS[predicted[row, column]],
                                       CONLL2003_LABELS[batch["labels"][row, column]]))
    sentences: dict[int, list[tuple[str, str]]] = {}
    for (sentence, _), tags in sorted(words.items()):
        sentences.setdefault(sentence, []).append(tags)
    got = load("conll2003").compute(predictions=[[p for p, _ in s] for s in sentences.values()],
                                    references=[[g for _, g in s] for s in sentences.values()])
    assert len(sentences) == 200 and 0 < got["f1"] < 1
    assert got == pytest.approx({name: logged[f"val/{name}"] for name in got}, abs=1e-6)
    assert set(got) == {"precision", "recall", "f1", "token_acc"}


def test_the_example_in_docs_runs(load):
    """docs/training.md's example, as written (the `load` fixture has imported the `evaluate` package)."""
    text = (REPO / "docs" / "training.md").read_text()
    example = re.search(r"^## Scoring predictions.*?^```python\n(.*?)^```", text, flags=re.M | re.S).group(1)
    scope: dict = {}
    exec(example, scope)  # noqa: S102 (the page's own example)
    assert scope["squad"].name == "squad_v1" and scope["glue"].config_name == "mrpc"
