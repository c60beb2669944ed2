"""src/train.py on CoNLL-2003 end to end (CPU, offline, real eng.* data): fine-tuned with test predictions,
and feature-based (Table 7), where only the BiLSTM and the classifier may move."""

import json
from pathlib import Path

import pytest
import torch

from .helpers import VARIED, call_in_new_process, validate_on_one_and_two_ranks
from .test_glue_e2e import run

# 128-token windows: the path end to end at a quarter of the task's 512 (its document context is
# test_conll_data's), 4x less attention to pay on every Dev window
COMMON = ["task=conll2003", "model=minilm_l6", "logger=csv", "trainer.enable_progress_bar=false",
          "data.batch_size=4", "data.max_train_examples=12", "optim.max_steps=3", "data.max_seq_length=128"]


def sentences(path, start, count):
    """Sentences [start, start + count) of a CoNLL file, with a -DOCSTART- line in front."""
    blocks = [b for b in path.read_text().split("\n\n") if b.strip() and not b.startswith("-DOCSTART-")]
    return "-DOCSTART- -X- O O\n\n" + "\n\n".join(blocks[start:start + count]) + "\n"


@pytest.fixture
def conll_dir(tmp_path, shared_data):
    """Train, dev and test cut from the real eng.train and eng.testa (eng.testb is held out of
    shared/data)."""
    folder = tmp_path / "conll"
    folder.mkdir()
    (folder / "eng.train").write_text(sentences(shared_data / "conll2003" / "eng.train", 0, 300))
    testa = shared_data / "conll2003" / "eng.testa"
    (folder / "eng.testa").write_text(sentences(testa, 0, 40))
    (folder / "eng.testb").write_text(sentences(testa, 120, 40))
    return folder


def test_fine_tuned_ner_writes_metrics_and_test_predictions(tmp_path, minilm_dir, conll_dir):
    proc, out = run(*COMMON, f"init={minilm_dir}", f"data.conll_dir={conll_dir}", "test=true",
                    f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, out[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    final = results["metrics"]["final"]
    assert {"val/precision", "val/recall", "val/f1", "val/token_acc", "val/loss"} <= set(final)
    assert 0.0 <= final["val/f1"] <= 1.0 and final["val/token_acc"] > 0.3  # O alone is ~83% of words
    assert results["missing_heads"] == ["classifier"] and results["global_step"] == 3
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "best.ckpt", map_location="cpu",
                            weights_only=False)
    # run.py: MiniLM's own casing, with a warning
    assert checkpoint["lowercase"] is True and "uncased vocabulary" in out
    lines = (tmp_path / "run" / "test_predictions" / "test.conll").read_text().split("\n")
    gold = [line.split() for line in (conll_dir / "eng.testb").read_text().splitlines()[2:] if line]
    words = [line.split() for line in lines if line]
    # every test word, sentence by sentence
    assert len(words) == len(gold) and sum(not line for line in lines) >= 39
    assert [w[:2] for w in words] == [  # word, gold as IOB2
        [g[0], g[3].replace("I-", "B-") if g[3] != "O" and (i == 0 or gold[i - 1][3][2:] != g[3][2:])
         else g[3]] for i, g in enumerate(gold)]
    assert {w[2] for w in words} <= {"O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC",
                                     "I-MISC"}


def test_feature_based_ner_trains_only_the_bilstm_and_classifier(tmp_path, minilm_dir, conll_dir):
    from bert_repro.convert import load_checkpoint

    proc, out = run(*COMMON, "ablation=feature_concat_last_four", "ablation.features.lstm_hidden=32",
                    "optim.lr=1e-3", f"init={minilm_dir}", f"data.conll_dir={conll_dir}",
                    f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, out[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["ablation"] == "feature_concat_last_four" and "val/f1" in results["metrics"]["final"]
    assert results["missing_heads"] == ["classifier", "lstm"]
    state = torch.load(tmp_path / "run" / "checkpoints" / "best.ckpt", map_location="cpu",
                       weights_only=False)["state_dict"]
    pretrained = load_checkpoint(str(minilm_dir)).state_dict
    encoder = [k for k in state if k.startswith("model.bert.")]
    assert len(encoder) > 50
    for k in encoder:
        assert torch.equal(state[k], pretrained[k.removeprefix("model.")]), k  # frozen through 3 AdamW steps
    assert state["model.lstm.weight_ih_l0"].shape == (4 * 32, 4 * 384)  # concat of the last four layers


def validate_on_two_ranks(minilm_dir: str, conll_dir: str, out: str) -> None:
    """Dev metrics of one set of weights on 1 process and on 2 DDP ranks (CPU, gloo), written to ``out``."""
    from bert_repro.data.conll import ConllDataModule
    from bert_repro.tasks.tagging import TokenTaggingModule

    runs = validate_on_one_and_two_ranks(
        lambda: TokenTaggingModule(VARIED, {}),
        lambda: ConllDataModule(conll_dir, tokenizer=minilm_dir, lowercase=True, batch_size=4,
                                cache_dir=f"{out}.cache"), out)
    Path(out).write_text(json.dumps([metrics for metrics, _, _ in runs]))


def test_dev_metrics_under_ddp_count_each_sentence_once(tmp_path, minilm_dir, conll_dir):
    """121 dev sentences (an odd number of windows) on two ranks score exactly as on one process."""
    (conll_dir / "eng.testa").write_text(sentences(conll_dir / "eng.train", 0, 121))
    out = tmp_path / "metrics.json"
    call_in_new_process("tests.test_conll_e2e.validate_on_two_ranks", str(minilm_dir), str(conll_dir),
                        str(out))
    single, ddp = json.loads(out.read_text())
    assert 0.0 < single["val/f1"] < 1.0 and single["val/token_acc"] < 0.9  # predictions vary
    for name in ("val/f1", "val/precision", "val/recall", "val/token_acc", "val/loss"):
        assert ddp[name] == pytest.approx(single[name], abs=1e-6), name
