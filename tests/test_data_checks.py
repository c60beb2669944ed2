"""Degenerate inputs every reader refuses by name (data/base.require_text and the readers' row checks): an
empty or whitespace-only text, a file with no rows, a vocabulary that repeats a token. Unit tests per reader;
the same faults end to end are in test_bad_inputs.py's catalogue (the fault suite)."""

import json
import re
from pathlib import Path

import pytest
from datasets import ClassLabel, Dataset, Features, Sequence, Value

from bert_repro.data import conll, glue, swag
from bert_repro.data.base import require_text
from bert_repro.data.glue import GlueDataModule
from bert_repro.data.squad import check_question, read_squad_json
from bert_repro.data.swag import SwagDataModule
from bert_repro.tokenization import load_tokenizer, tokenizer_from_vocab

DATA = Path(glue.__file__).parent
RTE_HEADER = "index\tsentence1\tsentence2\tlabel\n"
RTE_ROWS = "0\tA cat sat.\tA cat.\tentailment\n1\tA dog ran.\tA bird.\tnot_entailment\n"


def squad_file(path: Path, context: str, question: str, answer: str, start: int = 0) -> Path:
    qa = {"id": "q1", "question": question, "answers": [{"text": answer, "answer_start": start}]}
    path.write_text(json.dumps({"version": "1.1", "data": [
        {"title": "t", "paragraphs": [{"context": context, "qas": [qa]}]}]}))
    return path


def rte(tmp_path: Path, files: dict[str, str]) -> GlueDataModule:
    return GlueDataModule("rte", files=files, cache_dir=str(tmp_path / "cache"))


def test_require_text_refuses_empty_and_whitespace_only():
    require_text("a", "f.tsv line 2", "column 'x'")
    for text, shown in (("", "''"), (" \t\u00a0", repr(" \t\u00a0")), (None, "missing")):
        message = f"f.tsv line 2: column 'x' is {shown}; expected text"
        with pytest.raises(ValueError, match=re.escape(message)):
            require_text(text, "f.tsv line 2", "column 'x'")


def test_glue_blank_sentence_names_file_line_and_column(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text(RTE_HEADER + RTE_ROWS + "2\tA man.\t   \tentailment\n")
    with pytest.raises(ValueError, match=f"{path} line 4: column 'sentence2' is '   '; expected text"):
        rte(tmp_path, {"train": str(path), "dev": str(path)}).raw_splits()


@pytest.mark.parametrize("text,expected", [(RTE_HEADER, "no rows after the header line"), ("", "no rows")])
def test_glue_train_without_rows_names_the_file(tmp_path, text, expected):
    (tmp_path / "dev.tsv").write_text(RTE_HEADER + RTE_ROWS)
    (tmp_path / "train.tsv").write_text(text)
    with pytest.raises(ValueError, match=f"{tmp_path / 'train.tsv'}: {expected}; expected at least one"):
        rte(tmp_path, {"train": str(tmp_path / "train.tsv"), "dev": str(tmp_path / "dev.tsv")}).raw_splits()


def test_glue_json_file_without_records_names_the_file(tmp_path):
    for name, text, expected in (("a.json", " \n", "empty"), ("b.json", '{"rows": []}', "no records")):
        path = tmp_path / name
        path.write_text(text)
        spec = {"path": str(path), "json_field": "rows" if name == "b.json" else None}
        with pytest.raises(ValueError, match=f"{path}: {expected}; expected at least one example"):
            rte(tmp_path, {"train": spec, "dev": spec}).raw_splits()


def test_glue_hub_rows_with_a_blank_sentence_are_refused(monkeypatch, tmp_path):
    def fake_load_dataset(path, name, split, revision, cache_dir):
        return Dataset.from_dict({"sentence1": ["a", "b"], "sentence2": ["c", " "], "label": [0, 1],
                                  "idx": [0, 1]})

    monkeypatch.setattr("bert_repro.data.base.load_dataset", fake_load_dataset)
    with pytest.raises(ValueError, match=r"nyu-mll/glue rte \(train\) row 1: column 'sentence2' is ' '"):
        GlueDataModule("rte", glue_dir=None, cache_dir=str(tmp_path)).raw_splits()


def test_swag_blank_field_names_file_and_row():
    batch = {"sent1": ["A man.", "A dog."], "sent2": ["He", "It"], "ending0": ["runs.", "barks."],
             "ending1": ["sits.", "  "], "ending2": ["a", "b"], "ending3": ["c", "d"], "label": ["0", "1"]}
    with pytest.raises(ValueError, match=r"train.csv row 2 \(after the header\): column 'ending1' is '  '"):
        swag._examples(batch, [0, 1], "train.csv", labelled=True)


def test_swag_header_only_train_names_the_file(tmp_path):
    (tmp_path / "train.csv").write_text(",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,"
                                        "ending1,ending2,ending3,label\n")
    data = SwagDataModule(swag_dir=str(tmp_path), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=f"{tmp_path / 'train.csv'}: no rows after the header line"):
        data._rows("train")


@pytest.mark.parametrize("context,question,answer,start,expected", [
    ("   ", "Where?", " ", 0, "question q1: its context is '   '"),  # a random model scored EM 50 on this
    ("A short context.", " \n", "A", 0, "question q1: its question is ' \\n'"),
    ("A short context.", "Where?", " ", 1, "question q1: an answer is ' '"),  # the context's own space
], ids=["blank-context", "blank-question", "blank-answer"])
def test_squad_blank_context_question_or_answer_names_the_question(tmp_path, context, question, answer, start,
                                                                   expected):
    path = squad_file(tmp_path / "train-v1.1.json", context, question, answer, start)
    with pytest.raises(ValueError, match=re.escape(f"{path}: {expected}; expected text")):
        read_squad_json(path, version=1)


def test_squad_file_without_questions_names_the_file(tmp_path):
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": []}]}))
    with pytest.raises(ValueError, match=f"{path}: no questions"):
        read_squad_json(path, version=1)


def test_squad_hub_rows_are_held_to_the_same_check():
    row = {"id": "q7", "context": "\t", "question": "Why?", "answers": {"text": ["\t"], "answer_start": [0]}}
    with pytest.raises(ValueError, match=r"rajpurkar/squad \(train\): question q7: its context is '\\t'"):
        check_question(row, 1, "rajpurkar/squad (train)")


@pytest.mark.parametrize("tokens,expected", [([["EU", ""]], "row 0: word 2 is ''"),
                                             ([["EU"], []], "row 1: word 1 is missing")])
def test_conll_hub_blank_word_or_empty_sentence_is_refused(monkeypatch, tmp_path, tokens, expected):
    features = Features({"tokens": Sequence(Value("string")),
                         "ner_tags": Sequence(ClassLabel(names=list(conll.CONLL2003_LABELS)))})

    def fake_load_dataset(path, name, split, revision, cache_dir):
        return Dataset.from_dict({"tokens": tokens, "ner_tags": [[0] * len(t) for t in tokens]},
                                 features=features)

    monkeypatch.setattr("bert_repro.data.base.load_dataset", fake_load_dataset)
    data = conll.ConllDataModule(conll_dir=None, document_context=False, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=re.escape(f"eriktks/conll2003 (train) {expected}; expected text")):
        data.raw_sentences()


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_repeated_vocabulary_token_named_with_its_lines(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join([*SPECIALS, "the", "cat", "##s", "the", "dog"]) + "\n")
    with pytest.raises(ValueError, match=f"{path} line 9: token 'the' repeats line 6; expected each"):
        load_tokenizer(path)
    with pytest.raises(ValueError, match="token 'the' is both id 5 and id 8; expected each token once"):
        tokenizer_from_vocab([*SPECIALS, "the", "cat", "##s", "the"], lowercase=True)


def test_a_checkpoint_is_not_read_as_a_vocab_file(tmp_path):
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"PK\x03\x04 not text")
    with pytest.raises(ValueError, match=f"tokenizer {path} is a checkpoint"):
        load_tokenizer(path)


def test_data_modules_share_one_key_and_seed_and_import_nothing_above_them():
    """Cache keys and the held-out seed are defined once (data/base.py, beside fixed_subset); data/ reads
    no checkpoint (convert/), module (tasks/) or run: a value they hold is passed in."""
    for path in sorted(DATA.glob("*.py")):
        text = path.read_text()
        for copy in ("HELD_OUT_SEED =", "def _key("):
            assert path.name == "base.py" or copy not in text, (path.name, copy)
        assert not re.search(r"bert_repro\.(convert|tasks|run|pretrained|evaluate)\b", text), path.name


def test_an_unclosed_quote_is_named_at_the_line_it_opens(tmp_path):
    from bert_repro.data.tabular import FileSpec, read_rows

    path = tmp_path / "quote.csv"
    path.write_text('a,b,label\nx,y,1\n"unclosed,y,0\nz,w,1\nq,r,0\n')
    expected = f"{path} line 3: 1 fields, expected 3; the row runs to line 5: is a quote on line 3 left open?"
    with pytest.raises(ValueError, match=re.escape(expected)):
        read_rows(FileSpec(str(path)), tmp_path / "cache")


@pytest.mark.parametrize("setting, lead", [({"max_seq_length": 8}, "max_seq_length=8"),
                                           ({"max_query_length": 300}, "max_query_length=300"),
                                           ({"doc_stride": 400}, "doc_stride=400"),
                                           ({"max_seq_length": 128, "doc_stride": 64}, "doc_stride=64")])
def test_squad_windows_that_cannot_overlap_lead_with_the_key_the_user_set(setting, lead):
    from bert_repro.data.squad import SquadDataModule

    with pytest.raises(ValueError, match=re.escape(lead) + ": the passage room"):
        SquadDataModule(1, **setting)
