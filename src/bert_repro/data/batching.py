"""Batching for fine-tuning: dynamic padding, and optionally batches of similar length."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Sampler

PAD_ID = 0  # [PAD] in google-research/bert vocabularies (the data modules check it against the tokenizer)


class PadCollator:
    """Pads a batch to its longest sequence (dynamic padding), or to ``pad_to`` (the released code's fixed 128)."""

    def __init__(self, pad_to: int | None = None, regression: bool = False):
        self.pad_to, self.regression = pad_to, regression

    def __call__(self, rows: list[dict]) -> dict:
        B, T = len(rows), self.pad_to or max(len(r["input_ids"]) for r in rows)
        input_ids = np.full((B, T), PAD_ID, dtype=np.int64)
        token_type_ids = np.zeros((B, T), dtype=np.int64)
        attention_mask = np.zeros((B, T), dtype=np.int64)
        for b, r in enumerate(rows):
            n = len(r["input_ids"])
            input_ids[b, :n], token_type_ids[b, :n], attention_mask[b, :n] = r["input_ids"], r["token_type_ids"], 1
        labels = torch.tensor([r["label"] for r in rows], dtype=torch.float32 if self.regression else torch.long)
        return {"input_ids": torch.from_numpy(input_ids), "token_type_ids": torch.from_numpy(token_type_ids),
                "attention_mask": torch.from_numpy(attention_mask), "labels": labels,
                "row": torch.tensor([r["row"] for r in rows]), "idx": [r["idx"] for r in rows]}


class LengthGroupedSampler(Sampler[int]):
    """A random order in which each run of ``batch_size`` indices has similar lengths (less padding):
    shuffle, cut into mega-batches of ``batch_size * group`` examples, sort each by length, cut it into
    batches and shuffle those. Not the paper's batching (which examples share a batch changes), hence opt-in.
    Under DDP ``batch_size`` is the per-device batch x devices: each rank then takes its share of one group."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int, group: int = 50):
        self.lengths, self.batch_size, self.group, self.seed, self.epoch = np.asarray(lengths), batch_size, group, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1  # a new order next time also where set_epoch is not called (DDP's sampler wrapper)
        order, size = rng.permutation(len(self.lengths)), self.batch_size * self.group
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            chunk = chunk[np.argsort(-self.lengths[chunk], kind="stable")]
            batches = [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
            full = len(chunk) // self.batch_size  # a short last batch stays last, so the loader's batches stay aligned
            for b in [*rng.permutation(full), *range(full, len(batches))]:
                yield from batches[b].tolist()
