"""SQuAD v1.1 (§4.2) and v2.0 (v2 §4.3): questions over Wikipedia paragraphs, answered by a span.

Questions come from the official JSON files (train-v1.1.json, dev-v1.1.json; train-v2.0.json,
dev-v2.0.json) or the Hub (rajpurkar/squad, rajpurkar/squad_v2), as rows in the Hub's schema
(id, title, context, question, answers{text, answer_start}); every answer must be the context's text at
its answer_start. Each question becomes one or more windows [CLS] question [SEP] passage-piece [SEP]
(question at most max_query_length tokens; passage pieces every doc_stride tokens, as the released
run_squad.py). The answer's characters map to tokens through the tokenizer's offsets; a window that
does not hold the whole answer, and an unanswerable v2.0 question, point at [CLS] (position 0).
Each window keeps its passage tokens' character offsets, so a predicted span is cut out of the
original context. ``datasets`` caches the windows: a second run with the same data and vocabulary
does not tokenize again.
"""

from __future__ import annotations

import bisect
import json
import logging
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset, Features, Sequence, Value
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

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

CACHE_VERSION = 1  # bump when the window format below changes
FILES = {1: {"train": "train-v1.1.json", "dev": "dev-v1.1.json"},
         2: {"train": "train-v2.0.json", "dev": "dev-v2.0.json"}}
HUB = {1: {"path": "rajpurkar/squad", "name": None}, 2: {"path": "rajpurkar/squad_v2", "name": None}}
WINDOW_DEFAULTS = {"max_seq_length": 384, "doc_stride": 128, "max_query_length": 64}  # released run_squad.py
EXAMPLE_FEATURES = Features({"id": Value("string"), "title": Value("string"), "context": Value("string"),
                             "question": Value("string"),
                             "answers": {"text": Sequence(Value("string")),
                                         "answer_start": Sequence(Value("int64"))}})
WINDOW_FEATURES = Features({
    "input_ids": Sequence(Value("int32")), "token_type_ids": Sequence(Value("int8")),
    # [CLS] (0) when the answer is not here
    "start_positions": Value("int32"), "end_positions": Value("int32"),
    "example": Value("int64"),  # row of the question in the split's examples
    "context_start": Value("int32"),  # position of the first passage token: len(question) + 2
    "offsets": Sequence(Sequence(Value("int32"), length=2)),  # (start, end) characters of each passage token
    "max_context": Sequence(Value("bool")),  # the token has more context here than in any other window
})
# the window columns post-processing reads (squad_eval.Window and the question's row): dev batches only
SCORING_COLUMNS = ("example", "context_start", "offsets", "max_context")


# -- questions ---------------------------------------------------------------------------------------
def check_question(row: dict, version: int, where: str) -> None:
    """Refuse what the SQuAD files never hold: an empty context, question or answer, an answer that is not the
    context's text at its answer_start (or lies outside the context), an unanswerable question in v1.1, an
    answerable one without answers."""
    qid, context, answers = row["id"], row["context"], row["answers"]
    for what in ("context", "question"):
        require_text(row[what], f"{where}: question {qid}", f"its {what}")
    impossible = row.get("is_impossible", False) or not answers["text"]
    if version == 1 and impossible:
        raise ValueError(f"{where}: question {qid} has no answer; every SQuAD v1.1 question has one "
                         "(unanswerable questions are SQuAD v2.0: task=squad_v2)")
    if (version == 2 and row.get("is_impossible") is not None
            and row["is_impossible"] != (not answers["text"])):
        raise ValueError(f"{where}: question {qid} has is_impossible={row['is_impossible']} but "
                         f"{len(answers['text'])} answers; expected answers only on possible questions")
    for text, start in zip(answers["text"], answers["answer_start"]):
        require_text(text, f"{where}: question {qid}", "an answer")
        end = start + len(text)
        if start < 0 or end > len(context):
            raise ValueError(f"{where}: question {qid}: answer {text!r} at answer_start {start} lies outside "
                             f"its context ({len(context)} characters)")
        if context[start:end] != text:
            raise ValueError(f"{where}: question {qid}: answer {text!r} does not match the context at "
                             f"answer_start {start}, which reads {context[start:end]!r}")


def read_squad_json(path: str | Path, version: int) -> list[dict]:
    """Questions of an official SQuAD file, one row per question in the Hub's schema, each checked."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SQuAD file {path} does not exist; expected the official "
                                f"{' / '.join(FILES[version].values())} in data.squad_dir "
                                "(or squad_dir=null: the Hub)")
    require_utf8(path, "a SQuAD JSON file")
    try:
        articles = json.loads(path.read_text(encoding="utf-8"))["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a SQuAD file ({err!r}); "
                         "expected {'version', 'data': [articles]}") from err
    rows, seen = [], set()
    try:
        for article in articles:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    row = {"id": str(qa["id"]), "title": article.get("title", ""),
                           "context": paragraph["context"],
                           "question": qa["question"], "is_impossible": qa.get("is_impossible"),
                           "answers": {"text": [a["text"] for a in qa["answers"]],
                                       "answer_start": [int(a["answer_start"]) for a in qa["answers"]]}}
                    check_question(row, version, str(path))
                    if row["id"] in seen:
                        raise ValueError(f"{path}: question id {row['id']} appears twice; ids key the "
                                         "predictions")
                    seen.add(row["id"])
                    del row["is_impossible"]
                    rows.append(row)
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path}: not in the SQuAD layout (missing {err}); expected data > paragraphs > "
                         "context, qas > id, question, answers > text, answer_start") from err
    if not rows:
        raise ValueError(f"{path}: no questions; expected data > paragraphs > qas with at least one question")
    return rows


# -- windows -----------------------------------------------------------------------------------------
def window_starts(num_tokens: int, budget: int, doc_stride: int) -> list[int]:
    """First passage token of each window: every doc_stride tokens until one reaches the end
    (run_squad.py)."""
    starts, start = [0], 0
    while start + budget < num_tokens:
        start += min(budget, doc_stride)
        starts.append(start)
    return starts


def max_context(starts: list[int], num_tokens: int, budget: int) -> np.ndarray:
    """(windows, num_tokens) bool: the window where each token has its best context, min(left, right)
    + 0.01 x window length, first window on a tie (run_squad.py's _check_is_max_context)."""
    position = np.arange(num_tokens)
    scores = np.full((len(starts), num_tokens), -np.inf)
    for w, start in enumerate(starts):
        end = min(start + budget, num_tokens)  # exclusive
        inside = (position >= start) & (position < end)
        score = np.minimum(position - start, end - 1 - position) + 0.01 * (end - start)
        scores[w, inside] = score[inside]
    best = scores.argmax(axis=0)
    return best[None, :] == np.arange(len(starts))[:, None]


def char_to_token_span(offsets: list[tuple[int, int]], start_char: int,
                       end_char: int) -> tuple[int, int] | None:
    """The smallest run of tokens covering characters [start_char, end_char), from the tokens' (start, end)
    character offsets; None when no token overlaps them (an answer of whitespace or dropped characters)."""
    ends = [end for _, end in offsets]
    first = bisect.bisect_right(ends, start_char)  # first token ending after the answer's first character
    last = bisect.bisect_left(ends, end_char)  # first token reaching the answer's last character
    last = min(last, len(offsets) - 1)
    if first >= len(offsets) or offsets[first][0] >= end_char or last < first:
        return None
    return first, last


def make_windows(batch: dict, indices: list[int], tokenizer: Tokenizer, max_seq_length: int, doc_stride: int,
                 max_query_length: int) -> dict:
    """Windows of a batch of questions, answers placed with the first gold answer (dev: for the loss only)."""
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    questions = tokenizer.encode_batch(batch["question"], add_special_tokens=False)
    contexts = tokenizer.encode_batch(batch["context"], add_special_tokens=False)
    out: dict[str, list] = {name: [] for name in WINDOW_FEATURES}
    for example, question, context, answers in zip(indices, questions, contexts, batch["answers"]):
        query = question.ids[:max_query_length]
        budget = max_seq_length - len(query) - 3  # room left by [CLS], [SEP], [SEP]
        offsets, n = context.offsets, len(context.ids)
        answer = None
        if answers["text"]:
            start_char = answers["answer_start"][0]
            answer = char_to_token_span(offsets, start_char, start_char + len(answers["text"][0]))
        starts = window_starts(n, budget, doc_stride)
        best = max_context(starts, n, budget)
        context_start = len(query) + 2
        for w, start in enumerate(starts):
            end = min(start + budget, n)
            ids = [cls_id, *query, sep_id, *context.ids[start:end], sep_id]
            inside = answer is not None and start <= answer[0] and answer[1] < end
            out["input_ids"].append(ids)
            out["token_type_ids"].append([0] * context_start + [1] * (end - start + 1))
            out["start_positions"].append(context_start + answer[0] - start if inside else 0)
            out["end_positions"].append(context_start + answer[1] - start if inside else 0)
            out["example"].append(example)
            out["context_start"].append(context_start)
            out["offsets"].append(offsets[start:end])
            out["max_context"].append(best[w, start:end].tolist())
    return out


class SpanCollator:
    """Pads a batch of windows to its longest one; ``window`` indexes the split's windows (DDP's repeats are
    dropped by it).

    Given the split's ``questions`` (dev loaders), a batch also carries what scoring needs, so the module
    reads its data from its batches only: ``scoring``, per window a dict of its question's row (``example``),
    id, context and gold answer texts and its passage tokens (context_start, offsets, max_context);
    ``num_questions``, the split's size (a partly scored Dev is reported). Plain Python objects: Lightning
    moves only the tensors to the device. Training batches carry neither (their loader reads no offsets).
    """

    def __init__(self, questions: Dataset | None = None):
        self.questions = None if questions is None else questions.select_columns(["id", "context", "answers"])

    def __call__(self, rows: list[dict]) -> dict:
        batch = {**pad_inputs([r["input_ids"] for r in rows], [r["token_type_ids"] for r in rows]),
                 "start_positions": torch.tensor([r["start_positions"] for r in rows]),
                 "end_positions": torch.tensor([r["end_positions"] for r in rows]),
                 "window": torch.tensor([r["window"] for r in rows])}
        if self.questions is not None:
            q = self.questions[[r["example"] for r in rows]]  # the batch's questions, as columns
            batch["scoring"] = [{**{name: r[name] for name in SCORING_COLUMNS}, "id": qid, "context": text,
                                 "answers": answers["text"]}
                                for r, qid, text, answers in zip(rows, q["id"], q["context"], q["answers"])]
            batch["num_questions"] = len(self.questions)
        return batch


class SquadDataModule(FineTuningDataModule):
    """SQuAD train and dev as windows (§4.2; v2 §4.3). ``version``: 1 (v1.1) or 2 (v2.0).

    ``squad_dir``: a folder with the official files of the version; null reads ``hub`` instead.
    ``max_train_examples`` / ``max_dev_examples``: a fixed random subset of the questions (CPU runs);
    null = all, as the paper. ``examples[split]`` holds the questions, ``datasets[split]`` their windows.
    """

    speed_keys = ("num_workers", "num_proc")

    cache_folder = "squad"
    batch_columns = ("input_ids", "token_type_ids", "start_positions", "end_positions", "window")
    example_column = "example"  # max_eval_examples keeps whole questions: each is scored from all its windows

    def __init__(self, version: int = 1, squad_dir: str | None = None, hub: dict | None = None,
                 tokenizer: str | None = None, lowercase: bool = True,
                 max_seq_length: int = WINDOW_DEFAULTS["max_seq_length"],
                 doc_stride: int = WINDOW_DEFAULTS["doc_stride"],
                 max_query_length: int = WINDOW_DEFAULTS["max_query_length"], batch_size: int = 32,
                 max_train_examples: int | None = None, max_dev_examples: int | None = None,
                 max_eval_examples: int | None = None,
                 num_workers: int = 0, num_proc: int = 1, seed: int = 12345, cache_dir: str | None = None):
        if version not in FILES:
            raise ValueError(f"version={version!r}: expected 1 (SQuAD v1.1) or 2 (SQuAD v2.0)")
        room = max_seq_length - max_query_length - 3  # passage tokens per window
        if room <= doc_stride or doc_stride < 1:
            window = {"doc_stride": doc_stride, "max_seq_length": max_seq_length,
                      "max_query_length": max_query_length}
            # lead with a key the user moved from the released run_squad.py's value
            lead = next((k for k, v in window.items() if v != WINDOW_DEFAULTS[k]), "doc_stride")
            raise ValueError(f"{lead}={window[lead]}: the passage room max_seq_length - max_query_length - 3 "
                             f"= {max_seq_length} - {max_query_length} - 3 = {room} must exceed doc_stride="
                             f"{doc_stride} (at least 1), so consecutive windows overlap")
        for name, value in (("max_train_examples", max_train_examples),
                            ("max_dev_examples", max_dev_examples)):
            if value is not None and value < 1:
                raise ValueError(f"{name}={value}: expected a positive number of questions, or null")
        super().__init__()
        self.version, self.task = version, f"squad_v{version}"
        self.examples: dict[str, Dataset] = {}

    # -- questions ---------------------------------------------------------------------------------
    def _questions(self, split: str) -> Dataset:
        hp = self.hparams
        if hp.squad_dir is not None:
            rows = read_squad_json(Path(hp.squad_dir) / FILES[self.version][split], self.version)
            return Dataset.from_list(rows, features=EXAMPLE_FEATURES)
        hub = hp.hub or HUB[self.version]
        rows = hub_split(hub, "train" if split == "train" else "validation", self.cache_dir, "data.squad_dir")
        where = f"{hub['path']} ({split})"
        for row in rows:
            check_question(row, self.version, where)
        return rows.cast(EXAMPLE_FEATURES)

    def _subset(self, rows: Dataset, limit: int | None) -> Dataset:
        subset = fixed_subset(len(rows), limit)
        return rows if subset is None else rows.select(subset)

    # -- windows -----------------------------------------------------------------------------------
    def _windows(self, split: str, rows: Dataset) -> Dataset:
        hp = self.hparams
        settings = (hp.max_seq_length, hp.doc_stride, hp.max_query_length)
        key = cache_key(CACHE_VERSION, rows._fingerprint, cache_key(self.vocab), self.lowercase, settings)
        windows = cached_map(
            rows, self.cache_dir / f"windows-v{self.version}-{split}-{key}.arrow", make_windows, batched=True,
            batch_size=500, with_indices=True, num_proc=hp.num_proc if hp.num_proc > 1 else None,
            remove_columns=rows.column_names,
            fn_kwargs={"tokenizer": self._tokenizer, "max_seq_length": hp.max_seq_length,
                       "doc_stride": hp.doc_stride, "max_query_length": hp.max_query_length},
            features=WINDOW_FEATURES, new_fingerprint=key)
        return windows.add_column("window", np.arange(len(windows)), new_fingerprint=cache_key(key, "window"))

    def build(self, training: bool = True) -> None:
        hp = self.hparams
        for split, limit in (("train", hp.max_train_examples), ("dev", hp.max_dev_examples))[not training:]:
            self.examples[split] = self._subset(self._questions(split), limit)
            self.datasets[split] = self._windows(split, self.examples[split])
        if training:
            train = self.datasets["train"]
            answered = sum(1 for s in train["start_positions"] if s > 0)
            log.info("squad_v%d: train %d questions -> %d windows (%d hold the answer)", self.version,
                     len(self.examples["train"]), len(train), answered)
        log.info("squad_v%d: dev %d questions -> %d windows", self.version, len(self.examples["dev"]),
                 len(self.datasets["dev"]))

    # -- batches -----------------------------------------------------------------------------------
    def collator(self) -> SpanCollator:
        return SpanCollator()  # training's: inputs and targets only

    def _loader(self, split: str, train: bool = False) -> DataLoader:
        if train:
            return super()._loader(split, train=True)
        data = self.datasets[split].select_columns([*self.batch_columns, *SCORING_COLUMNS])
        return self._eval_loader(data, SpanCollator(self.examples[split]))

    def _eval_loader(self, data: Dataset, collate) -> DataLoader:
        # Under DDP Lightning's sampler pads the dev windows with repeats: the module de-duplicates by
        # "window"
        hp = self.hparams
        return DataLoader(data, batch_size=hp.batch_size, collate_fn=collate, num_workers=hp.num_workers)
