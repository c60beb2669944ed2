"""Pre-training instances: the data algorithm of google-research/bert `create_pretraining_data.py`
(§3.3.1, §3.3.2, Appendix A.1): `create_instances_from_document`, `create_masked_lm_predictions`
(here `mask_tokens`, and `mask_batch` for many instances at once) and `truncate_seq_pair` (`_truncate`,
with the lengths of `glue.truncated_lengths`: the same rule as run_classifier.py's).

The same algorithm and distributions as the original, at array speed: a document is one array of token ids
and its sentence boundaries (zero-copy views of the memory-mapped Arrow column, never a Python list of the
corpus), an instance is two slices of such arrays, and truncation and masking draw their randomness in
blocks. numpy Generators replace `random.Random`, one per (seed, dupe round, document), so the result does not
depend on batching or the number of processes. `WordPieceIds` and `InstanceMaker` are the `datasets.map`
functions `PretrainDataModule` runs (in parallel with num_proc, one deterministic shard per process).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, Features, Sequence, Value
from tokenizers import Tokenizer

TOKENS_FEATURES = Features({"tokens": Sequence(Sequence(Value("int32")))})


class WordPieceIds:
    """`datasets.map` function (batched, Arrow format): documents of sentences -> documents of sentences of
    token ids, empty ones dropped (they would break the random-B draw).

    Each distinct space-separated word is tokenized once: BERT's normaliser works per character and its
    pre-tokenizer splits at every space, so a sentence's ids are its words' ids end to end, and the
    tokenizer's batch encoding runs over new words only (by Zipf's law a few percent of the running text).
    """

    MAX_WORDS = 1 << 20  # the word cache starts afresh at this size: memory stays flat on any corpus
    WORDS_PER_TEXT = 4096  # new words are encoded space-joined, this many to one text

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._forget()

    def _forget(self) -> None:
        self.words = pa.array([], pa.string())
        self.ids, self.offsets = np.zeros(0, np.int32), np.zeros(1, np.int64)

    def _learn(self, words: list[str]) -> None:
        """Add distinct new words: each token of a space-joined text goes to the word its offset falls in."""
        texts, starts = [], []
        for i in range(0, len(words), self.WORDS_PER_TEXT):
            piece = words[i : i + self.WORDS_PER_TEXT]
            ends = np.cumsum(np.fromiter(map(len, piece), np.int64, len(piece)) + 1)
            texts.append(" ".join(piece))
            starts.append(np.r_[0, ends[:-1]])
        counts, ids = [], []
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        for encoding, word_starts in zip(encodings, starts):
            token_starts = np.array(encoding.offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
            word = np.searchsorted(word_starts, token_starts, "right") - 1
            counts.append(np.bincount(word, minlength=len(word_starts)))
            ids.append(np.array(encoding.ids, dtype=np.int32))
        self.words = pa.concat_arrays([self.words, pa.array(words, pa.string())])
        self.ids = np.concatenate([self.ids, *ids])
        self.offsets = np.concatenate([self.offsets, self.offsets[-1] + np.cumsum(np.concatenate(counts))])

    def __call__(self, batch: pa.Table) -> pa.Table:
        documents = batch.column("sentences").combine_chunks()
        sentences = documents.flatten()
        words = pc.split_pattern(sentences, " ")
        running = words.flatten()
        new = pc.unique(pc.filter(running, pc.is_null(pc.index_in(running, value_set=self.words))))
        if len(self.words) + len(new) > self.MAX_WORDS:
            self._forget()
            new = pc.unique(running)
        if len(new):
            self._learn(new.to_pylist())
        word = pc.index_in(running, value_set=self.words).to_numpy()
        # every running word's ids, end to end: a ragged gather from the cache
        lengths = np.diff(self.offsets)[word]
        ends = np.cumsum(lengths)
        total = int(ends[-1]) if len(ends) else 0
        ids = self.ids[np.repeat(self.offsets[word] - (ends - lengths), lengths) + np.arange(total)]
        word_bounds = words.offsets.to_numpy()
        sentence_lengths = np.diff(np.r_[0, ends][word_bounds - word_bounds[0]])
        kept = sentence_lengths > 0
        doc_bounds = documents.offsets.to_numpy()
        sentences_per_doc = np.diff(np.r_[0, np.cumsum(kept)][doc_bounds - doc_bounds[0]])
        sentences_per_doc = sentences_per_doc[sentences_per_doc > 0]
        inner = pa.ListArray.from_arrays(_offsets(sentence_lengths[kept]), pa.array(ids))
        return pa.table({"tokens": pa.ListArray.from_arrays(_offsets(sentences_per_doc), inner)})


def _offsets(lengths: np.ndarray) -> pa.Array:
    return pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32))


class TokenizedDocuments:
    """all_documents[i] -> (token ids, sentence boundaries): zero-copy views of the memory-mapped Arrow column
    (`tokens`, documents of sentences of ids)."""

    def __init__(self, dataset: Dataset):
        assert dataset._indices is None, "needs a flat dataset; row i must be document i"
        self.chunks = []
        for chunk in dataset.data.column("tokens").chunks:
            sentences = chunk.values  # the child arrays, unsliced: the offsets index into them
            self.chunks.append((chunk.offsets.to_numpy(), sentences.offsets.to_numpy(),
                                sentences.values.to_numpy()))
        self.starts = np.cumsum([0] + [len(offsets) - 1 for offsets, _, _ in self.chunks])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        c = int(np.searchsorted(self.starts, i, "right")) - 1
        documents, sentences, ids = self.chunks[c]
        j = i - self.starts[c]
        bounds = sentences[documents[j] : documents[j + 1] + 1]
        return ids[bounds[0] : bounds[-1]], bounds - bounds[0]


def flat_document(document) -> tuple[np.ndarray, np.ndarray]:
    """(ids, sentence boundaries) of a document given as a list of sentences of ids (or already flat)."""
    if isinstance(document, tuple):
        return document
    lengths = [len(sentence) for sentence in document]
    ids = np.fromiter((t for sentence in document for t in sentence), np.int32, sum(lengths))
    return ids, np.r_[0, np.cumsum(lengths)]


def _truncate(a: np.ndarray, b: np.ndarray, max_num_tokens: int, rng: np.random.Generator):
    """truncate_seq_pair: each trimmed token goes from the front or the back by a fair coin (to avoid biases),
    so each side loses a Binomial(trimmed, 1/2) number from its front."""
    from bert_repro.data.glue import truncated_lengths  # glue loads Lightning: not for a plan's disk figure

    len_a, len_b = truncated_lengths(len(a), len(b), max_num_tokens)
    front_a = int(rng.binomial(len(a) - len_a, 0.5)) if len_a < len(a) else 0
    front_b = int(rng.binomial(len(b) - len_b, 0.5)) if len_b < len(b) else 0
    return a[front_a : front_a + len_a], b[front_b : front_b + len_b]


def document_pairs(all_documents, doc_index: int, max_seq_length: int, short_seq_prob: float,
                   rng: np.random.Generator, nsp: bool = True) -> tuple[list, int]:
    """The original's create_instances_from_document as ([(A, B, is_random_next)], target length): A and B
    are token-id arrays, truncated; B is empty without NSP. `all_documents[i]` is a document, as a list of
    sentences of ids or as (ids, sentence boundaries)."""
    ids, bounds = flat_document(all_documents[doc_index])
    bounds = bounds.tolist()
    max_num_tokens = max_seq_length - (3 if nsp else 2)
    # Mostly fill the sequence, but 10% of the time (per document) aim shorter, so that pre-training
    # also sees the short inputs of fine-tuning. The target is soft; max_seq_length is hard.
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = 2 + int(rng.random() * (max_num_tokens - 1))
    pairs = []
    first = i = 0  # the current chunk is sentences first..i
    while i < len(bounds) - 1:
        if i == len(bounds) - 2 or bounds[i + 1] - bounds[first] >= target:
            # A and B are whole "sentences" of the input, not an arbitrary split of the token stream,
            # which would make NSP too easy.
            size = i + 1 - first
            a_end = first + (1 + int(rng.random() * (size - 1)) if size >= 2 else 1)
            a = ids[bounds[first] : bounds[a_end]]
            if not nsp:
                a, b, is_random_next = ids[bounds[first] : bounds[i + 1]], ids[:0], False
            # A one-sentence chunk has no true next part, so it always gets a random B; this is
            # why the original gives slightly more than 50% NotNext.
            elif size == 1 or rng.random() < 0.5:
                # Retry (10 times, as the original) so B rarely comes from this same document.
                for _ in range(10):
                    random_index = int(rng.random() * len(all_documents))
                    if random_index != doc_index:
                        break
                other, other_bounds = flat_document(all_documents[random_index])
                start = int(rng.random() * (len(other_bounds) - 1))
                # sentences from `start` on until B reaches the target (at least one)
                end = int(np.searchsorted(other_bounds, other_bounds[start] + target - len(a)))
                end = min(max(end, start + 1), len(other_bounds) - 1)
                b, is_random_next = other[other_bounds[start] : other_bounds[end]], True
                i = a_end - 1  # the unused sentences are "put back" for the next instance
            else:
                b, is_random_next = ids[bounds[a_end] : bounds[i + 1]], False
            pairs.append((*_truncate(a, b, max_num_tokens, rng), is_random_next))
            first = i + 1
        i += 1
    return pairs, target


def create_instances_from_document(all_documents, doc_index: int, max_seq_length: int, short_seq_prob: float,
                                   rng: np.random.Generator, nsp: bool = True,
                                   cls_id: int = 2, sep_id: int = 3) -> list[dict]:
    """Instances from `all_documents[doc_index]`, as dicts of lists (`document_pairs` builds them).

    nsp=True: [CLS] A [SEP] B [SEP]; B is the true continuation or, for `next_sentence_label=1`
    (the original's is_random_next), a span of another document. nsp=False (the No-NSP and LTR
    ablations, §5.1): [CLS] contiguous text [SEP], segment 0, no label.
    """
    pairs, target = document_pairs(all_documents, doc_index, max_seq_length, short_seq_prob, rng, nsp)
    instances = []
    for a, b, is_random_next in pairs:
        instance = {"input_ids": [cls_id, *a.tolist(), sep_id] + ([*b.tolist(), sep_id] if nsp else []),
                    "token_type_ids": [0] * (len(a) + 2) + ([1] * (len(b) + 1) if nsp else []),
                    "doc_index": doc_index, "target_length": target}
        if nsp:
            instance["next_sentence_label"] = int(is_random_next)
        instances.append(instance)
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
    masked[positions] = np.where(u < shares[0], mask_id,
                                 np.where(u < shares[0] + shares[1], labels, random_ids))
    return masked, positions, labels


def mask_sequence(input_ids, rng: np.random.Generator, settings: dict):
    """mask_tokens for an instance: [CLS]/[SEP] (`special_ids`) are never chosen; `is_continuation` is per
    vocab id."""
    ids = np.asarray(input_ids)
    settings = dict(settings)
    special_mask = np.isin(ids, settings.pop("special_ids"))
    continuation = settings.pop("is_continuation")
    return mask_tokens(ids, special_mask, rng,
                       is_continuation=None if continuation is None else continuation[ids], **settings)


def mask_draws(rng: np.random.Generator, n: int, max_seq_length: int, mask: dict) -> dict:
    """The randomness `mask_batch` uses for `n` instances of one document, drawn in three blocks: a sort key
    per position, and per prediction a uniform (MASK/SAME/RND) and a random id."""
    p = mask["max_predictions"]
    return {"keys": rng.random((n, max_seq_length)), "u": rng.random((n, p)),
            "random_ids": rng.integers(0, mask["vocab_size"], size=(n, p))}


def mask_batch(input_ids: np.ndarray, lengths: np.ndarray, draws: dict, mask: dict):
    """mask_tokens for many instances at once (flat ids, lengths): each instance takes its k non-special
    positions of smallest key, a uniformly random k-subset as the original's shuffle-and-take; then MASK, SAME
    or RND by its uniforms. Returns (corrupted flat ids, positions per instance flat, original ids there,
    predictions per instance)."""
    n, width = len(lengths), int(lengths.max())
    rows = np.repeat(np.arange(n), lengths)
    cols = np.arange(len(input_ids)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    ids = np.zeros((n, width), dtype=input_ids.dtype)
    ids[rows, cols] = input_ids
    keys = np.full((n, width), np.inf)
    candidate = ~np.isin(input_ids, mask["special_ids"])
    keys[rows[candidate], cols[candidate]] = draws["keys"][rows[candidate], cols[candidate]]
    k = np.minimum(mask["max_predictions"], np.maximum(1, np.round(lengths * mask["masked_lm_prob"])))
    k = k.astype(int)
    smallest = min(mask["max_predictions"], width)
    kth = np.sort(np.partition(keys, smallest - 1, axis=1)[:, :smallest], axis=1)
    chosen = keys <= kth[np.arange(n), np.minimum(k, width) - 1][:, None]
    chosen &= np.isfinite(keys)  # fewer candidates than k: all of them
    at_row, at_col = np.nonzero(chosen)
    counts = chosen.sum(axis=1)
    rank = np.arange(len(at_row)) - np.repeat(np.cumsum(counts) - counts, counts)
    labels = ids[at_row, at_col]
    u = draws["u"][at_row, rank]
    mask_share, same_share, _ = mask["shares"]
    random_ids = draws["random_ids"][at_row, rank]
    ids[at_row, at_col] = np.where(u < mask_share, mask["mask_id"],
                                   np.where(u < mask_share + same_share, labels, random_ids))
    return ids[rows, cols], at_col, labels, counts


def instance_features(nsp: bool, static_mask: bool) -> Features:
    """Arrow schema of the instances: `dupe` is the dupe_factor round an instance comes from."""
    features = {"input_ids": Sequence(Value("int32")), "token_type_ids": Sequence(Value("int8")),
                "doc_index": Value("int32"), "dupe": Value("int16"), "target_length": Value("int32")}
    if nsp:
        features["next_sentence_label"] = Value("int8")
    if static_mask:
        features.update(masked_lm_positions=Sequence(Value("int32")), masked_lm_ids=Sequence(Value("int32")))
    return Features(features)


def stored_instance_bytes(max_seq_length: int, max_predictions: int, nsp: bool = True) -> int:
    """Bytes one full-length statically masked instance takes in the Arrow files, from the format's dtypes:
    each list column stores its items plus one int32 offset. (Short instances take less: an upper bound.)"""
    features = instance_features(nsp, static_mask=True)
    lengths = {"input_ids": max_seq_length, "token_type_ids": max_seq_length,
               "masked_lm_positions": max_predictions, "masked_lm_ids": max_predictions}
    total = 0
    for name, feature in features.items():
        dtype = feature.feature.dtype if isinstance(feature, Sequence) else feature.dtype
        total += np.dtype(dtype).itemsize * lengths.get(name, 1) + (4 if name in lengths else 0)
    return total


class InstanceMaker:
    """`datasets.map` function over the tokenized documents (given no columns, only `indices`: it reads the
    documents it needs itself, random B documents included): every instance of the documents at `indices`
    in dupe_factor round `dupe` (the original's outer loop), masked when `mask` is given (static masking);
    without it the collator masks afresh every time (dynamic). Returns an Arrow table."""

    def __init__(self, all_documents: Dataset, seed: int, dupe: int, max_seq_length: int,
                 short_seq_prob: float, nsp: bool, cls_id: int, sep_id: int, mask: dict | None):
        self.all_documents, self.seed, self.dupe = all_documents, seed, dupe
        self.max_seq_length, self.short_seq_prob = max_seq_length, short_seq_prob
        self.nsp, self.mask = nsp, mask
        self.cls, self.sep = np.array([cls_id], np.int32), np.array([sep_id], np.int32)
        self.whole_word = mask is not None and mask["whole_word"]
        self.features = instance_features(nsp, mask is not None)
        self._documents: TokenizedDocuments | None = None  # opened in the process that runs the map

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_documents": None}

    def __call__(self, indices: list[int]) -> pa.Table:
        if self._documents is None:
            self._documents = TokenizedDocuments(self.all_documents)
        pieces, segments, labels, doc_index, targets, draws, predictions = [], [], [], [], [], [], []
        for index in indices:
            rng = np.random.default_rng([self.seed, self.dupe, index])
            pairs, target = document_pairs(self._documents, index, self.max_seq_length, self.short_seq_prob,
                                           rng, self.nsp)
            for a, b, is_random_next in pairs:
                parts = [self.cls, a, self.sep, b, self.sep] if self.nsp else [self.cls, a, self.sep]
                if self.whole_word:  # word by word, so per instance
                    masked, positions, originals = mask_sequence(np.concatenate(parts), rng, self.mask)
                    parts = [masked]
                    predictions.append((positions, originals))
                pieces += parts
                segments.append((len(a) + 2, len(b) + 1) if self.nsp else (len(a) + 2,))
                labels.append(is_random_next)
            doc_index += [index] * len(pairs)
            targets += [target] * len(pairs)
            if self.mask is not None and not self.whole_word and pairs:
                draws.append(mask_draws(rng, len(pairs), self.max_seq_length, self.mask))
        if not labels:
            return self.features.arrow_schema.empty_table()
        ids, segments = np.concatenate(pieces), np.array(segments)
        lengths = segments.sum(axis=1)
        columns = {"doc_index": np.array(doc_index, np.int32), "target_length": np.array(targets, np.int32),
                   "dupe": np.full(len(lengths), self.dupe, np.int16),
                   "next_sentence_label": np.array(labels, np.int8)}
        if self.whole_word:
            positions, originals = (np.concatenate(column) for column in zip(*predictions))
            counts = np.array([len(p) for p, _ in predictions])
        elif self.mask is not None:  # static masking: decided once, stored
            block = {key: np.concatenate([d[key] for d in draws]) for key in draws[0]}
            ids, positions, originals, counts = mask_batch(ids, lengths, block, self.mask)
        if self.mask is not None:
            columns["masked_lm_positions"] = _lists(counts, positions)
            columns["masked_lm_ids"] = _lists(counts, originals)
        columns["input_ids"] = _lists(lengths, ids)
        # segment 0 for [CLS] A [SEP], 1 for B [SEP]
        segment_ids = np.tile(np.arange(segments.shape[1]), len(segments))
        columns["token_type_ids"] = _lists(lengths, np.repeat(segment_ids, segments.ravel()))
        return pa.table({name: columns[name] for name in self.features}).cast(self.features.arrow_schema)


def _lists(lengths: np.ndarray, values: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(_offsets(lengths), pa.array(values))
