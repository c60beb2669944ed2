"""WordPiece training and loading on real text, and parity with transformers' BERT tokenizer."""

import json
from pathlib import Path

import pytest

from bert_repro.tokenization import (
    SPECIAL_TOKENS,
    load_tokenizer,
    save_vocab,
    tokenizer_from_vocab,
    tokenizer_lowercase,
    train_wordpiece,
    vocab_list,
)

from .conftest import SHARED

SAMPLE = SHARED / "pretrain_text" / "sample_text.txt"
WIKITEXT = SHARED / "pretrain_text" / "wikitext-2-raw" / "wiki.test.raw"


@pytest.fixture(scope="module")
def real_lines() -> list[str]:
    if not SAMPLE.is_file() or not WIKITEXT.is_file():
        pytest.skip(f"shared pre-training text not found under {SHARED} (set BERT_REPRO_SHARED_DATA)")
    wiki = WIKITEXT.read_text(encoding="utf-8").splitlines()[:600]
    return [line for line in SAMPLE.read_text(encoding="utf-8").splitlines() + wiki if line.strip()]


@pytest.fixture(scope="module")
def trained(real_lines):
    return train_wordpiece(real_lines, vocab_size=2000)


@pytest.fixture(scope="module")
def minilm_vocab(minilm_dir) -> Path:
    return minilm_dir / "vocab.txt"  # a real uncased BERT vocabulary


def test_trained_wordpiece_has_real_pieces(trained):
    vocab = vocab_list(trained)
    assert vocab[:5] == SPECIAL_TOKENS  # [PAD] = 0, the google-research/bert order
    assert 1000 < len(vocab) <= 2000
    assert trained.encode("The", add_special_tokens=False).tokens == ["the"]  # uncased, a whole word
    pieces = trained.encode("antidisestablishmentarianism", add_special_tokens=False).tokens
    assert len(pieces) > 1 and "[UNK]" not in pieces
    assert not pieces[0].startswith("##") and all(p.startswith("##") for p in pieces[1:])
    assert "".join(p.removeprefix("##") for p in pieces) == "antidisestablishmentarianism"


def test_plain_encoding_has_no_specials_and_pairs_follow_bert(trained):
    a, b = "The rain had only ceased.", "Gold, surely!"
    tokens_a, tokens_b = (trained.encode(t, add_special_tokens=False).tokens for t in (a, b))
    assert tokens_a[0] == "the" and "[CLS]" not in tokens_a + tokens_b and "[SEP]" not in tokens_a
    pair = trained.encode(a, b, add_special_tokens=True)
    assert pair.tokens == ["[CLS]", *tokens_a, "[SEP]", *tokens_b, "[SEP]"]
    assert pair.type_ids == [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)


def test_save_and_reload_give_the_same_tokenizer(trained, tmp_path):
    path = save_vocab(trained, tmp_path)
    assert path.read_text(encoding="utf-8").splitlines() == vocab_list(trained)
    text = "Possibly this may have been the reason why early risers adopted a thoughtful habit."
    for again in (load_tokenizer(path), load_tokenizer(tmp_path),
                  tokenizer_from_vocab(vocab_list(trained), True)):
        assert vocab_list(again) == vocab_list(trained)
        assert again.encode(text).ids == trained.encode(text).ids


@pytest.mark.slow
def test_minilm_vocab_matches_transformers(minilm_vocab, real_lines):
    transformers = pytest.importorskip("transformers")
    ours = load_tokenizer(minilm_vocab)
    assert ours.encode("The quick brown fox", add_special_tokens=False).tokens == ["the", "quick", "brown",
                                                                                   "fox"]
    # transformers 5 takes the vocabulary as `vocab=`; 4.x as `vocab_file=`.
    key = "vocab" if int(transformers.__version__.split(".")[0]) >= 5 else "vocab_file"
    reference = transformers.BertTokenizerFast(**{key: str(minilm_vocab)}, do_lower_case=True)
    sentences = real_lines[:8] + ["Cass Beard's ring: 力加勝北区 naïve Café!"]
    for a, b in zip(sentences, sentences[1:]):
        assert (ours.encode(a, add_special_tokens=False).ids
                == reference(a, add_special_tokens=False)["input_ids"])
        theirs = reference(a, b)
        pair = ours.encode(a, b)
        assert pair.ids == theirs["input_ids"] and pair.type_ids == theirs["token_type_ids"]
    # The checkpoint directory and its tokenizer.json give the same tokenizer as vocab.txt.
    for other in (load_tokenizer(minilm_vocab.parent),
                  load_tokenizer(minilm_vocab.parent / "tokenizer.json")):
        assert vocab_list(other) == vocab_list(ours) and tokenizer_lowercase(other)


def test_casing_comes_from_tokenizer_config(minilm_vocab, tmp_path):
    (tmp_path / "vocab.txt").write_bytes(minilm_vocab.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased = load_tokenizer(tmp_path)
    assert not tokenizer_lowercase(cased)
    assert cased.encode("The", add_special_tokens=False).tokens != ["the"]
    assert load_tokenizer(tmp_path, lowercase=True).encode("The", add_special_tokens=False).tokens == ["the"]


def test_bad_inputs_name_the_path(tmp_path):
    missing = tmp_path / "nope" / "vocab.txt"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_tokenizer(missing)
    with pytest.raises(FileNotFoundError, match="neither vocab.txt nor tokenizer.json"):
        load_tokenizer(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="empty.txt.*empty"):
        load_tokenizer(empty)
    no_specials = tmp_path / "words.txt"
    no_specials.write_text("the\nrain\n")
    with pytest.raises(ValueError, match=r"words.txt.*\[PAD\]"):
        load_tokenizer(no_specials)
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_tokenizer(broken)


# --- progress: the libraries' bars on a terminal, plain lines in a log ----------------------------------

TEXTS = ["The quick brown fox jumps over the lazy dog.", "A second, rather different sentence."] * 50


def test_wordpiece_training_shows_the_trainers_bars_on_a_terminal(monkeypatch):
    from tokenizers import BertWordPieceTokenizer

    from bert_repro import tokenization

    calls = []
    original = BertWordPieceTokenizer.train_from_iterator

    def spy(self, iterator, **kwargs):
        calls.append(kwargs["show_progress"])
        return original(self, iterator, **kwargs)

    monkeypatch.setattr(BertWordPieceTokenizer, "train_from_iterator", spy)
    monkeypatch.setattr(tokenization, "on_terminal", lambda: True)
    train_wordpiece(TEXTS, vocab_size=200)
    monkeypatch.setattr(tokenization, "on_terminal", lambda: False)
    train_wordpiece(TEXTS, vocab_size=200)
    assert calls == [True, False]


def test_wordpiece_training_logs_plain_lines_off_a_terminal(monkeypatch, caplog):
    from bert_repro import progress

    monkeypatch.setattr(progress, "EVERY_S", 0.0)  # a line after every sentence
    with caplog.at_level("INFO"):
        train_wordpiece(TEXTS, vocab_size=200)  # pytest's captured stderr is not a terminal
    lines = [r.getMessage() for r in caplog.records]
    assert "WordPiece training: sentences read: 1 so far" in lines[1]
    assert f"WordPiece training: sentences read: {len(TEXTS)} in all" in lines
    assert lines[-1].startswith("WordPiece vocabulary of ")
    assert not any("\r" in line for line in lines)


def test_datasets_maps_log_plain_lines_off_a_terminal(monkeypatch, caplog, tmp_path):
    from datasets.utils.logging import is_progress_bar_enabled

    from bert_repro import progress
    from bert_repro.data.corpus import load_documents

    (tmp_path / "c.txt").write_text("One sentence.\nTwo sentences.\n\nNext document.\n")
    seen = []
    original = progress.datasets_progress

    @progress.contextmanager
    def watched(what):
        with original(what):
            seen.append((what, is_progress_bar_enabled()))
            yield

    monkeypatch.setattr("bert_repro.data.corpus.datasets_progress", watched)
    with caplog.at_level("INFO", logger="bert_repro.progress"):
        load_documents(str(tmp_path / "c.txt"), cache_dir=tmp_path / "cache")
    assert seen == [(f"reading corpus {str(tmp_path / 'c.txt')!r} (1 file(s))", False)]  # bars off inside
    assert caplog.records[0].getMessage().startswith("reading corpus") and is_progress_bar_enabled()
    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    with progress.datasets_progress("on a terminal"):
        assert is_progress_bar_enabled()
