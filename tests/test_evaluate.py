"""src/evaluate.py: a trained checkpoint evaluated without training gives the training run's own final Dev
numbers (its task head restored), results.json in the training format, and predictions for a user's file."""

import json
import subprocess

import pytest

from .conftest import run_py, train_py

SMALL = ["task=mrpc", "model=tiny", "optim.limit_val_batches=2", "trainer.enable_progress_bar=false"]


def evaluate_py(*args: str) -> subprocess.CompletedProcess:
    return run_py(*args, script="evaluate.py")


@pytest.mark.slow
def test_a_trained_checkpoint_evaluates_to_its_training_numbers_and_predicts_a_file(tmp_path, minilm_dir,
                                                                                    shared_data):
    trained = tmp_path / "train"
    # checkpoint.keep_last: the final weights, whose numbers the training run reports
    proc = train_py(*SMALL, f"data.tokenizer={minilm_dir / 'vocab.txt'}", "optim.max_steps=3",
                    "data.max_train_examples=32", "logger=none", "checkpoint.keep_last=true",
                    f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={trained}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("id,first,second\n7,The cat sat on the mat.,A cat sat on the mat.\n"
                     "9,Stocks fell sharply.,\"The weather, today, is nice.\"\n")
    out = tmp_path / "eval"
    proc = evaluate_py(*SMALL, f"init={trained / 'checkpoints' / 'last.ckpt'}",
                       f"paths.cache_dir={tmp_path / 'cache'}",
                       f"predict={{path: {pairs}, columns: {{text_a: first, text_b: second, idx: id}}}}",
                       f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ours, theirs = (json.loads((d / "results.json").read_text()) for d in (out, trained))
    assert set(ours) >= set(theirs) - {"config"} and ours["status"] == "complete" and ours["global_step"] == 0
    assert ours["missing_heads"] == []  # the trained classifier, not a random one
    for name in ("val/loss", "val/f1", "val/acc"):
        assert ours["metrics"]["final"][name] == pytest.approx(theirs["metrics"]["final"][name], abs=1e-6)
    lines = (out / "predictions" / "MRPC.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and [line.split("\t")[0] for line in lines[1:]] == ["7", "9"]
    assert all(line.split("\t")[1] in ("0", "1") for line in lines[1:])


@pytest.mark.slow
def test_no_checkpoint_is_a_clear_refusal(tmp_path):
    proc = evaluate_py("task=mrpc", f"hydra.run.dir={tmp_path / 'eval'}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "evaluate needs init=" in said and "Traceback" not in said
    assert not (tmp_path / "eval" / "results.json").exists()
