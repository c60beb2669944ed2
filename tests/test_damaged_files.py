"""Damaged files: a cache this platform wrote and finds cut short is rebuilt, saying so; a user's
damaged file is refused by name; a failed write (a full disk) leaves no temporary file."""

import errno
import logging
import os
import subprocess
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_repro.data.hub import load_hub_documents
from bert_repro.data.pretraining import PretrainDataModule

from .conftest import SHARED

SAMPLE = SHARED / "pretrain_text" / "sample_text.txt"


def _module(cache, **kwargs) -> PretrainDataModule:
    if not SAMPLE.is_file():
        pytest.skip(f"{SAMPLE} not found (shared data; set BERT_REPRO_SHARED_DATA)")
    settings = dict(tokenizer=None, vocab_size=300, masking="static", val_fraction=0.2, max_seq_length=64,
                    cache_dir=str(cache))
    dm = PretrainDataModule(str(SAMPLE), **{**settings, **kwargs})
    dm.setup()
    return dm


def _cut(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("cache_file", ["instances-train-*.arrow", "tokens-train-*.arrow",
                                        "instances-val-*.arrow", "hf/corpus/**/*.arrow"])
def test_a_damaged_cache_is_rebuilt_and_said_so(tmp_path, caplog, cache_file):
    first = _module(tmp_path)
    expected = first.train_set.to_dict(), first.val_set.to_dict()
    folder = tmp_path if cache_file.startswith("hf") else tmp_path / "pretrain"
    damaged = sorted(folder.glob(cache_file))
    assert damaged
    for file in damaged:
        _cut(file)
    with caplog.at_level(logging.WARNING):
        again = _module(tmp_path)
    assert (again.train_set.to_dict(), again.val_set.to_dict()) == expected
    for file in damaged:
        assert f"cache file {file} is damaged" in caplog.text and "rebuilding it" in caplog.text


def test_a_cache_cut_where_a_batch_ends_is_rebuilt(tmp_path, caplog):
    """A file cut where a record batch ends reads as a whole, shorter table: the end-of-stream marker it lacks
    tells."""
    first = _module(tmp_path)
    (file,) = (tmp_path / "pretrain").glob("instances-train-*.arrow")
    with pa.memory_map(str(file)) as source:
        assert pa.ipc.open_stream(source).read_all().num_rows == len(first.train_set)
    file.write_bytes(file.read_bytes()[:-8])
    with pa.memory_map(str(file)) as source:
        assert pa.ipc.open_stream(source).read_all().num_rows == len(first.train_set)  # reads, unmarked
    with caplog.at_level(logging.WARNING):
        _module(tmp_path)
    assert f"cache file {file} is damaged (it ends before Arrow's end-of-stream marker)" in caplog.text


@pytest.mark.parametrize("cache_file", ["rows-rte-train-*.arrow", "tokens-rte-dev-*.arrow"])
@pytest.mark.slow
def test_a_damaged_fine_tuning_cache_is_rebuilt_and_said_so(tmp_path, caplog, minilm_dir, cache_file):
    """The fine-tuning tasks' caches (data.base.cached_map) as pre-training's: a file cut in half is rebuilt
    with a log line naming it, not read back as a raw Arrow error."""
    from bert_repro.data.glue import GlueDataModule

    labels = ("entailment", "not_entailment")
    rows = [["index", "sentence1", "sentence2", "label"]] + [
        [i, f"The cat number {i} sat on the mat.", "A cat is sitting.", labels[i % 2]] for i in range(64)]
    files = {}
    for split in ("train", "dev"):
        (tmp_path / f"{split}.tsv").write_text("".join("\t".join(map(str, r)) + "\n" for r in rows))
        files[split] = str(tmp_path / f"{split}.tsv")

    def built() -> dict:
        dm = GlueDataModule("rte", tokenizer=str(minilm_dir), cache_dir=str(tmp_path / "cache"), files=files)
        dm.setup()
        return {split: data.to_dict() for split, data in dm.datasets.items()}

    expected = built()
    (damaged,) = (tmp_path / "cache").glob(cache_file)
    _cut(damaged)
    with caplog.at_level(logging.WARNING):
        assert built() == expected
    assert f"cache file {damaged} is damaged" in caplog.text and "rebuilding it" in caplog.text
    assert not list((tmp_path / "cache").glob("tmp*"))


@pytest.mark.parametrize("streaming", [False, True])
def test_a_truncated_parquet_shard_is_refused_by_name(tmp_path, streaming):
    (tmp_path / "data" / "data").mkdir(parents=True)
    text = "A sentence that is long enough to be kept here. Another sentence follows it in the row."
    for shard in range(2):
        pq.write_table(pa.table({"text": [text] * 300}),
                       tmp_path / "data" / "data" / f"train-0000{shard}-of-00002.parquet")
    shard = tmp_path / "data" / "data" / "train-00001-of-00002.parquet"
    _cut(shard)
    with pytest.raises(ValueError) as err:
        load_hub_documents([{"path": str(tmp_path / "data"), "streaming": streaming}],
                           cache_dir=tmp_path / "cache")
    assert f"{shard} is damaged" in str(err.value) and "expected a whole parquet file" in str(err.value)


@pytest.fixture(params=["2m", "3m"])  # full while reading the corpus, while writing token ids
def full_disk(tmp_path, request):
    """A small tmpfs (root only)."""
    folder = tmp_path / f"full-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={request.param}", "tmpfs", str(folder)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)  # lazily: the error still maps its files


@pytest.mark.slow
def test_a_full_disk_leaves_no_temporary_file(full_disk):
    wikitext = SHARED / "pretrain_text" / "wikitext-2-raw" / "wiki.test.raw"
    if not wikitext.is_file():
        pytest.skip(f"{wikitext} not found (shared data; set BERT_REPRO_SHARED_DATA)")
    with pytest.raises(OSError) as err:
        PretrainDataModule(f"wikitext:{wikitext}", vocab_size=500, masking="static", dupe_factor=8,
                           val_fraction=0.1, cache_dir=str(full_disk)).setup()
    assert err.value.errno == errno.ENOSPC
    left = [p for p in full_disk.rglob("*") if p.is_file() and (p.name.startswith(("tmp", "."))
                                                                  or ".incomplete" in str(p))]
    assert not [p for p in left if not p.name.endswith(".lock")], left


def test_a_vocabulary_that_does_not_cover_the_corpus_is_refused(tmp_path):
    """A 100-token vocab.txt turns most of a corpus into [UNK]; it trains to nonsense, so it is refused,
    naming the vocabulary and the share."""
    vocab = tmp_path / "vocab.txt"
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters[:20],
                                *[f"w{i}" for i in range(75)]]) + "\n")
    with pytest.raises(ValueError) as err:
        _module(tmp_path / "cache", tokenizer=str(vocab))
    message = str(err.value)
    assert f"data.tokenizer={vocab} (100 tokens) turns" in message
    assert "data.max_unknown_share=0.05" in message
    share = float(message.split(" turns ")[1].split("%")[0])
    assert 20 < share <= 100
    dm = _module(tmp_path / "cache", tokenizer=str(vocab), max_unknown_share=1.0)  # the user's call
    assert len(dm.train_set) > 0
