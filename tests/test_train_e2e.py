"""src/train.py end to end on CPU: pre-train, write results.json, re-use the checkpoint as init=."""

import json

import pytest
import torch

from bert_repro.convert import load_checkpoint

from .conftest import run_py

FAST = ["model=tiny", "scale=smoke", "logger=csv", "optim.max_steps=6", "optim.val_check_interval=3",
        "optim.limit_val_batches=2", "data.batch_size=8", "scale.pretrain.vocab_size=2000",
        "trainer.enable_progress_bar=false"]


def train(tmp_path, name, *overrides, corpus="builtin:pydoc"):
    out = tmp_path / name
    proc = run_py(*FAST, f"data.corpus={corpus}", f"paths.cache_dir={tmp_path / 'cache'}",
                  f"hydra.run.dir={out}", *overrides)
    return proc, out


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    proc, out = train(tmp, "base_run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, out


def test_results_json_records_science_and_metrics(pretrained):
    _, out = pretrained
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and results["global_step"] == 6
    assert (results["task"], results["model"], results["ablation"], results["scale"]) == ("pretrain", "tiny",
                                                                                          "none", "smoke")
    assert results["seed"] == 12345 and results["wall_time_s"] > 0 and results["tokens_per_s"] > 0
    final = results["metrics"]["final"]
    for key in ("val/mlm_loss", "val/mlm_ppl", "val/mlm_acc", "val/nsp_acc"):
        assert key in final and final[key] is not None
    assert 1 < final["val/mlm_ppl"] < 2 * results["model_config"]["vocab_size"]
    assert results["model_config"]["vocab_size"] <= 2000 and results["model_config"]["num_layers"] == 2
    assert "git" in results and results["global_batch"] == 8


def test_checkpoint_carries_vocab_and_config(pretrained):
    _, out = pretrained
    loaded = load_checkpoint(str(out / "checkpoints" / "last.ckpt"))
    assert (loaded.vocab[:1] == ["[PAD]"] and "the" in loaded.vocab
            and len(loaded.vocab) == loaded.config.vocab_size)
    assert loaded.missing_heads == [] and not loaded.config.causal


def test_init_from_our_checkpoint(pretrained):
    tmp, out = pretrained
    proc, out2 = train(tmp, "from_init", f"init={out / 'checkpoints' / 'last.ckpt'}", "optim.max_steps=3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = json.loads((out / "results.json").read_text())
    second = json.loads((out2 / "results.json").read_text())
    assert second["missing_heads"] == [] and second["init"].endswith("last.ckpt")
    # starting from trained weights, held-out MLM loss begins where the first run ended, not at ln(V)
    assert second["metrics"]["final"]["val/mlm_loss"] < first["metrics"]["final"]["val/mlm_loss"] + 0.5


def test_corrupt_init_fails_clearly_and_leaves_results(pretrained, tmp_path):
    _, out = pretrained
    before = (out / "results.json").read_text()
    bad = tmp_path / "broken.ckpt"
    bad.write_bytes(b"not a checkpoint")
    proc, out2 = train(tmp_path, "bad_init", f"init={bad}")
    assert proc.returncode != 0
    assert str(bad) in proc.stdout + proc.stderr
    assert not (out2 / "results.json").exists() and (out / "results.json").read_text() == before


def test_missing_corpus_fails_clearly(tmp_path):
    proc, _ = train(tmp_path, "no_corpus", corpus=str(tmp_path / "nowhere.txt"))
    assert proc.returncode != 0 and "nowhere.txt" in proc.stdout + proc.stderr


def test_ltr_checkpoint_stays_causal(tmp_path):
    proc, out = train(tmp_path, "ltr", "ablation=ltr_no_nsp")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["ablation"] == "ltr_no_nsp" and "val/nsp_acc" not in results["metrics"]["final"]
    ckpt = out / "checkpoints" / "last.ckpt"
    loaded = load_checkpoint(str(ckpt))
    assert loaded.config.causal and "nsp" in loaded.missing_heads
    assert torch.load(ckpt, weights_only=True,
                      map_location="cpu")["hyper_parameters"]["model"]["causal"] is True
    # a bidirectional run may not silently drop the left-only constraint of this checkpoint
    proc, _ = train(tmp_path, "ltr_into_bidi", f"init={ckpt}")
    assert proc.returncode != 0 and "causal" in proc.stdout + proc.stderr


def test_init_from_hf_directory_takes_its_vocab_and_reports_missing_heads(tmp_path, minilm_dir, shared_data):
    """all-MiniLM-L6-v2 (an HF-format BertModel without pre-training heads) as init= on real text."""
    minilm = ["model.hidden_size=384", "model.num_layers=6", "model.num_heads=12", "optim.max_steps=2",
              "optim.val_check_interval=2", "optim.limit_val_batches=1", f"init={minilm_dir}"]
    proc, out = train(tmp_path, "minilm", *minilm,
                      corpus=str(shared_data / "pretrain_text" / "sample_text.txt"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["missing_heads"] == ["mlm", "nsp"] and results["model_config"]["vocab_size"] == 30522
    vocab = load_checkpoint(out / "checkpoints" / "last.ckpt").vocab  # resolved once, saved with the module
    assert vocab[101:104] == ["[CLS]", "[SEP]", "[MASK]"]  # the checkpoint's own vocabulary, in its own order
    # the CSV log names that vocabulary by its size: spelled out, each write of hparams.yaml took seconds
    assert "tokenizer: the run's vocabulary (30522 tokens)" in (out / "csv" / "hparams.yaml").read_text()
    # a model shape that does not match the checkpoint is refused with both shapes named
    proc, _ = train(tmp_path, "minilm_wrong_shape", *minilm[1:], "model.hidden_size=256", "model.num_heads=4",
                    corpus=str(shared_data / "pretrain_text" / "sample_text.txt"))
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "model.hidden_size: checkpoint 384, this run 256" in said
    # a tokenizer whose vocabulary is not the checkpoint's is refused before any training
    small_vocab = tmp_path / "vocab.txt"
    small_vocab.write_text("\n".join((minilm_dir / "vocab.txt").read_text().split("\n")[:2000]) + "\n")
    proc, out = train(tmp_path, "minilm_wrong_vocab", *minilm, f"data.tokenizer={small_vocab}",
                      corpus=str(shared_data / "pretrain_text" / "sample_text.txt"))
    assert proc.returncode != 0 and "vocabulary of 30522 tokens" in proc.stdout + proc.stderr
    assert not (out / "results.json").exists()
