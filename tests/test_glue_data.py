"""GLUE data: the original files read exactly, pairs packed and truncated as the released code, the
tokenized cache reused, dynamic padding, length grouping, column mapping, and clear errors."""

import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf

from bert_repro.data.batching import LENGTH_PROBS, LengthGroupedSampler, PadCollator
from bert_repro.data.glue import GlueDataModule, truncated_lengths

from .helpers import call_in_new_process


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("glue_cache")


def datamodule(task, cache, tokenizer=None, **kwargs):
    return GlueDataModule(task, tokenizer=str(tokenizer) if tokenizer else None, cache_dir=str(cache),
                          **kwargs)


def tsv(path, rows):
    path.write_text("".join("\t".join(map(str, row)) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def released_truncate_seq_pair(len_a, len_b, budget):
    """google-research/bert run_classifier.py, _truncate_seq_pair, on lengths."""
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def test_truncation_lengths_match_the_released_code():
    for budget in (1, 2, 7, 8, 125):
        for len_a in range(0, 140, 3):
            for len_b in range(0, 140, 5):
                assert truncated_lengths(len_a, len_b, budget) == released_truncate_seq_pair(len_a, len_b,
                                                                                             budget)


# (task, files override, expected rows per split, a row to check: split, index, text_a, text_b, label)
LAYOUTS = [
    ("cola", {}, {"train": 8551, "dev": 1043, "test": 1063},
     ("train", 0, "Our friends won't buy this analysis, let alone the next one we propose.", None, 1)),
    # BOM; quotes literal (csv's default quoting: 3,570 rows)
    ("mrpc", {}, {"train": 3668, "dev": 408, "test": 1725},
     ("train", 0,
      'Amrozi accused his brother, whom he called "the witness", of deliberately distorting his evidence.',
      'Referring to him as only "the witness", Amrozi accused his brother of deliberately distorting his '
      'evidence.', 1)),
    ("stsb", {}, {"train": 5749, "dev": 1500, "test": 1379},
     ("train", 1, "A man is playing a large flute.", "A man is playing a flute.", 3.8)),
    ("rte", {}, {"train": 2490, "dev": 277, "test": 3000},
     ("train", 0, "No Weapons of Mass Destruction Found in Iraq Yet.",
      "Weapons of Mass Destruction Found in Iraq.", 1)),
    ("wnli", {}, {"train": 635, "dev": 71, "test": 146}, ("dev", 0, None, None, None)),
    ("qnli", {"train": "QNLI/dev.tsv"}, {"train": 2461, "dev": 2461}, ("dev", 0, None, None, 1)),
    ("qqp", {"dev": "QQP_sample/dev.tsv", "test": "QQP_sample/test.tsv"}, {"train": 23496, "dev": 2,
                                                                           "test": 1},
     ("train", 0, "What causes stool color to change to yellow?",
      "What can cause stool to come out as little balls?", 0)),
    ("mnli", {s: f"MNLI_sample/{s}.tsv" for s in ("train", "dev_matched", "dev_mismatched", "test_matched",
                                                  "test_mismatched")},
     {"train": 3, "dev_matched": 2, "dev_mismatched": 2, "test_matched": 1, "test_mismatched": 1},
     ("dev_matched", 0, "The new rights are nice enough", "Everyone really likes the newest benefits ", 1)),
]


@pytest.mark.parametrize("task,files,sizes,row", LAYOUTS, ids=[case[0] for case in LAYOUTS])
@pytest.mark.slow
def test_original_glue_files_read_exactly(task, files, sizes, row, shared_data, cache):
    files = {split: str(shared_data / "glue" / path) for split, path in files.items()}
    splits = datamodule(task, cache, glue_dir=str(shared_data / "glue"), files=files).raw_splits()
    assert {s: len(d) for s, d in splits.items()} == sizes
    split, i, text_a, text_b, label = row
    got = splits[split][i]
    for key, value in (("text_a", text_a), ("text_b", text_b), ("label", label)):
        if value is not None:
            assert got[key] == pytest.approx(value) if key == "label" else got[key] == value
    test = next((d for s, d in splits.items() if s.startswith("test")), None)
    if test is not None:  # unlabelled, with the file's own ids for the submission
        assert set(test["label"]) == {-1} and test[0]["idx"] == "0"


@pytest.mark.slow
def test_sst2_dev_carved_from_train_and_train_subset(shared_data, cache):
    """SST-2's dev set is held out here: a fixed carve of train stands in, whatever the restart seed."""
    dm = datamodule("sst2", cache, glue_dir=str(shared_data / "glue"), dev_from_train=872)
    splits = dm.raw_splits()
    assert (len(splits["train"]), len(splits["dev"]), len(splits["test"])) == (67349 - 872, 872, 1821)
    assert not set(splits["train"]["idx"]) & set(splits["dev"]["idx"])  # idx: the row's line in train.tsv
    again = datamodule("sst2", cache, glue_dir=str(shared_data / "glue"), dev_from_train=872,
                       seed=7).raw_splits()
    assert again["dev"]["idx"] == splits["dev"]["idx"]  # the carve does not move with the restart seed
    sub = datamodule("sst2", cache, glue_dir=str(shared_data / "glue"), dev_from_train=872,
                     max_train_examples=300, seed=7).raw_splits()["train"]
    assert len(sub) == 300 and set(sub["idx"]) <= set(splits["train"]["idx"])


@pytest.mark.slow
def test_pairs_packed_truncated_and_cached(tmp_path, minilm_dir):
    long_a, long_b = " ".join(["alpha"] * 90), " ".join(["beta"] * 70)
    rows = [["index", "sentence1", "sentence2", "label"],
            [0, "The cat sat.", "A cat is sitting.", "entailment"], [1, long_a, long_b, "not_entailment"],
            [2, "Short one.", long_b, "entailment"]]
    files = {"train": tsv(tmp_path / "train.tsv", rows), "dev": tsv(tmp_path / "dev.tsv", rows)}
    dm = datamodule("rte", tmp_path / "cache", minilm_dir, files=files)
    dm.setup()
    train = dm.datasets["train"]
    tok = dm._tokenizer
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    a, b = tok.encode("The cat sat.", add_special_tokens=False).ids, tok.encode("A cat is sitting.",
                                                                                add_special_tokens=False).ids
    assert train[0]["input_ids"] == [cls, *a, sep, *b, sep]
    assert train[0]["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert train["label"] == [0, 1, 0]
    # longest side first, as the released code: 90 + 70 pieces into 125 -> 63 + 62; 3 + 70 fits untouched
    for row, (len_a, len_b) in ((1, (63, 62)), (2, (3, 70))):
        types = np.array(train[row]["token_type_ids"])
        assert len(types) == len_a + len_b + 3 <= 128 and (types == 0).sum() == len_a + 2
    # a second run (another process, the files' path spelled differently) reads the same cache files
    cached = {split: (d.cache_files[0]["filename"], os.path.getmtime(d.cache_files[0]["filename"]))
              for split, d in dm.datasets.items()}
    respelled = {split: str(tmp_path / ".." / tmp_path.name / Path(path).name)
                 for split, path in files.items()}
    call_in_new_process("tests.test_glue_data.write_cache_files", str(minilm_dir), str(tmp_path / "cache"),
                        json.dumps(respelled), str(tmp_path / "again.json"))
    again = json.loads((tmp_path / "again.json").read_text())
    assert again == {split: name for split, (name, _) in cached.items()}
    assert all(os.path.getmtime(name) == mtime for name, mtime in cached.values())  # read, not rewritten


def write_cache_files(tokenizer: str, cache: str, files: str, out: str) -> None:
    """The cache files a GLUE datamodule set up in this process reads, written to ``out`` as JSON."""
    dm = GlueDataModule("rte", tokenizer=tokenizer, cache_dir=cache, files=json.loads(files))
    dm.setup()
    Path(out).write_text(json.dumps({s: d.cache_files[0]["filename"] for s, d in dm.datasets.items()}))


def test_dynamic_and_fixed_padding():
    rows = [{"input_ids": [2, 5, 3], "token_type_ids": [0, 0, 0], "label": 1, "row": 0, "idx": "a"},
            {"input_ids": [2, 5, 6, 7, 3], "token_type_ids": [0, 0, 0, 1, 1], "label": 0, "row": 1,
             "idx": "b"}]
    batch = PadCollator()(rows)
    assert batch["input_ids"].tolist() == [[2, 5, 3, 0, 0], [2, 5, 6, 7, 3]]
    assert batch["attention_mask"].sum().item() == 8 and batch["labels"].tolist() == [1, 0]
    assert batch["token_type_ids"][1].tolist() == [0, 0, 0, 1, 1] and batch["idx"] == ["a", "b"]
    fixed = PadCollator(pad_to=128, regression=True)(rows)
    assert fixed["input_ids"].shape == (2, 128) and fixed["labels"].dtype.is_floating_point


def test_length_buckets_give_a_few_shapes_and_the_same_loss():
    """speed.length_bucket: a batch padded up to the next multiple of 32 (at most max_seq_length) is a few
    shapes for the compiler, and its padding is masked: the same logits and loss as padded to its longest."""
    import torch

    from bert_repro.tasks.classification import SequenceClassificationModule

    collate = PadCollator(bucket=32, max_length=100)
    lengths = (3, 32, 33, 64, 65, 97, 100)
    assert [collate.padded_length([n]) for n in lengths] == [32, 32, 64, 64, 96, 100, 100]
    assert PadCollator(pad_to=128, bucket=32).padded_length([40]) == 128  # fixed padding stays fixed
    rng = np.random.default_rng(0)
    rows = [{"input_ids": rng.integers(5, 100, n).tolist(), "token_type_ids": [0] * n, "label": n % 2,
             "row": i, "idx": str(i)} for i, n in enumerate((7, 19, 40))]
    longest, bucketed = PadCollator()(rows), collate(rows)
    assert longest["input_ids"].shape[1] == 40 and bucketed["input_ids"].shape[1] == 64
    tiny = {"vocab_size": 100, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "max_position": 128}
    optim = {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01}
    module = SequenceClassificationModule(model=tiny, optim=optim, task="mrpc", num_labels=2).eval()
    with torch.no_grad():
        logits = module(longest), module(bucketed)
    torch.testing.assert_close(logits[0], logits[1])
    assert module._loss(logits[0], longest["labels"]) == pytest.approx(
        float(module._loss(logits[1], bucketed["labels"])), rel=1e-6)


def test_only_a_step_compiled_for_cuda_pads_to_buckets(monkeypatch):
    from omegaconf import OmegaConf

    from bert_repro.lifecycle.build import compiled_on

    def run(compile: bool, accelerator: str):
        return OmegaConf.create({"speed": {"compile": compile}, "trainer": {"accelerator": accelerator}})

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert (compiled_on(run(True, "gpu")), compiled_on(run(True, "cpu")), compiled_on(run(False, "gpu"))) == (
        "cuda", "cpu", None)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert compiled_on(run(True, "auto")) == "cpu"


def test_the_mean_padded_length_is_the_expected_longest_of_a_batch_capped_at_the_length():
    """mean_padded_length (the plan's) against batches drawn at random: each padded to its longest."""
    rng = np.random.default_rng(0)
    lengths = np.minimum(np.round(rng.lognormal(3.5, 0.5, 200_000)).astype(int) + 2, 400)  # GLUE-like
    quantiles = np.quantile(lengths, LENGTH_PROBS, method="nearest").tolist()
    padded = PadCollator().mean_padded_length
    for batch, seq in [(1, 512), (8, 128), (32, 128), (32, 64), (4, 512), (32, 512)]:
        drawn = np.minimum(rng.choice(lengths, (20_000, batch)).max(axis=1), seq).mean()
        assert padded(quantiles, batch, seq) == pytest.approx(drawn, rel=0.05), (batch, seq)
    n = len(LENGTH_PROBS)
    assert padded([60] * n, 32, 128) == 60  # every example 60 tokens
    assert padded([600] * n, 32, 128) == 128  # truncated to the length
    assert padded(None, 32, 128) == 128  # nothing measured: the length, an upper bound
    assert PadCollator(pad_to=128).mean_padded_length([60] * n, 32, 128) == 128  # fixed padding
    with pytest.raises(ValueError, match="expected 16"):
        padded([60] * 3, 32, 128)


@pytest.mark.slow
def test_length_grouping_cuts_padding(shared_data, minilm_dir, cache):
    dm = datamodule("mrpc", cache, minilm_dir, glue_dir=str(shared_data / "glue"), batch_size=32)
    dm.setup()
    lengths = np.array(dm.datasets["train"]["length"])
    sampler = LengthGroupedSampler(lengths, batch_size=32, seed=1)
    first, second = list(sampler), list(sampler)
    # every example once; a new order each epoch
    assert sorted(first) == list(range(len(lengths))) and first != second

    def padded(order):
        batches = [lengths[order[i:i + 32]] for i in range(0, len(order), 32)]
        return sum(len(b) * b.max() for b in batches)

    shuffled = np.random.default_rng(0).permutation(len(lengths))
    assert padded(np.array(first)) < 0.75 * padded(shuffled)
    sampler.set_epoch(0)
    assert list(sampler) == first
    # DDP: groups of 32 x 2 ranks; Lightning's wrapper hands rank r every second index of that order
    on_two = np.array(list(LengthGroupedSampler(lengths, batch_size=64, seed=1)))
    for rank in (0, 1):
        assert padded(on_two[rank::2]) < 0.75 * padded(shuffled[rank::2])


@pytest.mark.slow
def test_eval_sets_counted_once_across_ranks(shared_data, minilm_dir, cache):
    """RTE dev (277 rows) over 2 ranks: each row on exactly one rank, none repeated to even out the ranks."""
    seen = []
    for rank in (0, 1):
        dm = datamodule("rte", cache, minilm_dir, glue_dir=str(shared_data / "glue"), batch_size=16)
        dm.setup()
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        seen += [r for batch in dm.val_dataloader() for r in batch["row"].tolist()]
    assert sorted(seen) == list(range(277))


@pytest.mark.slow
def test_column_mapping_for_other_layouts(shared_data, cache, tmp_path):
    mnli = shared_data / "glue" / "MNLI"
    files = {"train": {"path": str(mnli / "tp823_HW2-NLP" / "mnli_train.tsv"), "columns": {"label": "label"}},
             "dev_matched": {"path": str(mnli / "chaosnli" / "chaosNLI_mnli_m.jsonl"),
                             "columns": {"text_a": "example.premise", "text_b": "example.hypothesis",
                                         "label": "old_label"},
                             "label_map": {"e": "entailment", "n": "neutral", "c": "contradiction"}},
             "dev_mismatched": {"path": str(mnli / "textfooler" / "mnli_mismatched"), "header": False,
                                "names": ["gold", "premise", "hypothesis"],
                                "columns": {"text_a": "premise", "text_b": "hypothesis", "label": "gold"}}}
    splits = datamodule("mnli", cache, files=files).raw_splits()
    assert {s: len(d) for s, d in splits.items()} == {"train": 20000, "dev_matched": 1599,
                                                      "dev_mismatched": 1000}
    assert set(splits["dev_matched"]["label"]) == {0, 1, 2} and splits["dev_mismatched"][0]["label"] == 0
    assert splits["dev_mismatched"][0]["text_a"].startswith("You ca n't take it with you")
    # a user's comma-separated file with standard quoting, its own column names
    csv_file = tmp_path / "mine.csv"
    csv_file.write_text('premise,hypothesis,gold\n"A man, smiling.",A man smiles.,entailment\nA dog.,"No '
                        '""cat"".",not_entailment\n')
    spec = {"path": str(csv_file), "columns": {"text_a": "premise", "text_b": "hypothesis", "label": "gold"}}
    rows = datamodule("rte", cache, files={"train": spec, "dev": spec}).raw_splits()["dev"]
    assert (rows["text_a"] == ["A man, smiling.", "A dog."] and rows["text_b"][1] == 'No "cat".'
            and rows["label"] == [0, 1])


def test_hub_path_maps_nyu_mll_glue_columns(monkeypatch, cache):
    from datasets import Dataset

    calls = []

    def fake_load_dataset(path, name, split, revision, cache_dir):
        calls.append((path, name, split))
        return Dataset.from_dict({"premise": ["p"], "hypothesis": ["h"],
                                  "label": [2 if "test" not in split else -1], "idx": [7]})

    monkeypatch.setattr("bert_repro.data.base.load_dataset", fake_load_dataset)
    splits = datamodule("mnli", cache, glue_dir=None).raw_splits()
    assert (("nyu-mll/glue", "mnli", "validation_mismatched") in calls
            and ("nyu-mll/glue", "ax", "test") in calls)
    assert splits["dev_matched"][0] == {"text_a": "p", "text_b": "h", "label": 2, "idx": "7"}


BAD_FILES = [  # (rows, message parts)
    ([["index", "sentence1", "sentence2", "label"], [0, "a", "b", "entailment"],
      [1, "a", "b", "entailment", "extra"]],
     ["line 3", "5 fields, expected 4"]),
    ([["index", "sentence1", "sentence2", "label"], [0, "a", "b", "entailment"], [1, "a"]],
     ["line 3", "2 fields"]),
    ([["index", "sentence1", "sentence2", "label"], [0, "a", "b", "maybe"]],
     ["line 2", "'maybe'", "not_entailment"]),
    ([["index", "premise", "hypothesis", "label"], [0, "a", "b", "entailment"]], ["no column", "premise"]),
]


@pytest.mark.parametrize("rows,parts", BAD_FILES,
                         ids=["extra-field", "missing-field", "bad-label", "bad-column"])
def test_malformed_files_fail_naming_file_and_line(rows, parts, tmp_path):
    path = tsv(tmp_path / "bad.tsv", rows)
    with pytest.raises(ValueError) as err:
        datamodule("rte", tmp_path / "cache", files={"train": path, "dev": path}).raw_splits()
    for part in [path, *parts]:
        assert part in str(err.value)


@pytest.mark.slow
def test_clear_errors_for_wrong_input(tmp_path, shared_data):
    with pytest.raises(ValueError, match="unknown GLUE task 'mrcp'.*mrpc"):
        GlueDataModule("mrcp")
    with pytest.raises(FileNotFoundError, match="SST-2/dev.tsv does not exist.*dev_from_train"):
        datamodule("sst2", tmp_path, glue_dir=str(shared_data / "glue")).raw_splits()
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere" / "MRPC" / "train.tsv")):
        datamodule("mrpc", tmp_path, glue_dir=str(tmp_path / "nowhere")).raw_splits()
    with pytest.raises(ValueError, match="needs the pre-trained model's vocabulary.*init="):
        datamodule("mrpc", tmp_path, glue_dir=str(shared_data / "glue")).prepare_tokenizer()
    score = tsv(tmp_path / "sts.tsv", [["sentence1", "sentence2", "score"], ["a", "b", "high"]])
    with pytest.raises(ValueError, match="score 'high'.*not a number"):
        datamodule("stsb", tmp_path, files={"train": score, "dev": score}).raw_splits()
    with pytest.raises(ValueError, match="files has splits \\['validation'\\]"):
        datamodule("rte", tmp_path, files={"validation": score})


def test_a_vocabulary_that_turns_the_text_into_unk_is_warned_of(tmp_path, caplog):
    """A fine-tuning (random weights, data.tokenizer=...) whose vocabulary does not cover the task's text is
    said, as pre-training refuses it; the task's own vocabulary says nothing."""
    rows = [["index", "sentence1", "sentence2", "label"],
            *([i, "The cat sat on the mat.", "A cat is sitting.", "entailment"] for i in range(4))]
    files = {"train": tsv(tmp_path / "train.tsv", rows), "dev": tsv(tmp_path / "dev.tsv", rows)}
    covering = tmp_path / "covering.txt"
    covering.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on",
                                   "mat", "a", "is", "sitting", "."]) + "\n")
    sparse = tmp_path / "sparse.txt"
    sparse.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "."]) + "\n")
    for vocab, warned in ((covering, False), (sparse, True)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            datamodule("rte", tmp_path / vocab.stem, vocab, files=files).setup()
        said = [r.getMessage() for r in caplog.records if "[UNK]" in r.getMessage()]
        assert bool(said) == warned, said
    assert "of task=rte's train tokens into [UNK]" in said[0] and "data.lowercase" in said[0]


@pytest.mark.parametrize(("trainer", "compile", "bucket"), [("gpu", True, 32), ("gpu", False, None),
                                                             ("cpu", True, None)])
def test_the_run_gives_its_data_the_bucket_only_where_it_compiles_for_cuda(monkeypatch, trainer, compile,
                                                                           bucket):
    """speed.length_bucket through build_data, from the composed config to the GLUE collator."""
    from bert_repro.lifecycle.build import build_data

    from .test_config import compose_cfg, resolved

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # a GPU machine
    cfg = OmegaConf.create(resolved(compose_cfg(["task=mrpc", "model=tiny", f"trainer={trainer}",
                                                 f"speed.compile={str(compile).lower()}"])))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]
    datamodule = build_data(SimpleNamespace(cfg=cfg, per_device=8, vocab=vocab, lowercase=True))
    assert datamodule.collator().bucket == bucket
