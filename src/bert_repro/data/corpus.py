"""Pre-training corpora as documents of sentences (§3.3: "a document-level corpus", for NSP).

The on-disk format is google-research/bert's `create_pretraining_data.py` input: one sentence per
line, a blank line between documents. `load_documents` reads it through a `datasets` builder
(`OriginalFormat`), so a corpus is read once, in parallel even from one large file, then memory-mapped from
the Arrow cache. Sources that are not yet in that format are converted once into it under the cache
directory:

  builtin:pydoc        the English reference text that ships with CPython (pydoc_data), one
                       document per topic; offline and always present, for smoke runs and tests
  wikitext:<file>      WikiText raw (" = Title = " starts an article), one document per article,
                       text passages only (`wiki_passages`)
  gutenberg:<path>     Project Gutenberg plain-text books (a file or a directory of *.txt),
                       licence stripped, one document per chapter

Hugging Face datasets (data.source=hub) are read by `hub.py` with the same sentence splitter and filter.

Undecodable bytes are dropped, as `create_pretraining_data.py` reads its input
(`tokenization.convert_to_unicode`, errors="ignore"), and counted in the log; a file that is mostly not
text (binary, compressed) is refused by name.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, Features, Sequence, Value

from bert_repro.data.textfiles import refuse_non_text
from bert_repro.progress import counted, datasets_progress

log = logging.getLogger(__name__)

BUILTIN_PYDOC = "builtin:pydoc"
TEXT_EXPECTED = "plain text, one sentence per line and a blank line between documents"
READER_VERSION = 1  # part of the documents' cache key: bump when `documents_table` reads text otherwise
BLOCK_BYTES = 1 << 20  # text read and split at a time: memory stays flat whatever the corpus size
READ_BYTES = 4 << 20  # files are read in ranges of about this size, the shards num_proc processes share
# text per process below which a corpus is read here: a pool costs time to start and stop (pool_size)
READ_POOL_BYTES = 32 << 20
MIN_WORDS = 3  # converted sentences with fewer words are headings, list items or code, not prose

# A sentence ends at . ! or ? (and any closing quotes/brackets) followed by whitespace and a capital
# letter, digit or opening quote. Deliberately simple: the original BERT data used an external
# sentence splitter, and NSP only needs sentence-ish units that respect document order.
_SENTENCE_END = re.compile(r"""([.!?]+["'\u201d\u2019)\]]*)\s+(?=["'\u201c\u2018(\[]?[A-Z0-9])""")
# ...except after a title or an initial ("Mr. Holmes", "H. G. Wells"), which joins the next piece.
_ABBREVIATION = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|Prof|Mt|No|vs)|\b[A-Z]|\be\.g|\bi\.e)\.$")
# "Text passages only" (§3.4: for Wikipedia "we extract only the text passages and ignore lists, tables,
# and headers"). A line (a paragraph) is a passage when it has at least MIN_PASSAGE_WORDS words, ends like a
# sentence (or leads into a quote), and does not start with wiki list/table/heading markup; a back-matter
# heading (References, See also ...) ends the article's text. WikiText's " = = Heading = = " lines, track
# lists, cast lists, discographies and taxonomies, and the plain-text headings of the Hub's Wikipedia dumps
# all fail the test.
MIN_PASSAGE_WORDS = 6
# list items, definition lists, table rows, headings
_MARKUP = re.compile(r"^(?:[*#:;|!=\u2022\u00b7-]|\{\|)")
_PASSAGE_END = re.compile(r"""[.!?:](?:\s?["'\u201d\u2019)\]])*$""")  # ":" leads into a quote or list
BACK_MATTER = {"references", "see also", "external links", "further reading", "notes", "bibliography",
               "sources", "footnotes", "citations", "notes and references", "works cited"}
_GUTENBERG_HEADING = re.compile(
    r"^(?:(?:CHAPTER|Chapter|STAVE|LETTER|Letter|ADVENTURE|BOOK|Book|PART|Part)\b.{0,60}|[IVXLC]+\.?)$"
)


ARROW_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the end-of-stream marker every finished Arrow stream has


def default_cache_dir() -> Path:
    return Path(os.environ.get("BERT_REPRO_CACHE", Path.home() / ".cache" / "bert_repro"))


def split_sentences(text: str) -> list[str]:
    """Split prose into sentences with the regex above; whitespace (line wraps) is normalised."""
    pieces = _SENTENCE_END.sub("\\1\n", " ".join(text.split())).split("\n")
    sentences: list[str] = []
    for piece in pieces:
        if sentences and _ABBREVIATION.search(sentences[-1]):
            sentences[-1] += " " + piece
        elif piece:
            sentences.append(piece)
    return sentences


def is_passage(line: str) -> bool:
    """A running-text paragraph, not a list item, table row or header (see MIN_PASSAGE_WORDS)."""
    line = line.strip()
    return (len(line.split()) >= MIN_PASSAGE_WORDS and _PASSAGE_END.search(line) is not None
            and _MARKUP.match(line) is None)


def is_back_matter(line: str) -> bool:
    """A heading ("References", " = = See also = = ") after which an article holds no more running text."""
    return line.strip().strip("=").strip().lower() in BACK_MATTER


def wiki_passages(lines: Iterable[str]) -> Iterator[str]:
    """The text passages of one article's lines, in order, whitespace normalised (§3.4)."""
    for line in lines:
        if is_back_matter(line):
            return
        if is_passage(line):
            yield " ".join(line.split())


def prose_sentences(paragraph: str) -> list[str]:
    return [s for s in split_sentences(paragraph) if len(s.split()) >= MIN_WORDS]


def drop_damaged(cache_file: str | Path) -> bool:
    """Delete the Arrow cache `cache_file` (with its shards: the files named as it with a suffix) if it no
    longer reads whole, with a log line naming it, so the `datasets` step that follows rebuilds it: a file
    this platform wrote, cut short by a crash, a full disk or a copy, would otherwise stop the run in Arrow's
    reader, naming no file. Returns whether it deleted any."""
    cache_file, dropped = Path(cache_file), False
    for file in sorted(cache_file.parent.glob(f"{cache_file.stem}*{cache_file.suffix}")):
        try:
            with pa.memory_map(str(file)) as source:
                pa.ipc.open_stream(source).read_all()  # a batch cut short
                source.seek(max(0, source.size() - len(ARROW_END)))
                whole = source.read(len(ARROW_END)) == ARROW_END  # cut between two batches
            damage = None if whole else "it ends before Arrow's end-of-stream marker"
        except (OSError, pa.ArrowInvalid) as err:
            damage = str(err)
        if damage:
            log.warning("cache file %s is damaged (%s): rebuilding it", file, damage)
            file.unlink()
            dropped = True
    return dropped


@contextmanager
def no_temporary_left(folder: Path) -> Iterator[None]:
    """`datasets.map` writes a cache file as a temporary one beside it (tmpXXXXXXXX) and leaves it when the
    write fails at closing (a full disk): on a failure, remove those this block made, never one that another
    process (a run side by side) holds open."""
    before = set(folder.glob("tmp*"))
    try:
        yield
    except BaseException:
        made = set(folder.glob("tmp*")) - before
        if made:
            held = set()
            for fd in Path("/proc").glob("[0-9]*/fd/*"):
                if fd.parts[2] != str(os.getpid()):
                    with suppress(OSError):
                        held.add(os.readlink(fd))
            for file in made:
                if str(file) not in held:
                    file.unlink(missing_ok=True)
        raise


@contextmanager
def replaced_whole(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path``, this writer's own, that replaces ``path`` when the block ends without
    error: no reader sees a half-written cache file, and runs that build the same one at once (a joblib
    launcher's jobs, two test workers) each rename a whole copy instead of writing into one another's."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_documents(documents: Iterable[list[str]], path: str | Path) -> Path:
    """Write documents in the original format; empty documents and blank sentences are dropped."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_whole(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for sentences in documents:
            sentences = [" ".join(s.split()) for s in sentences if s.strip()]
            if sentences:
                f.write("\n".join(sentences) + "\n\n")
    return path


def pydoc_documents() -> Iterator[list[str]]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        sentences = []
        for paragraph in re.split(r"\n\s*\n", topics[name]):
            lines = paragraph.strip("\n").splitlines()
            # Indented blocks are grammar and code; a line of *, =, - or ^ underlines a heading.
            if not lines or lines[0][:1].isspace() or any(re.fullmatch(r"[*=\-^~]+", ln) for ln in lines):
                continue
            sentences += prose_sentences(paragraph)
        yield sentences


def _wikitext_articles(path: Path) -> Iterator[list[str]]:
    """The lines of each WikiText article, read line by line (a corpus is never held whole in memory)."""
    lines: list[str] = []
    # universal newlines: CRLF reads as "\n"; a bad byte becomes U+FFFD, dropped in load_documents
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if re.fullmatch(r" = [^=].* = ", line):  # " = Title = " starts an article
                yield lines
                lines = []
            elif line.strip():
                lines.append(line)
    yield lines


def wikitext_documents(path: Path) -> Iterator[list[str]]:
    for article in _wikitext_articles(path):
        sentences: list[str] = []
        for passage in wiki_passages(article):
            # Undo the WikiText tokenisation of in-word hyphens and number separators.
            passage = passage.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
            sentences += prose_sentences(passage)
        yield sentences


def gutenberg_documents(path: Path) -> Iterator[list[str]]:
    for book in sorted(path.rglob("*.txt")) if path.is_dir() else [path]:
        text = book.read_text(encoding="utf-8", errors="replace")
        # Keep only the book: drop the Project Gutenberg header and the closing line and licence.
        start, end = text.find("*** START OF"), text.find("*** END OF")
        text = text[text.find("\n", start) + 1 if start >= 0 else 0 : end if end >= 0 else None]
        text = re.split(r"\n\s*End of (?:the )?Project Gutenberg", text)[0]
        chapters: list[list[str]] = [[]]
        for paragraph in re.split(r"\n\s*\n", text):
            if _GUTENBERG_HEADING.match(paragraph.strip()):
                chapters.append([])
            else:
                chapters[-1] += prose_sentences(paragraph)
        # Before the first heading come the title page and contents, not prose.
        yield from chapters[1:] if len(chapters) > 1 else chapters


_CONVERTERS = {"wikitext": wikitext_documents, "gutenberg": gutenberg_documents}
CONVERTER_VERSION = 2  # part of a converted corpus's file name: bump when a converter's output changes


def _fingerprint(*parts) -> str:
    """A short hash of `parts`, a path standing for its files' (resolved path, size, modification time)."""
    stats = []
    for part in parts:
        if isinstance(part, Path):
            files = sorted(part.rglob("*")) if part.is_dir() else [part]
            part = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()]
        stats.append(part)
    return hashlib.sha256(repr(stats).encode()).hexdigest()[:16]


def _resolve(source: str, cache_dir: Path) -> list[Path]:
    """The original-format files behind `source`, converting it first when needed."""
    kind, _, rest = source.partition(":")
    if source == BUILTIN_PYDOC:
        out = cache_dir / "corpora" / f"pydoc-{sys.version_info.major}.{sys.version_info.minor}.txt"
        return [out if out.is_file() else write_documents(pydoc_documents(), out)]
    if kind in _CONVERTERS:
        path = Path(rest).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"corpus {source!r}: {path} does not exist")
        for file in sorted(path.rglob("*.txt")) if path.is_dir() else [path]:
            refuse_non_text(file, f"{kind} plain text")
        out = cache_dir / "corpora" / f"{kind}-{path.stem}-{_fingerprint(path)}-v{CONVERTER_VERSION}.txt"
        if out.is_file():
            return [out]
        return [write_documents(counted(_CONVERTERS[kind](path), f"converting {source}: documents"), out)]
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"corpus {source!r} does not exist; expected a text file or a directory of *.txt files "
            f"(one sentence per line, blank line between documents), or {BUILTIN_PYDOC!r}"
        )
    files = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"corpus directory {path} holds no *.txt files")
    for file in files:
        refuse_non_text(file, TEXT_EXPECTED)
    return files


# A blank line in bytes (ASCII whitespace) is a document break in the text too; the rarer ones (a line of
# U+3000, say) show only in the text. So a cut after one of these always falls between two documents.
_BLANK_LINE = re.compile(rb"\n[ \t\r\x0b\x0c]*\n")
DOCUMENT_FEATURES = Features({"sentences": Sequence(Value("string")), "dropped": Value("int64")})


def documents_table(text: str, dropped_before: int = 0) -> pa.Table:
    """The documents of `text` (whole documents) as an Arrow table, its lines split, stripped and grouped
    without a Python loop. As in the original reader, a blank (whitespace-only) line ends a document and
    sentences are stripped. Each U+FFFD is an undecodable byte sequence (decoded with errors="replace"),
    dropped and counted (`dropped`, per document with the blank lines after it; `dropped_before`: those before
    the first) as convert_to_unicode(errors="ignore") drops it (its tokenizer drops a real U+FFFD too)."""
    if "\r" in text:  # universal newlines, as text mode reads
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = pc.split_pattern(pa.array([text], pa.large_string()), "\n").flatten()
    bad = np.zeros(len(lines), np.int64)
    if "\ufffd" in text:
        bad = pc.count_substring(lines, "\ufffd").to_numpy()
        lines = pc.replace_substring(lines, "\ufffd", "")
    lines = pc.utf8_trim_whitespace(lines)  # str.strip()'s whitespace (str.isspace) exactly
    kept = np.flatnonzero(pc.utf8_length(lines).to_numpy() > 0)
    firsts = kept[np.r_[True, np.diff(kept) > 1]] if len(kept) else kept  # each document's first line
    document = np.maximum(np.searchsorted(firsts, np.arange(len(lines)), "right") - 1, 0)
    dropped = np.bincount(document, weights=bad, minlength=len(firsts))[: len(firsts)].astype(np.int64)
    if len(dropped):
        dropped[0] += dropped_before
    offsets = np.r_[np.searchsorted(kept, firsts), len(kept)].astype(np.int32)
    sentences = pa.ListArray.from_arrays(pa.array(offsets), lines.take(pa.array(kept)).cast(pa.string()))
    return pa.table({"sentences": sentences, "dropped": pa.array(dropped)})


def _last_break(data: bytes) -> int:
    """The end of the last blank line in `data`, or 0: looked for in its last 64 kB first."""
    for start in (max(0, len(data) - (64 << 10)), 0):
        ends = [m.end() for m in _BLANK_LINE.finditer(data, start)]
        if ends or not start:
            return ends[-1] if ends else 0
    return 0


def read_range(path: str, start: int, end: int) -> Iterator[pa.Table]:
    """The documents of bytes [start, end) of `path` (whole documents: see `byte_ranges`), read BLOCK_BYTES at
    a time and cut at the block's last blank line (a longer document is read on to its end). A block of blank
    lines only adds what it dropped to a neighbour's count (a range of over READ_BYTES of them, to none)."""
    pending, held, dropped_before = b"", None, 0  # held: the last table, for the blank lines after it
    with open(path, "rb") as f:
        f.seek(start)
        left = end - start
        while left > 0 or pending:
            data = f.read(min(BLOCK_BYTES, left))
            left, pending = left - len(data), pending + data
            cut = len(pending)
            if left > 0:
                cut = _last_break(pending)
                if not cut:
                    continue
            text, pending = pending[:cut].decode("utf-8", errors="replace"), pending[cut:]
            table = documents_table(text, dropped_before)
            if not table.num_rows and held is None:
                dropped_before += text.count("\ufffd")
            elif not table.num_rows:
                dropped = held.column("dropped").to_numpy().copy()
                dropped[-1] += text.count("\ufffd")
                held = held.set_column(1, "dropped", pa.array(dropped))
            else:
                if held is not None:
                    yield held
                held, dropped_before = table, 0
    if held is not None:
        yield held


def _break_after(f, position: int, size: int) -> int:
    """The end of the first blank line (ASCII whitespace) that starts at or after `position` in the open
    file `f` of `size` bytes, or `size`."""
    if position >= size:
        return size
    f.seek(position - 1)
    f.readline()  # to the end of the line holding byte position - 1: the next line starts at or after it
    for line in iter(f.readline, b""):
        if not line.strip():
            return f.tell()
    return size


def byte_ranges(files: list[Path]) -> list[tuple[str, int, int]]:
    """(file, start, end): the files cut into ranges of about READ_BYTES, each just after a blank line, so
    every range holds whole documents and one file is read by many processes. The same for any num_proc."""
    ranges, size = [], READ_BYTES
    for file in files:
        total = file.stat().st_size
        with open(file, "rb") as f:
            start = 0
            while start < total:
                end = _break_after(f, start + size, total)
                ranges.append((str(file), start, end))
                start = end
    return ranges


@dataclass
class OriginalFormatConfig(datasets.BuilderConfig):
    files: tuple[str, ...] = ()


class OriginalFormat(datasets.ArrowBasedBuilder):
    """google-research/bert's input format as a `datasets` builder: one row per document (`sentences`,
    `dropped`), in corpus order. Its shards are byte ranges of the files (`byte_ranges`), so num_proc
    processes read even one large file at once, each writing its own Arrow file."""

    BUILDER_CONFIG_CLASS = OriginalFormatConfig

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(features=DOCUMENT_FEATURES)

    def _split_generators(self, dl_manager) -> list[datasets.SplitGenerator]:
        ranges = byte_ranges([Path(f) for f in self.config.files])
        return [datasets.SplitGenerator(name=datasets.Split.TRAIN, gen_kwargs={"ranges": ranges})]

    def _generate_tables(self, ranges: list[tuple[str, int, int]]) -> Iterator[tuple[tuple, pa.Table]]:
        for i, (path, start, end) in enumerate(ranges):
            for j, table in enumerate(read_range(path, start, end)):
                yield (i, j), table


def pool_size(dataset: Dataset, num_proc: int | None, min_bytes: int) -> int | None:
    """The `num_proc` to give `dataset.map`: up to num_proc processes with at least `min_bytes` of the
    dataset's Arrow data each, None (this process) below two. A pool costs time to start and stop
    (forking a parent that holds torch, datasets' progress manager, the workers' exit): a small map would
    spend more on it than it saves. Deterministic in the data, so a rerun finds the same shards."""
    if not num_proc or num_proc < 2:
        return None
    table = dataset.data  # a split's rows are its share of the table its indices point into
    nbytes = table.nbytes * len(dataset) // max(table.num_rows, 1)
    processes = min(num_proc, nbytes // min_bytes)
    return processes if processes > 1 else None


def load_documents(source: str, cache_dir: str | Path | None = None, num_proc: int | None = None) -> Dataset:
    """One row per document with a `sentences: list[str]` column, in corpus order."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    files = _resolve(source, cache_dir)
    if not any(Path(f).stat().st_size for f in files):
        raise ValueError(f"corpus {source!r} ({', '.join(map(str, files[:3]))}) is empty; expected plain "
                         "text, one sentence per line and a blank line between documents")
    # the cache is keyed by the files' paths, sizes and times, and by how they are read
    key = _fingerprint(READER_VERSION, BLOCK_BYTES, READ_BYTES, *files)
    builder = OriginalFormat(cache_dir=str(cache_dir / "hf"), config_name="documents", hash=key,
                             files=tuple(str(f) for f in files))
    if drop_damaged(Path(builder.cache_dir) / f"{builder.name}-train.arrow"):
        shutil.rmtree(builder.cache_dir)  # datasets prepares a split whole or not at all
    processes = min(num_proc or 1, sum(Path(f).stat().st_size for f in files) // READ_POOL_BYTES)
    with datasets_progress(f"reading corpus {source!r} ({len(files)} file(s))"):
        try:
            builder.download_and_prepare(num_proc=processes if processes > 1 else None)
        except datasets.exceptions.DatasetGenerationError as err:
            if isinstance(err.__cause__, OSError):  # a full disk, say: the error itself, named upstream
                raise err.__cause__ from None
            raise
    if not builder.info.splits["train"].num_examples:
        raise ValueError(f"corpus {source!r} ({', '.join(map(str, files[:3]))}) holds no documents")
    documents = builder.as_dataset(split="train")
    dropped = pc.sum(documents.data.column("dropped")).as_py() or 0  # in Arrow, not row by row
    if dropped:
        log.warning("corpus %r: dropped %d undecodable byte sequence(s) (not UTF-8), as "
                    "google-research/bert's convert_to_unicode(errors='ignore') does", source, dropped)
    return documents.remove_columns("dropped")
