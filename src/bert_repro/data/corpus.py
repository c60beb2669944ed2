"""Pre-training corpora as documents of sentences (§3.3: "a document-level corpus", for NSP).

The on-disk format is google-research/bert's `create_pretraining_data.py` input: one sentence per
line, a blank line between documents. `load_documents` reads it through the `datasets` "text"
builder, so a corpus is read once and then memory-mapped from the Arrow cache. Sources that are
not yet in that format are converted once into it under the cache directory:

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
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.compute as pc
from datasets import Dataset, load_dataset

from bert_repro.data.textfiles import refuse_non_text
from bert_repro.work_progress import counted, datasets_progress

log = logging.getLogger(__name__)

BUILTIN_PYDOC = "builtin:pydoc"
TEXT_EXPECTED = "plain text, one sentence per line and a blank line between documents"
SPLIT_BYTES = 128 << 20  # text per process below which load_documents splits documents in this process
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


def _fingerprint(path: Path) -> str:
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()]
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


def _to_documents(batch: dict) -> dict:
    # A "paragraph" of the text builder is the text between two "\n\n". As in the original reader,
    # any whitespace-only line also ends a document, and sentences are stripped. The builder decodes
    # with errors="replace": each U+FFFD is an undecodable byte (sequence), dropped and counted per
    # document as convert_to_unicode(errors="ignore") drops it (its tokenizer drops a real U+FFFD too).
    documents: list[list[str]] = []
    dropped: list[int] = []
    pending = 0  # dropped before the batch's first document
    for paragraph in batch["text"]:
        pending += paragraph.count("\ufffd")
        sentences: list[str] = []
        for line in paragraph.replace("\ufffd", "").split("\n"):
            if line.strip():
                sentences.append(line.strip())
            elif sentences:
                documents.append(sentences)
                sentences = []
        if sentences:
            documents.append(sentences)
        dropped += [0] * (len(documents) - len(dropped))
        if dropped:
            dropped[-1], pending = dropped[-1] + pending, 0
    return {"sentences": documents, "dropped": dropped}


def pool_size(dataset: Dataset, num_proc: int | None, min_bytes: int) -> int | None:
    """The `num_proc` to give `dataset.map`: up to num_proc processes with at least `min_bytes` of the
    dataset's Arrow data each, None (this process) below two. A pool costs about 0.3 s to start and stop
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
    if not any(Path(f).stat().st_size for f in files):  # the text builder fails obscurely on empty files
        raise ValueError(f"corpus {source!r} ({', '.join(map(str, files[:3]))}) is empty; expected plain "
                         "text, one sentence per line and a blank line between documents")
    # Universal newlines: the text builder opens files in text mode, so CRLF reads as "\n". It reads 1 MB at a
    # time (instead of its default 10 MB) and the map below 64 documents at a time, each written out as it
    # comes: memory stays flat whatever the corpus size.
    with datasets_progress(f"reading corpus {source!r} ({len(files)} file(s))"):
        text = load_dataset("text", data_files=[str(f) for f in files], sample_by="paragraph",
                            chunksize=1 << 20, encoding_errors="replace", split="train",
                            cache_dir=str(cache_dir / "hf"))
        # splitting runs at about 140 MB/s a process: a pool (0.3 s to start and stop) pays from ~100 MB each
        documents = text.map(_to_documents, batched=True, batch_size=64, writer_batch_size=64,
                             remove_columns=["text"], num_proc=pool_size(text, num_proc, SPLIT_BYTES),
                             desc="splitting documents")
    if len(documents) == 0:
        raise ValueError(f"corpus {source!r} ({', '.join(map(str, files[:3]))}) holds no documents")
    dropped = pc.sum(documents.data.column("dropped")).as_py() or 0  # in Arrow, not row by row
    if dropped:
        log.warning("corpus %r: dropped %d undecodable byte sequence(s) (not UTF-8), as "
                    "google-research/bert's convert_to_unicode(errors='ignore') does", source, dropped)
    return documents.remove_columns("dropped")
