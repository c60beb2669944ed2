"""SWAG (§4.4, Table 4): the original CSV files (train.csv, val.csv, test.csv) or the Hub, as four sequences.

Each example becomes four sequences [CLS] sent1 [SEP] sent2 ending_i [SEP] (segment ids 0 then 1), the longer
side truncated first as google-research/bert's ``_truncate_seq_pair``; ``datasets`` caches the result. A batch
is (B, 4, T), padded to its longest sequence.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from datasets import Dataset, Features, Sequence, Value
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
from bert_repro.data.glue import truncated_lengths
from bert_repro.data.tabular import FileSpec, read_rows

log = logging.getLogger(__name__)

NUM_CHOICES = 4
SPLIT_FILES = {"train": "train.csv", "dev": "val.csv", "test": "test.csv"}
HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
COLUMNS = ("sent1", "sent2", *(f"ending{i}" for i in range(NUM_CHOICES)))
CACHE_VERSION = 2  # bump when the rows below change (2: rows with a blank field are refused)


def _examples(batch: dict, indices: list[int], where: str, labelled: bool) -> dict:
    """CSV / Hub rows -> context, the four endings (sent2 + " " + ending_i), label (-1 unlabelled), id,
    row."""
    out: dict[str, list] = {"context": [], "endings": [], "label": [], "idx": [], "row": []}
    for r, i in enumerate(indices):
        for column in COLUMNS:
            require_text(batch[column][r], f"{where} row {i + 1} (after the header)", f"column {column!r}")
        out["context"].append(batch["sent1"][r])
        out["endings"].append([f"{batch['sent2'][r]} {batch[f'ending{k}'][r]}" for k in range(NUM_CHOICES)])
        label = -1
        if labelled:
            raw = str(batch["label"][r]).strip()
            if raw not in {str(k) for k in range(NUM_CHOICES)}:
                raise ValueError(f"{where} row {i + 1} (after the header): label {raw!r}; expected "
                                 f"0-{NUM_CHOICES - 1}")
            label = int(raw)
        out["label"].append(label)
        out["idx"].append(str(batch[""][r]) if "" in batch else str(i))  # the CSV's unnamed id column
        out["row"].append(i)
    return out


def _tokenize(batch: dict, tokenizer: Tokenizer, max_seq_length: int) -> dict:
    """[CLS] context [SEP] ending_i [SEP] for each of the four endings: (4, T_i) ids and segment ids."""
    contexts = tokenizer.encode_batch(batch["context"], add_special_tokens=False)
    ids, types = [], []
    for context, endings in zip(contexts, batch["endings"]):
        choice_ids, choice_types = [], []
        for ending in tokenizer.encode_batch(endings, add_special_tokens=False):
            a = context.ids
            len_a, len_b = truncated_lengths(len(a), len(ending.ids), max_seq_length - 3)
            packed = [tokenizer.token_to_id("[CLS]"), *a[:len_a], tokenizer.token_to_id("[SEP]"),
                      *ending.ids[:len_b], tokenizer.token_to_id("[SEP]")]
            choice_ids.append(packed)
            choice_types.append([0] * (len_a + 2) + [1] * (len_b + 1))
        ids.append(choice_ids)
        types.append(choice_types)
    return {"input_ids": ids, "token_type_ids": types}


class ChoiceCollator:
    """Pads a batch to (B, 4, T), T its longest sequence."""

    def __call__(self, rows: list[dict]) -> dict:
        flat = pad_inputs([s for r in rows for s in r["input_ids"]],
                          [t for r in rows for t in r["token_type_ids"]])
        return {**{name: x.view(len(rows), NUM_CHOICES, -1) for name, x in flat.items()},  # (B, 4, T)
                "labels": torch.tensor([r["label"] for r in rows]),
                "row": torch.tensor([r["row"] for r in rows])}


class SwagDataModule(FineTuningDataModule):
    """SWAG train / dev / test as four-way choices (§4.4).

    ``swag_dir``: a folder with the original train.csv, val.csv (and test.csv, unlabelled); null loads ``hub``
    (allenai/swag, regular). ``max_train_examples``: a fixed random train subset (CPU runs); null = all.
    """

    writes_predictions = True

    cache_folder = "swag"
    batch_columns = ("input_ids", "token_type_ids", "label", "row")
    task = "swag"

    def __init__(self, swag_dir: str | None = None, hub: dict | None = None, tokenizer: str | None = None,
                 lowercase: bool = True, max_seq_length: int = 128, batch_size: int = 16,
                 max_train_examples: int | None = None, max_eval_examples: int | None = None,
                 num_workers: int = 0, seed: int = 12345,
                 cache_dir: str | None = None):
        if max_seq_length < 5:
            raise ValueError(f"max_seq_length={max_seq_length}: too short for [CLS] A [SEP] B [SEP]")
        if max_train_examples is not None and max_train_examples < 1:
            raise ValueError(f"max_train_examples={max_train_examples}: expected a positive number of rows, "
                             "or null")
        super().__init__()

    # -- rows ------------------------------------------------------------------------------------
    def _rows(self, split: str) -> tuple[Dataset, str] | None:
        """The split's raw rows and where they came from; None for a missing test file."""
        hp = self.hparams
        if hp.swag_dir is None:
            hub = hp.hub or {"path": "allenai/swag", "name": "regular"}
            rows = hub_split(hub, HUB_SPLITS[split], self.cache_dir, "data.swag_dir")
            return rows, f"{hub['path']}:{split}"
        folder = Path(hp.swag_dir)
        path = folder / SPLIT_FILES[split]
        if not path.is_file():
            if split == "test":
                return None
            raise FileNotFoundError(f"task=swag: {path} does not exist; data.swag_dir must hold the original "
                                    "train.csv and val.csv (test.csv optional), or be null for the Hub")
        rows = read_rows(FileSpec(str(path), format="csv"), self.cache_dir)
        wanted = [*COLUMNS, *(["label"] if split != "test" else [])]
        missing = [c for c in wanted if c not in rows.column_names]
        if missing:
            raise ValueError(f"{path}: no column {missing}; SWAG's CSV has {', '.join(wanted)} (its columns: "
                             f"{rows.column_names})")
        return rows, str(path)

    def _encoded(self, split: str, rows: Dataset, where: str) -> Dataset:
        hp = self.hparams
        labelled = split != "test" and "label" in rows.column_names
        key = cache_key(CACHE_VERSION, rows._fingerprint, labelled)
        examples = cached_map(rows, self.cache_dir / f"examples-{split}-{key}.arrow", _examples, batched=True,
                              with_indices=True, remove_columns=rows.column_names,
                              fn_kwargs={"where": where, "labelled": labelled},
                              features=Features({"context": Value("string"),
                                                 "endings": Sequence(Value("string")),
                                                 "label": Value("int64"), "idx": Value("string"),
                                                 "row": Value("int64")}),
                              new_fingerprint=f"examples-{key}")
        subset = fixed_subset(len(examples), hp.max_train_examples) if split == "train" else None
        if subset is not None:
            examples = examples.select(subset)
        key = cache_key(key, cache_key(self.vocab), self.lowercase, hp.max_seq_length, subset)
        return cached_map(examples, self.cache_dir / f"tokens-{split}-{key}.arrow", _tokenize, batched=True,
                          batch_size=1000, remove_columns=["context", "endings"],
                          fn_kwargs={"tokenizer": self._tokenizer, "max_seq_length": hp.max_seq_length},
                          features=Features({"label": Value("int64"), "idx": Value("string"),
                                             "row": Value("int64"),
                                             "input_ids": Sequence(Sequence(Value("int32"))),
                                             "token_type_ids": Sequence(Sequence(Value("int8")))}),
                          new_fingerprint=f"tokens-{key}")

    def build(self, training: bool = True) -> None:
        for split in SPLIT_FILES if training else [s for s in SPLIT_FILES if s != "train"]:
            found = self._rows(split)
            if found is None:
                log.info("swag: no test.csv in %s; no test predictions", self.hparams.swag_dir)
                continue
            self.datasets[split] = self._encoded(split, *found)
        log.info("swag: %s", ", ".join(f"{s} {len(d)}" for s, d in self.datasets.items()))

    # -- batches ---------------------------------------------------------------------------------
    def collator(self) -> ChoiceCollator:
        return ChoiceCollator()

    def write_predictions(self, predictions: list[dict], out_dir: str | Path) -> dict[str, str]:
        """``swag_test.csv``: ``id,label`` a row (the id column of test.csv, the predicted ending 0-3)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        data = self.datasets["test"]
        values = {}
        for out in predictions:
            values.update(zip(out["row"].tolist(), out["prediction"].tolist()))
        if sorted(values) != list(range(len(data))):
            raise RuntimeError(f"test: predictions for {len(values)} of {len(data)} rows")
        path = out_dir / "swag_test.csv"
        ids = data["idx"]
        path.write_text("id,label\n" + "".join(f"{ids[r]},{values[r]}\n" for r in range(len(data))),
                        encoding="utf-8")
        return {"test": str(path)}
