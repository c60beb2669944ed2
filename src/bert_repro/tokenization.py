"""WordPiece tokenisation (§3.1: "WordPiece embeddings with a 30,000 token vocabulary").

Every tokenizer in the project is built the same way, from a vocabulary, by
`tokenizers.BertWordPieceTokenizer`: BERT's normaliser (clean text, split CJK characters, optional
lower-casing with accent stripping), BERT's pre-tokeniser (whitespace and punctuation) and greedy
longest-match-first WordPiece with the "##" continuation prefix. A trained vocabulary, a Google /
Hugging Face `vocab.txt`, a `tokenizer.json` and the vocab list stored in a checkpoint therefore all
give the same kind of object, and `vocab[i]` is always the token with id i.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path

from tokenizers import BertWordPieceTokenizer, Tokenizer

from bert_repro.progress import counted, on_terminal

log = logging.getLogger(__name__)

# The order of google-research/bert's vocab files: [PAD] is id 0, so padding with 0 is padding.
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CONTINUATION_PREFIX = "##"


def tokenizer_from_vocab(vocab: list[str], lowercase: bool) -> Tokenizer:
    """The tokenizer for `vocab` (token i has id i), as checkpoints store it.

    Plain `encode(text, add_special_tokens=False)` gives word pieces only; with specials a pair
    becomes [CLS] A [SEP] B [SEP] with type ids 0 for [CLS] A [SEP] and 1 for B [SEP] (§3.2).
    """
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise ValueError(f"vocabulary of {len(vocab)} tokens lacks the special tokens {missing}")
    repeated = first_repeat(vocab)
    if repeated is not None:
        token, first, again = repeated
        raise ValueError(f"token {token!r} is both id {first} and id {again}; expected each token once")
    ids = {token: i for i, token in enumerate(vocab)}
    # strip_accents follows lowercase, as in the original uncased/cased models.
    return BertWordPieceTokenizer(vocab=ids, lowercase=lowercase,
                                  wordpieces_prefix=CONTINUATION_PREFIX)._tokenizer


def first_repeat(vocab: list[str]) -> tuple[str, int, int] | None:
    """The first token that appears twice, with both its ids. A repeat cannot be tokenized: one of its ids
    would never be produced, and the list no longer maps ids to tokens one to one."""
    seen: dict[str, int] = {}
    for i, token in enumerate(vocab):
        if token in seen:
            return token, seen[token], i
        seen[token] = i
    return None


def train_wordpiece(texts: Iterable[str], vocab_size: int, lowercase: bool = True) -> Tokenizer:
    """Learn a WordPiece vocabulary of at most `vocab_size` tokens from `texts`.

    Progress: the trainer's own bars on a terminal, plain lines (sentences read so far) otherwise.
    """
    start = time.perf_counter()
    terminal = on_terminal()
    log.info("training a WordPiece vocabulary of at most %d tokens", vocab_size)
    trainer = BertWordPieceTokenizer(lowercase=lowercase, wordpieces_prefix=CONTINUATION_PREFIX)
    trainer.train_from_iterator(
        texts if terminal else counted(texts, "WordPiece training: sentences read"),
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        wordpieces_prefix=CONTINUATION_PREFIX,
        show_progress=terminal,
    )
    # Rebuilt from its vocabulary so that a trained tokenizer and a re-loaded one are the same thing
    # (the trainer's own object has no [CLS]/[SEP] post-processor).
    tokenizer = tokenizer_from_vocab(vocab_list(trainer._tokenizer), lowercase)
    seconds = time.perf_counter() - start
    log.info("WordPiece vocabulary of %d tokens in %.1fs", tokenizer.get_vocab_size(), seconds)
    return tokenizer


def vocab_list(tokenizer: Tokenizer) -> list[str]:
    """The vocabulary in id order, the form checkpoints and vocab.txt store."""
    by_id = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError("tokenizer ids are not contiguous from 0; cannot write them as a vocab list")
    return [by_id[i] for i in range(len(by_id))]


def tokenizer_lowercase(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` lower-cases its input (uncased model)."""
    return bool(getattr(tokenizer.normalizer, "lowercase", False))


def save_vocab(tokenizer: Tokenizer, path: str | Path) -> Path:
    """Write vocab.txt (one token a line, id order) to `path`, or into it when it is a directory."""
    path = Path(path)
    if path.is_dir():
        path = path / "vocab.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{token}\n" for token in vocab_list(tokenizer)), encoding="utf-8")
    return path


def _read_vocab_txt(path: Path) -> list[str]:
    # One token a line; like the original load_vocab, surrounding whitespace is not part of a token.
    vocab = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    while vocab and not vocab[-1]:
        vocab.pop()
    if not vocab:
        raise ValueError(f"vocabulary file {path} is empty; expected one WordPiece token per line")
    repeated = first_repeat(vocab)
    if repeated is not None:  # line i + 1 holds id i
        token, first, again = repeated
        raise ValueError(f"{path} line {again + 1}: token {token!r} repeats line {first + 1}; expected each "
                         "WordPiece token on one line only")
    return vocab


def _read_tokenizer_json(path: Path) -> tuple[list[str], bool]:
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        model = spec["model"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a tokenizers tokenizer.json ({err})") from err
    if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        raise ValueError(f"{path} holds a {model.get('type')!r} model; expected a WordPiece vocabulary")
    by_id = {i: t for t, i in model["vocab"].items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError(f"{path}: WordPiece ids are not contiguous from 0")
    lowercase = bool((spec.get("normalizer") or {}).get("lowercase", False))
    return [by_id[i] for i in range(len(by_id))], lowercase


def load_tokenizer(path: str | Path, lowercase: bool | None = None) -> Tokenizer:
    """Load a WordPiece tokenizer from a vocab.txt, a directory holding one, or a tokenizer.json.

    `lowercase=None` takes the casing from the files: `do_lower_case` in a Hugging Face
    directory's tokenizer_config.json, the normaliser of a tokenizer.json, else uncased (the
    paper's default, §3.1).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer {path} does not exist; expected vocab.txt, tokenizer.json or a "
                                "directory")
    if path.suffix == ".ckpt":  # a checkpoint carries its vocabulary: the run reads it (run.resolve_vocab)
        raise ValueError(f"tokenizer {path} is a checkpoint; pass its vocabulary (a list of tokens), or give "
                         "data.tokenizer=<.ckpt> to a run, which reads it from the checkpoint")
    stored_lowercase = None
    if path.is_dir():
        config = path / "tokenizer_config.json"
        if config.is_file():
            stored_lowercase = json.loads(config.read_text(encoding="utf-8")).get("do_lower_case")
        if (path / "vocab.txt").is_file():
            vocab = _read_vocab_txt(path / "vocab.txt")
        elif (path / "tokenizer.json").is_file():
            vocab, json_lowercase = _read_tokenizer_json(path / "tokenizer.json")
            stored_lowercase = json_lowercase if stored_lowercase is None else stored_lowercase
        else:
            raise FileNotFoundError(f"directory {path} holds neither vocab.txt nor tokenizer.json")
    elif path.suffix == ".json":
        vocab, stored_lowercase = _read_tokenizer_json(path)
    else:
        vocab = _read_vocab_txt(path)
    if lowercase is None:
        lowercase = True if stored_lowercase is None else bool(stored_lowercase)
    elif stored_lowercase is not None and bool(stored_lowercase) != lowercase:
        log.warning("%s was saved with lowercase=%s but is loaded with lowercase=%s", path, stored_lowercase,
                    lowercase)
    try:
        return tokenizer_from_vocab(vocab, lowercase)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err


def fine_tuning_tokenizer(path: str | Path | list[str] | None, lowercase: bool, task: str,
                          pad_id: int = 0) -> tuple[Tokenizer, list[str]]:
    """The pre-trained model's tokenizer for fine-tuning ``task``, and its vocabulary: it must exist (init=
    brings it, or data.tokenizer names it) and hold [PAD] at ``pad_id``, [CLS] and [SEP], which every task's
    inputs use."""
    if path is None:
        raise ValueError(f"task={task}: fine-tuning needs the pre-trained model's vocabulary; give "
                         "init=<checkpoint> (its vocabulary comes with it) or data.tokenizer=<vocab.txt | "
                         "tokenizer.json | Hugging Face directory>")
    given = isinstance(path, (list, tuple))  # the run's vocabulary itself (run.resolve_vocab)
    tokenizer = tokenizer_from_vocab(list(path), lowercase) if given else load_tokenizer(path,
                                                                                         lowercase=lowercase)
    vocab = vocab_list(tokenizer)
    missing = ([t for t in ("[CLS]", "[SEP]") if t not in vocab]
               + ([] if vocab[pad_id] == "[PAD]" else ["[PAD]"]))
    if missing:
        where = f"the vocabulary of {len(vocab)} tokens" if given else f"tokenizer {path}"
        raise ValueError(f"{where}: needs {missing}, with [PAD] as id {pad_id} (it is {vocab[pad_id]!r})")
    return tokenizer, vocab
