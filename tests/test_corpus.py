"""Pre-training corpora: the original format, the converted sources, Wikipedia "text passages only",
and Hugging Face datasets (data.source=hub), read from local dataset folders: tests never touch the Hub."""

import json
import random
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_repro.data import hub
from bert_repro.data.corpus import (
    gutenberg_documents,
    is_passage,
    load_documents,
    pool_size,
    wiki_passages,
    wikitext_documents,
    write_documents,
)
from bert_repro.data.hub import load_hub_documents
from bert_repro.data.pretraining import PretrainDataModule

from .conftest import SHARED

TEXT = SHARED / "pretrain_text"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not found (shared data; set BERT_REPRO_SHARED_DATA)")
    return path


# --- local corpora --------------------------------------------------------------------------------------


def test_original_format_crlf_and_document_breaks(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"First one.\r\nSecond one.\r\n\r\n\r\nNext doc.\r\n   \r\nThird "
                                     b"doc.\r\n")
    (tmp_path / "b.txt").write_text("Only line of b.\n")
    docs = load_documents(str(tmp_path), cache_dir=tmp_path / "cache")
    assert docs["sentences"] == [["First one.", "Second one."], ["Next doc."], ["Third doc."],
                                 ["Only line of b."]]


def test_sample_text_reads_as_three_documents(tmp_path):
    docs = load_documents(str(_need(TEXT / "sample_text.txt")), cache_dir=tmp_path)
    assert len(docs) == 3
    assert docs[0]["sentences"][0].startswith("This text is included to make sure Unicode")
    assert [len(s) for s in docs["sentences"]] == [3, 13, 15]


def test_missing_or_empty_corpus_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such_corpus"):
        load_documents(str(tmp_path / "no_such_corpus"), cache_dir=tmp_path)
    (tmp_path / "blank.txt").write_text("\n\n  \n")
    with pytest.raises(ValueError, match="blank.txt"):
        load_documents(str(tmp_path / "blank.txt"), cache_dir=tmp_path)


def reference_documents(path: Path) -> list[list[str]]:
    """google-research/bert's create_pretraining_data.py reader: each line through convert_to_unicode, which
    decodes bytes with errors="ignore", then stripped; an empty line ends a document."""
    documents: list[list[str]] = [[]]
    for raw in path.read_bytes().split(b"\n"):
        line = raw.decode("utf-8", "ignore").strip()
        if not line:
            documents.append([])
        else:
            documents[-1].append(line)
    return [d for d in documents if d]


def test_undecodable_bytes_are_dropped_as_the_reference_reader_drops_them(tmp_path, caplog):
    """One Latin-1 byte used to end pre-training in a raw DatasetGenerationError traceback."""
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(b"The caf\xe9 is open.\nIt serves coffee \xc3\xa0 la carte.\n"
                       b"\xff\xfe\nAfter a line of junk.\n"
                       b"\nSecond document, cut mid-character \xe2\x82.\n\n\x80\x81 Third document.\n")
    with caplog.at_level("WARNING", logger="bert_repro.data.corpus"):
        docs = load_documents(str(corpus), cache_dir=tmp_path / "cache")
    assert docs["sentences"] == reference_documents(corpus)
    assert docs["sentences"][0] == ["The caf is open.", "It serves coffee \u00e0 la carte."]
    assert docs.column_names == ["sentences"]
    assert "dropped 6 undecodable byte sequence(s)" in caplog.text and "latin1.txt" in caplog.text


def text_mode_documents(path: Path) -> tuple[list[list[str]], int]:
    """(documents, undecodable sequences) read line by line in text mode (universal newlines) as the original
    reader reads a file, each U+FFFD dropped and counted, each line stripped; a blank line ends a document."""
    documents, dropped = [[]], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            dropped += line.count("\ufffd")
            line = line.replace("\ufffd", "").strip()
            documents[-1].append(line) if line else documents.append([])
    return [d for d in documents if d], dropped


@pytest.mark.slow
def test_files_read_in_byte_ranges_and_blocks_as_a_line_by_line_reader(tmp_path, monkeypatch, caplog):
    """load_documents cuts files at blank lines into ranges (read by many processes) and blocks (memory):
    with ranges and blocks of a few bytes, every kind of line end, blank line, bad byte and whitespace falls
    on a cut, and the documents are still those of a line-by-line reader, for any num_proc."""
    from bert_repro.data import corpus

    monkeypatch.setattr(corpus, "BLOCK_BYTES", 17)
    monkeypatch.setattr(corpus, "READ_POOL_BYTES", 1)
    rng = random.Random(7)
    # U+3000, U+001C and U+00A0 are whitespace to str.strip(); a BOM is not
    pieces = [b"A sentence.", b"caf\xc3\xa9 \xe2\x80\x94 dash", b"bad \xe9 byte", b"cut \xe2\x82",
              b"\xff\xfe", b"  padded  ", b"\t", b" ", b"\xe3\x80\x80", b"\x1c", b"\xc2\xa0x\xc2\xa0", b"",
              b"\xef\xbb\xbfbom"]
    ends = [b"\n", b"\r\n", b"\r", b"\n\n", b"\r\n\r\n", b"\n \n", b"\n\t\r\n"]
    for case, last in enumerate([b"", b"last line, no line end"]):
        path = tmp_path / f"c{case}.txt"
        path.write_bytes(b"".join(rng.choice(pieces) + rng.choice(ends) for _ in range(400)) + last)
        expected, dropped = text_mode_documents(path)
        monkeypatch.setattr(corpus, "READ_BYTES", 23)
        assert len(expected) > 50 and dropped > 20
        assert len(corpus.byte_ranges([path])) > 50  # the processes share one file
        for num_proc in (1, 3):
            docs = load_documents(str(path), cache_dir=tmp_path / f"c-{case}-{num_proc}", num_proc=num_proc)
            assert docs["sentences"] == expected
        # every undecodable sequence is counted, those of blank lines too (unless a whole range is blank)
        monkeypatch.setattr(corpus, "READ_BYTES", 1 << 20)
        with caplog.at_level("WARNING", logger="bert_repro.data.corpus"):
            load_documents(str(path), cache_dir=tmp_path / f"cache-{case}")
        assert f"dropped {dropped} undecodable byte sequence(s)" in caplog.text
        caplog.clear()


@pytest.mark.slow
def test_arrow_strips_the_whitespace_python_strips():
    """documents_table strips lines with Arrow's utf8_trim_whitespace: the same characters as str.strip()."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chars = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000]  # no lone surrogates
    trimmed = pc.utf8_length(pc.utf8_trim_whitespace(pa.array(chars))).to_numpy()
    assert [c for c, n in zip(chars, trimmed) if (n == 0) != c.isspace()] == []


def test_converted_sources_log_progress_and_drop_bad_bytes(tmp_path, caplog):
    wiki = tmp_path / "wiki.raw"
    wiki.write_bytes(b" = First = \n\n The caf\xe9 opened in the spring of that year . It was busy .\n\n"
                     b" = Second = \n\n A second article has one passage of running text here .\n")
    with caplog.at_level("INFO"):
        docs = load_documents(f"wikitext:{wiki}", cache_dir=tmp_path / "cache")
    assert len(docs) == 2 and docs[0]["sentences"][0].startswith("The caf opened")
    assert f"converting wikitext:{wiki}: documents: 3 in all" in caplog.text  # the empty preamble too
    assert "dropped 1 undecodable byte sequence(s)" in caplog.text


@pytest.mark.parametrize("content,message", [
    (b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4, "is gzip-compressed, not text"),
    (b"PK\x03\x04" + b"A sentence.\n" * 10, "is zip-compressed, not text"),
    (b"A sentence.\n\x00\x01\x02\n", r"is a binary file \(it holds NUL bytes\)"),
    (bytes(range(128, 256)) * 8 + b"\nA sentence.\n", "is mostly not text"),
])
def test_a_file_that_is_not_text_is_refused_by_name(tmp_path, content, message):
    (tmp_path / "corpus.txt").write_bytes(content)
    with pytest.raises(ValueError, match=message) as err:
        load_documents(str(tmp_path), cache_dir=tmp_path / "cache")
    assert str(tmp_path / "corpus.txt") in str(err.value)


def test_a_map_gets_a_pool_only_with_enough_data_per_process(tmp_path):
    """pool_size: num_proc processes of at least min_bytes each, or fewer; None (this process) below two.
    A split (an indices mapping into its table) counts its share of the table."""
    from datasets import Dataset

    docs = Dataset.from_dict({"text": ["x" * 1000] * 100})  # about 100 kB
    size = docs.data.nbytes
    assert pool_size(docs, None, 1) is None and pool_size(docs, 1, 1) is None
    assert pool_size(docs, 4, size // 4) == 4 and pool_size(docs, 8, size // 3) == 3
    assert pool_size(docs, 4, size // 2 + 1) is None  # one process's worth: no pool
    half = docs.select(range(50))
    assert pool_size(half, 4, size // 4) == 2


def test_pydoc_builtin_corpus(tmp_path):
    docs = load_documents("builtin:pydoc", cache_dir=tmp_path)
    assert len(docs) >= 60  # one per pydoc topic with prose
    sentences = [s for d in docs["sentences"] for s in d]
    assert len(sentences) > 1500 and all(len(s.split()) >= 3 for s in sentences)
    written = next((tmp_path / "corpora").glob("pydoc-*.txt"))
    stamp = written.stat().st_mtime_ns
    assert len(load_documents("builtin:pydoc", cache_dir=tmp_path)) == len(docs)
    assert written.stat().st_mtime_ns == stamp  # written once, then read like any other file


def test_two_writers_of_one_cache_file_each_rename_a_whole_copy(tmp_path):
    """Runs sharing a cache (a joblib launcher's jobs, two test workers) may convert the same corpus at once:
    here the other writer finishes while this one is half way."""
    path = tmp_path / "corpora" / "pydoc.txt"

    def documents():
        yield ["First sentence here.", "Second sentence here."]
        write_documents([["The other writer's sentence."]], path)
        yield ["Third sentence here."]

    write_documents(documents(), path)
    assert path.read_text() == "First sentence here.\nSecond sentence here.\n\nThird sentence here.\n\n"
    assert [p.name for p in path.parent.iterdir()] == ["pydoc.txt"]  # no temporary file left behind


def test_gutenberg_book_converts_to_chapters(tmp_path):
    book = _need(TEXT / "gutenberg" / "11.txt")  # Alice's Adventures in Wonderland: 12 chapters
    path = write_documents(gutenberg_documents(book), tmp_path / "alice.txt")
    docs = load_documents(str(path), cache_dir=tmp_path)
    assert len(docs) == 12
    assert docs[0]["sentences"][0].startswith("Alice was beginning to get very tired")
    text = " ".join(s for d in docs["sentences"] for s in d)
    assert "Project Gutenberg" not in text and "START OF" not in text


# --- Wikipedia: text passages only (§3.4) ---------------------------------------------------------

ARTICLE = """\
Anarchism is a political philosophy and movement that is skeptical of all justifications for authority.
Humans lived in societies without formal hierarchies long before the establishment of states.

History
= = Early history = =
During the Neolithic period, people began to settle in villages and form the first states.
* Peter Kropotkin, a Russian geographer and the best known writer of the movement.
# A numbered list item that is long enough to be a sentence of its own.
{| class="wikitable"
| Year || Event || Place of the event in question.
! Header cell of the table with several words in it.
Studio albums
Church of Realities ( 1995 )
See also
Libertarianism is a related philosophy that the article links to at the end."""


def test_wiki_passages_keep_running_text_only():
    kept = list(wiki_passages(ARTICLE.split("\n")))
    assert kept == [
        "Anarchism is a political philosophy and movement that is skeptical of all justifications for "
        "authority.",
        "Humans lived in societies without formal hierarchies long before the establishment of states.",
        "During the Neolithic period, people began to settle in villages and form the first states.",
    ]  # headings, list items, table rows and cells, discographies, and everything after "See also" dropped
    # WikiText's spaced quotes
    assert is_passage('He was described as " horribly menacing " in the role . " ')
    assert is_passage("In his later poems, he wrote :")  # a passage leading into a quotation
    assert not is_passage("Kid Bass ( Kurt Blankenship ) — bass ( 2015 – current )")


def test_wikitext_articles_are_text_passages_only(tmp_path):
    raw = _need(TEXT / "wikitext-2-raw" / "wiki.test.raw")
    docs = [d for d in wikitext_documents(raw) if d]
    assert 60 <= len(docs) <= 62  # one document per " = Title = " article (62), unless it is all lists
    sentences = [s for d in docs for s in d]
    assert len(sentences) > 8000 and not any(s.startswith("=") or "@-@" in s for s in sentences)
    text = "\n".join(sentences)
    assert "Robert Boulter is an English film , television and theatre actor ." in text
    # lists of the source that must not survive: a discography, a band line-up, a taxonomy
    for listed in ("Church of Realities ( 1995 )", "Kristoffer Fogelmark — background vocals",
                   "Family Edopidae"):
        assert listed not in text


# --- Hugging Face datasets (data.source=hub), from local dataset folders ------------------------------


@pytest.fixture
def hub_dirs(tmp_path):
    """A Wikipedia-like dataset (one article per row, headings and lists inline) and a BookCorpus-like one
    (one sentence per row, a book id column), as JSON-lines folders that `datasets.load_dataset` reads."""
    wiki, books = tmp_path / "wiki", tmp_path / "books"
    wiki.mkdir()
    books.mkdir()
    with open(wiki / "train.jsonl", "w") as f:
        for i in range(6):
            text = ARTICLE.replace("Anarchism", f"Topic{i}")
            f.write(json.dumps({"id": str(i), "title": f"Topic{i}", "text": text}) + "\n")
    with open(books / "train.jsonl", "w") as f:
        for book in range(3):
            for s in range(5):
                f.write(json.dumps({"book": book, "text": f"this is sentence {s} of book {book} ."}) + "\n")
    return wiki, books


WIKI_FIRST = ["Topic0 is a political philosophy and movement that is skeptical of all justifications for "
              "authority.",
              "Humans lived in societies without formal hierarchies long before the establishment of states.",
              "During the Neolithic period, people began to settle in villages and form the first states."]


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_documents_wiki_and_books(hub_dirs, tmp_path, streaming):
    wiki, books = hub_dirs
    entries = [{"path": str(wiki), "format": "wiki", "streaming": streaming},
               {"path": str(books), "format": "sentences", "document_column": "book", "streaming": streaming}]
    docs = load_hub_documents(entries, cache_dir=tmp_path / "cache", num_proc=None)
    assert len(docs) == 6 + 3 and docs[0]["sentences"] == WIKI_FIRST
    assert docs[6]["sentences"] == [f"this is sentence {s} of book 0 ." for s in range(5)]
    capped = load_hub_documents(entries, cache_dir=tmp_path / "cache", max_documents=2)
    assert len(capped) == 2 + 2  # the first two documents of each dataset


def test_hub_calls_load_dataset_with_the_configured_names(hub_dirs, tmp_path, monkeypatch):
    """The real Hub path: `load_dataset(path, name, split=, revision=, streaming=)`, here answered locally."""
    wiki, _ = hub_dirs
    calls = []
    real = hub.load_dataset

    def fake(path, name=None, **kwargs):
        calls.append((path, name, kwargs["split"], kwargs["revision"], kwargs["streaming"]))
        return real(str(wiki), split=kwargs["split"], streaming=kwargs["streaming"])

    monkeypatch.setattr(hub, "load_dataset", fake)
    entry = {"path": "wikimedia/wikipedia", "name": "20231101.en", "revision": "abc123", "format": "wiki",
             "streaming": True}
    docs = load_hub_documents([entry], cache_dir=tmp_path / "cache")
    assert calls == [("wikimedia/wikipedia", "20231101.en", "train", "abc123", True)]
    assert docs[0]["sentences"] == WIKI_FIRST
    # a second run with the same entry reads the Arrow cache back: the Hub is not asked again
    monkeypatch.setattr(hub, "load_dataset", lambda *a, **k: pytest.fail("the cached corpus was read again"))
    assert load_hub_documents([entry], cache_dir=tmp_path / "cache")["sentences"] == docs["sentences"]


def test_sentence_rows_without_ids_group_by_count_or_blank_rows(tmp_path):
    rows = [{"text": t} for t in ["a one .", "a two .", "", "b one .", "b two .", "b three ."]]
    spec = hub.hub_spec({"path": "x", "format": "sentences"})
    assert list(hub._sentence_documents(rows, spec)) == [["a one .", "a two ."],
                                                         ["b one .", "b two .", "b three ."]]
    spec = hub.hub_spec({"path": "x", "format": "sentences", "rows_per_document": 2})
    assert list(hub._sentence_documents(rows, spec)) == [["a one .", "a two ."], ["b one ."],
                                                         ["b two .", "b three ."]]


@pytest.mark.parametrize("grouping", [{"rows_per_document": 3}, {"document_column": "book"}, {}])
@pytest.mark.slow
def test_sentence_rows_read_in_ranges_give_one_readers_documents(tmp_path, monkeypatch, grouping):
    """`sentences` rows grouped in ranges of a few rows, by two processes, cut where a document starts (every
    3 rows, where `book` changes, after an empty row): the documents one reader gives from the first row,
    empty rows, runs of one book longer than a range and a last document without an end included."""
    rng = np.random.default_rng(0)
    books = np.repeat(np.arange(12), rng.integers(1, 15, 12))
    texts = [rng.choice(["", "  ", f"s{i} of {book} .", f"t{i}\t end ."], p=[0.1, 0.05, 0.6, 0.25])
             for i, book in enumerate(books.tolist())]
    folder = tmp_path / "rows"
    folder.mkdir()
    pq.write_table(pa.table({"text": texts, "book": books}), folder / "rows.parquet")
    spec = hub.hub_spec({"path": str(folder), "format": "sentences", **grouping})
    expected = list(hub._sentence_documents([{"text": t, "book": b} for t, b in zip(texts, books.tolist())],
                                            spec))
    monkeypatch.setattr(hub, "RANGE_ROWS", 7)
    monkeypatch.setattr(hub, "PROCESS_BYTES", 1)  # a pool for any size
    starts = hub._document_starts(hub._load(spec, tmp_path / "hf", streaming=False), spec)
    assert len(starts) > 6 and starts == sorted(set(starts)) and starts[-1] == len(texts)
    for num_proc in (None, 2):
        got = load_hub_documents([spec], cache_dir=tmp_path / f"cache-{num_proc}", num_proc=num_proc)
        assert got.to_dict()["sentences"] == expected and len(expected) >= 8
        assert len(got.cache_files) == (num_proc or 1)  # one shard per process


def test_hub_entry_mistakes_are_named(hub_dirs, tmp_path):
    wiki, _ = hub_dirs
    with pytest.raises(ValueError, match="unknown: colum"):
        hub.hub_spec({"path": str(wiki), "colum": "text"})
    with pytest.raises(ValueError, match="format='html'"):
        hub.hub_spec({"path": str(wiki), "format": "html"})
    for streaming in (False, True):
        with pytest.raises(ValueError, match="no column 'body'.*'title', 'text'"):
            load_hub_documents([{"path": str(wiki), "text_column": "body", "streaming": streaming}],
                               cache_dir=tmp_path)
    for files in ("shards/*.parquet", "train.parquet"):  # a glob, and a name, that match nothing there
        with pytest.raises(ValueError, match=rf"data.hub entry '{wiki}': data_files='{re.escape(files)}' "
                                             "matches no data file there"):
            load_hub_documents([{"path": str(wiki), "data_files": files}], cache_dir=tmp_path)
    with pytest.raises(ValueError, match="data.source=hub needs data.hub"):
        PretrainDataModule(source="hub")
    with pytest.raises(ValueError, match="data.source='web'"):
        PretrainDataModule("builtin:pydoc", source="web")


def test_datamodule_reads_hub_source(hub_dirs, tmp_path):
    wiki, books = hub_dirs
    entries = [{"path": str(wiki), "format": "wiki"},
               {"path": str(books), "format": "sentences", "document_column": "book"}]
    dm = PretrainDataModule(source="hub", hub=entries, vocab_size=300, max_seq_length=32,
                            max_predictions_per_seq=5, val_fraction=0.2, cache_dir=str(tmp_path / "cache"),
                            nsp=False)
    dm.setup()
    assert dm.corpus_name == f"hub:{wiki}+{books}"
    # every document, split
    assert len(set(dm.train_set["doc_index"])) + len(set(dm.val_set["doc_index"])) == 9
    assert dm.instance_stats["train"]["instances"] == len(dm.train_set) > 0
