"""SQuAD data on the real fixtures: answer spans to tokens and back, windows, malformed files, the token
cache."""

import json

import pytest

from bert_repro.data import squad
from bert_repro.data.squad import SquadDataModule, char_to_token_span, make_windows, read_squad_json
from bert_repro.tokenization import load_tokenizer

FILES = [(1, "squad_v1/train-v1.1.json"), (1, "squad_v1/dev-v1.1.json"), (2, "squad_v2/train-v2.0.json"),
         (2, "squad_v2/dev-v2.0.json")]


def squash(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("version, name", FILES)
@pytest.mark.slow
def test_every_answer_maps_to_tokens_and_back(shared_data, minilm_dir, version, name):
    """Each gold answer -> the smallest token span covering it -> its text through the offsets. The text is
    the answer (modulo whitespace), except where the answer starts or ends inside a WordPiece token ("gold" of
    "golden", "7" of "1817"): there it is the whole token(s), and such answers are under 1.5% of each file."""
    tokenizer = load_tokenizer(minilm_dir)
    rows = read_squad_json(shared_data / name, version)
    contexts = sorted({r["context"] for r in rows})
    offsets = dict(zip(contexts,
                       (e.offsets for e in tokenizer.encode_batch(contexts, add_special_tokens=False))))
    answers = inside_tokens = 0
    for row in rows:
        context = row["context"]
        for text, start in zip(row["answers"]["text"], row["answers"]["answer_start"]):
            answers += 1
            first, last = char_to_token_span(offsets[context], start, start + len(text))
            begin, end = offsets[context][first][0], offsets[context][last][1]
            recovered = context[begin:end]
            if begin < start or end > start + len(text):  # the answer begins or ends inside a token
                inside_tokens += 1
                assert begin <= start < end and text.strip() in recovered, (row["id"], text, recovered)
            else:
                assert squash(recovered) == squash(text), (row["id"], text, recovered)
    assert answers > 4000 and inside_tokens / answers < 0.015, (inside_tokens, answers)


def windows_of(rows, tokenizer, max_seq_length=384, doc_stride=128, max_query_length=64):
    batch = {key: [r[key] for r in rows] for key in ("question", "context", "answers")}
    return make_windows(batch, list(range(len(rows))), tokenizer, max_seq_length, doc_stride,
                        max_query_length)


@pytest.mark.parametrize("version, name", [(1, "squad_v1/dev-v1.1.json"), (2, "squad_v2/train-v2.0.json")])
@pytest.mark.slow
def test_windows_place_every_answer(shared_data, minilm_dir, version, name):
    """With the paper's settings every answerable question has a window whose start / end positions give the
    answer back through that window's offsets; other windows and unanswerable questions point at [CLS]."""
    tokenizer = load_tokenizer(minilm_dir)
    rows = read_squad_json(shared_data / name, version)
    out = windows_of(rows, tokenizer)
    placed = [0] * len(rows)
    for i, example in enumerate(out["example"]):
        start, end, first = out["start_positions"][i], out["end_positions"][i], out["context_start"][i]
        assert len(out["input_ids"][i]) <= 384
        if start == 0:
            assert end == 0
            continue
        row = rows[example]
        offsets = out["offsets"][i]
        recovered = row["context"][offsets[start - first][0]:offsets[end - first][1]]
        assert squash(row["answers"]["text"][0]) in squash(recovered), (row["id"], recovered)
        placed[example] += 1
    for row, count in zip(rows, placed):
        assert (count > 0) == bool(row["answers"]["text"]), row["id"]
    assert sum(1 for r in rows if not r["answers"]["text"]) == (348 if version == 2 else 0)


@pytest.mark.parametrize("max_seq_length, doc_stride, max_query_length",
                         [(384, 128, 64), (96, 24, 24), (64, 8, 24)])
@pytest.mark.slow
def test_windows_never_drop_an_answer_that_fits(shared_data, minilm_dir, max_seq_length, doc_stride,
                                                max_query_length):
    """Windows cover the whole passage, hold [CLS] question [SEP] piece [SEP] with segment ids 0 then 1, and
    an answer that fits in the windows' overlap (+1 token) is whole in at least one window, which points at
    it."""
    tokenizer = load_tokenizer(minilm_dir)
    rows = read_squad_json(shared_data / "squad_v1/dev-v1.1.json", 1)[:300]
    out = windows_of(rows, tokenizer, max_seq_length, doc_stride, max_query_length)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    fitting = 0
    for example, row in enumerate(rows):
        context = tokenizer.encode(row["context"], add_special_tokens=False)
        query = tokenizer.encode(row["question"], add_special_tokens=False).ids[:max_query_length]
        start_char = row["answers"]["answer_start"][0]
        first, last = char_to_token_span(context.offsets, start_char,
                                         start_char + len(row["answers"]["text"][0]))
        mine = [i for i, e in enumerate(out["example"]) if e == example]
        covered, hits = [], 0
        for i in mine:
            ids, types, begin = out["input_ids"][i], out["token_type_ids"][i], out["context_start"][i]
            assert len(ids) <= max_seq_length and begin == len(query) + 2
            assert ids[:begin] == [cls_id, *query, sep_id] and ids[-1] == sep_id
            assert types == [0] * begin + [1] * (len(ids) - begin)
            piece = ids[begin:-1]
            offset = context.offsets.index(tuple(out["offsets"][i][0])) if piece else 0
            assert piece == context.ids[offset:offset + len(piece)]
            covered.extend(range(offset, offset + len(piece)))
            if out["start_positions"][i]:
                hits += 1
                assert (out["start_positions"][i], out["end_positions"][i]) == (begin + first - offset,
                                                                                begin + last - offset)
        assert sorted(set(covered)) == list(range(len(context.ids)))
        budget = max_seq_length - len(query) - 3
        if last - first + 1 <= budget - doc_stride + 1:
            fitting += 1
            assert hits >= 1, row["id"]
    assert fitting > 200


def write_squad(folder, version, qas, context="The cat sat on the mat."):
    folder.mkdir(parents=True, exist_ok=True)
    data = {"version": "1.1" if version == 1 else "v2.0",
            "data": [{"title": "Cats", "paragraphs": [{"context": context, "qas": qas}]}]}
    for name in squad.FILES[version].values():
        (folder / name).write_text(json.dumps(data), encoding="utf-8")
    return folder / squad.FILES[version]["train"]


@pytest.mark.parametrize("version, qa, message", [
    (1, {"id": "q-mismatch", "question": "Who sat?", "answers": [{"text": "dog", "answer_start": 4}]},
     "answer 'dog' does not match the context at answer_start 4, which reads 'cat'"),
    (1, {"id": "q-outside", "question": "Who sat?", "answers": [{"text": "cat", "answer_start": 40}]},
     "answer 'cat' at answer_start 40 lies outside its context (23 characters)"),
    (1, {"id": "q-none", "question": "Who sat?", "answers": []}, "has no answer"),
    (1, {"id": "q-impossible", "question": "Who sat?", "answers": [], "is_impossible": True},
     "task=squad_v2"),
    (2, {"id": "q-v2", "question": "Who sat?", "answers": [], "is_impossible": False},
     "is_impossible=False but 0"),
    (2, {"id": "q-v2-outside", "question": "Who?", "answers": [{"text": "mat.", "answer_start": 20}],
         "is_impossible": False}, "lies outside its context"),
])
def test_malformed_files_are_refused(tmp_path, minilm_dir, version, qa, message):
    train = write_squad(tmp_path / "squad", version, [qa])
    data = SquadDataModule(version, squad_dir=str(tmp_path / "squad"), tokenizer=str(minilm_dir),
                           cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError) as err:
        data.setup()
    assert (str(train) in str(err.value) and f"question {qa['id']}" in str(err.value)
            and message in str(err.value))


def test_wrong_layout_and_missing_files(tmp_path, minilm_dir):
    (tmp_path / "train-v1.1.json").write_text(json.dumps({"version": "1.1", "rows": []}))
    data = SquadDataModule(1, squad_dir=str(tmp_path), tokenizer=str(minilm_dir),
                           cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="is not a SQuAD file"):
        data.setup()
    with pytest.raises(FileNotFoundError, match="dev-v1.1.json does not exist"):
        read_squad_json(tmp_path / "dev-v1.1.json", 1)
    # windows would not overlap
    with pytest.raises(ValueError, match="doc_stride=64: the passage room .* = 61 must exceed"):
        SquadDataModule(1, max_seq_length=128, doc_stride=64)


@pytest.mark.slow
def test_second_run_reads_the_token_cache(tmp_path, shared_data, minilm_dir, monkeypatch):
    settings = dict(version=2, squad_dir=str(shared_data / "squad_v2"), tokenizer=str(minilm_dir),
                    cache_dir=str(tmp_path), max_train_examples=40, max_dev_examples=20)
    first = SquadDataModule(**settings)
    first.setup()
    assert len(first.examples["train"]) == 40 and len(first.examples["dev"]) == 20

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(squad, "make_windows", no_tokenizing)
    second = SquadDataModule(**settings)
    second.setup()  # same files, vocabulary and settings: read back from the cache
    assert second.datasets["dev"]["input_ids"] == first.datasets["dev"]["input_ids"]
    assert second.examples["dev"]["id"] == first.examples["dev"]["id"]
    # another window setting is another cache entry
    with pytest.raises(AssertionError, match="tokenized again"):
        SquadDataModule(**{**settings, "doc_stride": 64}).setup()


@pytest.mark.slow
def test_hub_rows_are_read_and_checked_like_the_files(tmp_path, shared_data, minilm_dir, monkeypatch):
    """squad_dir=null reads rajpurkar/squad_v2 through datasets.load_dataset (here answered offline from the
    fixture in the Hub's schema); its rows pass the same answer check as the official files."""
    from datasets import Dataset

    rows = read_squad_json(shared_data / "squad_v2/dev-v2.0.json", 2)[:30]
    calls = []

    def hub(path, name, split, revision, cache_dir):
        calls.append((path, name, split))
        return Dataset.from_list(rows)

    monkeypatch.setattr("bert_repro.data.base.load_dataset", hub)
    data = SquadDataModule(2, squad_dir=None, tokenizer=str(minilm_dir), cache_dir=str(tmp_path))
    data.setup()
    assert calls == [("rajpurkar/squad_v2", None, "train"), ("rajpurkar/squad_v2", None, "validation")]
    assert data.examples["dev"]["id"] == [r["id"] for r in rows] and len(data.datasets["dev"]) >= 30
    bad = next(r for r in rows if r["answers"]["text"])
    rows[rows.index(bad)] = {**bad, "answers": {"text": ["x" + bad["answers"]["text"][0]],
                                                "answer_start": bad["answers"]["answer_start"]}}
    with pytest.raises(ValueError, match=f"rajpurkar/squad_v2 \\(train\\): question {bad['id']}: answer 'x"):
        SquadDataModule(2, squad_dir=None, tokenizer=str(minilm_dir), cache_dir=str(tmp_path)).setup()


@pytest.mark.slow
def test_dev_batches_carry_what_scoring_needs_and_training_batches_do_not(tmp_path, shared_data, minilm_dir):
    """The span module scores Dev from its batches alone (not trainer.datamodule): every dev window carries
    its question's row, id, context and gold texts and its passage tokens; training batches stay lean."""
    data = SquadDataModule(2, squad_dir=str(shared_data / "squad_v2"), tokenizer=str(minilm_dir),
                           cache_dir=str(tmp_path), max_seq_length=64, doc_stride=16, max_query_length=16,
                           max_train_examples=8, max_dev_examples=8, batch_size=4)
    data.setup()
    assert set(next(iter(data.train_dataloader()))) == {"input_ids", "token_type_ids", "attention_mask",
                                                        "start_positions", "end_positions", "window"}
    windows, examples = data.datasets["dev"], data.examples["dev"]
    batches = list(data.val_dataloader())
    assert {b["num_questions"] for b in batches} == {8}
    scored = [(int(w), s) for b in batches for w, s in zip(b["window"], b["scoring"])]
    assert [w for w, _ in scored] == list(range(len(windows))) and len(windows) > 8  # several per question
    passage = ("example", "context_start", "offsets", "max_context")
    for w, s in scored:
        row = windows[w]
        question = examples[row["example"]]
        assert s == {**{name: row[name] for name in passage}, "id": question["id"],
                     "context": question["context"], "answers": question["answers"]["text"]}
