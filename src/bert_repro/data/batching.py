"""Batching: dynamic padding, batches of similar length, and the loaders every datamodule shares (a
training order that survives a resume and does not depend on the number of ranks; evaluation sets
seen once each under DDP)."""

from __future__ import annotations

import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, DistributedSampler, Sampler
from torchdata.stateful_dataloader import StatefulDataLoader

PAD_ID = 0  # [PAD] in google-research/bert vocabularies (the data modules check it against the tokenizer)
# the probabilities of a task's stored length quantiles: finer in the tail, where a batch's longest comes from
LENGTH_PROBS = (0, .1, .2, .3, .4, .5, .6, .7, .8, .9, .95, .975, .99, .995, .999, 1)


def pad_inputs(ids: list, types: list | None = None, length: int | None = None) -> dict[str, torch.Tensor]:
    """The encoder's inputs, (N, T) each: input_ids padded with [PAD], token_type_ids with 0 (all 0 without
    ``types``), attention_mask 1 on the real tokens; T = ``length``, or the longest sequence (dynamic
    padding)."""
    N, T = len(ids), length or max(len(x) for x in ids)
    input_ids = np.full((N, T), PAD_ID, dtype=np.int64)
    token_type_ids = np.zeros((N, T), dtype=np.int64)
    attention_mask = np.zeros((N, T), dtype=np.int64)
    for i, x in enumerate(ids):
        input_ids[i, :len(x)], attention_mask[i, :len(x)] = x, 1
        if types is not None:
            token_type_ids[i, :len(x)] = types[i]
    return {"input_ids": torch.from_numpy(input_ids), "token_type_ids": torch.from_numpy(token_type_ids),
            "attention_mask": torch.from_numpy(attention_mask)}


def draw_lengths(quantiles: list[int], shape: int | tuple[int, int], seq: int) -> np.ndarray:
    """Row lengths drawn from a task's length ``quantiles`` at LENGTH_PROBS, at most ``seq``; seeded, so a
    plan is the same every time it is made."""
    drawn = np.interp(np.random.default_rng(0).random(shape), LENGTH_PROBS, quantiles)
    return np.minimum(np.ceil(drawn), seq)


def bucketed(longest: int, bucket: int | None, max_length: int | None) -> int:
    """A batch's padded length: its ``longest`` row rounded up to a multiple of ``bucket``
    (speed.length_bucket), at most ``max_length``; ``longest`` without a bucket."""
    if not bucket:
        return longest
    return max(longest, min(-(-longest // bucket) * bucket, max_length or longest))


class PadCollator:
    """Pads a batch to its longest sequence (dynamic padding), or to ``pad_to`` (the released code's fixed
    128). ``bucket``: the longest rounded up to a multiple of it, at most ``max_length``, so a compiled step
    sees a few shapes (speed.length_bucket); the padding is masked, so the loss is the same."""

    def __init__(self, pad_to: int | None = None, regression: bool = False, bucket: int | None = None,
                 max_length: int | None = None):
        self.pad_to, self.regression, self.bucket, self.max_length = pad_to, regression, bucket, max_length

    def padded_length(self, lengths) -> int:
        """The length a batch of rows of ``lengths`` tokens is padded to."""
        return self.pad_to or bucketed(int(max(lengths)), self.bucket, self.max_length)

    def mean_padded_length(self, quantiles: list[int] | None, batch: int, seq: int) -> float:
        """The mean length this pads batches of ``batch`` examples to, over 10,000 drawn from a task's length
        ``quantiles`` at LENGTH_PROBS (truncated at ``seq``); ``seq`` where none are measured (an upper
        bound)."""
        if not quantiles:
            return float(seq)
        if len(quantiles) != len(LENGTH_PROBS):
            raise ValueError(f"token_lengths {quantiles}: expected {len(LENGTH_PROBS)}, at {LENGTH_PROBS}")
        # a batch pads to what its longest row gives: each longest drawn counted once (a plan asks thousands)
        drawn = draw_lengths(quantiles, (10_000, batch), seq)
        longest, count = np.unique(drawn.max(axis=1), return_counts=True)
        return float(sum(self.padded_length([n]) * c for n, c in zip(longest, count)) / count.sum())

    def __call__(self, rows: list[dict]) -> dict:
        ids = [r["input_ids"] for r in rows]
        inputs = pad_inputs(ids, [r["token_type_ids"] for r in rows], self.padded_length(map(len, ids)))
        labels = torch.tensor([r["label"] for r in rows],
                              dtype=torch.float32 if self.regression else torch.long)
        return {**inputs, "labels": labels, "row": torch.tensor([r["row"] for r in rows]),
                "idx": [r["idx"] for r in rows]}


class LengthGroupedSampler(Sampler[int]):
    """A random order in which each run of ``batch_size`` indices has similar lengths (less padding):
    shuffle, cut into mega-batches of ``batch_size * group`` examples, sort each by length, cut it into
    batches and shuffle those. Not the paper's batching (which examples share a batch changes), hence opt-in.
    Under DDP ``batch_size`` is the per-device batch x devices: each rank then takes its share of one
    group."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int, group: int = 50):
        self.lengths, self.batch_size, self.group, self.seed, self.epoch = (np.asarray(lengths), batch_size,
                                                                            group, seed, 0)

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
            # a short last batch stays last, so the loader's batches stay aligned
            full = len(chunk) // self.batch_size
            for b in [*rng.permutation(full), *range(full, len(batches))]:
                yield from batches[b].tolist()


class GlobalBatchSampler(DistributedSampler):
    """The training order of a run, the same whatever the number of ranks (STYLE 8: global batch is the
    truth).

    A permutation fixed by (seed, epoch), or grouped by length (``lengths``), is cut into global batches of
    ``per_device x num_replicas``; rank r takes the r-th per-device share of each, so one process and N
    processes train on the same global batches (a short last global batch is shared out evenly, wrapping
    round to fill the last share as DistributedSampler pads). A DistributedSampler, so Lightning does not
    replace it; stateful (the epoch of the pass in progress), so a StatefulDataLoader that saved its position
    mid-epoch resumes the same order. ``keyed``: yield ``(epoch, index)``, for data that draw randomness per
    example (dynamic masking: the same masks after a resume, and on any number of ranks or workers).
    """

    def __init__(self, size: int, per_device: int, seed: int, num_replicas: int = 1, rank: int = 0,
                 lengths: list[int] | None = None, group: int = 50, keyed: bool = False):
        super().__init__(range(size), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.size, self.per_device, self.keyed = size, per_device, keyed
        self.grouped = (LengthGroupedSampler(lengths, per_device * num_replicas, seed, group)
                        if lengths is not None else None)
        self._pass_epoch, self._position, self._skip = self.epoch, 0, 0

    def order(self, epoch: int) -> np.ndarray:
        """Every index once, in the global order of ``epoch`` (the same on every rank)."""
        if self.grouped is not None:
            self.grouped.set_epoch(epoch)
            return np.fromiter(iter(self.grouped), dtype=np.int64, count=self.size)
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def _share(self, remainder: int) -> int:
        return -(-remainder // self.num_replicas)  # ceil

    def __len__(self) -> int:
        full, remainder = divmod(self.size, self.per_device * self.num_replicas)
        return full * self.per_device + (self._share(remainder) if remainder else 0)

    def __iter__(self):
        epoch = self._pass_epoch = self.epoch
        skip, self._skip, self._position = self._skip, 0, 0
        order, step = self.order(epoch), self.per_device * self.num_replicas
        for start in range(0, self.size, step):
            chunk = order[start:start + step]
            share = self.per_device if len(chunk) == step else self._share(len(chunk))
            chunk = np.resize(chunk, share * self.num_replicas)  # repeats from the start when it must pad
            for i in chunk[self.rank * share:(self.rank + 1) * share].tolist():
                self._position += 1
                if self._position > skip:
                    yield (epoch, i) if self.keyed else i
        self.epoch = epoch + 1  # a second pass without set_epoch (outside Lightning) is a new epoch too

    def state_dict(self) -> dict:
        return {"epoch": self._pass_epoch, "position": self._position}

    def load_state_dict(self, state: dict) -> None:
        """Resume the pass that was saved: its epoch, after the examples it had already handed out."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if position >= len(self):  # saved after the pass's last batch: the next pass starts the next epoch
            epoch, position = epoch + 1, 0
        self.epoch = self._pass_epoch = epoch
        self._skip = position


class EpochKeyed(torch.utils.data.Dataset):
    """Rows of ``data`` fetched by ``(epoch, index)`` keys (a keyed GlobalBatchSampler), each with its key."""

    def __init__(self, data):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: tuple[int, int]) -> dict:
        return {**self.data[key[1]], "example_key": key}

    def __getitems__(self, keys: list[tuple[int, int]]) -> list[dict]:
        rows = self.data.__getitems__([i for _, i in keys])
        return [{**row, "example_key": key} for row, key in zip(rows, keys)]


def _world(trainer) -> tuple[int, int]:
    return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)


def _pinned(trainer) -> bool:
    """Page-locked batches on a GPU run: the host-to-device copy is faster and can overlap compute."""
    device = getattr(getattr(trainer, "strategy", None), "root_device", None)
    return device is not None and device.type == "cuda"


def train_loader(data, per_device: int, seed: int, collate_fn, trainer=None, num_workers: int = 0,
                 lengths: list[int] | None = None, keyed: bool = False) -> StatefulDataLoader:
    """The training loader every datamodule shares: a GlobalBatchSampler (same global batches on any number
    of ranks) in torchdata's StatefulDataLoader, whose position Lightning saves in every checkpoint. The
    loader's own generator seeds its workers, so loading data never draws from the global RNG that dropout
    uses (a resumed run replays the same dropout masks)."""
    world, rank = _world(trainer)
    sampler = GlobalBatchSampler(len(data), per_device, seed, num_replicas=world, rank=rank, lengths=lengths,
                                 keyed=keyed)
    return StatefulDataLoader(EpochKeyed(data) if keyed else data, batch_size=per_device, sampler=sampler,
                              collate_fn=collate_fn, num_workers=num_workers,
                              persistent_workers=num_workers > 0, pin_memory=_pinned(trainer),
                              generator=torch.Generator().manual_seed(seed))


def eval_loader(data, batch_size: int, collate_fn, trainer=None, num_workers: int = 0) -> DataLoader:
    """An evaluation loader: in order, and under DDP each example on exactly one rank (Lightning's default
    DistributedSampler repeats examples to even out the ranks, which would count them twice in the
    metrics)."""
    world, rank = _world(trainer)
    sampler = (UnrepeatedDistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
               if world > 1 else None)
    return DataLoader(data, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn,
                      num_workers=num_workers,
                      # its own generator: iterating it leaves the global RNG alone
                      pin_memory=_pinned(trainer), generator=torch.Generator())
