"""Three small fine-tuning tasks derived from the embedded pre-training corpus (``builtin:pydoc``, CPython's
reference text), so that ``make demo`` runs Table 5 in miniature with no download. Demonstration tasks, not
GLUE tasks and not the paper's: their numbers say the pipeline works, nothing about BERT.

``pydoc_order`` (one sentence, like SST-2 / CoLA): is the sentence as written (1), or are its words shuffled
(0)? Half the sentences of each split are shuffled (a permutation that moves at least one word).

``pydoc_next`` (a pair, like MNLI / QNLI / MRPC): is B the sentence that follows A in its document (1), or a
sentence of another document of the same split (0)? This is the NSP construction of §3.1, so the BERT-base row
(pre-trained with NSP on the same text) has a head start here by construction, the demo's version of the
paper's point that NSP helps the sentence-pair tasks.

``pydoc_punct`` (token-level, like NER / SQuAD's span ends): the passage with the mark that ends each sentence
(``.?!:``) removed; tag each word that ended a sentence (sentence-end restoration). Read cased, the answer
sits mostly in the word after ("... variable The value ..."): a capital starting the next sentence. It needs
right context as SQuAD's does (§5.1); a left-to-right model sees only the words before, and the +BiLSTM row
reads the next word back in. Tagged ``B-PUNCT`` (scored as one-word entities by seqeval, i.e. the F1 of the
tagged class), ``O`` otherwise; read as CoNLL-style rows by :class:`PydocPunctDataModule`.

Train and Dev come from disjoint documents (every fifth document is Dev), each a fixed random sample
(seed 0). Pre-training saw every document's text but never these labels. The rows are written once as
TSV files under the cache folder and read by :class:`~bert_repro.data.glue.GlueDataModule`; their columns and
labels are in data/glue_tasks.yaml beside the GLUE tasks'.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bert_repro.data.base import cache_key
from bert_repro.data.conll import ConllDataModule
from bert_repro.data.corpus import default_cache_dir, pydoc_documents, replaced_whole
from bert_repro.data.glue import GlueDataModule, glue_task

TASKS = {name: glue_task(name) for name in ("pydoc_order", "pydoc_next")}  # their facts: data/glue_tasks.yaml

VERSION = 3  # bump when the rows below change
DEV_EVERY = 5  # documents 0, 5, 10, ... are Dev


def _clean(sentence: str) -> str:
    return " ".join(sentence.split())  # no tabs or newlines inside a TSV field


def _order_rows(documents: list[list[str]], n: int, rng: np.random.Generator) -> list[dict]:
    candidates = [_clean(s) for doc in documents for s in doc if len(set(s.lower().split())) >= 4]
    picked = [candidates[i] for i in rng.choice(len(candidates), min(n, len(candidates)), replace=False)]
    rows = []
    for k, sentence in enumerate(picked):
        words, label = sentence.split(), "1"
        if k % 2:  # shuffled: a permutation that changes the text (four distinct words make that certain)
            shuffled = words
            while shuffled == words:
                shuffled = [words[i] for i in rng.permutation(len(words))]
            words, label = shuffled, "0"
        rows.append({"sentence": " ".join(words), "label": label})
    return rows


def _next_rows(documents: list[list[str]], n: int, rng: np.random.Generator) -> list[dict]:
    docs = [[_clean(s) for s in doc] for doc in documents if len(doc) >= 2]
    anchors = [(d, i) for d, doc in enumerate(docs) for i in range(len(doc) - 1)]
    picked = [anchors[j] for j in rng.choice(len(anchors), min(n, len(anchors)), replace=False)]
    rows = []
    for k, (d, i) in enumerate(picked):
        if k % 2 == 0:
            rows.append({"sentence1": docs[d][i], "sentence2": docs[d][i + 1], "label": "1"})
        else:  # a random sentence of another document (§3.1's NSP negatives)
            other = docs[(d + 1 + rng.integers(len(docs) - 1)) % len(docs)]
            rows.append({"sentence1": docs[d][i], "sentence2": other[rng.integers(len(other))], "label": "0"})
    return rows


def write_task(task: str, folder: Path, train_examples: int, dev_examples: int) -> dict[str, str]:
    """The task's train.tsv and dev.tsv (written once, then reused); returns their paths."""
    if task not in TASKS:
        raise ValueError(f"unknown demonstration task {task!r}; expected one of {', '.join(TASKS)}")
    key = cache_key(VERSION, task, train_examples, dev_examples)[:12]
    out = folder / f"{task}-{key}"
    paths = {split: out / f"{split}.tsv" for split in ("train", "dev")}
    if all(p.is_file() for p in paths.values()):
        return {s: str(p) for s, p in paths.items()}
    documents = list(pydoc_documents())
    split_docs = {"train": [d for i, d in enumerate(documents) if i % DEV_EVERY],
                  "dev": [d for i, d in enumerate(documents) if i % DEV_EVERY == 0]}
    make = _order_rows if task == "pydoc_order" else _next_rows
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train_examples), ("dev", dev_examples)):
        rows = make(split_docs[split], n, np.random.default_rng(0 if split == "train" else 1))
        with replaced_whole(paths[split]) as tmp, tmp.open("w", encoding="utf-8") as f:
            f.write("\t".join(rows[0]) + "\n")  # literal fields (no tabs or newlines), as GLUE's TSVs
            f.writelines("\t".join(row.values()) + "\n" for row in rows)
    return {s: str(p) for s, p in paths.items()}


class PydocTaskDataModule(GlueDataModule):
    """A demonstration task of this module (``pydoc_order``, ``pydoc_next``) as a GLUE-style data module."""

    def __init__(self, task: str, train_examples: int = 1024, dev_examples: int = 256,
                 tokenizer: str | None = None, lowercase: bool = True, max_seq_length: int = 128,
                 batch_size: int = 32, padding: str = "longest", num_workers: int = 0, num_proc: int = 1,
                 length_bucket: int | None = None, seed: int = 12345, cache_dir: str | None = None):
        if train_examples < 2 or dev_examples < 2:
            raise ValueError(f"train_examples={train_examples}, dev_examples={dev_examples}: "
                             "expected at least 2 each")
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "glue"
        files = write_task(task, cache / "pydoc_tasks", train_examples, dev_examples)
        super().__init__(task=task, glue_dir=None, files=files, hub=None, tokenizer=tokenizer,
                         lowercase=lowercase, max_seq_length=max_seq_length, batch_size=batch_size,
                         padding=padding, num_workers=num_workers, num_proc=num_proc,
                         length_bucket=length_bucket, seed=seed, cache_dir=str(cache))


PUNCT_LABELS = ("O", "B-PUNCT")
ENDS = ".?!:"  # the marks that end a sentence of the corpus; commas and the rest stay in the text


def punct_passages(documents: list[list[str]], max_words: int, n: int,
                   rng: np.random.Generator) -> dict[str, list]:
    """Passages of consecutive sentences (up to ``max_words`` words), cased, with the mark that ends each
    sentence stripped from its last word, which is tagged B-PUNCT; a fixed random sample of ``n``."""
    passages: list[tuple[list[str], list[str]]] = []
    for doc in documents:
        words: list[str] = []
        tags: list[str] = []
        for sentence in doc:
            sentence_words = sentence.split()
            last = sentence_words[-1].rstrip(ENDS)
            if last and last != sentence_words[-1]:  # a sentence that ends in a mark (not a heading)
                sentence_words[-1] = last
                words += sentence_words
                tags += ["O"] * (len(sentence_words) - 1) + ["B-PUNCT"]
            if len(words) >= max_words // 2:  # passages end at a sentence end, a few sentences long
                passages.append((words[:max_words], tags[:max_words]))
                words, tags = [], []
        if len(words) >= 4:
            passages.append((words, tags))
    picked = sorted(rng.choice(len(passages), min(n, len(passages)), replace=False).tolist())
    return {"tokens": [passages[i][0] for i in picked], "tags": [passages[i][1] for i in picked],
            "document": list(range(len(picked))), "line": picked}


class PydocPunctDataModule(ConllDataModule):
    """``pydoc_punct`` (sentence-end restoration on the embedded corpus) as CoNLL-style tagged words; the
    rows are built in memory from ``builtin:pydoc`` (train and Dev from disjoint documents), not files."""

    task = "pydoc_punct"
    cache_folder = "pydoc_punct"

    def __init__(self, train_examples: int = 1024, dev_examples: int = 256, max_words: int = 48,
                 tokenizer: str | None = None, lowercase: bool = True, max_seq_length: int = 128,
                 batch_size: int = 32, num_workers: int = 0, seed: int = 12345, cache_dir: str | None = None):
        if train_examples < 2 or dev_examples < 2 or max_words < 8:
            raise ValueError(f"train_examples={train_examples}, dev_examples={dev_examples}, "
                             f"max_words={max_words}: expected at least 2 passages per split, 8 words each")
        super().__init__(conll_dir=None, tokenizer=tokenizer, lowercase=lowercase,
                         max_seq_length=max_seq_length, batch_size=batch_size, num_workers=num_workers,
                         seed=seed, cache_dir=cache_dir)
        self.labels = PUNCT_LABELS

    def prepare_tokenizer(self):
        return super(ConllDataModule, self).prepare_tokenizer()  # CoNLL's casing warning is not this task's

    def raw_sentences(self, training: bool = True) -> dict[str, tuple[dict[str, list], str]]:
        hp = self.hparams
        documents = list(pydoc_documents())
        splits = {"train": ([d for i, d in enumerate(documents) if i % DEV_EVERY], hp.train_examples, 0),
                  "dev": ([d for i, d in enumerate(documents) if i % DEV_EVERY == 0], hp.dev_examples, 1)}
        return {split: (punct_passages(docs, hp.max_words, n, np.random.default_rng(seed)),
                        f"builtin:pydoc:{self.task}:v{VERSION}:{split}")
                for split, (docs, n, seed) in splits.items() if training or split != "train"}
