"""What the fine-tuning data modules (GLUE, SQuAD, CoNLL-2003, SWAG) share: their hyper-parameters, the
pre-trained model's vocabulary, and the loaders (``batching.train_loader`` / ``eval_loader``). Each task
module keeps its own checks, rows and tokenization; it declares the columns its collator reads.

What every data module (pre-training too) shares is here as well: cache keys, the held-out seed, fixed
subsets, and the check that refuses an empty text wherever a reader takes one."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import lightning as L
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, load_dataset
from filelock import FileLock
from lightning.fabric.utilities.data import AttributeDict
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from bert_repro.data.batching import PAD_ID, eval_loader, train_loader
from bert_repro.data.corpus import default_cache_dir, drop_damaged, no_temporary_left
from bert_repro.tokenization import fine_tuning_tokenizer

# Carved dev splits, train subsets and pre-training's val split and masks do not move with the restart
# seed: restarts then differ in data order only (§4.1), and val/ppl compares across runs.
HELD_OUT_SEED = 0
# [UNK] among a text's tokens above which its vocabulary does not cover it: pre-training refuses more
# (data.max_unknown_share's default), fine-tuning warns, measured on its first UNKNOWN_ROWS train rows
MAX_UNKNOWN_SHARE = 0.05
UNKNOWN_ROWS = 2000
log = logging.getLogger(__name__)


def cache_key(*parts) -> str:
    """A short stable hash of a cache file's inputs and settings (part of its name)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def fixed_subset(size: int, limit: int | None) -> list[int] | None:
    """``limit`` of ``size`` rows drawn with HELD_OUT_SEED, in file order; None when limit is None or not
    below size (all rows)."""
    if limit is None or limit >= size:
        return None
    return np.sort(np.random.default_rng(HELD_OUT_SEED).choice(size, limit, replace=False)).tolist()


def require_text(text, where: str, what: str) -> None:
    """Refuse an empty or whitespace-only text: it tokenizes to nothing, and a question or answer of nothing
    is scored as if it were one (a blank SQuAD context and answer gave a random model EM 50). ``where`` names
    the file and its line, row or question; ``what`` the field."""
    if text is None or not str(text).strip():
        raise ValueError(f"{where}: {what} is {'missing' if text is None else repr(text)}; expected text "
                         "(not empty or whitespace only)")


def cached_map(rows: Dataset, cache_file: Path, function, **kwargs) -> Dataset:
    """``rows.map(function, **kwargs)`` kept in ``cache_file`` (its name holds its key): one found damaged (a
    crash, a full disk, a copy cut short) is rebuilt with a log line saying so, and a write that fails leaves
    no temporary file (corpus.drop_damaged, corpus.no_temporary_left)."""
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    drop_damaged(cache_file)
    with no_temporary_left(cache_file.parent):
        return rows.map(function, cache_file_name=str(cache_file), **kwargs)


HUB_CACHE = "hub"  # a task's Hub data sets, under its data.cache_dir


def hub_split(hub: dict, split: str, cache_dir: Path, local_key: str) -> Dataset:
    """One split of a task's Hub data set (``task.hub``: path, name, revision), every request bounded by
    network.timeout_s; a Hub that does not answer is named with ``local_key``, the key that reads the task's
    files instead (network.reaching)."""
    from bert_repro.network import reaching

    with reaching(f"the Hub data set {hub['path']}" + (f" ({hub['name']})" if hub.get("name") else ""),
                  f"give the task's files with {local_key}=<folder>"):
        return load_dataset(hub["path"], hub.get("name"), split=split, revision=hub.get("revision"),
                            cache_dir=str(cache_dir / HUB_CACHE))


class VocabularyBySize(L.LightningDataModule):
    """The base of every DataModule: its ``tokenizer`` argument may be the run's vocabulary, a list of some
    30k tokens, which loggers record by its size (a CSV logger's hparams.yaml spelled out each token)."""

    @property
    def hparams_initial(self) -> AttributeDict:
        hp = super().hparams_initial
        if isinstance(hp.get("tokenizer"), (list, tuple)):
            hp["tokenizer"] = f"the run's vocabulary ({len(hp['tokenizer'])} tokens)"
        return hp


class FineTuningDataModule(VocabularyBySize):
    """A subclass checks its arguments, then calls ``super().__init__()``, which saves them as ``hparams``
    (Lightning collects the subclass's arguments; they must include tokenizer, lowercase, batch_size, seed,
    num_workers and cache_dir). ``tokenizer`` is the run's vocabulary as a list of tokens (run.resolve_vocab),
    or a vocab.txt / tokenizer.json / Hugging Face folder. It sets ``task`` (the name the tokenizer check
    reports), fills ``datasets`` in ``build`` and returns its batches' collator from ``collator``."""

    # what the module declares it offers a run (run.py asks, never probes)
    speed_keys: tuple[str, ...] = ("num_workers",)  # the speed: options its constructor takes
    writes_predictions = False  # test=true / predict=: write_predictions in the task's submission format
    labels: list[str] | None = None  # the task's label names, where it has a fixed set

    cache_folder: str  # under default_cache_dir() when cache_dir is null
    batch_columns: tuple[str, ...]  # the columns of datasets[split] that the collator reads
    task: str
    example_column: str | None = None  # the column naming a row's example (a window's question); None: a row

    def __init__(self):
        super().__init__()
        self.save_hyperparameters()
        hp = self.hparams
        self.cache_dir = (Path(hp.cache_dir) if hp.cache_dir is not None
                          else default_cache_dir() / self.cache_folder)
        self.lowercase = hp.lowercase
        self.vocab: list[str] | None = None
        self._tokenizer: Tokenizer | None = None
        self.datasets: dict[str, Dataset] = {}

    def prepare_tokenizer(self) -> Tokenizer:
        """``tokenizer``: the run's vocabulary (a list of tokens, run.resolve_vocab), or a file or folder."""
        hp = self.hparams
        self._tokenizer, self.vocab = fine_tuning_tokenizer(hp.tokenizer, hp.lowercase, self.task, PAD_ID)
        return self._tokenizer

    def build(self, training: bool = True) -> None:
        """Fill ``datasets`` (split -> tokenized rows), train only when ``training``; the tokenizer is set."""
        raise NotImplementedError

    def collator(self):
        raise NotImplementedError

    def prepare_data(self) -> None:
        """Every cache built once: Lightning calls this on each node's first rank while the others wait in
        its barrier without the process group's timeout (data_connector's _InfiniteBarrier), then setup on
        every rank reads the caches. The cache folder's lock makes nodes that share it, and runs of the same
        data started side by side, tokenize once: the first to take it builds, the others read."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(self.cache_dir / "prepare.lock"):
            self.setup(self.trainer.state.fn.value if self.trainer is not None else None)

    def setup(self, stage: str | None = None) -> None:
        """Every split, built once; a Dev or test pass alone (``stage`` validate, test or predict:
        src/evaluate.py, the selection tool) builds no train split, and needs no train file."""
        training = stage in (None, "fit")
        if self.datasets and (not training or "train" in self.datasets):
            return
        if self._tokenizer is None:
            self.prepare_tokenizer()
        self.build(training)
        self.limit_eval()
        self.warn_unknown()

    def warn_unknown(self) -> None:
        """A vocabulary that turns much of the task's text into [UNK] (another language, script or casing)
        leaves the model little to read: said once, above the share pre-training refuses."""
        if "train" not in self.datasets or "[UNK]" not in (self.vocab or []):
            return
        ids = self.datasets["train"].with_format("arrow")[:UNKNOWN_ROWS]["input_ids"]
        while pa.types.is_list(ids.type) or pa.types.is_large_list(ids.type):  # SWAG: a list per choice
            ids = pc.list_flatten(ids)
        unknown = pc.sum(pc.equal(ids, self.vocab.index("[UNK]"))).as_py() or 0
        if len(ids) and unknown / len(ids) > MAX_UNKNOWN_SHARE:
            log.warning("data.tokenizer (%d tokens) turns %.1f%% of task=%s's train tokens into [UNK] (%d of "
                        "the first %d): expected a vocabulary that covers the text (its language, script and "
                        "casing: data.lowercase); the numbers will be a model's that reads little",
                        len(self.vocab), 100 * unknown / len(ids), self.task, unknown, len(ids))

    def limit_eval(self) -> None:
        """``max_eval_examples`` (data.max_eval_examples, a subclass argument): each Dev split keeps that
        many of its examples, a fixed subset (HELD_OUT_SEED), every window of each. A debug and speed key, not
        science: unlike SQuAD's ``max_dev_examples`` it names no run folder and leaves the caches as they
        are."""
        limit = self.hparams.get("max_eval_examples")
        for split in self.dev_splits if limit is not None else ():
            data = self.datasets[split]
            owners = data[self.example_column] if self.example_column else list(range(len(data)))
            examples = sorted(set(owners))
            keep = fixed_subset(len(examples), limit)
            if keep is not None:
                kept = {examples[i] for i in keep}
                self.datasets[split] = data.select([row for row, e in enumerate(owners) if e in kept])

    @property
    def dev_splits(self) -> list[str]:
        return ["dev"]

    @property
    def test_splits(self) -> list[str]:
        return ["test"] if "test" in self.datasets else []

    # -- batches ---------------------------------------------------------------------------------
    def train_lengths(self, split: str) -> list[int] | None:
        """Sequence lengths for length-grouped batches; None: a plain random order (the paper's)."""
        return None

    def _eval_loader(self, data: Dataset, collate) -> DataLoader:
        hp = self.hparams
        # each example on one rank
        return eval_loader(data, hp.batch_size, collate, self.trainer, hp.num_workers)

    def _loader(self, split: str, train: bool = False) -> DataLoader:
        hp = self.hparams
        data = self.datasets[split].select_columns(list(self.batch_columns))
        if train:  # §4.1: a restart's seed changes the data order; the same on any number of ranks, resumable
            return train_loader(data, hp.batch_size, hp.seed, self.collator(), self.trainer, hp.num_workers,
                                lengths=self.train_lengths(split))
        return self._eval_loader(data, self.collator())

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        loaders = [self._loader(split) for split in self.dev_splits]
        return loaders[0] if len(loaders) == 1 else loaders

    def predict_dataloader(self) -> list[DataLoader]:
        """The test splits, in ``test_splits`` order (predict_step's dataloader_idx indexes it)."""
        return [self._loader(split) for split in self.test_splits]
