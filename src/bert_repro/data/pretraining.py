"""Pre-training data (§3.3): the DataModule and its collator. The instance algorithm itself (NSP pairs,
masked-LM corruption) is in `instances.py`; the corpora are in `corpus.py` (files) and `hub.py` (the Hub).
"""

from __future__ import annotations

import gc
import logging
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import torch
from datasets import Dataset, concatenate_datasets
from filelock import FileLock
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from bert_repro.data import instances
from bert_repro.data.base import HELD_OUT_SEED, MAX_UNKNOWN_SHARE, VocabularyBySize, cache_key
from bert_repro.data.batching import bucketed, eval_loader, train_loader
from bert_repro.data.corpus import (
    default_cache_dir,
    drop_damaged,
    load_documents,
    no_temporary_left,
    pool_size,
    replaced_whole,
)
from bert_repro.data.hub import load_hub_documents
from bert_repro.progress import datasets_progress
from bert_repro.tokenization import load_tokenizer, tokenizer_from_vocab, train_wordpiece, vocab_list

log = logging.getLogger(__name__)

PAD_ID = 0  # [PAD] is id 0 in google-research/bert vocabularies (checked against the tokenizer)
CACHE_FORMAT = 3  # bump when the cached token or instance layout changes, so old caches are not read back
BATCH_DOCUMENTS = 64  # documents per map batch: enough for array work; the heap holds one batch
# Arrow data (text, or token ids: about as many bytes) a num_proc worker must get, else a map runs here: at a
# process's rate, a pool's start and stop pays for itself from a few MB (docs/benchmarks.md, instances)
PROCESS_BYTES = 8 << 20
UNKNOWN_SAMPLE = 10_000_000  # the [UNK] share is measured on about this many of the first train tokens


def cache_settings(hp, static: bool) -> tuple[dict, dict]:
    """The settings a run's data caches are made from: the corpus's token ids (its documents, their split and
    the vocabulary: the keys hash what these make), and a round of instances from those tokens (beside its
    seed and round number). The instances' cache key hashes the second; a plan compares both."""
    tokens = {k: hp[k] for k in ("source", "corpus", "hub", "max_documents", "val_fraction", "tokenizer",
                                 "vocab_size", "lowercase")}
    round_ = {k: hp[k] for k in ("max_seq_length", "short_seq_prob", "nsp", "ltr")}
    if static and not hp["ltr"]:  # masks drawn once, into the cache; dynamic ones are the collator's
        round_ |= {k: hp[k] for k in ("masked_lm_prob", "max_predictions_per_seq", "mask_shares",
                                      "whole_word_mask")}
    return tokens, round_


@contextmanager
def frozen_heap():
    """gc.freeze() for the block: the objects alive before it (torch's, Lightning's: about a million) stay
    out of the collector's full passes, which cost most in a forked num_proc worker, where touching them
    copies their pages (docs/benchmarks.md, instances). Objects made in the block are collected as usual."""
    if gc.get_freeze_count():  # frozen by the caller already: theirs to unfreeze
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class PretrainingCollator:
    """Pads a list of instances to the longest one (or its bucket, batching.bucketed) and, for dynamic
    masking, masks them afresh.

    Batch: input_ids, token_type_ids, attention_mask (B, T); masked_lm_positions, masked_lm_ids,
    masked_lm_weights (B, P = max_predictions), unless LTR; next_sentence_labels (B,) with NSP.
    """

    def __init__(self, mask: dict | None, dynamic: bool, nsp: bool, seed: int, bucket: int | None = None,
                 max_length: int | None = None):
        self.mask, self.dynamic, self.nsp, self.seed = mask, dynamic, nsp, seed
        self.bucket, self.max_length = bucket, max_length  # batching.bucketed
        self._rng, self._rng_key = None, None

    def _generator(self, example: dict) -> np.random.Generator:
        # Keyed examples (epoch, index) each get their own stream: a resumed run, or one on N ranks or with
        # workers, masks every example exactly as the uninterrupted single-process run does.
        if "example_key" in example:
            return np.random.default_rng([self.seed, *example["example_key"]])
        # Otherwise one stream per process: in a worker, seeded from the worker's seed (which the loader's
        # seeded generator draws afresh every epoch), so no two workers repeat each other's masks.
        info = torch.utils.data.get_worker_info()
        key = None if info is None else info.seed
        if self._rng is None or key != self._rng_key:
            self._rng = np.random.default_rng([self.seed] if key is None else [self.seed, key])
            self._rng_key = key
        return self._rng

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(e["input_ids"]) for e in examples)
        B, T = len(examples), bucketed(longest, self.bucket, self.max_length)
        input_ids = np.full((B, T), PAD_ID, dtype=np.int64)
        token_type_ids = np.zeros((B, T), dtype=np.int64)
        attention_mask = np.zeros((B, T), dtype=np.int64)
        batch = {}
        if self.mask is not None:
            P = self.mask["max_predictions"]
            positions, lm_ids = np.zeros((B, P), dtype=np.int64), np.zeros((B, P), dtype=np.int64)
            weights = np.zeros((B, P), dtype=np.float32)
        ids = [np.asarray(e["input_ids"]) for e in examples]
        if self.mask is not None and self.dynamic:  # one mask_batch over the batch, a generator per example
            lengths = np.array([len(i) for i in ids])
            flat, pos, labels, counts = instances.mask_with([self._generator(e) for e in examples], [1] * B,
                                                            np.concatenate(ids), lengths, self.mask)
            ids = np.split(flat, np.cumsum(lengths)[:-1])
            splits = np.cumsum(counts)[:-1]
            predictions = zip(np.split(pos, splits), np.split(labels, splits))
        elif self.mask is not None:
            predictions = ((e["masked_lm_positions"], e["masked_lm_ids"]) for e in examples)
        for b, e in enumerate(examples):
            n = len(ids[b])
            if self.mask is not None:
                pos, labels = next(predictions)
                positions[b, : len(pos)], lm_ids[b, : len(pos)], weights[b, : len(pos)] = pos, labels, 1.0
            input_ids[b, :n], token_type_ids[b, :n], attention_mask[b, :n] = ids[b], e["token_type_ids"], 1
        batch.update(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        if self.mask is not None:
            batch.update(masked_lm_positions=positions, masked_lm_ids=lm_ids, masked_lm_weights=weights)
        if self.nsp:
            batch["next_sentence_labels"] = np.array([e["next_sentence_label"] for e in examples],
                                                     dtype=np.int64)
        return {k: torch.from_numpy(v) for k, v in batch.items()}


class PretrainDataModule(VocabularyBySize):
    """Masked LM + NSP pre-training data (§3.3) and its ablations: No NSP, LTR (§5.1), MASK/SAME/RND
    shares (v2 C.2), static vs dynamic masking, whole-word masking.

    Pipeline (each step cached under cache_dir, keyed by its inputs and settings): documents (`source`:
    "files" reads `corpus`, "hub" the Hugging Face datasets listed in `hub`) -> train/val split by
    document -> WordPiece vocab (trained on the train documents unless `tokenizer` names one: a vocab.txt,
    tokenizer.json, HF directory, or the run's vocabulary as a list, as run.resolve_vocab reads it from a
    .ckpt) -> token ids -> instances (`dupe_factor` rounds with different randomness, as the original's
    default 10) -> batches.
    The val set is always masked statically with HELD_OUT_SEED.
    """

    speed_keys = ("num_workers", "num_proc", "length_bucket")  # the speed: options its constructor takes
    writes_predictions = False
    labels = None

    def __init__(self, corpus: str | None = None, tokenizer: str | None = None, vocab_size: int = 30522,
                 lowercase: bool = True, max_seq_length: int = 128, max_predictions_per_seq: int = 20,
                 masked_lm_prob: float = 0.15, short_seq_prob: float = 0.1,
                 mask_shares: tuple | list = (0.8, 0.1, 0.1), whole_word_mask: bool = False, nsp: bool = True,
                 ltr: bool = False, masking: str = "dynamic", dupe_factor: int = 1,
                 val_fraction: float = 0.05, batch_size: int = 32, num_workers: int = 0, num_proc: int = 1,
                 length_bucket: int | None = None, seed: int = 12345, cache_dir: str | None = None,
                 max_documents: int | None = None,
                 source: str = "files", hub: list[dict] | None = None,
                 max_unknown_share: float = MAX_UNKNOWN_SHARE):
        super().__init__()
        mask_shares = tuple(float(s) for s in mask_shares)
        if len(mask_shares) != 3 or min(mask_shares) < 0 or abs(sum(mask_shares) - 1) > 1e-6:
            raise ValueError(f"mask_shares={mask_shares}: expected three (MASK, SAME, RND) shares summing to "
                             "1")
        if masking not in ("static", "dynamic"):
            raise ValueError(f"masking={masking!r}: expected 'static' or 'dynamic'")
        if ltr and nsp:
            raise ValueError("ltr=True is the 'LTR & No NSP' ablation (§5.1); set nsp=False with it")
        if not 0 <= val_fraction < 1 or max_seq_length < 8:
            raise ValueError(f"val_fraction={val_fraction}, max_seq_length={max_seq_length}: expected [0, 1) "
                             "and >= 8")
        if not 0 <= max_unknown_share <= 1:
            raise ValueError(f"data.max_unknown_share={max_unknown_share}: expected a share in [0, 1]")
        if source not in ("files", "hub"):
            raise ValueError(f"data.source={source!r}: expected 'files' (data.corpus) or 'hub' (data.hub)")
        if source == "files" and not corpus:
            raise ValueError("data.source=files needs data.corpus: a text file or folder in the original "
                             "format, builtin:pydoc, wikitext:<file> or gutenberg:<path>")
        if source == "hub" and not hub:
            raise ValueError("data.source=hub needs data.hub: a list of datasets, e.g. "
                             "[{path: wikimedia/wikipedia, name: 20231101.en, format: wiki}]")
        self.save_hyperparameters()
        self.hparams.mask_shares = mask_shares
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.lowercase = lowercase
        self.vocab: list[str] | None = None
        self._tokenizer: Tokenizer | None = None
        self._splits: tuple[Dataset, Dataset | None] | None = None
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.instance_stats: dict[str, dict] = {}  # per split: documents, instances, seconds, cached

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer if self._tokenizer is not None else self.prepare_tokenizer()

    @property
    def corpus_name(self) -> str:
        hp = self.hparams
        return (hp.corpus if hp.source == "files"
                else "hub:" + "+".join(str(spec.get("path")) for spec in hp.hub))

    def _documents(self) -> tuple[Dataset, Dataset | None]:
        """Train and val documents: val_fraction of the documents (at least one), fixed by HELD_OUT_SEED."""
        if self._splits is None:
            hp = self.hparams
            num_proc = hp.num_proc if hp.num_proc > 1 else None
            if hp.source == "hub":
                docs = load_hub_documents(hp.hub, cache_dir=self.cache_dir, num_proc=num_proc,
                                          max_documents=hp.max_documents)
            else:
                docs = load_documents(hp.corpus, cache_dir=self.cache_dir, num_proc=num_proc)
                if hp.max_documents is not None:
                    docs = docs.select(range(min(hp.max_documents, len(docs))))
            n_val = max(1, round(len(docs) * hp.val_fraction)) if hp.val_fraction > 0 else 0
            if len(docs) - n_val < 1:
                raise ValueError(f"corpus {self.corpus_name!r} has {len(docs)} document(s); "
                                 f"need more than {n_val} for a val split")
            order = np.random.default_rng(HELD_OUT_SEED).permutation(len(docs))
            # The index mappings go to disk (memory-mapped), not to memory: a corpus may have millions of
            # documents.
            folder = self.cache_dir / "pretrain"
            folder.mkdir(parents=True, exist_ok=True)
            key = cache_key(CACHE_FORMAT, docs._fingerprint, n_val, HELD_OUT_SEED)

            def part(name: str, rows: np.ndarray) -> Dataset:
                drop_damaged(indices := folder / f"split-{name}-{key}.arrow")
                return docs.select(np.sort(rows), indices_cache_file_name=str(indices))

            self._splits = (part("train", order[n_val:]), part("val", order[:n_val]) if n_val else None)
        return self._splits

    def prepare_tokenizer(self) -> Tokenizer:
        """Load `tokenizer`, or train (once, then cached) a WordPiece vocab on the train documents."""
        hp = self.hparams
        if isinstance(hp.tokenizer, (list, tuple)):  # the run's vocabulary itself (run.resolve_vocab)
            self._tokenizer = tokenizer_from_vocab(list(hp.tokenizer), hp.lowercase)
        elif hp.tokenizer is not None:
            self._tokenizer = load_tokenizer(hp.tokenizer, lowercase=hp.lowercase)
        else:
            train_docs, _ = self._documents()
            key = cache_key(CACHE_FORMAT, train_docs._fingerprint, hp.vocab_size, hp.lowercase)
            path = self.cache_dir / "wordpiece" / key / "vocab.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            # Runs started side by side (a table's sweeps_at_once) train it once and share it: the trainer is
            # not deterministic (huggingface/tokenizers#1794), so two trainings would give two vocabularies.
            with FileLock(path.with_suffix(".lock")):
                if path.is_file():
                    self._tokenizer = load_tokenizer(path, lowercase=hp.lowercase)
                else:
                    texts = (s for batch in train_docs.iter(batch_size=256)
                             for doc in batch["sentences"] for s in doc)
                    self._tokenizer = train_wordpiece(texts, hp.vocab_size, lowercase=hp.lowercase)
                    with replaced_whole(path) as tmp:
                        tmp.write_text("".join(f"{t}\n" for t in vocab_list(self._tokenizer)),
                                       encoding="utf-8")
        self.vocab = vocab_list(self._tokenizer)
        if self.vocab[PAD_ID] != "[PAD]":
            raise ValueError(f"tokenizer {hp.tokenizer}: id {PAD_ID} is {self.vocab[PAD_ID]!r}; expected "
                             "[PAD]")
        self.special_ids = {t: self.vocab.index(t) for t in ("[CLS]", "[SEP]", "[MASK]")}
        return self._tokenizer

    def _mask_settings(self) -> dict | None:
        hp = self.hparams
        if hp.ltr:
            return None  # a left-to-right LM predicts every next token; the model shifts the ids itself
        is_continuation = np.array([t.startswith("##") for t in self.vocab]) if hp.whole_word_mask else None
        return dict(vocab_size=len(self.vocab), mask_id=self.special_ids["[MASK]"],
                    masked_lm_prob=hp.masked_lm_prob, max_predictions=hp.max_predictions_per_seq,
                    shares=hp.mask_shares, whole_word=hp.whole_word_mask, is_continuation=is_continuation,
                    special_ids=(self.special_ids["[CLS]"], self.special_ids["[SEP]"]))

    def _tokens(self, docs: Dataset, split: str) -> tuple[Dataset, str]:
        """(`docs` as token ids, `tokens`: documents of sentences of ids, cached; its cache key); the time
        goes to instance_stats."""
        folder = self.cache_dir / "pretrain"
        folder.mkdir(parents=True, exist_ok=True)
        tokens_key = cache_key(CACHE_FORMAT, docs._fingerprint, self.vocab, self.lowercase)
        drop_damaged(cache_file := folder / f"tokens-{split}-{tokens_key}.arrow")
        start = time.perf_counter()
        # One word cache for both splits in this process, and the one a pool's workers start from (it travels
        # with the pickled function): val, tokenized first, fills it with the corpus's common words.
        if getattr(self, "_word_ids", (None,))[0] is not self._tokenizer:
            self._word_ids = (self._tokenizer, instances.WordPieceIds(self._tokenizer))
        # Batches of documents, written out as they come: a batch is the largest thing held in memory.
        with datasets_progress(f"{split}: tokenizing {len(docs)} documents"), no_temporary_left(folder):
            tokens = docs.with_format("arrow").map(
                self._word_ids[1], batched=True, batch_size=BATCH_DOCUMENTS,
                writer_batch_size=BATCH_DOCUMENTS, remove_columns=docs.column_names,
                num_proc=pool_size(docs, self.hparams.num_proc, PROCESS_BYTES),
                features=instances.TOKENS_FEATURES, new_fingerprint=tokens_key,
                cache_file_name=str(cache_file),
                desc=f"{split}: tokenizing documents").with_format(None)
        self.instance_stats[split] = dict(tokenize_s=time.perf_counter() - start)
        return tokens, tokens_key

    def _instances(self, tokenized: tuple[Dataset, str], split: str, seed: int, dupe_factor: int,
                   static: bool) -> Dataset:
        hp = self.hparams
        tokens, tokens_key = tokenized
        folder = self.cache_dir / "pretrain"
        mask = self._mask_settings() if static else None
        settings = dict(seed=seed, max_seq_length=hp.max_seq_length, short_seq_prob=hp.short_seq_prob,
                        nsp=hp.nsp, cls_id=self.special_ids["[CLS]"], sep_id=self.special_ids["[SEP]"],
                        mask=mask)
        num_proc = pool_size(tokens, hp.num_proc, PROCESS_BYTES)  # the same for every round
        start = time.perf_counter()
        # One cached dataset per dupe_factor round, in num_proc shards: a killed preparation restarts from its
        # finished rounds and shards (datasets reprocesses only missing shards), and more rounds reuse these.
        rounds, cached = [], True
        for dupe in range(dupe_factor):
            key = cache_key(CACHE_FORMAT, instances.DRAWS, tokens_key,  # the vocabulary's ids: in tokens_key
                            {**cache_settings(hp, static)[1], "seed": seed, "dupe": dupe})
            drop_damaged(cache_file := folder / f"instances-{split}-{key}.arrow")
            cached &= any(folder.glob(f"{cache_file.stem}*.arrow"))  # with num_proc, one file per shard
            with datasets_progress(f"{split}: creating instances from {len(tokens)} documents"), \
                    no_temporary_left(folder):
                rounds.append(tokens.map(
                    instances.InstanceMaker(tokens, dupe=dupe, **settings), batched=True,
                    batch_size=BATCH_DOCUMENTS, with_indices=True, input_columns=[],
                    remove_columns=["tokens"], num_proc=num_proc,
                    features=instances.instance_features(hp.nsp, mask is not None),
                    cache_file_name=str(cache_file), new_fingerprint=key,
                    desc=f"{split}: creating instances, round {dupe + 1} of {dupe_factor}"))
        dataset = rounds[0] if len(rounds) == 1 else concatenate_datasets(rounds)
        seconds = time.perf_counter() - start
        self.instance_stats[split].update(documents=len(tokens), instances=len(dataset), instances_s=seconds,
                                          cached=cached)
        if cached:
            log.info("%s: %d instances from %d documents, loaded from %s", split, len(dataset), len(tokens),
                     folder)
        else:
            log.info("%s: %d instances from %d documents in %.1fs (%.0f documents/s, %.0f instances/s)",
                     split, len(dataset), len(tokens), seconds, len(tokens) / seconds, len(dataset) / seconds)
        return dataset

    def prepare_data(self) -> None:
        self.setup()  # builds every cache once (rank 0); setup on the other ranks then reads them

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        with frozen_heap():
            if self.vocab is None:
                self.prepare_tokenizer()
            train_docs, val_docs = self._documents()
            # val first: small, so tokenized here, it warms the word cache the train workers start from
            val_tokens = self._tokens(val_docs, "val") if val_docs is not None else None
            train_tokens = self._tokens(train_docs, "train")
            self._refuse_unknown(train_tokens[0])
            self.train_set = self._instances(train_tokens, "train", hp.seed, hp.dupe_factor,
                                             static=hp.masking == "static")
            if val_tokens is not None:
                self.val_set = self._instances(val_tokens, "val", HELD_OUT_SEED, 1, static=True)

    def _refuse_unknown(self, tokens: Dataset) -> None:
        """A vocabulary that does not cover the corpus trains to nonsense: refuse more [UNK] than
        data.max_unknown_share (English Wikipedia under BERT's own vocabulary: well below 1%)."""
        hp = self.hparams
        if "[UNK]" not in self.vocab:
            return
        unk, seen, unknown = self.vocab.index("[UNK]"), 0, 0
        for chunk in tokens.data.column("tokens").chunks:
            ids = chunk.flatten().flatten()
            seen, unknown = seen + len(ids), unknown + (pc.sum(pc.equal(ids, unk)).as_py() or 0)
            if seen >= UNKNOWN_SAMPLE:
                break
        if seen and unknown / seen > hp.max_unknown_share:
            name = ("the run's vocabulary" if isinstance(hp.tokenizer, (list, tuple))
                    else hp.tokenizer or "the WordPiece vocabulary trained on it")
            raise ValueError(f"data.tokenizer={name} ({len(self.vocab)} tokens) turns {unknown / seen:.1%} "
                             f"of corpus {self.corpus_name!r}'s tokens into [UNK] ({unknown} of the first "
                             f"{seen}), above data.max_unknown_share={hp.max_unknown_share}: expected a "
                             "vocabulary that covers the corpus (its language, script and casing: "
                             "data.lowercase)")

    def _columns(self, static: bool) -> list[str]:
        columns = ["input_ids", "token_type_ids"] + (["next_sentence_label"] if self.hparams.nsp else [])
        return columns + (["masked_lm_positions", "masked_lm_ids"] if static and not self.hparams.ltr else [])

    def collator(self, static: bool) -> PretrainingCollator:
        return PretrainingCollator(self._mask_settings(), dynamic=not static, nsp=self.hparams.nsp,
                                   seed=self.hparams.seed, bucket=self.hparams.length_bucket,
                                   max_length=self.hparams.max_seq_length)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        static = hp.masking == "static"
        # dynamic masks are drawn per (epoch, example): the same after a resume, on any number of ranks or
        # workers
        return train_loader(self.train_set.select_columns(self._columns(static)), hp.batch_size, hp.seed,
                            self.collator(static), self.trainer, hp.num_workers, keyed=not static)

    def val_dataloader(self) -> DataLoader | list:
        if self.val_set is None:
            return []
        return eval_loader(self.val_set.select_columns(self._columns(True)), self.hparams.batch_size,
                           self.collator(static=True), self.trainer, self.hparams.num_workers)
