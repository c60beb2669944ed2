"""The demonstration tasks of `make demo` (bert_repro.data.pydoc_tasks): rows built as documented, from
disjoint documents, balanced, and written once."""

from __future__ import annotations

import csv
from collections import Counter

import numpy as np
import pytest

from bert_repro.data.corpus import pydoc_documents
from bert_repro.data.pydoc_tasks import DEV_EVERY, PydocPunctDataModule, punct_passages, write_task


def read(path: str) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


@pytest.fixture(scope="module")
def documents():
    docs = [[" ".join(s.split()) for s in doc] for doc in pydoc_documents()]
    return {"train": [d for i, d in enumerate(docs) if i % DEV_EVERY],
            "dev": [d for i, d in enumerate(docs) if i % DEV_EVERY == 0]}


def test_order_rows_are_sentences_as_written_or_shuffled(tmp_path, documents):
    paths = write_task("pydoc_order", tmp_path, 200, 100)
    for split, n in (("train", 200), ("dev", 100)):
        rows = read(paths[split])
        assert len(rows) == n and Counter(r["label"] for r in rows) == {"1": n // 2, "0": n // 2}
        sentences = {s for doc in documents[split] for s in doc}
        by_words = {tuple(sorted(s.split())): s for s in sentences}
        for row in rows:
            if row["label"] == "1":
                assert row["sentence"] in sentences
            else:  # the same words in another order, never the original
                original = by_words[tuple(sorted(row["sentence"].split()))]
                assert row["sentence"] != original


def test_next_rows_follow_the_nsp_construction(tmp_path, documents):
    paths = write_task("pydoc_next", tmp_path, 200, 100)
    for split in ("train", "dev"):
        docs = documents[split]
        following = {(a, b) for doc in docs for a, b in zip(doc, doc[1:])}
        home = {}
        for d, doc in enumerate(docs):
            for s in doc:
                home.setdefault(s, set()).add(d)
        rows = read(paths[split])
        assert Counter(r["label"] for r in rows)["1"] == len(rows) // 2
        for row in rows:
            a, b = row["sentence1"], row["sentence2"]
            if row["label"] == "1":
                assert (a, b) in following
            else:  # B comes from another document of the split than A (§3.1's negatives)
                assert home[b] - home[a], (a, b)
            assert a in home  # A is a sentence of this split's documents (train and Dev never share one)


def test_rows_are_written_once_and_unknown_task_is_named(tmp_path):
    first = write_task("pydoc_order", tmp_path, 50, 20)
    stamp = {s: (tmp_path / p).stat().st_mtime_ns for s, p in first.items()}
    assert write_task("pydoc_order", tmp_path, 50, 20) == first
    assert {s: (tmp_path / p).stat().st_mtime_ns for s, p in first.items()} == stamp
    with pytest.raises(ValueError, match="pydoc_typo"):
        write_task("pydoc_typo", tmp_path, 50, 20)


def test_punct_passages_strip_the_sentence_ends_and_tag_the_words_they_followed():
    docs = [["Call it, then return.", "The value: a list; done!"],
            ["One two three four five six seven eight?", "A heading without a mark"]]
    rows = punct_passages(docs, max_words=8, n=10, rng=np.random.default_rng(0))
    # a passage ends at the first sentence end past max_words / 2 words; only the sentence's last mark goes,
    # commas, colons and semicolons inside it stay; casing stays (the cue is the next sentence's capital)
    assert rows["tokens"][:2] == [["Call", "it,", "then", "return"], ["The", "value:", "a", "list;", "done"]]
    assert rows["tags"][:2] == [["O", "O", "O", "B-PUNCT"], ["O", "O", "O", "O", "B-PUNCT"]]
    assert rows["tags"][2] == ["O"] * 7 + ["B-PUNCT"] and len(rows["tokens"]) == 3  # the heading is dropped
    assert all(not s[-1].endswith(tuple(".?!:")) for s in rows["tokens"])


def test_punct_splits_come_from_disjoint_documents_and_both_tags_occur(documents):
    splits = PydocPunctDataModule(train_examples=64, dev_examples=32).raw_sentences()
    for split, (rows, _) in splits.items():
        assert len(rows["tokens"]) == {"train": 64, "dev": 32}[split]
        # the split's sentences that end in a mark, the mark stripped: each passage is text of this split
        text = " ".join(s.rstrip(".?!:") for doc in documents[split] for s in doc if s.rstrip(".?!:") != s)
        assert all(" ".join(words) in text for words in rows["tokens"])
        tags = [t for sentence in rows["tags"] for t in sentence]
        assert 0.02 < tags.count("B-PUNCT") / len(tags) < 0.3
    with pytest.raises(ValueError, match="max_words=4"):
        PydocPunctDataModule(max_words=4)


@pytest.mark.slow
def test_punct_task_fine_tunes_a_two_tag_tagger_end_to_end(tmp_path, minilm_dir):
    import json

    import torch

    from .test_glue_e2e import run

    proc, out = run("task=pydoc_punct", "model=minilm_l6", f"init={minilm_dir}", "logger=csv",
                    "optim.max_steps=2", "trainer.enable_progress_bar=false", "data.train_examples=32",
                    "data.dev_examples=16", "data.batch_size=16", f"paths.cache_dir={tmp_path / 'cache'}",
                    f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, out[-3000:]
    final = json.loads((tmp_path / "run" / "results.json").read_text())["metrics"]["final"]
    assert 0.0 <= final["val/f1"] <= 1.0 and final["val/token_acc"] > 0.5
    state = torch.load(tmp_path / "run" / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    assert state["state_dict"]["model.classifier.weight"].shape[0] == 2  # O and B-PUNCT: the task's labels
