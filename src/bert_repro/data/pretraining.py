"""Pre-training instances: masked LM + next sentence prediction (§3.3.1, §3.3.2, Appendix A.1).

The instance logic follows google-research/bert `create_pretraining_data.py`
(`create_instances_from_document`, `create_masked_lm_predictions`, `truncate_seq_pair`), with
numpy Generators instead of `random.Random` and one generator per (seed, dupe round, document), so
the result does not depend on batching or the number of processes. Documents are token-id lists
per sentence; they stay in memory-mapped Arrow files, never in one Python list of the corpus.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from datasets import Dataset, Features, Sequence, Value
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from bert_repro.data.corpus import default_cache_dir, load_documents
from bert_repro.tokenization import load_tokenizer, train_wordpiece, vocab_list

log = logging.getLogger(__name__)

PAD_ID = 0  # [PAD] is id 0 in google-research/bert vocabularies (checked against the tokenizer)
HELD_OUT_SEED = 0  # the val split and its masks do not move with the training seed, so val/ppl compares across runs


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int, rng: np.random.Generator) -> None:
    """Trim the longer side, from the front or the back at random (to avoid biases), in place."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        del longer[0 if rng.random() < 0.5 else -1]


def create_instances_from_document(all_documents, doc_index: int, max_seq_length: int, short_seq_prob: float,
                                   rng: np.random.Generator, nsp: bool = True,
                                   cls_id: int = 2, sep_id: int = 3) -> list[dict]:
    """Instances from `all_documents[doc_index]` (a list of sentences, each a list of token ids).

    nsp=True: [CLS] A [SEP] B [SEP]; B is the true continuation or, for `next_sentence_label=1`
    (the original's is_random_next), a span of another document. nsp=False (the No-NSP and LTR
    ablations, §5.1): [CLS] contiguous text [SEP], segment 0, no label.
    """
    document = all_documents[doc_index]
    max_num_tokens = max_seq_length - (3 if nsp else 2)
    # Mostly fill the sequence, but 10% of the time (per document) aim shorter, so that pre-training
    # also sees the short inputs of fine-tuning. The target is soft; max_seq_length is hard.
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_num_tokens + 1))

    instances = []
    chunk: list[list[int]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target:
            # A and B are whole "sentences" of the input, not an arbitrary split of the token stream,
            # which would make NSP too easy.
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
            if not nsp:
                tokens_a += [t for sentence in chunk[a_end:] for t in sentence]
                truncate_seq_pair(tokens_a, [], max_num_tokens, rng)
                instances.append({"input_ids": [cls_id, *tokens_a, sep_id], "token_type_ids": [0] * (len(tokens_a) + 2),
                                  "doc_index": doc_index, "target_length": target})
            else:
                tokens_b: list[int] = []
                # A one-sentence chunk has no true next part, so it always gets a random B; this is
                # why the original gives slightly more than 50% NotNext.
                is_random_next = len(chunk) == 1 or rng.random() < 0.5
                if is_random_next:
                    # Retry (10 times, as the original) so B rarely comes from this same document.
                    for _ in range(10):
                        random_index = int(rng.integers(0, len(all_documents)))
                        if random_index != doc_index:
                            break
                    random_document = all_documents[random_index]
                    for sentence in random_document[int(rng.integers(0, len(random_document))):]:
                        tokens_b += sentence
                        if len(tokens_b) >= target - len(tokens_a):
                            break
                    i -= len(chunk) - a_end  # the unused sentences are "put back" for the next instance
                else:
                    tokens_b = [t for sentence in chunk[a_end:] for t in sentence]
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                instances.append({
                    "input_ids": [cls_id, *tokens_a, sep_id, *tokens_b, sep_id],
                    "token_type_ids": [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1),
                    "next_sentence_label": int(is_random_next),
                    "doc_index": doc_index,
                    "target_length": target,
                })
            chunk, chunk_length = [], 0
        i += 1
    return instances


def mask_tokens(input_ids, special_mask, rng: np.random.Generator, vocab_size: int, mask_id: int,
                masked_lm_prob: float = 0.15, max_predictions: int = 20, shares=(0.8, 0.1, 0.1),
                whole_word: bool = False, is_continuation=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The masked-LM corruption of one sequence (§3.3.1; the original create_masked_lm_predictions).

    Chooses min(max_predictions, max(1, round(len * masked_lm_prob))) non-special positions
    uniformly (whole words at a time when `whole_word`, the later Whole Word Masking release); of
    those, shares = (MASK, SAME, RND): [MASK], kept, or a random id from the whole vocabulary
    (v2 Appendix C.2 varies these). Returns (corrupted ids, sorted positions, original ids there).
    """
    ids = np.asarray(input_ids)
    candidates = np.flatnonzero(~np.asarray(special_mask, dtype=bool))
    num_to_predict = min(max_predictions, max(1, int(round(len(ids) * masked_lm_prob))))
    if not whole_word:
        chosen = rng.permutation(candidates)[:num_to_predict]
    else:
        # A "##" piece joins the word before it when that word ends right next to it.
        cont = np.asarray(is_continuation, dtype=bool)[candidates]
        starts = ~cont | np.r_[True, np.diff(candidates) != 1]
        words = np.split(candidates, np.flatnonzero(starts)[1:])
        picked: list[np.ndarray] = []
        count = 0
        for w in rng.permutation(len(words)):
            if count >= num_to_predict:
                break
            if count + len(words[w]) <= num_to_predict:  # a word that would overshoot is skipped
                picked.append(words[w])
                count += len(words[w])
        chosen = np.concatenate(picked) if picked else candidates[:0]
    positions = np.sort(chosen)
    labels = ids[positions]
    masked = ids.copy()
    u = rng.random(len(positions))
    random_ids = rng.integers(0, vocab_size, size=len(positions))
    masked[positions] = np.where(u < shares[0], mask_id, np.where(u < shares[0] + shares[1], labels, random_ids))
    return masked, positions, labels


def _mask_sequence(input_ids, rng: np.random.Generator, settings: dict):
    """mask_tokens for an instance: [CLS]/[SEP] (`special_ids`) are never chosen; `is_continuation` is per vocab id."""
    ids = np.asarray(input_ids)
    settings = dict(settings)
    special_mask = np.isin(ids, settings.pop("special_ids"))
    continuation = settings.pop("is_continuation")
    return mask_tokens(ids, special_mask, rng, is_continuation=None if continuation is None else continuation[ids],
                       **settings)


class _TokenizedDocuments:
    """all_documents[i] -> list of sentences of token ids, read from the memory-mapped Arrow table."""

    def __init__(self, dataset: Dataset):
        assert dataset._indices is None, "needs a flat dataset; row i must be document i"
        self.column = dataset.data.column("tokens")

    def __len__(self) -> int:
        return len(self.column)

    def __getitem__(self, i: int) -> list[list[int]]:
        return self.column[i].as_py()


def _tokenize_batch(batch: dict, tokenizer: Tokenizer) -> dict:
    sentences = [s for doc in batch["sentences"] for s in doc]
    encoded = iter(tokenizer.encode_batch(sentences, add_special_tokens=False))
    documents = [[e.ids for _, e in zip(doc, encoded) if e.ids] for doc in batch["sentences"]]
    return {"tokens": [doc for doc in documents if doc]}  # empty documents would break the random-B draw


def _instances_batch(batch: dict, indices: list[int], all_documents: Dataset, seed: int, dupe_factor: int,
                     max_seq_length: int, short_seq_prob: float, nsp: bool, cls_id: int, sep_id: int,
                     mask: dict | None) -> dict:
    documents = _TokenizedDocuments(all_documents)
    columns: dict[str, list] = {}
    for doc_index in indices:
        for dupe in range(dupe_factor):
            rng = np.random.default_rng([seed, dupe, doc_index])
            for instance in create_instances_from_document(documents, doc_index, max_seq_length, short_seq_prob,
                                                           rng, nsp=nsp, cls_id=cls_id, sep_id=sep_id):
                if mask is not None:  # static masking: decided once, stored
                    masked, positions, labels = _mask_sequence(instance["input_ids"], rng, mask)
                    instance.update(input_ids=masked, masked_lm_positions=positions, masked_lm_ids=labels)
                for key, value in instance.items():
                    columns.setdefault(key, []).append(value)
    return columns


class PretrainingCollator:
    """Pads a list of instances to the longest one and, for dynamic masking, masks them afresh.

    Batch: input_ids, token_type_ids, attention_mask (B, T); masked_lm_positions, masked_lm_ids,
    masked_lm_weights (B, P = max_predictions), unless LTR; next_sentence_labels (B,) with NSP.
    """

    def __init__(self, mask: dict | None, dynamic: bool, nsp: bool, seed: int):
        self.mask, self.dynamic, self.nsp, self.seed = mask, dynamic, nsp, seed
        self._rng, self._rng_key = None, None

    def _generator(self) -> np.random.Generator:
        # One stream per process: in a worker, seeded from the worker's seed (which the loader's
        # seeded generator draws afresh every epoch), so no two workers repeat each other's masks.
        info = torch.utils.data.get_worker_info()
        key = None if info is None else info.seed
        if self._rng is None or key != self._rng_key:
            self._rng = np.random.default_rng([self.seed] if key is None else [self.seed, key])
            self._rng_key = key
        return self._rng

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        B, T = len(examples), max(len(e["input_ids"]) for e in examples)
        input_ids = np.full((B, T), PAD_ID, dtype=np.int64)
        token_type_ids = np.zeros((B, T), dtype=np.int64)
        attention_mask = np.zeros((B, T), dtype=np.int64)
        batch = {}
        if self.mask is not None:
            P = self.mask["max_predictions"]
            positions, lm_ids = np.zeros((B, P), dtype=np.int64), np.zeros((B, P), dtype=np.int64)
            weights = np.zeros((B, P), dtype=np.float32)
        for b, e in enumerate(examples):
            ids, n = np.asarray(e["input_ids"]), len(e["input_ids"])
            if self.mask is not None:
                if self.dynamic:
                    ids, pos, labels = _mask_sequence(ids, self._generator(), self.mask)
                else:
                    pos, labels = e["masked_lm_positions"], e["masked_lm_ids"]
                positions[b, : len(pos)], lm_ids[b, : len(pos)], weights[b, : len(pos)] = pos, labels, 1.0
            input_ids[b, :n], token_type_ids[b, :n], attention_mask[b, :n] = ids, e["token_type_ids"], 1
        batch.update(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        if self.mask is not None:
            batch.update(masked_lm_positions=positions, masked_lm_ids=lm_ids, masked_lm_weights=weights)
        if self.nsp:
            batch["next_sentence_labels"] = np.array([e["next_sentence_label"] for e in examples], dtype=np.int64)
        return {k: torch.from_numpy(v) for k, v in batch.items()}


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


class PretrainDataModule(L.LightningDataModule):
    """Masked LM + NSP pre-training data (§3.3) and its ablations: No NSP, LTR (§5.1), MASK/SAME/RND
    shares (v2 C.2), static vs dynamic masking, whole-word masking.

    Pipeline (each step cached under cache_dir, keyed by its inputs and settings): documents ->
    train/val split by document -> WordPiece vocab (trained on the train documents unless
    `tokenizer` names one) -> token ids -> instances (`dupe_factor` rounds with different
    randomness, as the original's default 10) -> batches. The val set is always masked statically
    with HELD_OUT_SEED.
    """

    def __init__(self, corpus: str, tokenizer: str | None = None, vocab_size: int = 30522, lowercase: bool = True,
                 max_seq_length: int = 128, max_predictions_per_seq: int = 20, masked_lm_prob: float = 0.15,
                 short_seq_prob: float = 0.1, mask_shares: tuple | list = (0.8, 0.1, 0.1), whole_word_mask: bool = False,
                 nsp: bool = True, ltr: bool = False, masking: str = "dynamic", dupe_factor: int = 1,
                 val_fraction: float = 0.05, batch_size: int = 32, num_workers: int = 0, num_proc: int = 1,
                 seed: int = 12345, cache_dir: str | None = None, max_documents: int | None = None):
        super().__init__()
        mask_shares = tuple(float(s) for s in mask_shares)
        if len(mask_shares) != 3 or min(mask_shares) < 0 or abs(sum(mask_shares) - 1) > 1e-6:
            raise ValueError(f"mask_shares={mask_shares}: expected three (MASK, SAME, RND) shares summing to 1")
        if masking not in ("static", "dynamic"):
            raise ValueError(f"masking={masking!r}: expected 'static' or 'dynamic'")
        if ltr and nsp:
            raise ValueError("ltr=True is the 'LTR & No NSP' ablation (§5.1); set nsp=False with it")
        if not 0 <= val_fraction < 1 or max_seq_length < 8:
            raise ValueError(f"val_fraction={val_fraction}, max_seq_length={max_seq_length}: expected [0, 1) and >= 8")
        self.save_hyperparameters()
        self.hparams.mask_shares = mask_shares
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.lowercase = lowercase
        self.vocab: list[str] | None = None
        self._tokenizer: Tokenizer | None = None
        self._splits: tuple[Dataset, Dataset | None] | None = None
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer if self._tokenizer is not None else self.prepare_tokenizer()

    def _documents(self) -> tuple[Dataset, Dataset | None]:
        """Train and val documents: val_fraction of the documents (at least one), fixed by HELD_OUT_SEED."""
        if self._splits is None:
            hp = self.hparams
            docs = load_documents(hp.corpus, cache_dir=self.cache_dir, num_proc=hp.num_proc if hp.num_proc > 1 else None)
            if hp.max_documents is not None:
                docs = docs.select(range(min(hp.max_documents, len(docs))))
            n_val = max(1, round(len(docs) * hp.val_fraction)) if hp.val_fraction > 0 else 0
            if len(docs) - n_val < 1:
                raise ValueError(f"corpus {hp.corpus!r} has {len(docs)} document(s); need more than {n_val} for a val split")
            order = np.random.default_rng(HELD_OUT_SEED).permutation(len(docs))
            val = docs.select(np.sort(order[:n_val])) if n_val else None
            self._splits = (docs.select(np.sort(order[n_val:])), val)
        return self._splits

    def prepare_tokenizer(self) -> Tokenizer:
        """Load `tokenizer`, or train (once, then cached) a WordPiece vocab on the train documents."""
        hp = self.hparams
        if hp.tokenizer is not None:
            self._tokenizer = load_tokenizer(hp.tokenizer, lowercase=hp.lowercase)
        else:
            train_docs, _ = self._documents()
            path = self.cache_dir / "wordpiece" / _key(train_docs._fingerprint, hp.vocab_size, hp.lowercase) / "vocab.txt"
            if path.is_file():
                self._tokenizer = load_tokenizer(path, lowercase=hp.lowercase)
            else:
                texts = (s for batch in train_docs.iter(batch_size=256) for doc in batch["sentences"] for s in doc)
                self._tokenizer = train_wordpiece(texts, hp.vocab_size, lowercase=hp.lowercase)
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_text("".join(f"{t}\n" for t in vocab_list(self._tokenizer)), encoding="utf-8")
                tmp.replace(path)
        self.vocab = vocab_list(self._tokenizer)
        if self.vocab[PAD_ID] != "[PAD]":
            raise ValueError(f"tokenizer {hp.tokenizer}: id {PAD_ID} is {self.vocab[PAD_ID]!r}; expected [PAD]")
        self.special_ids = {t: self.vocab.index(t) for t in ("[CLS]", "[SEP]", "[MASK]")}
        return self._tokenizer

    def _mask_settings(self) -> dict | None:
        hp = self.hparams
        if hp.ltr:
            return None  # a left-to-right LM predicts every next token; the model shifts the ids itself
        is_continuation = np.array([t.startswith("##") for t in self.vocab]) if hp.whole_word_mask else None
        return dict(vocab_size=len(self.vocab), mask_id=self.special_ids["[MASK]"], masked_lm_prob=hp.masked_lm_prob,
                    max_predictions=hp.max_predictions_per_seq, shares=hp.mask_shares,
                    whole_word=hp.whole_word_mask, is_continuation=is_continuation,
                    special_ids=(self.special_ids["[CLS]"], self.special_ids["[SEP]"]))

    def _instances(self, docs: Dataset, split: str, seed: int, dupe_factor: int, static: bool) -> Dataset:
        hp = self.hparams
        vocab_key = _key(self.vocab, self.lowercase)
        folder = self.cache_dir / "pretrain"
        folder.mkdir(parents=True, exist_ok=True)
        num_proc = hp.num_proc if hp.num_proc > 1 else None
        tokens_key = _key(docs._fingerprint, vocab_key)
        tokens = docs.map(_tokenize_batch, batched=True, batch_size=256, remove_columns=docs.column_names,
                          fn_kwargs={"tokenizer": self._tokenizer}, num_proc=num_proc,
                          features=Features({"tokens": Sequence(Sequence(Value("int32")))}),
                          cache_file_name=str(folder / f"tokens-{split}-{tokens_key}.arrow"), new_fingerprint=tokens_key)
        mask = self._mask_settings() if static else None
        settings = dict(seed=seed, dupe_factor=dupe_factor, max_seq_length=hp.max_seq_length,
                        short_seq_prob=hp.short_seq_prob, nsp=hp.nsp, cls_id=self.special_ids["[CLS]"],
                        sep_id=self.special_ids["[SEP]"], mask=mask)
        key = _key(tokens_key, {**settings, "mask": mask and {k: v for k, v in mask.items() if k != "is_continuation"}})
        features = {"input_ids": Sequence(Value("int32")), "token_type_ids": Sequence(Value("int8")),
                    "doc_index": Value("int32"), "target_length": Value("int32")}
        if hp.nsp:
            features["next_sentence_label"] = Value("int8")
        if mask is not None:
            features.update(masked_lm_positions=Sequence(Value("int32")), masked_lm_ids=Sequence(Value("int32")))
        cache_file = folder / f"instances-{split}-{key}.arrow"
        cached = any(folder.glob(f"{cache_file.stem}*.arrow"))  # with num_proc, datasets writes one file per shard
        start = time.perf_counter()
        instances = tokens.map(_instances_batch, batched=True, batch_size=64, with_indices=True,
                               remove_columns=["tokens"], fn_kwargs={"all_documents": tokens, **settings},
                               num_proc=num_proc, features=Features(features),
                               cache_file_name=str(cache_file), new_fingerprint=key)
        seconds = time.perf_counter() - start
        if cached:
            log.info("%s: %d instances from %d documents, loaded from %s", split, len(instances), len(tokens), cache_file)
        else:
            log.info("%s: %d instances from %d documents in %.1fs (%.0f documents/s, %.0f instances/s)", split,
                     len(instances), len(tokens), seconds, len(tokens) / seconds, len(instances) / seconds)
        return instances

    def prepare_data(self) -> None:
        self.setup()  # builds every cache once (rank 0); setup on the other ranks then reads them

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        if self.vocab is None:
            self.prepare_tokenizer()
        train_docs, val_docs = self._documents()
        self.train_set = self._instances(train_docs, "train", hp.seed, hp.dupe_factor, static=hp.masking == "static")
        if val_docs is not None:
            self.val_set = self._instances(val_docs, "val", HELD_OUT_SEED, 1, static=True)

    def _columns(self, static: bool) -> list[str]:
        columns = ["input_ids", "token_type_ids"] + (["next_sentence_label"] if self.hparams.nsp else [])
        return columns + (["masked_lm_positions", "masked_lm_ids"] if static and not self.hparams.ltr else [])

    def collator(self, static: bool) -> PretrainingCollator:
        return PretrainingCollator(self._mask_settings(), dynamic=not static, nsp=self.hparams.nsp, seed=self.hparams.seed)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        static = hp.masking == "static"
        if getattr(self, "_train_collator", None) is None:  # kept, so the dynamic-mask stream continues across epochs
            self._train_collator = self.collator(static)
        generator = torch.Generator().manual_seed(hp.seed)
        return DataLoader(self.train_set.select_columns(self._columns(static)), batch_size=hp.batch_size, shuffle=True,
                          generator=generator, collate_fn=self._train_collator, num_workers=hp.num_workers,
                          persistent_workers=hp.num_workers > 0)

    def val_dataloader(self) -> DataLoader | list:
        if self.val_set is None:
            return []
        return DataLoader(self.val_set.select_columns(self._columns(True)), batch_size=self.hparams.batch_size,
                          collate_fn=self.collator(static=True), num_workers=self.hparams.num_workers)

