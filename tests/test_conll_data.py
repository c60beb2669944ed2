"""CoNLL-2003 reading and windowing (v1 §4.3): IOB1 -> IOB2, documents, bad lines named, first-piece labels on
real word pieces, long sentences split into windows in which every word is predicted exactly once."""

from collections import Counter

import pytest

from bert_repro.data.conll import CONLL2003_LABELS, IGNORE, ConllDataModule, iob1_to_iob2, read_conll

SAMPLE = """-DOCSTART- -X- O O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- O O

Werner NNP I-NP I-PER
Zwingmann NNP I-NP I-PER
Dutch JJ I-NP I-MISC
French JJ I-NP B-MISC
"""


def write_dir(tmp_path, train=SAMPLE, dev=SAMPLE):
    (tmp_path / "eng.train").write_text(train)
    (tmp_path / "eng.testa").write_text(dev)
    return tmp_path


def test_iob1_becomes_iob2():
    assert iob1_to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]) == \
        ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG"]
    iob2 = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC"]
    assert iob1_to_iob2(iob2) == iob2


def test_read_conll_sentences_documents_and_tags(tmp_path):
    path = write_dir(tmp_path) / "eng.train"
    s = read_conll(path)
    assert s["tokens"] == [["EU", "rejects", "German", "call", "."], ["Peter", "Blackburn"],
                           ["Werner", "Zwingmann", "Dutch", "French"]]
    assert s["tags"][0] == ["B-ORG", "O", "B-MISC", "O", "O"] and s["tags"][2] == ["B-PER", "I-PER", "B-MISC",
                                                                                   "B-MISC"]
    assert s["document"] == [0, 0, 1] and s["line"] == [3, 9, 14]


def test_malformed_line_names_file_and_line(tmp_path):
    bad = SAMPLE.replace("call NN I-NP O", "call NN O")
    path = write_dir(tmp_path, train=bad) / "eng.train"
    with pytest.raises(ValueError, match=r"eng.train line 6: 3 column\(s\), expected 4"):
        read_conll(path)
    (tmp_path / "eng.train").write_text(SAMPLE.replace("I-MISC", "I-MISCELLANEOUS", 1))
    with pytest.raises(ValueError, match=r"eng.train line 5: NER tag 'I-MISCELLANEOUS'"):
        read_conll(path)


def test_missing_dev_file_and_hub_document_context_are_refused(tmp_path, minilm_dir):
    (tmp_path / "eng.train").write_text(SAMPLE)
    data = ConllDataModule(str(tmp_path), tokenizer=str(minilm_dir), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="no dev file; expected one of eng.testa"):
        data.setup()
    with pytest.raises(ValueError, match="document_context=true needs document boundaries"):
        ConllDataModule(None, document_context=True)


def rows_of(data, split):
    d = data.datasets[split]
    return [d[i] for i in range(len(d))]


def test_first_piece_carries_the_label_on_real_word_pieces(tmp_path, minilm_dir):
    data = ConllDataModule(str(write_dir(tmp_path)), tokenizer=str(minilm_dir), lowercase=True,
                           cache_dir=str(tmp_path / "cache"))
    data.setup()
    window = rows_of(data, "train")[2]  # Werner Zwingmann Dutch French
    pieces = [data.vocab[i] for i in window["input_ids"]]
    assert pieces == ["[CLS]", "werner", "z", "##wing", "##mann", "dutch", "french", "[SEP]"]  # no [UNK]
    labels = [CONLL2003_LABELS[t] if t != IGNORE else "X" for t in window["labels"]]
    assert labels == ["X", "B-PER", "I-PER", "X", "X", "B-MISC", "B-MISC", "X"]
    assert window["word"] == [-1, 0, 1, -1, -1, 2, 3, -1]
    batch = next(iter(data.val_dataloader()))
    assert batch["labels"].shape == batch["input_ids"].shape == batch["word"].shape
    assert (batch["labels"][batch["attention_mask"] == 0] == IGNORE).all()


@pytest.mark.slow
def test_long_sentences_become_windows_each_word_once(tmp_path, minilm_dir, shared_data):
    """Real eng.testa at 24 tokens a window: many sentences split; every word predicted exactly once."""
    data = ConllDataModule(str(shared_data / "conll2003"), tokenizer=str(minilm_dir), lowercase=True,
                           max_seq_length=24, max_train_examples=10, cache_dir=str(tmp_path / "cache"))
    data.setup()
    dev = data.datasets["dev"]
    words = sum(len(t) for t in data.sentences["dev"]["tokens"])
    assert len(data.sentences["dev"]) == 3250 and words == 51362  # SOURCE.md's counts
    assert len(dev) > 3250 and max(dev["length"]) == 24
    seen = Counter((s, w) for s, ws in zip(dev["sentence"], dev["word"]) for w in ws if w >= 0)
    assert len(seen) == words and set(seen.values()) == {1}
    split = Counter(dev["sentence"])
    s = next(s for s, n in split.items() if n > 1)
    windows = [r for r in rows_of(data, "dev") if r["sentence"] == s]
    # a later window carries earlier words of its sentence as unlabelled context
    assert windows[1]["labels"][1] == IGNORE and windows[1]["input_ids"][1] in windows[0]["input_ids"]
    assert len(data.datasets["train"]) >= 10 and len(set(data.datasets["train"]["sentence"])) == 10


def test_document_context_fills_windows_from_neighbouring_sentences(tmp_path, minilm_dir):
    folder = write_dir(tmp_path)
    plain = ConllDataModule(str(folder), tokenizer=str(minilm_dir), lowercase=True,
                            cache_dir=str(tmp_path / "c1"))
    context = ConllDataModule(str(folder), tokenizer=str(minilm_dir), lowercase=True, document_context=True,
                              cache_dir=str(tmp_path / "c2"))
    plain.setup()
    context.setup()
    peter_plain, peter_context = rows_of(plain, "train")[1], rows_of(context, "train")[1]
    assert [plain.vocab[i] for i in peter_plain["input_ids"]] == ["[CLS]", "peter", "blackburn", "[SEP]"]
    pieces = [context.vocab[i] for i in peter_context["input_ids"]]
    assert pieces[:3] == ["[CLS]", "eu", "rejects"] and "werner" not in pieces  # document 0 only
    labelled = [p for p, t in zip(pieces, peter_context["labels"]) if t != IGNORE]
    assert labelled == ["peter", "blackburn"]


@pytest.mark.slow
def test_hub_layout_with_class_label_ids(tmp_path, minilm_dir):
    """The Hub code path (load_dataset), offline: a folder in eriktks/conll2003's layout (IOB2 ids, no
    documents)."""
    import json

    s = read_conll(write_dir(tmp_path) / "eng.train")
    hub = tmp_path / "hub"
    hub.mkdir()
    for split in ("train", "validation", "test"):
        with open(hub / f"{split}.json", "w") as f:
            for i, (tokens, tags) in enumerate(zip(s["tokens"], s["tags"])):
                f.write(json.dumps({"id": str(i), "tokens": tokens,
                                    "ner_tags": [CONLL2003_LABELS.index(t) for t in tags]}) + "\n")
    data = ConllDataModule(None, hub={"path": str(hub)}, tokenizer=str(minilm_dir), lowercase=True,
                           cache_dir=str(tmp_path / "cache"))
    data.setup()
    assert data.sentences["dev"]["tags"] == s["tags"] and data.test_splits == ["test"]
    assert ([r["labels"][1] for r in rows_of(data, "train")]
            == [CONLL2003_LABELS.index(t[0]) for t in s["tags"]])


@pytest.mark.slow
def test_real_dev_windows_hold_the_maximal_document_context(tmp_path, minilm_dir, shared_data):
    """v2 §5.3 "maximal document context": on real eng.testa word pieces at the model's length (the task
    config's max_seq_length), each window is its document up to 512 pieces, never a fixed 128."""
    from hydra import compose, initialize_config_dir

    from .conftest import REPO

    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        cfg = compose("train", overrides=["task=conll2003", "model=large"])
    assert cfg.data.max_seq_length == cfg.model.max_position == 512 and cfg.data.document_context
    data = ConllDataModule(str(shared_data / "conll2003"), tokenizer=str(minilm_dir), lowercase=True,
                           max_seq_length=512, document_context=True, max_train_examples=1,
                           cache_dir=str(tmp_path / "cache"))
    data.setup()
    raw, _ = data.raw_sentences()["dev"]
    pieces = Counter()  # per document: its word pieces (an emptied word keeps one position, [UNK])
    for tokens, document, encoding in zip(raw["tokens"], raw["document"], data._tokenizer.encode_batch(
            raw["tokens"], is_pretokenized=True, add_special_tokens=False)):
        per_word = Counter(encoding.word_ids)
        pieces[document] += sum(max(1, per_word[w]) for w in range(len(tokens)))
    dev = data.datasets["dev"]
    documents = [raw["document"][s] for s in dev["sentence"]]
    assert dev["length"] == [min(512, pieces[d] + 2) for d in documents]
    assert sum(n > 128 for n in dev["length"]) > len(dev) / 2  # most windows reach past 128 pieces
    seen = Counter((s, w) for s, ws in zip(dev["sentence"], dev["word"]) for w in ws if w >= 0)
    assert len(seen) == sum(len(t) for t in raw["tokens"]) and set(seen.values()) == {1}
