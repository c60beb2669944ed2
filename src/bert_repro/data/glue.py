"""GLUE (§4.1, Table 1): the nine tasks' files as GLUE distributes them, or the Hub, as BERT reads them.

Local files are read exactly as GLUE ships them (``tabular.py``: tab-separated with literal quotes;
MRPC's UTF-8 BOM; CoLA's train/dev without a header) through the ``datasets`` csv builder; any
CSV/TSV/JSON file whose columns a config maps onto a task works the same way.
Texts become [CLS] A [SEP] B [SEP] with the checkpoint's WordPiece (``tokenizers``), the longer side
truncated first as google-research/bert's ``_truncate_seq_pair``; ``datasets`` caches the result,
so a second run over the same files and vocabulary does not tokenize again. Batches are padded to
their own longest sequence (or to max_seq_length, as the released code), optionally grouped by length.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from datasets import Dataset, Features, Value
from tokenizers import Tokenizer

from bert_repro.data.base import (
    HELD_OUT_SEED,
    FineTuningDataModule,
    cache_key,
    cached_map,
    fixed_subset,
    hub_split,
    require_text,
)
from bert_repro.data.batching import PadCollator
from bert_repro.data.tabular import FileSpec, normalise_rows, read_rows

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # bump when the row format below changes (2: rows with a blank text are refused)


@dataclass(frozen=True)
class GlueTask:
    """One task as GLUE distributes it: where its files are, which columns hold what, how it is scored."""

    folder: str  # <glue_dir>/<folder>/train.tsv ...
    text_a: str  # columns of the original files
    text_b: str | None
    label: str
    # label strings of the files and the test server, in Hub order; None = regression
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]  # dev metrics (metrics/glue.py names)
    score: tuple[str, ...]  # Table 1 column(s), averaged in the GLUE score
    server: dict[str, str]  # test split -> the GLUE server's file name
    hub_text: tuple[str, str | None]  # text columns of nyu-mll/glue
    dev: dict[str, str] = field(default_factory=lambda: {"dev": ""})  # dev split -> metric name prefix
    test_index: str = "index"  # id column of test.tsv, echoed in the submission
    no_header: tuple[str, ...] | None = None  # column names of labelled files that have no header (CoLA)
    names: tuple[str, ...] | None = None  # what digit labels mean (nyu-mll/glue's names): exported id2label

    @property
    def num_labels(self) -> int:
        return len(self.labels) if self.labels else 1

    @property
    def splits(self) -> list[str]:
        return ["train", *self.dev, *self.server]


def _read_tasks() -> dict[str, dict[str, GlueTask]]:
    """glue_tasks.yaml, the one place the tasks' facts are written: section -> task name -> GlueTask."""
    sections = yaml.safe_load(Path(__file__).with_name("glue_tasks.yaml").read_text(encoding="utf-8"))
    tuples = ("labels", "metrics", "score", "hub_text", "no_header", "names")

    def task(facts: dict) -> GlueTask:
        return GlueTask(**{k: tuple(v) if k in tuples and v is not None else v for k, v in facts.items()})

    return {section: {name: task(facts) for name, facts in tasks.items()}
            for section, tasks in sections.items()}


_TASKS = _read_tasks()
GLUE_TASKS = _TASKS["glue"]  # the nine of Table 1
TASKS = {**GLUE_TASKS, **_TASKS["demo"]}  # and make demo's stand-ins (data/pydoc_tasks.py)


# a task of one's own: one dev split, no test server, scored by accuracy unless it says otherwise
OWN_REQUIRED = ("name", "text_a", "label", "labels")
OWN_DEFAULTS = {"text_b": None, "metrics": ["acc"], "score": None, "names": None}


def own_task(facts: Mapping) -> GlueTask:
    """A classification task defined in config alone (docs/extending.md): ``facts`` names its columns and
    label names as glue_tasks.yaml does for GLUE's; it reads the files given in ``data.files``."""
    given = {str(k): v for k, v in facts.items()}
    missing = [k for k in OWN_REQUIRED if given.get(k) is None]
    unknown = sorted(set(given) - set(OWN_REQUIRED) - set(OWN_DEFAULTS))
    if missing or unknown:
        raise ValueError(f"task {given.get('name', '?')!r}: missing {missing}, unknown {unknown}; a task of "
                         f"one's own takes {list(OWN_REQUIRED)} and optionally {list(OWN_DEFAULTS)}")
    f = {**OWN_DEFAULTS, **given}
    metrics = tuple(f["metrics"])
    return GlueTask(folder=str(f["name"]), text_a=f["text_a"], text_b=f["text_b"], label=f["label"],
                    labels=tuple(str(label) for label in f["labels"]), metrics=metrics,
                    score=tuple(f["score"] or metrics), server={}, hub_text=(f["text_a"], f["text_b"]),
                    names=tuple(f["names"]) if f["names"] else None)


def task_name(task: str | Mapping) -> str:
    return str(task["name"]) if isinstance(task, Mapping) else task


def glue_task(task: str | Mapping) -> GlueTask:
    """A task by its name in glue_tasks.yaml, or a task of one's own by its facts (``own_task``)."""
    if isinstance(task, Mapping):
        return own_task(task)
    if task not in TASKS:
        raise ValueError(f"unknown GLUE task {task!r}; expected one of {', '.join(TASKS)}, or a task's facts "
                         "(docs/extending.md)")
    return TASKS[task]


def truncated_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths after google-research/bert's ``_truncate_seq_pair``: drop the last token of the longer side
    (of B on a tie) until both fit ``budget``. (``tokenizers``' longest_first breaks odd ties the other
    way.)"""
    if len_a + len_b <= budget:
        return len_a, len_b
    short = min(len_a, len_b)
    if 2 * short <= budget:  # only the longer side is cut
        return (budget - len_b, len_b) if len_a > len_b else (len_a, budget - len_a)
    return (budget + 1) // 2, budget // 2  # both cut down to halves, A keeping the odd token


def _tokenize(batch: dict, indices: list[int], tokenizer: Tokenizer, max_seq_length: int) -> dict:
    """[CLS] A [SEP] B [SEP] (§3.2) with segment ids 0 then 1, at most max_seq_length tokens."""
    pair = "text_b" in batch
    encodings_a = tokenizer.encode_batch(batch["text_a"], add_special_tokens=False)
    encodings_b = (tokenizer.encode_batch(batch["text_b"], add_special_tokens=False) if pair
                   else [None] * len(encodings_a))
    ids, types = [], []
    for a, b in zip(encodings_a, encodings_b):
        budget = max_seq_length - (3 if pair else 2)  # room left by [CLS], [SEP] (, [SEP])
        len_a, len_b = truncated_lengths(len(a), len(b) if pair else 0, budget)
        for encoding, n in ((a, len_a), (b, len_b)):
            if encoding is not None and n < len(encoding):
                encoding.truncate(n)
        packed = tokenizer.post_process(a, b)
        ids.append(packed.ids)
        types.append(packed.type_ids)
    return {"input_ids": ids, "token_type_ids": types, "length": [len(x) for x in ids], "row": indices}


class GlueDataModule(FineTuningDataModule):
    """One GLUE task's train / dev / test splits, tokenized and batched (§4.1).

    ``glue_dir``: a folder in the original GLUE layout (<TASK>/train.tsv, dev.tsv, test.tsv; MNLI's
    dev_matched.tsv ...; AX in diagnostic/diagnostic.tsv); null loads ``hub`` (nyu-mll/glue) instead.
    ``task``: a name in glue_tasks.yaml, or a task of one's own by its facts (``own_task``).
    ``files``: per split, a file in the task's GLUE layout (a path) or any file with its columns mapped
    (a FileSpec dict). ``dev_from_train``: carve the dev split out of train (rows, or a fraction) where no
    dev file exists. ``max_train_examples``: a fixed random train subset (CPU runs); null = all, as the paper.
    """

    speed_keys = ("num_workers", "num_proc", "padding", "length_bucket")
    writes_predictions = True

    @property
    def labels(self) -> list[str] | None:
        return list(self.spec.labels) if self.spec.labels else None

    cache_folder = "glue"
    batch_columns = ("input_ids", "token_type_ids", "label", "row", "idx")

    def __init__(self, task: str | Mapping, glue_dir: str | None = None, files: dict | None = None,
                 hub: dict | None = None, tokenizer: str | None = None, lowercase: bool = True,
                 max_seq_length: int = 128, batch_size: int = 32, padding: str = "longest",
                 group_by_length: bool = False, dev_from_train: float | int | None = None,
                 max_train_examples: int | None = None, max_eval_examples: int | None = None,
                 num_workers: int = 0, num_proc: int = 1, length_bucket: int | None = None,
                 seed: int = 12345, cache_dir: str | None = None):
        spec, name = glue_task(task), task_name(task)  # task itself stays as given: save_hyperparameters
        if padding not in ("longest", "max_length"):
            raise ValueError(f"padding={padding!r}; expected 'longest' (per batch) or 'max_length' (fixed)")
        unknown = set(files or {}) - set(spec.splits)
        if unknown:
            raise ValueError(f"task={name}: files has splits {sorted(unknown)}; {name} has {spec.splits}")
        if dev_from_train is not None and len(spec.dev) != 1:
            raise ValueError(f"task={name}: dev_from_train needs a task with one dev split; map "
                             f"{list(spec.dev)}")
        if max_train_examples is not None and max_train_examples < 1:
            raise ValueError(f"max_train_examples={max_train_examples}: expected a positive number of rows, "
                             "or null")
        if max_seq_length < 4:
            raise ValueError(f"max_seq_length={max_seq_length}: too short for [CLS] A [SEP] B [SEP]")
        super().__init__()
        self.spec, self.task = spec, name

    # -- rows ------------------------------------------------------------------------------------
    def _file_spec(self, split: str) -> FileSpec | None:
        """The split's file: ``files[split]`` over the GLUE layout. None when the split has no file."""
        spec, hp = self.spec, self.hparams
        given = (hp.files or {}).get(split)
        if given is None and hp.glue_dir is None:
            return None
        if given is None or isinstance(given, str):
            default = Path(hp.glue_dir or ".") / ("diagnostic/diagnostic.tsv" if split == "ax"
                                                  else f"{spec.folder}/{split}.tsv")
            given = {"path": str(given or default)}
        given = dict(given)
        labelled = split not in spec.server
        if ("names" not in given and "header" not in given and labelled and spec.no_header
                and "columns" not in given):
            given.update(header=False, names=list(spec.no_header))  # CoLA train/dev: no header row
        columns = {"text_a": spec.text_a, "text_b": spec.text_b, "label": spec.label if labelled else None,
                   "idx": None if labelled else spec.test_index}
        if split == "ax":
            columns.update(text_a="sentence1", text_b="sentence2")
        given["columns"] = {**columns, **(given.get("columns") or {})}
        return FileSpec(**given)

    def _local_split(self, split: str, file: FileSpec) -> Dataset:
        if not Path(file.path).is_file():
            hint = "" if split in self.spec.server else (
                " (set data.dev_from_train to carve a dev split from train)" if split in self.spec.dev
                else "")
            raise FileNotFoundError(f"task={self.task} split {split}: {file.path} does not exist{hint}; map "
                                    f"another file with data.files.{split}=..., or set data.glue_dir=null to "
                                    "use the Hub")
        rows = read_rows(file, self.cache_dir)
        wanted = [c for c in file.columns.values() if c]
        missing = [c for c in wanted if c not in rows.column_names]
        if missing:
            raise ValueError(f"{file.path}: no column {missing}; its columns are {rows.column_names} "
                             f"(map them with data.files.{split}.columns)")
        unit, first = ("record", 1) if file.format == "json" else ("line", 2 if file.header else 1)
        settings = dict(columns=file.columns, labels=self.spec.labels if file.columns["label"] else None,
                        label_map=file.label_map, where=file.path, unit=unit, first=first)
        # the rows' fingerprint names the file; `where` (the path as spelled, for messages) stays out of the
        # key
        key = cache_key(CACHE_VERSION, rows._fingerprint, {k: v for k, v in settings.items() if k != "where"},
                        self.spec.labels is None)
        features = {"text_a": Value("string"),
                    "label": Value("float32" if self.spec.labels is None else "int64"),
                    "idx": Value("string")}
        if file.columns["text_b"]:
            features["text_b"] = Value("string")
        return cached_map(rows, self.cache_dir / f"rows-{self.task}-{split}-{key}.arrow", normalise_rows,
                          batched=True, with_indices=True, remove_columns=rows.column_names,
                          fn_kwargs=settings, features=Features(features), new_fingerprint=key)

    def _hub_split(self, split: str) -> Dataset:
        hub = self.hparams.hub or {"path": "nyu-mll/glue", "name": self.task}
        name, hub_split_name = ("ax", "test") if split == "ax" else (hub["name"],
                                                                     split.replace("dev", "validation"))
        rows = hub_split({**hub, "name": name}, hub_split_name, self.cache_dir, "data.glue_dir")
        a, b = self.spec.hub_text
        for column in filter(None, (a, b)):
            for i, text in enumerate(rows[column]):
                require_text(text, f"{hub['path']} {name} ({hub_split_name}) row {i}", f"column {column!r}")
        rows = rows.rename_columns({a: "text_a", **({b: "text_b"} if b else {})})
        return rows.cast_column("idx", Value("string"))

    def raw_splits(self, training: bool = True) -> dict[str, Dataset]:
        """Every available split as text_a / text_b / label / idx rows, with the dev carve and train subset
        applied; train only when ``training`` or the dev split is carved from it."""
        hp, spec = self.hparams, self.spec
        splits: dict[str, Dataset] = {}
        use_hub = hp.glue_dir is None and not any((hp.files or {}).values())
        for split in spec.splits:
            if split in spec.dev and hp.dev_from_train is not None:
                continue  # carved out of train below
            if split == "train" and not training and hp.dev_from_train is None:
                continue
            file = self._file_spec(split)
            if file is None and use_hub:
                splits[split] = self._hub_split(split)
            elif file is None and split not in spec.server:
                raise FileNotFoundError(f"task={self.task}: no {split} file; map one with "
                                        f"data.files.{split}=... or set data.glue_dir to a folder in the "
                                        "GLUE layout")
            elif file is None or split in spec.server and not Path(file.path).is_file():
                log.info("%s: no %s file; no test predictions for it", self.task, split)
            else:  # train and dev must exist: a missing one is an error naming the file
                splits[split] = self._local_split(split, file)
        if hp.dev_from_train is not None:
            dev = next(iter(spec.dev))
            parts = splits["train"].train_test_split(test_size=hp.dev_from_train, seed=HELD_OUT_SEED,
                                                     shuffle=True)
            splits["train"], splits[dev] = parts["train"], parts["test"]
            log.info("%s: dev carved out of train: %d rows (train keeps %d)", self.task, len(parts["test"]),
                     len(parts["train"]))
        subset = fixed_subset(len(splits["train"]), hp.max_train_examples) if "train" in splits else None
        if subset is not None:
            splits["train"] = splits["train"].select(subset)
        return splits

    # -- tokens ----------------------------------------------------------------------------------
    def _encoded(self, split: str, rows: Dataset) -> Dataset:
        hp = self.hparams
        key = cache_key(CACHE_VERSION, rows._fingerprint, cache_key(self.vocab), self.lowercase,
                        hp.max_seq_length)
        features = Features({"input_ids": [Value("int32")], "token_type_ids": [Value("int8")],
                             "length": Value("int32"), "label": rows.features["label"],
                             "idx": Value("string"), "row": Value("int64")})
        return cached_map(
            rows, self.cache_dir / f"tokens-{self.task}-{split}-{key}.arrow", _tokenize, batched=True,
            batch_size=1000, with_indices=True, num_proc=hp.num_proc if hp.num_proc > 1 else None,
            fn_kwargs={"tokenizer": self._tokenizer, "max_seq_length": hp.max_seq_length},
            remove_columns=[c for c in rows.column_names if c not in ("label", "idx")], features=features,
            new_fingerprint=key)

    def build(self, training: bool = True) -> None:
        for split, rows in self.raw_splits(training).items():
            self.datasets[split] = self._encoded(split, rows)
        for split in ("train", *self.spec.dev) if training else self.spec.dev:
            if split not in self.datasets:
                raise FileNotFoundError(f"task={self.task}: no {split} split found")
        sizes = ", ".join(f"{s} {len(d)}" for s, d in self.datasets.items())
        log.info("%s: %s", self.task, sizes)

    @property
    def dev_splits(self) -> list[str]:
        return list(self.spec.dev)

    @property
    def test_splits(self) -> list[str]:
        return [s for s in self.spec.server if s in self.datasets]

    def train_label_counts(self) -> np.ndarray:
        self.setup("fit")  # a Dev pass alone (WNLI's majority class, §4.1) built no train split
        return np.bincount(np.asarray(self.datasets["train"]["label"]), minlength=self.spec.num_labels)

    # -- batches ---------------------------------------------------------------------------------
    def collator(self) -> PadCollator:
        hp = self.hparams
        return PadCollator(hp.max_seq_length if hp.padding == "max_length" else None,
                           self.spec.labels is None, hp.length_bucket, hp.max_seq_length)

    def train_lengths(self, split: str) -> list[int] | None:
        return self.datasets[split]["length"] if self.hparams.group_by_length else None

    def write_predictions(self, predictions: list[dict], out_dir: str | Path) -> dict[str, str]:
        """The GLUE server's files (<server name>.tsv: ``index<TAB>prediction``, label strings as in the
        task's files; STS-B scores clipped to 0-5) from predict_step outputs (split index, rows,
        predictions)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        written = {}
        for i, split in enumerate(self.test_splits):
            data = self.datasets[split]
            values = {}
            for out in predictions:
                if out["split"] == i:
                    values.update(zip(out["row"].tolist(), out["prediction"].tolist()))
            if sorted(values) != list(range(len(data))):
                raise RuntimeError(f"{split}: predictions for {len(values)} of {len(data)} test rows")
            ids = data["idx"]
            if self.spec.labels is None:
                lines = [f"{ids[r]}\t{min(max(values[r], 0.0), 5.0):.3f}" for r in range(len(data))]
            else:
                lines = [f"{ids[r]}\t{self.spec.labels[int(values[r])]}" for r in range(len(data))]
            path = out_dir / f"{self.spec.server[split]}.tsv"
            path.write_text("index\tprediction\n" + "\n".join(lines) + "\n", encoding="utf-8")
            written[split] = str(path)
        return written
