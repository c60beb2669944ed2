"""Pre-training instances: the data algorithm of google-research/bert `create_pretraining_data.py`
(§3.3.1, §3.3.2, Appendix A.1): `create_instances_from_document`, `create_masked_lm_predictions`
(here `mask_tokens`) and `truncate_seq_pair`.

numpy Generators replace `random.Random`, one per (seed, dupe round, document), so the result does not
depend on batching or the number of processes. Documents are token-id lists per sentence read from a
memory-mapped Arrow column, never one Python list of the corpus. `instances_batch` is the `datasets.map`
function that `PretrainDataModule` runs over the tokenized documents (in parallel with num_proc).
"""

from __future__ import annotations

import numpy as np
from datasets import Dataset, Features, Sequence, Value
from tokenizers import Tokenizer


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
                instances.append({"input_ids": [cls_id, *tokens_a, sep_id],
                                  "token_type_ids": [0] * (len(tokens_a) + 2), "doc_index": doc_index,
                                  "target_length": target})
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


class TokenizedDocuments:
    """all_documents[i] -> list of sentences of token ids, read from the memory-mapped Arrow table."""

    def __init__(self, dataset: Dataset):
        assert dataset._indices is None, "needs a flat dataset; row i must be document i"
        self.column = dataset.data.column("tokens")

    def __len__(self) -> int:
        return len(self.column)

    def __getitem__(self, i: int) -> list[list[int]]:
        return self.column[i].as_py()


TOKENS_FEATURES = Features({"tokens": Sequence(Sequence(Value("int32")))})


def tokenize_batch(batch: dict, tokenizer: Tokenizer) -> dict:
    """`datasets.map` function: documents of sentences (strings) -> documents of sentences of token ids."""
    sentences = [s for doc in batch["sentences"] for s in doc]
    encoded = iter(tokenizer.encode_batch(sentences, add_special_tokens=False))
    documents = [[e.ids for _, e in zip(doc, encoded) if e.ids] for doc in batch["sentences"]]
    return {"tokens": [doc for doc in documents if doc]}  # empty documents would break the random-B draw


def instance_features(nsp: bool, static_mask: bool) -> Features:
    """Arrow schema of the instances: `dupe` is the dupe_factor round an instance comes from."""
    features = {"input_ids": Sequence(Value("int32")), "token_type_ids": Sequence(Value("int8")),
                "doc_index": Value("int32"), "dupe": Value("int16"), "target_length": Value("int32")}
    if nsp:
        features["next_sentence_label"] = Value("int8")
    if static_mask:
        features.update(masked_lm_positions=Sequence(Value("int32")), masked_lm_ids=Sequence(Value("int32")))
    return Features(features)


def instances_batch(indices: list[int], all_documents: Dataset, seed: int, dupe_factor: int,
                    max_seq_length: int, short_seq_prob: float, nsp: bool, cls_id: int, sep_id: int,
                    mask: dict | None) -> dict:
    """`datasets.map` function over the tokenized documents (given no columns, only `indices`: it reads the
    documents it needs itself, random B documents included): every instance of the documents at `indices`,
    `dupe_factor` times with different randomness (the original's outer loop), masked when `mask` is given
    (static masking); without it the collator masks afresh every time (dynamic)."""
    documents = TokenizedDocuments(all_documents)
    columns: dict[str, list] = {}
    for doc_index in indices:
        for dupe in range(dupe_factor):
            rng = np.random.default_rng([seed, dupe, doc_index])
            for instance in create_instances_from_document(documents, doc_index, max_seq_length,
                                                           short_seq_prob, rng, nsp=nsp, cls_id=cls_id,
                                                           sep_id=sep_id):
                instance["dupe"] = dupe
                if mask is not None:  # static masking: decided once, stored
                    masked, positions, labels = mask_sequence(instance["input_ids"], rng, mask)
                    instance.update(input_ids=masked, masked_lm_positions=positions, masked_lm_ids=labels)
                for key, value in instance.items():
                    columns.setdefault(key, []).append(value)
    return columns
