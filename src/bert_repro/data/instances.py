"""Pre-training instances: the data algorithm of google-research/bert `create_pretraining_data.py`
(§3.3.1, §3.3.2, Appendix A.1): `create_instances_from_document` (here `document_pairs`, for many documents
at once), `create_masked_lm_predictions` (here `mask_batch`, for many instances at once, static or dynamic,
whole words or not) and `truncate_seq_pair` (`_truncate`, with the lengths of `truncated_lengths`: glue's
rule, run_classifier.py's).

The same algorithm and distributions as the original, at array speed: a document is one array of token ids
and its sentence boundaries (zero-copy views of the memory-mapped Arrow column, never a Python list of the
corpus), an instance is two spans of such arrays (a few integers: only the chunking walks a document, an
instance per step), and random B, truncation, masking and the ids themselves are done on all of a batch's
instances at once. numpy Generators replace `random.Random`, one per (seed, dupe round, document) drawing its
randomness in blocks, so the result does not depend on batching or the number of processes. `WordPieceIds`
and `InstanceMaker` are the `datasets.map` functions `PretrainDataModule` runs (in parallel with num_proc, one
deterministic shard per process)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, Features, Sequence, Value
from tokenizers import Tokenizer

# the order the instances draw their randomness in: bump when a seed gives other instances (the same
# distributions), so a cache of the earlier ones is not read back as this code's
DRAWS = 3
TOKENS_FEATURES = Features({"tokens": Sequence(Sequence(Value("int32")))})


class _Cache:
    """Strings -> their token ids (end to end, with offsets), append-only. The lookup is a dict: a batch costs
    its own distinct strings, not the cache's size."""

    def __init__(self):
        self.row_of: dict[str, int] = {}
        self.ids, self.offsets = np.zeros(0, np.int32), np.zeros(1, np.int64)

    def __len__(self) -> int:
        return len(self.row_of)

    def __getstate__(self) -> dict:
        # the keys as one Arrow array, in row order: datasets' dill pickles a large dict slowly
        keys = pa.array(list(self.row_of), pa.large_string())
        return {"keys": keys, "ids": self.ids, "offsets": self.offsets}

    def __setstate__(self, state: dict) -> None:
        keys = state["keys"].to_pylist()
        self.row_of = dict(zip(keys, range(len(keys))))
        self.ids, self.offsets = state["ids"], state["offsets"]

    def index(self, keys: list[str]) -> np.ndarray:
        """Each key's row in the cache, -1 where new."""
        return np.fromiter(map(self.row_of.get, keys, repeat(-1)), np.int64, len(keys))

    def add(self, keys: list[str], ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Append new keys; returns their rows."""
        rows = range(len(self.row_of), len(self.row_of) + len(keys))
        self.row_of.update(zip(keys, rows))
        self.ids = np.concatenate([self.ids, ids])
        self.offsets = np.concatenate([self.offsets, self.offsets[-1] + np.cumsum(lengths)])
        return np.asarray(rows)

    def rows(self, keys: pa.Array, learn) -> np.ndarray:
        """The row of each distinct key, new ones added with their `learn(new keys)` -> (ids, lengths)."""
        names = keys.to_pylist()
        rows = self.index(names)
        new = np.flatnonzero(rows < 0)
        if len(new):
            rows[new] = self.add([names[i] for i in new], *learn(keys.take(new)))
        return rows

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the ids of `rows` end to end, their lengths): a ragged gather."""
        lengths = np.diff(self.offsets)[rows]
        return self.ids[_ranges(self.offsets[rows], lengths)], lengths


class WordPieceIds:
    """`datasets.map` function (batched, Arrow format): documents of sentences -> documents of sentences of
    token ids, empty ones dropped (they would break the random-B draw).

    Each distinct space-separated word is tokenized once: BERT's normaliser works per character and its
    pre-tokenizer splits at every space and around every punctuation character, so a sentence's ids are its
    words' ids end to end, and a word's are its pieces' (the word cut around ASCII punctuation: "end." is
    "end" and "."). Both are cached, and the tokenizer's batch encoding runs over new pieces only (by Zipf's
    law a few percent of the running text), many to one text with a separator token between them: the
    separators mark where each piece's ids end.
    """

    MAX_WORDS = 1 << 19  # the caches start afresh at this size: memory stays flat on any corpus
    PIECES_PER_TEXT = 4096  # new pieces are encoded separator-joined, this many to one text
    PUNCTUATION = "[!-/:-@\\[-`{-~]"  # ASCII punctuation: always a piece of its own to BertPreTokenizer

    def __init__(self, tokenizer: Tokenizer):
        from tokenizers.pre_tokenizers import BertPreTokenizer

        if tokenizer.padding or tokenizer.truncation:  # ids are counted per text: none may be added or cut
            tokenizer = Tokenizer.from_str(tokenizer.to_str())
            tokenizer.no_padding()
            tokenizer.no_truncation()
        self.tokenizer = tokenizer
        self.encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # no offsets needed
        # Cutting at punctuation beforehand is what BertPreTokenizer does anyway; not so for other ones.
        self.cut = isinstance(tokenizer.pre_tokenizer, BertPreTokenizer)
        # Added tokens ([SEP], ...) are matched in the text, so a word holding one is never cut.
        self.added = [(t.content, t.normalized) for t in tokenizer.get_added_tokens_decoder().values()]
        self.separator, self.separator_id = None, None
        unknown = tokenizer.token_to_id(getattr(tokenizer.model, "unk_token", None) or "[UNK]")
        for char in ",.;:!?":  # the first punctuation character that is one known token
            ids = tokenizer.encode(char, add_special_tokens=False).ids
            if len(ids) == 1 and ids[0] != unknown:
                self.separator, self.separator_id = char, ids[0]
                break
        self._forget()

    def _forget(self) -> None:
        self.words, self.pieces = _Cache(), _Cache()

    def _pieces(self, words: pa.Array) -> pa.ListArray:
        """Each word's pieces: cut around ASCII punctuation (the words that have some, and no added token)."""
        if not self.cut:
            return pa.ListArray.from_arrays(pa.array(np.arange(len(words) + 1, dtype=np.int32)), words)
        cut = pc.match_substring_regex(words, self.PUNCTUATION)
        for token, normalized in self.added:
            cut = pc.and_not(cut, pc.match_substring(words, token, ignore_case=normalized))
        index = np.arange(len(words))
        cut = cut.to_numpy(zero_copy_only=False)
        index[cut] = len(words) + np.arange(cut.sum())
        spaced = pc.replace_substring_regex(words.filter(cut), f"({self.PUNCTUATION})", r" \1 ")
        return pc.split_pattern(pa.concat_arrays([words, spaced]).take(index), " ")

    def _encode(self, pieces: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(ids end to end, length per piece) of distinct pieces: separator-joined where a piece holds no
        separator and the separators come back one per join, else one piece to an encoding."""
        joined = self.separator is not None and self.cut
        alone = [i for i, piece in enumerate(pieces) if not joined or self.separator in piece]
        rest = [i for i, piece in enumerate(pieces) if joined and self.separator not in piece]
        groups = [rest[i : i + self.PIECES_PER_TEXT] for i in range(0, len(rest), self.PIECES_PER_TEXT)]
        texts = [f" {self.separator} ".join([pieces[i] for i in group]) for group in groups]
        order, ids, lengths = [], [], []
        for group, encoding in zip(groups, self.encode(texts, add_special_tokens=False)):
            group_ids = np.array(encoding.ids, np.int32)
            separator = group_ids == self.separator_id
            if separator.sum() != len(group) - 1:  # a piece normalised to the separator: encode them alone
                alone += group
                continue
            order.append(group)
            lengths.append(np.diff(np.r_[-1, np.flatnonzero(separator), len(group_ids)]) - 1)
            ids.append(group_ids[~separator])
        if alone:
            encodings = self.encode([pieces[i] for i in alone], add_special_tokens=False)
            order.append(alone)
            lengths.append(np.array([len(e.ids) for e in encodings], np.int64))
            ids += [np.array(e.ids, np.int32) for e in encodings]
        lengths, ids = np.concatenate(lengths), np.concatenate(ids)
        rank = np.empty(len(pieces), np.int64)  # piece i's results are the rank[i]-th encoded
        rank[np.concatenate(order)] = np.arange(len(pieces))
        starts = np.cumsum(lengths) - lengths
        return ids[_ranges(starts[rank], lengths[rank])], lengths[rank]

    def _word_ids(self, words: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(ids end to end, length per word) of new words: their pieces' ids, new pieces encoded."""
        pieces = self._pieces(words)
        distinct = pc.dictionary_encode(pieces.flatten())
        rows = self.pieces.rows(distinct.dictionary, lambda new: self._encode(new.to_pylist()))
        ids, piece_lengths = self.pieces.gather(rows[distinct.indices.to_numpy()])
        bounds = pieces.offsets.to_numpy()
        return ids, np.diff(np.r_[0, np.cumsum(piece_lengths)][bounds - bounds[0]])

    def __call__(self, batch: pa.Table) -> pa.Table:
        documents = batch.column("sentences").combine_chunks()
        sentences = documents.flatten()
        words = pc.split_pattern(sentences, " ")
        distinct = pc.dictionary_encode(words.flatten())  # the batch's distinct words, and each running one's
        if max(len(self.words) + len(distinct.dictionary), len(self.pieces)) > self.MAX_WORDS:
            self._forget()
        rows = self.words.rows(distinct.dictionary, self._word_ids)
        # every running word's ids, end to end
        ids, lengths = self.words.gather(rows[distinct.indices.to_numpy()])
        ends = np.cumsum(lengths)
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
    """all_documents[i] -> (token ids, sentence boundaries), read in place from the `tokens` column
    (documents of sentences of ids): int32 views of the memory that holds it, a cache file's whole memory map
    (a "region"), zero-copy, never a Python list of the corpus. A record batch of the column is three places
    in its region: where its document offsets, its sentence offsets and its ids start. Documents and
    instances are then positions in a region, and the batch methods (`random_spans`, `gather`) take any
    number of them with a few array operations per region (one per cache file), however many record batches
    they come from: a loop per record batch made random B cost O(corpus) per map batch."""

    def __init__(self, dataset: Dataset | None = None):
        self.regions: list[np.ndarray] = []
        places = []  # per record batch: (region, documents_at, sentences_at, ids_at, number of documents)
        if dataset is not None:
            assert dataset._indices is None, "needs a flat dataset; row i must be document i"
            roots: dict[int, int] = {}  # a root buffer's address -> its region
            for record in dataset.data.column("tokens").chunks:
                sentences = record.values  # the child arrays, unsliced: the offsets index into them
                arrays = (record.offsets, sentences.offsets, sentences.values)
                root, at = _region_of(arrays)
                if root is None:  # not one buffer's slices (a table built in memory): a region of its own
                    parts = [a.to_numpy() for a in arrays]
                    self.regions.append(np.concatenate(parts).astype(np.int32, copy=False))
                    region, at = len(self.regions) - 1, np.cumsum([0] + [len(p) for p in parts[:-1]])
                else:
                    if root.address not in roots:
                        roots[root.address] = len(self.regions)
                        self.regions.append(np.frombuffer(root, np.int32, root.size // 4))
                    region = roots[root.address]
                places.append((region, *map(int, at), len(record)))
        self._index(places)

    @classmethod
    def from_lists(cls, documents) -> TokenizedDocuments:
        """Documents as lists of sentences of ids (tests, the original's `all_documents`): one region."""
        self = cls()
        lengths = [len(sentence) for document in documents for sentence in document]
        ids = np.fromiter((t for d in documents for s in d for t in s), np.int32, sum(lengths))
        document_offsets = np.r_[0, np.cumsum([len(d) for d in documents])]
        sentence_offsets = np.r_[0, np.cumsum(lengths)]
        self.regions = [np.concatenate([document_offsets, sentence_offsets, ids]).astype(np.int32)]
        self._index([(0, 0, len(documents) + 1, len(documents) + len(lengths) + 2, len(documents))])
        return self

    def _index(self, places: list[tuple]) -> None:
        self.places = places  # lists: a document lookup costs no numpy call
        self.starts = np.r_[0, np.cumsum([n for *_, n in places], dtype=np.int64)]
        self._starts = self.starts.tolist()
        self.region_of, self.documents_at, self.sentences_at, self.ids_at = (
            np.array([place[field] for place in places], np.int64).reshape(-1) for field in range(4))

    def __len__(self) -> int:
        return int(self.starts[-1])

    def sentences(self, i: int) -> tuple[int, list[int]]:
        """(region, sentence boundaries of document i as positions in the region)."""
        c = bisect_right(self._starts, i) - 1
        region, documents_at, sentences_at, ids_at, _ = self.places[c]
        memory = self.regions[region]
        row = documents_at + i - self._starts[c]
        first, last = memory[row : row + 2].tolist()
        return region, (memory[sentences_at + first : sentences_at + last + 1] + np.int64(ids_at)).tolist()

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        region, bounds = self.sentences(i)
        bounds = np.array(bounds)
        return self.regions[region][bounds[0] : bounds[-1]], bounds - bounds[0]

    def random_spans(self, docs: np.ndarray, u: np.ndarray, need: np.ndarray):
        """The original's random B: from a uniformly drawn sentence (`u` uniforms) of each document in `docs`,
        whole sentences until `need` tokens are reached (at least one; at most to the document's end).
        Returns (region, start, length) arrays."""
        records = np.searchsorted(self.starts, docs, "right") - 1
        regions = self.region_of[records]
        starts, lengths = np.zeros(len(docs), np.int64), np.zeros(len(docs), np.int64)
        for region, part in _groups(regions):
            memory, record = self.regions[region], records[part]
            row = self.documents_at[record] + docs[part] - self.starts[record]
            first, last = memory[row], memory[row + 1]  # sentences first..last-1 of the record batch
            boundary = self.sentences_at[record]  # + k: sentence k's first token, in the record batch's ids
            start = first + (u[part] * (last - first)).astype(np.int64)
            begin = memory[boundary + start]
            # B ends at the first boundary that reaches `need` tokens, between start + 1 and last: a binary
            # search of every document at once (boundaries rise within a document)
            low, high = start + 1, last
            while (searching := low < high).any():
                middle = (low + high) // 2
                reached = memory[boundary + middle] >= begin + need[part]
                high = np.where(searching & reached, middle, high)
                low = np.where(searching & ~reached, middle + 1, low)
            starts[part] = begin + self.ids_at[record]
            lengths[part] = memory[boundary + low] - begin
        return regions, starts, lengths

    def gather(self, regions: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The token ids of spans (region, start, length), end to end."""
        out = np.empty(int(lengths.sum()), np.int32)
        dest = np.cumsum(lengths) - lengths
        for region, part in _groups(regions):
            memory = self.regions[region]
            out[_ranges(dest[part], lengths[part])] = memory[_ranges(starts[part], lengths[part])]
        return out


def _region_of(arrays) -> tuple[pa.Buffer | None, list[int]]:
    """(the buffer that Arrow int32 `arrays` are all slices of, at the root of their parents, and the
    element each starts at in it), or (None, []) when they are not so."""
    roots, at = {}, []
    for array in arrays:
        if array.type != pa.int32():
            return None, []
        buffer = array.buffers()[1]
        while buffer.parent is not None:
            buffer = buffer.parent
        offset = array.buffers()[1].address + 4 * array.offset - buffer.address
        if offset % 4 or buffer.address % 4:
            return None, []
        roots[buffer.address] = buffer
        at.append(offset // 4)
    return (roots.popitem()[1], at) if len(roots) == 1 else (None, [])


def _groups(keys: np.ndarray):
    """(key, positions of that key) for each distinct key."""
    order = np.argsort(keys, kind="stable")
    for part in np.split(order, np.flatnonzero(np.diff(keys[order])) + 1):
        if len(part):
            yield int(keys[part[0]]), part


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """start..start+length-1 for each span, end to end (a ragged arange)."""
    ends = np.cumsum(lengths)
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(ends[-1] if len(ends) else 0)


PAIR_FIELDS = ("slot", "a_start", "a_length", "b_start", "b_length", "random_document", "u_start", "need")


def document_pairs(documents: TokenizedDocuments, doc_indices, rngs, max_seq_length: int,
                   short_seq_prob: float, nsp: bool = True) -> dict[str, np.ndarray]:
    """The original's create_instances_from_document for the documents `doc_indices`, document k drawing
    its randomness from `rngs[k]` only (so the result does not depend on which documents are built
    together). Returns arrays, one item per instance, in document order: `slot` (k), `doc_index`,
    `target_length`, `random_next`, and A and B as spans of the regions' ids (`a_region`, `a_start`,
    `a_length`, `b_...`), truncated; B is empty without NSP. `per_document`: the instances of each
    document."""
    max_num_tokens = max_seq_length - (3 if nsp else 2)
    n_documents = len(documents)
    rows, targets, regions = [], [], []
    for k, (index, rng) in enumerate(zip(doc_indices, rngs)):
        region, bounds = documents.sentences(index)
        # Mostly fill the sequence, but 10% of the time (per document) aim shorter, so that pre-training
        # also sees the short inputs of fine-tuning. The target is soft; max_seq_length is hard.
        coin, short = rng.random(2).tolist()
        target = max_num_tokens if coin >= short_seq_prob else 2 + int(short * (max_num_tokens - 1))
        targets.append(target)
        regions.append(region)
        n_sentences, first = len(bounds) - 1, 0
        # An instance takes at least one sentence, so a row of uniforms per sentence is enough: the split
        # point of A, the NSP coin, the random document and the sentence B starts from in it.
        for u_split, u_next, u_document, u_start in rng.random((n_sentences, 4)).tolist():
            if first == n_sentences:
                break
            # The chunk is sentences first..end-1: up to the first that reaches the target, or the last.
            # A and B are whole "sentences" of the input, not an arbitrary split of the token stream, which
            # would make NSP too easy.
            end = min(bisect_left(bounds, bounds[first] + target, first + 1), n_sentences)
            a_end = first + 1 + int(u_split * (end - first - 1))
            a_length = bounds[a_end] - bounds[first]
            if not nsp:
                rows.append((k, bounds[first], bounds[end] - bounds[first], 0, 0, -1, 0.0, 0))
            # A one-sentence chunk has no true next part, so it always gets a random B; this is why the
            # original gives slightly more than 50% NotNext.
            elif end - first == 1 or u_next < 0.5:
                other = int(u_document * n_documents)
                for _ in range(9):  # retried (10 tries in all, as the original) so B rarely comes from here
                    if other != index:
                        break
                    other = int(rng.random() * n_documents)
                rows.append((k, bounds[first], a_length, 0, 0, other, u_start, target - a_length))
                end = a_end  # the unused sentences are "put back" for the next instance
            else:
                b_length = bounds[end] - bounds[a_end]
                rows.append((k, bounds[first], a_length, bounds[a_end], b_length, -1, 0.0, 0))
            first = end
    columns = dict(zip(PAIR_FIELDS, np.array(rows, np.float64).reshape(-1, len(PAIR_FIELDS)).T))
    pairs = {name: column.astype(np.int64) for name, column in columns.items() if name != "u_start"}
    slot = pairs["slot"]
    pairs.update(doc_index=np.asarray(doc_indices, np.int64)[slot], target_length=np.array(targets)[slot],
                 a_region=np.array(regions, np.int64)[slot], b_region=np.array(regions, np.int64)[slot],
                 random_next=pairs["random_document"] >= 0,
                 per_document=np.bincount(slot, minlength=len(rngs)))
    random = pairs["random_next"]
    if random.any():
        spans = documents.random_spans(pairs["random_document"][random], columns["u_start"][random],
                                       pairs["need"][random])
        pairs["b_region"][random], pairs["b_start"][random], pairs["b_length"][random] = spans
    _truncate(pairs, max_num_tokens, rngs)
    return pairs


def truncated_lengths(len_a: np.ndarray, len_b: np.ndarray, budget: int):
    """`glue.truncated_lengths` (the original's _truncate_seq_pair: the longer side, B on a tie, loses its
    last token until both fit) for arrays of lengths; a test checks the two agree."""
    short = np.minimum(len_a, len_b)
    a_longer = len_a > len_b
    one_side = 2 * short <= budget  # only the longer side is cut; else both down to halves, A keeping the odd
    kept_a = np.where(one_side, np.where(a_longer, budget - len_b, len_a), (budget + 1) // 2)
    kept_b = np.where(one_side, np.where(a_longer, len_b, budget - len_a), budget // 2)
    fits = len_a + len_b <= budget
    return np.where(fits, len_a, kept_a), np.where(fits, len_b, kept_b)


def _truncate(pairs: dict, max_num_tokens: int, rngs) -> None:
    """truncate_seq_pair, in place: each trimmed token goes from the front or the back by a fair coin (to
    avoid biases), so each side loses a Binomial(trimmed, 1/2) number from its front (drawn per document)."""
    a, b = pairs["a_length"], pairs["b_length"]
    kept_a, kept_b = truncated_lengths(a, b, max_num_tokens)
    trimmed = np.stack([a - kept_a, b - kept_b], axis=1)
    front = np.zeros_like(trimmed)
    ends = np.cumsum(pairs["per_document"])
    for k in np.unique(pairs["slot"][trimmed.any(axis=1)]).tolist():
        rows = slice(ends[k] - pairs["per_document"][k], ends[k])
        front[rows] = rngs[k].binomial(trimmed[rows], 0.5)
    pairs["a_start"] += front[:, 0]
    pairs["b_start"] += front[:, 1]
    pairs["a_length"], pairs["b_length"] = kept_a, kept_b


def pair_ids(documents: TokenizedDocuments, pairs: dict, cls_id: int, sep_id: int, nsp: bool):
    """[CLS] A [SEP] B [SEP] (nsp) or [CLS] A [SEP] of every pair, end to end, and the (A, B) segment lengths
    (with their special tokens) per instance."""
    a, b = pairs["a_length"], pairs["b_length"]
    segments = np.stack([a + 2, b + 1], axis=1) if nsp else (a + 2)[:, None]
    lengths = segments.sum(axis=1)
    ids = np.full(int(lengths.sum()), sep_id, np.int32)
    starts = np.cumsum(lengths) - lengths
    ids[starts] = cls_id
    ids[_ranges(starts + 1, a)] = documents.gather(pairs["a_region"], pairs["a_start"], a)
    if nsp:
        ids[_ranges(starts + a + 2, b)] = documents.gather(pairs["b_region"], pairs["b_start"], b)
    return ids, segments


def create_instances_from_document(all_documents, doc_index: int, max_seq_length: int, short_seq_prob: float,
                                   rng: np.random.Generator, nsp: bool = True,
                                   cls_id: int = 2, sep_id: int = 3) -> list[dict]:
    """Instances from `all_documents[doc_index]` (TokenizedDocuments, or lists of sentences of ids), as
    dicts of lists (`document_pairs` builds them).

    nsp=True: [CLS] A [SEP] B [SEP]; B is the true continuation or, for `next_sentence_label=1`
    (the original's is_random_next), a span of another document. nsp=False (the No-NSP and LTR
    ablations, §5.1): [CLS] contiguous text [SEP], segment 0, no label.
    """
    documents = (all_documents if isinstance(all_documents, TokenizedDocuments)
                 else TokenizedDocuments.from_lists(all_documents))
    pairs = document_pairs(documents, [doc_index], [rng], max_seq_length, short_seq_prob, nsp)
    ids, segments = pair_ids(documents, pairs, cls_id, sep_id, nsp)
    instances = []
    for row, input_ids in zip(segments, np.split(ids, np.cumsum(segments.sum(axis=1))[:-1])):
        instance = {"input_ids": input_ids.tolist(),
                    "token_type_ids": [0] * int(row[0]) + ([1] * int(row[1]) if nsp else []),
                    "doc_index": doc_index, "target_length": int(pairs["target_length"][0])}
        instances.append(instance)
    if nsp:
        for instance, label in zip(instances, pairs["random_next"].tolist()):
            instance["next_sentence_label"] = int(label)
    return instances


def mask_draws(rng: np.random.Generator, lengths, mask: dict) -> dict:
    """The randomness `mask_batch` uses for instances of these `lengths` from one generator, in three blocks:
    a sort key per token, and per prediction a uniform (MASK/SAME/RND) and a random id."""
    n, p = len(lengths), mask["max_predictions"]
    return {"keys": rng.random(int(np.sum(lengths))), "u": rng.random((n, p)),
            "random_ids": rng.integers(0, mask["vocab_size"], size=(n, p))}


def mask_with(rngs: list, counts, input_ids: np.ndarray, lengths: np.ndarray, mask: dict):
    """`mask_batch` of instances drawn in order from `rngs`, `counts[i]` of them from `rngs[i]`: a static
    round (a generator per document) or a dynamic batch (a generator per example)."""
    ends = np.cumsum(counts)
    draws = [mask_draws(rng, lengths[end - n : end], mask) for rng, n, end in zip(rngs, counts, ends) if n]
    block = {key: np.concatenate([d[key] for d in draws]) for key in draws[0]}
    return mask_batch(input_ids, lengths, block, mask)


def mask_batch(input_ids: np.ndarray, lengths: np.ndarray, draws: dict, mask: dict):
    """The masked-LM corruption (§3.3.1; the original create_masked_lm_predictions) of many instances at once
    (flat ids, lengths; `draws` from `mask_draws`).

    Each instance predicts k = min(max_predictions, max(1, round(length * masked_lm_prob))) tokens, never
    [CLS]/[SEP] (`special_ids`): it takes words in a uniformly random order (their first pieces' keys), each
    while it fits in k, a word that would overshoot skipped. A word is one token, or with `is_continuation`
    (per vocab id: whole-word masking, the later Whole Word Masking release) a token and the "##" pieces
    right after it. Of the chosen tokens, `shares` = (MASK, SAME, RND) become [MASK], stay, or take a random
    id from the whole vocabulary (v2 Appendix C.2 varies these). Returns (corrupted flat ids, positions per
    instance flat, original ids there, predictions per instance)."""
    n, width = len(lengths), int(lengths.max())
    padded = _ranges(np.arange(n) * width, lengths)  # each token's place in an (n, width) layout
    ids = np.zeros(n * width, dtype=input_ids.dtype)
    ids[padded] = input_ids
    ids = ids.reshape(n, width)
    keys = np.full(n * width, np.inf)  # inf: no candidate (padding, [CLS], [SEP])
    keys[padded] = draws["keys"]
    keys = keys.reshape(n, width)
    keys[np.isin(ids, mask["special_ids"])] = np.inf
    k = np.minimum(mask["max_predictions"], np.maximum(1, np.round(lengths * mask["masked_lm_prob"])))
    k = k.astype(int)
    if mask.get("is_continuation") is None:
        chosen = _first_tokens(keys, k, min(mask["max_predictions"], width))
    else:
        chosen = _first_words(keys, mask["is_continuation"][ids], k)
    at_row, at_col = np.nonzero(chosen)
    counts = chosen.sum(axis=1)
    rank = np.arange(len(at_row)) - np.repeat(np.cumsum(counts) - counts, counts)
    labels = ids[at_row, at_col]
    u = draws["u"][at_row, rank]
    mask_share, same_share, _ = mask["shares"]
    random_ids = draws["random_ids"][at_row, rank]
    ids[at_row, at_col] = np.where(u < mask_share, mask["mask_id"],
                                   np.where(u < mask_share + same_share, labels, random_ids))
    return ids.ravel()[padded], at_col, labels, counts


def _first_tokens(keys: np.ndarray, k: np.ndarray, most: int) -> np.ndarray:
    """`_first_words` where every word is one token: the k candidates of smallest key (a partition)."""
    n, width = keys.shape
    kth = np.sort(np.partition(keys, most - 1, axis=1)[:, :most], axis=1)
    chosen = keys <= kth[np.arange(n), np.minimum(k, width) - 1][:, None]
    return chosen & np.isfinite(keys)  # fewer candidates than k: all of them


def _first_words(keys: np.ndarray, continuation: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The tokens of the words taken in key order while each fits in k (the original's loop over shuffled
    words: a word that would overshoot is skipped); a "##" piece joins the candidate right before it."""
    n, width = keys.shape
    candidate = np.isfinite(keys)
    before = np.pad(candidate[:, :-1], ((0, 0), (1, 0)))
    first = candidate & ~(continuation & before)  # a word's first piece
    columns = np.broadcast_to(np.arange(width), (n, width))
    word = np.maximum.accumulate(np.where(first, columns, 0), axis=1)  # each piece's first piece's column
    rows = np.arange(n)[:, None]
    sizes = np.bincount((rows * width + word)[candidate], minlength=n * width).reshape(n, width)
    order = np.argsort(np.where(first, keys, np.inf), axis=1)
    sizes = np.take_along_axis(sizes, order, axis=1)  # word sizes in key order, zeros after the last word
    taken, count = np.zeros((n, width), bool), np.zeros(n, int)
    for j in range(width):
        fits = (sizes[:, j] > 0) & (count + sizes[:, j] <= k)
        if not (sizes[:, j] > 0).any():
            break
        taken[:, j] = fits
        count += np.where(fits, sizes[:, j], 0)
    chosen_first = np.zeros((n, width), bool)
    np.put_along_axis(chosen_first, order, taken, axis=1)
    return candidate & chosen_first[rows, word]


def instance_features(nsp: bool, static_mask: bool) -> Features:
    """Arrow schema of the instances: `dupe` is the dupe_factor round an instance comes from."""
    features = {"input_ids": Sequence(Value("int32")), "token_type_ids": Sequence(Value("int8")),
                "doc_index": Value("int32"), "dupe": Value("int16"), "target_length": Value("int32")}
    if nsp:
        features["next_sentence_label"] = Value("int8")
    if static_mask:
        features.update(masked_lm_positions=Sequence(Value("int32")), masked_lm_ids=Sequence(Value("int32")))
    return Features(features)


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
        self.cls_id, self.sep_id = cls_id, sep_id
        self.features = instance_features(nsp, mask is not None)
        self._documents: TokenizedDocuments | None = None  # opened in the process that runs the map

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_documents": None}

    def __call__(self, indices: list[int]) -> pa.Table:
        if self._documents is None:
            self._documents = TokenizedDocuments(self.all_documents)
        # one stream per (seed, round, document): the same instances for any batching or num_proc
        rngs = [np.random.default_rng([self.seed, self.dupe, index]) for index in indices]
        pairs = document_pairs(self._documents, indices, rngs, self.max_seq_length, self.short_seq_prob,
                               self.nsp)
        if not len(pairs["slot"]):
            return self.features.arrow_schema.empty_table()
        ids, segments = pair_ids(self._documents, pairs, self.cls_id, self.sep_id, self.nsp)
        lengths = segments.sum(axis=1)
        columns = {"doc_index": pairs["doc_index"], "target_length": pairs["target_length"],
                   "dupe": np.full(len(lengths), self.dupe), "next_sentence_label": pairs["random_next"]}
        if self.mask is not None:  # static masking: decided once, stored
            per_document = pairs["per_document"]
            ids, positions, originals, counts = mask_with(rngs, per_document, ids, lengths, self.mask)
            columns["masked_lm_positions"] = _lists(counts, positions)
            columns["masked_lm_ids"] = _lists(counts, originals)
        columns["input_ids"] = _lists(lengths, ids)
        # segment 0 for [CLS] A [SEP], 1 for B [SEP]
        segment_ids = np.tile(np.arange(segments.shape[1], dtype=np.int8), len(segments))
        columns["token_type_ids"] = _lists(lengths, np.repeat(segment_ids, segments.ravel()))
        schema = self.features.arrow_schema
        return pa.table([_column(columns[field.name], field.type) for field in schema], schema=schema)


def _column(values, dtype: pa.DataType) -> pa.Array:
    """An Arrow column of the schema's type (no cast of the table): list columns are built so, the rest are
    numpy arrays converted."""
    if isinstance(values, pa.Array):
        return values
    return pa.array(np.asarray(values).astype(dtype.to_pandas_dtype()))


def _lists(lengths: np.ndarray, values: np.ndarray) -> pa.ListArray:
    """int32 offsets, int32 values (int8 values stay int8): the types of `instance_features`."""
    values = np.asarray(values)
    return pa.ListArray.from_arrays(_offsets(lengths), pa.array(values if values.dtype == np.int8
                                                                   else values.astype(np.int32)))
