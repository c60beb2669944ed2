"""Pre-training corpora from the Hugging Face Hub (`data.source=hub`): the paper's English Wikipedia and
book collection (§3.4), or any text dataset, turned into documents of sentences like the local corpora.

Each entry of `data.hub` names one dataset and how to read it:

  path, name, split, revision,  what `datasets.load_dataset(path, name, split=split, revision=revision,
  data_files                    data_files=data_files)` loads (a Hub id or a local copy of the repository);
                                pin `revision` to reproduce; `data_files` (a glob inside the repository, e.g.
                                "20231101.en/train-*.parquet") reads those files only
  text_column                   the column holding the text (default "text")
  format                        wiki:      a row is an article; text passages only (`corpus.wiki_passages`),
                                           split into sentences
                                text:      a row is a document of prose, paragraphs split at blank lines
                                sentences: a row is one sentence; consecutive rows form a document, which
                                           ends where `document_column` changes, every `rows_per_document`
                                           rows, or at an empty row
  streaming                     read the dataset as a stream (nothing downloaded up front)

Documents are written to Arrow under cache_dir as they are produced (`datasets.map` with num_proc for
`wiki` and `text`; `Dataset.from_generator` for streams, one reader in order, and for the `sentences`
format, whose rows are read in ranges cut where a document starts, shared by num_proc processes), so memory
stays flat whatever the corpus size, and a second run with the same entry reads the cache back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import (
    Dataset,
    Features,
    Sequence,
    Value,
    concatenate_datasets,
    load_dataset,
    load_dataset_builder,
)
from datasets.exceptions import DataFilesNotFoundError, DatasetGenerationError

from bert_repro.data.corpus import pool_size, prose_sentences, wiki_passages
from bert_repro.network import reaching

FORMATS = ("wiki", "text", "sentences")
DEFAULTS = {"name": None, "split": "train", "revision": None, "data_files": None, "text_column": "text",
            "format": "text", "streaming": False, "document_column": None, "rows_per_document": None}
DOCUMENT_FEATURES = Features({"sentences": Sequence(Value("string"))})
# Arrow data a num_proc worker must get, else the rows are split here: at a process's rate a pool pays from a
# few MB (docs/benchmarks.md, instances)
PROCESS_BYTES = 8 << 20
# `sentences` rows are grouped into documents in ranges of about this many rows (BookCorpus: ~8 MB of text,
# some 570 ranges), each starting where a document does, so that any num_proc gives one reader's documents
RANGE_ROWS = 1 << 17
HF_CACHE = "hf"  # the corpora's Hub data sets, under the pre-training's data.cache_dir
OFFLINE = "read a local copy of its files (path=<folder>) or text files (data.source=files data.corpus=...)"


def hub_spec(entry: dict) -> dict:
    """`entry` with the defaults filled in, checked; the message names the entry and what was expected."""
    entry = dict(entry)
    unknown = set(entry) - {"path", *DEFAULTS}
    if "path" not in entry or unknown:
        raise ValueError(f"data.hub entry {entry}: needs 'path'; valid keys are path, {', '.join(DEFAULTS)}"
                         + (f" (unknown: {', '.join(sorted(unknown))})" if unknown else ""))
    spec = {**DEFAULTS, **entry}
    if spec["format"] not in FORMATS:
        raise ValueError(f"data.hub entry {spec['path']!r}: format={spec['format']!r}; expected one of "
                         f"{FORMATS}")
    return spec


def row_documents(texts: Iterable[str], fmt: str) -> Iterator[list[str]]:
    """Sentences of each row of a `wiki` or `text` dataset (one document per row)."""
    for text in texts:
        if fmt == "wiki":
            yield [s for passage in wiki_passages(text.split("\n")) for s in prose_sentences(passage)]
        else:
            yield [s for paragraph in re.split(r"\n\s*\n", text) for s in prose_sentences(paragraph)]


def _rows_to_documents(batch: dict, text_column: str, fmt: str) -> dict:
    return {"sentences": [doc for doc in row_documents(batch[text_column], fmt) if doc]}


def _sentence_documents(rows: Iterable[dict], spec: dict) -> Iterator[list[str]]:
    """Group sentence rows into documents (see the module docstring)."""
    column, by, every = spec["text_column"], spec["document_column"], spec["rows_per_document"]
    document: list[str] = []
    key = None
    for i, row in enumerate(rows):
        text = " ".join((row[column] or "").split())
        new_key = row[by] if by else (i // every if every else None)
        if document and (new_key != key or (not by and not every and not text)):
            yield document
            document = []
        key = new_key
        if text:
            document.append(text)
    if document:
        yield document


def damaged_file(spec: dict, err: Exception) -> ValueError:
    """The refusal of a data set whose file does not read (a parquet shard cut short, a copy gone wrong),
    naming the first of the entry's parquet files that does not open, else the reader's own words."""
    cause = err.__cause__ if isinstance(err, DatasetGenerationError) and err.__cause__ else err
    where = f"data.hub entry {spec['path']!r} (split {spec['split']!r})"
    builder = load_dataset_builder(spec["path"], spec["name"], revision=spec["revision"],
                                   data_files=spec["data_files"])
    for file in (builder.config.data_files or {}).get(spec["split"], []):
        if str(file).endswith(".parquet"):
            try:
                with fsspec.open(file) as handle:
                    pq.ParquetFile(handle)
            except (OSError, pa.ArrowException) as problem:
                return ValueError(f"{where}: {file} is damaged ({problem}); expected a whole parquet file: "
                                  "fetch it again (delete it, or the Hub cache's copy) and rerun")
    return ValueError(f"{where} does not read: {type(cause).__name__}: {cause}")


def _load(spec: dict, cache_dir: Path | None, streaming: bool, num_proc: int | None = None):
    try:
        return _open(spec, cache_dir, streaming, num_proc)
    except (DatasetGenerationError, pa.ArrowException) as err:
        raise damaged_file(spec, err) from None
    except FileNotFoundError as err:  # datasets names the folder (or every extension it tried), not the key
        if spec["data_files"] is None or not (isinstance(err, DataFilesNotFoundError)
                                              or str(err).startswith("Unable to find")):
            raise
        raise ValueError(f"data.hub entry {spec['path']!r}: data_files={spec['data_files']!r} matches no "
                         "data file there; expected a path or glob of its files, e.g. 'data/train-*.parquet'"
                         ) from None


def _open(spec: dict, cache_dir: Path | None, streaming: bool, num_proc: int | None = None):
    # num_proc: the files (Wikipedia's 41 parquet shards) converted to Arrow by that many processes
    rows = load_dataset(spec["path"], spec["name"], split=spec["split"], revision=spec["revision"],
                        data_files=spec["data_files"], streaming=streaming,
                        cache_dir=str(cache_dir) if cache_dir else None,
                        **({"num_proc": num_proc} if num_proc and num_proc > 1 and not streaming else {}))
    columns = rows.column_names or []  # a stream may not know its columns before the first row
    needed = [spec["text_column"]] + ([spec["document_column"]] if spec["document_column"] else [])
    missing = [c for c in needed if columns and c not in columns]
    if missing:
        raise ValueError(f"data.hub entry {spec['path']!r} (split {spec['split']!r}) has no column "
                         f"{missing[0]!r}; "
                         f"its columns are {columns}: set text_column (or document_column) to one of them")
    return rows


def _checked_rows(rows: Iterable[dict], spec: dict) -> Iterator[dict]:
    """The rows, the first one checked for the configured columns (a stream names them only then)."""
    for i, row in enumerate(rows):
        if i == 0:
            for column in filter(None, (spec["text_column"], spec["document_column"])):
                if column not in row:
                    raise ValueError(f"data.hub entry {spec['path']!r} (split {spec['split']!r}) has no "
                                     f"column {column!r}; its columns are {list(row)}: set text_column (or "
                                     "document_column)")
        yield row


def _document_starts(rows: Dataset, spec: dict) -> list[int]:
    """Rows where a `sentences` document starts, about RANGE_ROWS apart, and the row count last: a reader
    that starts at one gives the documents one reader from the first row gives there (every
    `rows_per_document` rows counting from a multiple of it; else after a change of `document_column`, or
    after an empty row)."""
    n, every, by = len(rows), spec["rows_per_document"], spec["document_column"]
    if every and not by:
        return [0, *range(step := max(1, RANGE_ROWS // every) * every, n, step), n]
    column = by or spec["text_column"]
    starts = [0]
    for cut in range(RANGE_ROWS, n, RANGE_ROWS):
        start = max(cut, starts[-1] + 1)
        for window in range(start - 1, n - 1, 4096):  # windows of 4,097 rows: each row with the one before
            values = rows[window : window + 4097][column]
            ends = [k for k in range(1, len(values))
                    if (values[k] != values[k - 1] if by else not (values[k - 1] or "").split())]
            if ends:
                starts.append(window + ends[0])
                break
        else:
            break  # no document starts after `cut`: the last range runs to the end
    return [*starts, n]


def _generate_ranges(spec: dict, ranges: list[tuple[int, int]], cache_dir: str) -> Iterator[dict]:
    """`Dataset.from_generator` source, sharded: the documents of `sentences` rows start..end-1 for each
    range, in order (the ranges from `_document_starts`)."""
    rows = _load(spec, Path(cache_dir), streaming=False)
    for start, end in ranges:
        for sentences in _sentence_documents(rows.select(range(start, end)), spec):
            yield {"sentences": sentences}


def _generate(spec: dict, max_documents: int | None, cache_dir: str | None) -> Iterator[dict]:
    """`Dataset.from_generator` source: the documents of one entry, in order. Its arguments are plain
    values, so they (and this function's code) are the key of the Arrow cache it fills."""
    rows = _checked_rows(_load(spec, Path(cache_dir) if cache_dir else None, spec["streaming"]), spec)
    if spec["format"] == "sentences":
        documents = _sentence_documents(rows, spec)
    else:
        documents = (doc for doc in row_documents((row[spec["text_column"]] for row in rows), spec["format"])
                     if doc)
    for n, sentences in enumerate(documents):
        if max_documents is not None and n >= max_documents:
            return
        yield {"sentences": sentences}


def load_hub_documents(entries: list[dict], cache_dir: str | Path, num_proc: int | None = None,
                       max_documents: int | None = None) -> Dataset:
    """One row per document with a `sentences: list[str]` column: every entry's documents, in order
    (the first `max_documents` of each when set). A Hub that does not answer within network.timeout_s is
    named with the entry (network.reaching)."""
    hf_cache = Path(cache_dir) / HF_CACHE
    parts = []
    for spec in map(hub_spec, entries):
        with reaching(f"data.hub entry {spec['path']!r}", OFFLINE):
            documents = _documents(spec, hf_cache, num_proc, max_documents)
        if len(documents) == 0:
            raise ValueError(f"data.hub entry {spec['path']!r} ({spec['format']} format, column "
                             f"{spec['text_column']!r}) gave no documents")
        parts.append(documents)
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


def _documents(spec: dict, hf_cache: Path, num_proc: int | None, max_documents: int | None) -> Dataset:
    if spec["format"] == "sentences" and not spec["streaming"] and max_documents is None:
        # an Arrow dataset on disk: ranges of rows grouped in parallel
        rows = _load(spec, hf_cache, streaming=False, num_proc=num_proc)
        starts = _document_starts(rows, spec)
        return _from_generator(
            _generate_ranges, hf_cache, pool_size(rows, num_proc, PROCESS_BYTES),
            {"spec": spec, "ranges": list(zip(starts[:-1], starts[1:])), "cache_dir": str(hf_cache)})
    if spec["streaming"] or spec["format"] == "sentences":  # one reader, in order
        return _from_generator(_generate, hf_cache, None,
                               {"spec": spec, "max_documents": max_documents, "cache_dir": str(hf_cache)})
    # an Arrow dataset on disk: split articles into sentences in parallel
    rows = _load(spec, hf_cache, streaming=False, num_proc=num_proc)
    if max_documents is not None:
        rows = rows.select(range(min(max_documents, len(rows))))
    return rows.map(_rows_to_documents, batched=True, remove_columns=rows.column_names,
                    num_proc=pool_size(rows, num_proc, PROCESS_BYTES), features=DOCUMENT_FEATURES,
                    fn_kwargs={"text_column": spec["text_column"], "fmt": spec["format"]})


def _from_generator(generator, hf_cache: Path, num_proc: int | None, gen_kwargs: dict) -> Dataset:
    try:
        return Dataset.from_generator(generator, features=DOCUMENT_FEATURES, cache_dir=str(hf_cache),
                                      gen_kwargs=gen_kwargs, num_proc=num_proc)
    # the builder wraps our own message; show it, not the wrapper
    except DatasetGenerationError as err:
        if isinstance(err.__cause__, pa.ArrowException):  # a file of the data set, read in the generator
            raise damaged_file(gen_kwargs["spec"], err) from None
        if isinstance(err.__cause__, ValueError):
            raise err.__cause__ from None
        raise
