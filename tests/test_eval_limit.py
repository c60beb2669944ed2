"""data.max_eval_examples: Dev scored on a fixed subset of its examples (whole examples: every window of a
CoNLL sentence), a debug and speed key that leaves the run folder's name as a full run's."""

import json

import pytest

from bert_repro.data.conll import ConllDataModule
from bert_repro.data.glue import GlueDataModule

from .conftest import train_py
from .test_run_names import hydra_config

LONG = "\n".join(f"word{i} NN I-NP {'I-PER' if i % 3 else 'O'}" for i in range(40))
SHORT = ["EU NNP I-NP I-ORG\nrejects VBZ I-VP O", "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER"]
CONLL = "-DOCSTART- -X- O O\n\n" + "\n\n".join([LONG, *SHORT, LONG]) + "\n"


@pytest.mark.slow
def test_a_subset_scored_run_has_its_own_folder_and_the_full_run_keeps_its_name():
    full = hydra_config(["task=rte", "optim.lr=3e-5"])
    limited = hydra_config(["task=rte", "optim.lr=3e-5", "+data.max_eval_examples=8"])
    assert limited.data.max_eval_examples == 8  # composed, so the DataModule gets it
    assert "max_eval_examples" not in full.data  # a full run never sets it: its folder name is as before
    assert full.hydra.run.dir == "outputs/rte/optim.lr-3e-05+task-rte"
    # its Dev scores are a subset's: never in the full run's folder, where they would pass as its results
    assert limited.hydra.run.dir == "outputs/rte/data.max_eval_examples-8+optim.lr-3e-05+task-rte"


@pytest.mark.slow
def test_a_dev_split_keeps_whole_sentences_and_train_all(tmp_path, minilm_dir):
    for name in ("eng.train", "eng.testa"):
        (tmp_path / name).write_text(CONLL)

    def data(limit):
        module = ConllDataModule(str(tmp_path), tokenizer=str(minilm_dir), lowercase=True, max_seq_length=16,
                                 max_eval_examples=limit, cache_dir=str(tmp_path / "cache"))
        module.setup()
        return module.datasets

    full, limited = data(None), data(2)
    assert len(set(full["dev"]["sentence"])) == 4 and len(full["dev"]) > 4  # long sentences: several windows
    kept = set(limited["dev"]["sentence"])
    assert len(kept) == 2
    assert list(limited["dev"]["sentence"]) == [s for s in full["dev"]["sentence"] if s in kept]  # windows
    assert len(limited["train"]) == len(full["train"])
    assert data(2)["dev"]["sentence"] == limited["dev"]["sentence"]  # a fixed subset


@pytest.mark.slow
def test_the_dev_loader_yields_that_many_examples(tmp_path, minilm_dir, shared_data):
    rte = GlueDataModule("rte", glue_dir=str(shared_data / "glue"), tokenizer=str(minilm_dir / "vocab.txt"),
                         max_train_examples=8, max_eval_examples=5, batch_size=2, cache_dir=str(tmp_path))
    rte.setup()
    assert sum(len(batch["labels"]) for batch in rte.val_dataloader()) == 5
    with pytest.raises(ValueError, match=r"data.max_eval_examples=0: expected a positive whole number"):
        from bert_repro.config import check

        check(hydra_config(["task=rte", "+data.max_eval_examples=0"]))


@pytest.mark.e2e
def test_a_run_scores_that_many_dev_examples(tmp_path, minilm_dir, shared_data):
    proc = train_py("task=rte", "model=tiny", "logger=none", "trainer.enable_progress_bar=false",
                    f"data.tokenizer={minilm_dir / 'vocab.txt'}", "data.max_train_examples=8",
                    "data.batch_size=4", "optim.max_steps=1", "+data.max_eval_examples=5",
                    f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["data_sizes"]["dev"] == 5 and results["data_sizes"]["train"] == 8
    assert results["config"]["data"]["max_eval_examples"] == 5
