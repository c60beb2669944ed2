"""CoNLL-2003 NER (v1 §4.3): the shared task's column files, or the Hub, as BERT tags them.

Files: one word a line (``word POS chunk NER``), a blank line ends a sentence, ``-DOCSTART-`` starts a
document. The original release tags in IOB1; tags are converted to IOB2 on reading, which conlleval scores
the same and which gives each entity one B- label. Each word is WordPiece-tokenized; its first piece carries
the label and every other position gets -100 (no loss, no prediction: the paper's "X"). Each sentence is
labelled in a window of up to max_seq_length pieces (conf/task/conll2003.yaml: the model's length), a longer
one in several, cut at word boundaries, so every word is predicted exactly once. The rest of each window is
unlabelled context, about half on each side: with ``document_context`` (the task config's default) from the
whole document around the sentence, the "maximal document context provided by the data" of v2 §5.3; without
it (the constructor's default, and the Hub copy, which has no document boundaries) from the sentence alone.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from datasets import ClassLabel, Dataset, Features, Sequence, Value
from tokenizers import Tokenizer

from bert_repro.data.base import (
    FineTuningDataModule,
    cache_key,
    cached_map,
    fixed_subset,
    hub_split,
    require_text,
)
from bert_repro.data.batching import pad_inputs
from bert_repro.data.textfiles import require_utf8

log = logging.getLogger(__name__)

# The label set, in the order of the Hub copy's ClassLabel (eriktks/conll2003): IOB2 over PER, ORG, LOC, MISC.
CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
IGNORE = -100  # not in the loss, not predicted (torch's cross-entropy ignore_index)
SPLIT_FILES = {"train": ("eng.train", "train.txt"), "dev": ("eng.testa", "valid.txt", "dev.txt"),
               "test": ("eng.testb", "test.txt")}
HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
CACHE_VERSION = 1


def iob1_to_iob2(tags: list[str]) -> list[str]:
    """IOB1 (I- by default, B- only between two adjacent entities of one type) -> IOB2 (B- opens every
    entity). IOB2 input comes back unchanged."""
    out = []
    for i, tag in enumerate(tags):
        if tag.startswith("I-") and (i == 0 or tags[i - 1] == "O" or tags[i - 1][2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
    return out


def read_conll(path: str | Path, labels: tuple[str, ...] = CONLL2003_LABELS) -> dict[str, list]:
    """Sentences of a CoNLL column file: tokens, IOB2 tags, document number, first line. Every word line must
    have the column count of the file's first one (the word first, the NER tag last)."""
    path = Path(path)
    allowed = set(labels) | {t.replace("B-", "I-") for t in labels}
    out: dict[str, list] = {"tokens": [], "tags": [], "document": [], "line": []}
    words: list[str] = []
    tags: list[str] = []
    document, columns, first = 0, None, 0
    in_document = False

    def end_sentence() -> None:
        nonlocal in_document
        if words:
            out["tokens"].append(list(words))
            out["tags"].append(iob1_to_iob2(tags))
            out["document"].append(document)
            out["line"].append(first)
            words.clear()
            tags.clear()
            in_document = True

    require_utf8(path, "a CoNLL column file")
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                end_sentence()
                continue
            if fields[0] == "-DOCSTART-":
                end_sentence()
                if in_document:
                    document, in_document = document + 1, False
                continue
            columns = columns or len(fields)
            if len(fields) != columns or columns < 2:
                raise ValueError(f"{path} line {number}: {len(fields)} column(s), expected {max(columns, 2)} "
                                 "(word ... NER tag, whitespace-separated, as the file's first word line)")
            if fields[-1] not in allowed:
                raise ValueError(f"{path} line {number}: NER tag {fields[-1]!r} is not one of "
                                 f"{sorted(allowed)}")
            if not words:
                first = number
            words.append(fields[0])
            tags.append(fields[-1])
    end_sentence()
    if not out["tokens"]:
        raise ValueError(f"{path}: no sentences; expected CoNLL column lines (word POS chunk NER)")
    return out


def _fill(start: int, end: int, size: int, room: int) -> tuple[int, int]:
    """Context pieces to add left and right of [start, end) in a stream of ``size``: about half each, more
    on one side where the other runs out."""
    left = min(start, max(room // 2, room - (size - end)))
    return left, min(size - end, room - left)


def _windows(batch: dict, tokenizer: Tokenizer, max_seq_length: int, document_context: bool,
             labelled: list[int] | None) -> dict:
    """Sentences (the whole split as one batch) -> windows [CLS] pieces [SEP] with labels on first pieces."""
    cls, sep, unk = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[UNK]"))
    encodings = tokenizer.encode_batch(batch["tokens"], is_pretokenized=True, add_special_tokens=False)
    words = []  # per sentence: the pieces of each word
    for tokens, encoding in zip(batch["tokens"], encodings):
        pieces: list[list[int]] = [[] for _ in tokens]
        for piece, w in zip(encoding.ids, encoding.word_ids):
            pieces[w].append(piece)
        words.append([p or [unk] for p in pieces])  # a word the normaliser empties still gets its position
    units = defaultdict(list)  # the stream a window's context comes from: the document, or the sentence
    for s, document in enumerate(batch["document"]):
        units[document if document_context else s].append(s)
    budget = max_seq_length - 2
    out: dict[str, list] = {"input_ids": [], "labels": [], "word": [], "sentence": [], "length": []}
    wanted = set(range(len(words)) if labelled is None else labelled)
    for members in units.values():
        stream = [p for s in members for w in words[s] for p in w]
        offset = 0
        for s in members:
            starts = np.cumsum([0] + [len(w) for w in words[s]]) + offset  # piece offset of each word
            offset = int(starts[-1])
            if s not in wanted:
                continue
            w0 = 0
            while w0 < len(words[s]):
                w1 = w0 + 1
                while w1 < len(words[s]) and starts[w1 + 1] - starts[w0] <= budget:
                    w1 += 1
                # one overlong word: cut
                a, b = int(starts[w0]), min(int(starts[w1]), int(starts[w0]) + budget)
                left, right = _fill(a, b, len(stream), budget - (b - a))
                ids = [cls, *stream[a - left:b + right], sep]
                labels = [IGNORE] * len(ids)
                word = [-1] * len(ids)
                for w in range(w0, w1):
                    position = 1 + left + int(starts[w]) - a
                    labels[position], word[position] = batch["tags"][s][w], w
                out["input_ids"].append(ids)
                out["labels"].append(labels)
                out["word"].append(word)
                out["sentence"].append(s)
                out["length"].append(len(ids))
                w0 = w1
    return out


class TagCollator:
    """Pads a batch of windows to its longest: input ids with [PAD], labels with -100, word indices with
    -1."""

    def __call__(self, rows: list[dict]) -> dict:
        inputs = pad_inputs([r["input_ids"] for r in rows])  # one segment: token types all 0
        B, T = inputs["input_ids"].shape
        labels = np.full((B, T), IGNORE, dtype=np.int64)
        word = np.full((B, T), -1, dtype=np.int64)
        for b, r in enumerate(rows):
            n = len(r["input_ids"])
            labels[b, :n], word[b, :n] = r["labels"], r["word"]
        return {**inputs, "labels": torch.from_numpy(labels), "word": torch.from_numpy(word),
                "sentence": torch.tensor([r["sentence"] for r in rows])}


class ConllDataModule(FineTuningDataModule):
    """CoNLL-2003 train / dev / test, tokenized into labelled windows (v1 §4.3).

    ``conll_dir``: a folder with eng.train / eng.testa / eng.testb (or train.txt / valid.txt / test.txt); null
    loads ``hub`` (eriktks/conll2003; its copy drops the -DOCSTART- lines, so no ``document_context``).
    ``max_train_examples``: a fixed random subset of train sentences (CPU runs); null = all, as the paper.
    """

    writes_predictions = True

    cache_folder = "conll2003"
    batch_columns = ("input_ids", "labels", "word", "sentence")
    example_column = "sentence"  # max_eval_examples keeps whole sentences: F1 rebuilds them from windows
    task = "conll2003"

    def __init__(self, conll_dir: str | None = None, hub: dict | None = None, tokenizer: str | None = None,
                 lowercase: bool = False, max_seq_length: int = 128, document_context: bool = False,
                 batch_size: int = 32, max_train_examples: int | None = None,
                 max_eval_examples: int | None = None, num_workers: int = 0,
                 seed: int = 12345, cache_dir: str | None = None):
        if max_seq_length < 3:
            raise ValueError(f"max_seq_length={max_seq_length}: too short for [CLS] word [SEP]")
        if max_train_examples is not None and max_train_examples < 1:
            raise ValueError(f"max_train_examples={max_train_examples}: expected a positive number of "
                             "sentences, or null")
        if conll_dir is None and document_context:
            raise ValueError("data.document_context=true needs document boundaries (-DOCSTART-), which the "
                             "Hub copy drops; give data.conll_dir=<folder with the original eng.* files>")
        super().__init__()
        self.labels = CONLL2003_LABELS
        self.sentences: dict[str, Dataset] = {}

    def prepare_tokenizer(self) -> Tokenizer:
        if self.hparams.lowercase:
            log.warning("conll2003 with an uncased vocabulary: the paper tags with the cased model (§4.3)")
        return super().prepare_tokenizer()

    # -- sentences -------------------------------------------------------------------------------
    def _split_file(self, split: str) -> Path | None:
        folder = Path(self.hparams.conll_dir)
        if not folder.is_dir():
            raise FileNotFoundError(f"data.conll_dir={folder} is not a folder; expected eng.train, eng.testa "
                                    "(eng.testb) or train.txt, valid.txt (test.txt), or data.conll_dir=null "
                                    "for the Hub")
        found = [folder / name for name in SPLIT_FILES[split] if (folder / name).is_file()]
        if not found and split != "test":
            raise FileNotFoundError(f"{folder}: no {split} file; expected one of "
                                    f"{', '.join(SPLIT_FILES[split])}")
        return found[0] if found else None

    def _hub_split(self, split: str) -> dict[str, list]:
        hub = self.hparams.hub or {"path": "eriktks/conll2003", "revision": "refs/convert/parquet"}
        rows = hub_split(hub, HUB_SPLITS[split], self.cache_dir, "data.conll_dir")
        for i, tokens in enumerate(rows["tokens"]):
            for w, token in enumerate(tokens or [None]):  # a sentence of no words: its first is missing
                require_text(token, f"{hub['path']} ({split}) row {i}", f"word {w + 1}")
        feature = rows.features["ner_tags"].feature
        names = feature.names if isinstance(feature, ClassLabel) else CONLL2003_LABELS
        tags = [iob1_to_iob2([names[t] for t in sentence]) for sentence in rows["ner_tags"]]
        return {"tokens": list(rows["tokens"]), "tags": tags, "document": list(range(len(tags))),
                "line": list(range(1, len(tags) + 1))}

    def raw_sentences(self, training: bool = True) -> dict[str, tuple[dict[str, list], str]]:
        """split -> (sentences, what they were read from); train only when ``training``."""
        splits = {}
        for split in SPLIT_FILES if training else [s for s in SPLIT_FILES if s != "train"]:
            if self.hparams.conll_dir is None:
                splits[split] = (self._hub_split(split), f"{(self.hparams.hub or {}).get('path')}:{split}")
            elif (path := self._split_file(split)) is not None:
                splits[split] = (read_conll(path, self.labels), str(path.resolve()))
        return splits

    # -- windows ---------------------------------------------------------------------------------
    def _encoded(self, split: str, sentences: dict[str, list], source: str) -> Dataset:
        hp = self.hparams
        label_ids = {t: i for i, t in enumerate(self.labels)}
        rows = Dataset.from_dict({"tokens": sentences["tokens"], "document": sentences["document"],
                                  "tags": [[label_ids[t] for t in s] for s in sentences["tags"]]})
        labelled = fixed_subset(len(rows), hp.max_train_examples) if split == "train" else None
        key = cache_key(CACHE_VERSION, source, cache_key(sentences), cache_key(self.vocab), self.lowercase,
                        hp.max_seq_length, hp.document_context, labelled)
        features = Features({"input_ids": Sequence(Value("int32")), "labels": Sequence(Value("int16")),
                             "word": Sequence(Value("int16")), "sentence": Value("int64"),
                             "length": Value("int32")})
        return cached_map(rows, self.cache_dir / f"windows-{split}-{key}.arrow", _windows, batched=True,
                          batch_size=None, remove_columns=rows.column_names, features=features,
                          fn_kwargs={"tokenizer": self._tokenizer, "max_seq_length": hp.max_seq_length,
                                     "document_context": hp.document_context, "labelled": labelled},
                          new_fingerprint=key)

    def build(self, training: bool = True) -> None:
        for split, (sentences, source) in self.raw_sentences(training).items():
            self.sentences[split] = Dataset.from_dict({"tokens": sentences["tokens"],
                                                       "tags": sentences["tags"]})
            self.datasets[split] = self._encoded(split, sentences, source)
        log.info("conll2003: %s", ", ".join(f"{s} {len(self.sentences[s])} sentences in {len(d)} windows"
                                            for s, d in self.datasets.items()))

    # -- batches ---------------------------------------------------------------------------------
    def collator(self) -> TagCollator:
        return TagCollator()

    def write_predictions(self, predictions: list[dict], out_dir: str | Path) -> dict[str, str]:
        """``<split>.conll``: ``word gold predicted`` a line, a blank line between sentences (conlleval's
        input), from predict_step outputs (sentence, word and predicted label of every labelled position)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        written = {}
        for i, split in enumerate(self.test_splits):
            sentences = self.sentences[split]
            predicted: dict[tuple[int, int], int] = {}
            for out in predictions:
                if out["split"] == i:
                    predicted.update(zip(zip(out["sentence"].tolist(), out["word"].tolist()),
                                         out["prediction"].tolist()))
            expected = sum(len(t) for t in sentences["tokens"])
            if len(predicted) != expected:
                raise RuntimeError(f"{split}: predictions for {len(predicted)} of {expected} words")
            lines = []
            for s, (tokens, tags) in enumerate(zip(sentences["tokens"], sentences["tags"])):
                lines += [f"{w} {g} {self.labels[predicted[s, j]]}"
                          for j, (w, g) in enumerate(zip(tokens, tags))] + [""]
            path = out_dir / f"{split}.conll"
            path.write_text("\n".join(lines), encoding="utf-8")
            written[split] = str(path)
        return written
