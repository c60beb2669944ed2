"""Instance creation at corpus scale: the word-cached tokenization, sharded output identical for any num_proc,
a killed preparation resumed from its finished shards, and peak heap flat in corpus size."""

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import dill
import pyarrow as pa
import pytest
from datasets import Dataset

from bert_repro.data import pretraining
from bert_repro.data.corpus import load_documents, wikitext_documents, write_documents
from bert_repro.data.instances import WordPieceIds
from bert_repro.data.pretraining import PretrainDataModule
from bert_repro.tokenization import save_vocab, train_wordpiece

from .conftest import SHARED

WIKI = SHARED / "pretrain_text" / "wikitext-2-raw" / "wiki.test.raw"


@pytest.fixture(scope="module")
def wiki(tmp_path_factory):
    if not WIKI.is_file():
        pytest.skip(f"{WIKI} not found (shared data; set BERT_REPRO_SHARED_DATA)")
    docs = [d for d in wikitext_documents(WIKI) if d]
    tokenizer = train_wordpiece((s for d in docs for s in d), vocab_size=3000)
    root = tmp_path_factory.mktemp("wiki")
    return docs, tokenizer, str(save_vocab(tokenizer, root)), root


ODD = [["Café  naïve\tfaçade — 東京 x\u00ad y", "  ", "Ünïcödé [SEP] [UNK]!"], [" "],  # last: no tokens
       ["x[UNK]y [SEP], (a,b) «q»; e.g.,,. ÉTÉ é,é ;\u037e; don't 3.14% a\x00.b ,\u0301x"]]


@pytest.mark.parametrize("separator", [None, "e"])
@pytest.mark.slow
def test_word_cache_tokenizes_as_the_tokenizer(wiki, separator):
    """Word and piece caches, punctuation cut and separator-joined encoding give the tokenizer's own ids; with
    "e" for separator, pieces like "é" and "É" normalise to it, and their texts are encoded piece by piece."""
    docs, tokenizer, _, _ = wiki
    documents = docs + ODD
    words = WordPieceIds(tokenizer)
    words.PIECES_PER_TEXT = 97  # several joined texts per batch
    if separator:
        words.separator, words.separator_id = separator, tokenizer.token_to_id(separator)
    got = [row for part in (documents[:30], documents[30:50], documents[50:])  # later ones reuse the caches
           for row in words(pa.table({"sentences": part})).column("tokens").to_pylist()]
    expected = [[e.ids for e in tokenizer.encode_batch(d, add_special_tokens=False) if e.ids]
                for d in documents]
    assert got == [d for d in expected if d]


@pytest.mark.slow
def test_word_cache_starts_afresh_when_full(wiki):
    docs, tokenizer, _, _ = wiki
    words = WordPieceIds(tokenizer)
    words.MAX_WORDS = 3000  # below one batch's words: every batch starts afresh
    got = [row for part in (docs[:20], docs[20:40])
           for row in words(pa.table({"sentences": part})).column("tokens").to_pylist()]
    assert len(words.words) == len({w for d in docs[20:40] for s in d for w in s.split(" ")})  # last batch
    assert got == [[e.ids for e in tokenizer.encode_batch(d, add_special_tokens=False) if e.ids]
                   for d in docs[:40]]


@pytest.mark.slow
def test_word_cache_travels_to_workers(wiki):
    """A num_proc worker gets the function pickled (datasets uses dill): the warm caches go with it, their
    words as one Arrow array, and the copy tokenizes as the tokenizer does, adding to them."""
    docs, tokenizer, _, _ = wiki
    words = WordPieceIds(tokenizer)
    words(pa.table({"sentences": docs[:30]}))
    copy = dill.loads(dill.dumps(words))
    assert copy.words.row_of == words.words.row_of and copy.pieces.row_of == words.pieces.row_of
    assert (copy.words.ids == words.words.ids).all() and (copy.pieces.offsets == words.pieces.offsets).all()
    got = copy(pa.table({"sentences": docs[:40]})).column("tokens").to_pylist()
    assert got == [[e.ids for e in tokenizer.encode_batch(d, add_special_tokens=False) if e.ids]
                   for d in docs[:40]]
    assert len(copy.words) == len({w for d in docs[:40] for s in d for w in s.split(" ")})


def _module(corpus, vocab, cache_dir, **kwargs) -> PretrainDataModule:
    settings = dict(tokenizer=vocab, masking="static", dupe_factor=2, val_fraction=0.1, seed=3)
    dm = PretrainDataModule(corpus, cache_dir=str(cache_dir), **{**settings, **kwargs})
    dm.setup()
    return dm


@pytest.mark.slow
def test_killed_preparation_resumes_and_any_num_proc_gives_the_same_instances(wiki, tmp_path, monkeypatch):
    docs, _, vocab, _ = wiki
    corpus = str(write_documents(docs[:20], tmp_path / "wiki20.txt"))
    one = _module(corpus, vocab, tmp_path / "one").train_set.to_dict()
    # too small for a pool: num_proc=2 runs every map here, one file each, and gives the same instances
    small = _module(corpus, vocab, tmp_path / "small", num_proc=2)
    assert small.train_set.to_dict() == one and gc.get_freeze_count() == 0  # setup unfroze the heap
    assert not list((tmp_path / "small" / "pretrain").glob("*_of_0000*.arrow"))
    monkeypatch.setattr(pretraining, "PROCESS_BYTES", 1)  # a pool for any map
    two = _module(corpus, vocab, tmp_path / "two", num_proc=2)
    assert len(one["input_ids"]) > 1000 and two.train_set.to_dict() == one  # same seed, num_proc 1 or 2
    shards = sorted((tmp_path / "two" / "pretrain").glob("instances-train-*_of_00002.arrow"))
    assert len(shards) == 4  # 2 rounds x 2 shards
    finished = {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in shards}
    # killed while writing round 2's second shard: datasets writes a shard to a temporary file and renames it
    # when done, so the shard is missing and a temporary file is left
    shards[-1].rename(shards[-1].with_name("tmpkilled"))
    again = _module(corpus, vocab, tmp_path / "two", num_proc=2)
    assert again.train_set.to_dict() == one
    for path, (mtime, data) in finished.items():
        assert path.read_bytes() == data
        assert path == shards[-1] or path.stat().st_mtime_ns == mtime  # the finished shards were not redone


def _peak_heap_mb(corpus: Path, vocab: str, cache_dir: Path) -> float:
    """Peak heap above the baseline of a fresh process running the DataModule's setup on `corpus` (the
    benchmark's own measurement: a process that ran other tests would reuse memory it already holds)."""
    run = {"corpus": str(corpus), "vocab": vocab, "copies": 1, "num_proc": 1, "dupe_factor": 1,
           "max_seq_length": 128, "cache_dir": str(cache_dir)}
    command = [sys.executable, "-m", "bert_repro.benchmarks.instances", "--child", json.dumps(run)]
    proc = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])["peak_anon_increase_mb"]


@pytest.mark.e2e
def test_peak_heap_is_flat_in_corpus_size(wiki, tmp_path):
    """1x and 4x the WikiText-2 test text (2 and 8 batches of documents): the heap holds one batch, whatever
    the corpus size (the caches are memory-mapped files, not heap)."""
    docs, _, vocab, _ = wiki
    text = write_documents(docs * 2, tmp_path / "1x.txt").read_text()
    (tmp_path / "4x.txt").write_text(text * 4)
    one, four = (_peak_heap_mb(tmp_path / f"{size}.txt", vocab, tmp_path / size) for size in ("1x", "4x"))
    assert 0 < four < 1.25 * one + 8, (one, four)  # growing with the corpus, 4x would be about 4 times 1x


@pytest.mark.slow
def test_the_plans_disk_per_token_is_what_the_caches_take(tmp_path):
    """The plan's disk figures (tables/plan.py) against the caches the DataModule writes on the books the
    benchmark measured them on (its corpus, at 1x, and its 8,000-piece vocabulary), at both phases'
    lengths."""
    from bert_repro.benchmarks.instances import write_corpus
    from bert_repro.tables import plan

    text = SHARED / "pretrain_text"
    if not (text / "gutenberg").is_dir():
        pytest.skip(f"{text / 'gutenberg'} not found (shared data; set BERT_REPRO_SHARED_DATA)")
    corpus = write_corpus(text, tmp_path / "books.txt", 1)
    books = [d for batch in load_documents(str(corpus), cache_dir=tmp_path / "docs").iter(batch_size=256)
             for d in batch["sentences"]]
    vocab = str(save_vocab(train_wordpiece((s for d in books for s in d), vocab_size=8000), tmp_path))
    for seq, predictions in ((128, 20), (512, 80)):
        cache = tmp_path / f"cache-{seq}"
        dm = PretrainDataModule(str(corpus), tokenizer=vocab, masking="static", max_seq_length=seq,
                                max_predictions_per_seq=predictions, cache_dir=str(cache), seed=12345)
        dm.setup()
        tokens = sum(len(record.values.values) for split in ("train", "val")
                     for path in (cache / "pretrain").glob(f"tokens-{split}-*.arrow")
                     for record in Dataset.from_file(str(path)).data.column("tokens").chunks)
        size = {kind: sum(p.stat().st_size for p in cache.rglob(f"{kind}*.arrow"))
                for kind in ("corpus", "tokens", "instances")}
        assert tokens > 1_000_000 and size["corpus"] > 0
        text_bytes = size["corpus"] + size["tokens"]
        rates = plan.cpu_rates()  # what benchmarks/instances.py --rates measured
        assert text_bytes / tokens == pytest.approx(rates["text_cache_bytes_per_token"], rel=0.05)
        per_round = rates["instance_bytes_per_token"][str(seq)]
        assert size["instances"] / tokens == pytest.approx(per_round, rel=0.05)
