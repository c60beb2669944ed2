"""src/train.py on SQuAD v1.1 and v2.0 end to end (CPU, offline, the real fixtures, all-MiniLM-L6-v2 as
init=), a malformed file through the command line, and Dev scored once per window under DDP."""

import json
from pathlib import Path

import pytest
import torch

from .conftest import run_py
from .helpers import VARIED, call_in_new_process, validate_on_one_and_two_ranks

DEV = 8  # Dev questions, each a few windows
SMALL = ["model=minilm_l6", "logger=csv", "trainer.enable_progress_bar=false", "data.max_seq_length=128",
         "data.doc_stride=32", "data.max_query_length=32", "data.max_train_examples=8",
         f"data.max_dev_examples={DEV}", "data.batch_size=8", "optim.epochs=1"]


def run(*args, timeout=600):
    proc = run_py(*args, timeout=timeout)
    return proc, proc.stdout + proc.stderr


def train(task, tmp_path, minilm_dir, shared_data, *extra):
    proc, out = run(f"task={task}", *SMALL, f"init={minilm_dir}", f"paths.shared_data={shared_data}",
                    f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}", *extra)
    assert proc.returncode == 0, out[-3000:]
    return tmp_path / "run", json.loads((tmp_path / "run" / "results.json").read_text())


def dev_ids(shared_data, name, version, count=DEV):
    import numpy as np

    from bert_repro.data.base import HELD_OUT_SEED
    from bert_repro.data.squad import read_squad_json

    rows = read_squad_json(shared_data / name, version)
    chosen = np.sort(np.random.default_rng(HELD_OUT_SEED).choice(len(rows), count, replace=False))
    return {rows[i]["id"] for i in chosen}


def test_squad_v1_end_to_end(tmp_path, minilm_dir, shared_data):
    run_dir, results = train("squad_v1", tmp_path, minilm_dir, shared_data)
    final = results["metrics"]["final"]
    assert {"val/exact_match", "val/f1", "val/loss"} <= set(final) and 0 <= final["val/f1"] <= 100
    assert results["missing_heads"] == ["qa_outputs"] and results["global_step"] >= 2
    assert results["monitor"] == "val/f1" and "val/f1" in results["metrics"]["per_epoch"][-1]
    predictions = json.loads((run_dir / "predictions.json").read_text())
    assert set(predictions) == dev_ids(shared_data, "squad_v1/dev-v1.1.json", 1)
    nbest = json.loads((run_dir / "nbest_predictions.json").read_text())
    assert all(nbest[q][0]["text"] == predictions[q] and len(nbest[q]) <= 20 for q in predictions)
    assert not (run_dir / "null_odds.json").exists()


def test_squad_v2_end_to_end(tmp_path, minilm_dir, shared_data):
    run_dir, results = train("squad_v2", tmp_path, minilm_dir, shared_data)
    final = results["metrics"]["final"]
    assert {"val/exact_match", "val/f1", "val/has_ans_exact", "val/has_ans_f1", "val/no_ans_exact",
            "val/no_ans_f1", "val/best_f1", "val/best_f1_thresh", "val/null_threshold"} <= set(final)
    assert final["val/f1"] == pytest.approx(final["val/best_f1"])  # the answers use the tau tuned for F1
    tau = final["val/null_threshold"]
    predictions = json.loads((run_dir / "predictions.json").read_text())
    odds = json.loads((run_dir / "null_odds.json").read_text())
    nbest = json.loads((run_dir / "nbest_predictions.json").read_text())
    assert set(predictions) == set(odds) == dev_ids(shared_data, "squad_v2/dev-v2.0.json", 2)
    for qid, text in predictions.items():
        best_span = next(e["text"] for e in nbest[qid] if e["text"])
        assert text == ("" if odds[qid] > tau else best_span), qid
        assert sum(1 for e in nbest[qid] if e["text"] == "") == 1  # the null answer is always listed
    checkpoint = torch.load(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["null_threshold"] == pytest.approx(tau)  # stored with the run, for later predictions


def test_malformed_file_fails_with_a_message(tmp_path, minilm_dir):
    folder = tmp_path / "squad"
    folder.mkdir()
    article = {"title": "Cats", "paragraphs": [{"context": "The cat sat.", "qas": [
        {"id": "q-7", "question": "Who sat?", "answers": [{"text": "The dog", "answer_start": 0}]}]}]}
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (folder / name).write_text(json.dumps({"version": "1.1", "data": [article]}))
    proc, out = run("task=squad_v1", *SMALL, f"data.tokenizer={minilm_dir}", f"data.squad_dir={folder}",
                    f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, out[-3000:]
    assert f"{folder / 'train-v1.1.json'}: question q-7: answer 'The dog' does not match the context" in out
    assert not (tmp_path / "run" / "results.json").exists()


def validate_on_two_ranks(minilm_dir: str, squad_dir: str, out: str) -> None:
    """Dev metrics and predictions of one set of weights on 1 process and on 2 DDP ranks (CPU, gloo)."""
    from bert_repro.data.squad import SquadDataModule
    from bert_repro.tasks.span import SpanExtractionModule

    def data() -> SquadDataModule:
        dm = SquadDataModule(2, squad_dir=squad_dir, tokenizer=minilm_dir, cache_dir=f"{out}.cache",
                             batch_size=4, max_seq_length=64, doc_stride=16, max_query_length=16,
                             max_dev_examples=7, max_train_examples=1)
        dm.setup()  # here, so the parent process knows the windows too (ddp_fork's ranks are its children)
        return dm

    runs = validate_on_one_and_two_ranks(lambda: SpanExtractionModule(VARIED, {}, version=2), data, out)
    Path(out).write_text(json.dumps([
        {"metrics": metrics, "windows": len(dm.datasets["dev"]),
         "predictions": json.loads((folder / "nbest_predictions.json").read_text())}
        for metrics, dm, folder in runs]))


def test_dev_windows_are_scored_once_under_ddp(tmp_path, minilm_dir, shared_data):
    """An odd number of Dev windows on 2 ranks: Lightning's sampler repeats one; the module drops the
    repeat."""
    out = tmp_path / "metrics.json"
    call_in_new_process("tests.test_squad_e2e.validate_on_two_ranks", str(minilm_dir),
                        str(shared_data / "squad_v2"), str(out))
    single, ddp = json.loads(out.read_text())
    assert single["windows"] % 2 == 1 and single["windows"] > 7  # several windows per question, one repeated
    assert set(single["metrics"]) == set(ddp["metrics"]) and "val/no_ans_f1" in single["metrics"]
    for name, value in single["metrics"].items():
        assert ddp["metrics"][name] == pytest.approx(value, abs=1e-5), name  # val/loss would count the repeat
    assert set(ddp["predictions"]) == set(single["predictions"])
    for qid, nbest in single["predictions"].items():
        assert [e["text"] for e in ddp["predictions"][qid]] == [e["text"] for e in nbest]
        assert [e["probability"] for e in ddp["predictions"][qid]] == pytest.approx(
            [e["probability"] for e in nbest], abs=1e-4)
