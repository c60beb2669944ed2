"""SWAG (§4.4): the original CSV rows become four [CLS] sent1 [SEP] sent2 ending_i [SEP] sequences, batches
are (B, 4, T), one vector V scores each pooled C_i; src/train.py runs it end to end with test predictions."""

import csv
import json

import pytest
import torch

from bert_repro.data.swag import SwagDataModule
from bert_repro.tasks.choice import MultipleChoiceModule

from .test_glue_e2e import run

SHAPE = dict(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=2)


@pytest.fixture
def swag_dir(shared_data):
    return shared_data / "swag" / "hf_datasets_dummy"


def test_rows_become_four_sequences_and_batches_are_b_4_t(tmp_path, swag_dir, minilm_dir):
    data = SwagDataModule(str(swag_dir), tokenizer=str(minilm_dir), batch_size=3,
                          cache_dir=str(tmp_path / "cache"))
    data.setup()
    assert {s: len(d) for s, d in data.datasets.items()} == {"train": 4, "dev": 4, "test": 4}
    with open(swag_dir / "val.csv", newline="") as f:
        first = next(csv.DictReader(f))
    row = data.datasets["dev"][0]
    assert row["label"] == int(first["label"]) == 2 and len(row["input_ids"]) == 4
    for k, (ids, types) in enumerate(zip(row["input_ids"], row["token_type_ids"])):
        text = data._tokenizer.decode(ids, skip_special_tokens=False)
        ending = f"{first['sent2']} {first[f'ending{k}']}".lower()
        assert text == data._tokenizer.decode(data._tokenizer.encode(first["sent1"].lower(), ending).ids,
                                              skip_special_tokens=False)
        sep = ids.index(data.vocab.index("[SEP]"))
        assert types == [0] * (sep + 1) + [1] * (len(ids) - sep - 1)
    batch = next(iter(data.val_dataloader()))
    B, N, T = batch["input_ids"].shape
    assert (B, N) == (3, 4) and batch["token_type_ids"].shape == batch["attention_mask"].shape == (3, 4, T)
    assert T == max(len(s) for r in range(3) for s in data.datasets["dev"][r]["input_ids"])
    assert batch["labels"].tolist() == [int(r["label"])
                                        for r in csv.DictReader(open(swag_dir / "val.csv"))][:3]
    assert data.datasets["test"]["label"] == [-1] * 4 and data.datasets["test"]["idx"] == ["0", "1", "2", "3"]


def test_long_inputs_are_truncated_to_max_seq_length(tmp_path, swag_dir, minilm_dir):
    data = SwagDataModule(str(swag_dir), tokenizer=str(minilm_dir), max_seq_length=16,
                          cache_dir=str(tmp_path / "c"))
    data.setup()
    lengths = [len(s) for split in data.datasets.values() for r in split["input_ids"] for s in r]
    assert max(lengths) == 16


@pytest.mark.slow
def test_bad_files_are_named(tmp_path, swag_dir, minilm_dir):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("train.csv", "val.csv"):
        (bad / name).write_text((swag_dir / name).read_text())
    rows = (swag_dir / "val.csv").read_text().splitlines()
    (bad / "val.csv").write_text("\n".join([rows[0], rows[1][:-1] + "7", *rows[2:]]))
    data = SwagDataModule(str(bad), tokenizer=str(minilm_dir), cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match=r"val.csv row 1 \(after the header\): label '7'"):
        data.setup()
    with open(swag_dir / "val.csv", newline="") as f, open(bad / "val.csv", "w", newline="") as g:
        csv.writer(g).writerows(r[:-2] for r in csv.reader(f))  # no ending3, no label
    with pytest.raises(ValueError, match=r"val.csv: no column \['ending3', 'label'\]"):
        SwagDataModule(str(bad), tokenizer=str(minilm_dir), cache_dir=str(tmp_path / "c2")).setup()
    with pytest.raises(FileNotFoundError, match="nowhere/train.csv does not exist"):
        SwagDataModule(str(tmp_path / "nowhere"), tokenizer=str(minilm_dir),
                       cache_dir=str(tmp_path / "c3")).setup()


def test_one_vector_scores_each_choice():
    torch.manual_seed(0)
    module = MultipleChoiceModule(SHAPE, {}).eval()
    assert module.model.classifier.weight.shape == (1, 32)  # V (§4.4)
    ids = torch.randint(5, 1000, (2, 4, 9))
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids),
             "attention_mask": torch.ones_like(ids)}
    scores = module(batch)
    assert scores.shape == (2, 4)
    single = module.model(ids[1, 2:3], torch.zeros(1, 9, dtype=torch.long),
                          torch.ones(1, 9, dtype=torch.long))
    assert torch.allclose(scores[1, 2], single.squeeze())  # choices are scored independently, then compared
    with pytest.raises(ValueError, match="3 choices per example"):
        module({k: v[:, :3] for k, v in batch.items()})
    bilstm = MultipleChoiceModule({**SHAPE, "causal": True}, {}, bilstm=True)  # Table 5's heads
    assert bilstm.model.lstm is not None and bilstm(batch).shape == (2, 4)
    bilstm(batch).sum().backward()
    assert all(p.grad is not None for p in bilstm.parameters() if p.requires_grad)  # none idle under DDP


def test_swag_end_to_end_with_test_predictions(tmp_path, minilm_dir, shared_data):
    proc, out = run("task=swag", "model=minilm_l6", f"init={minilm_dir}", "logger=csv",
                    "trainer.enable_progress_bar=false", "data.batch_size=2", "optim.max_steps=3",
                    "test=true", f"paths.shared_data={shared_data}", f"paths.cache_dir={tmp_path / 'cache'}",
                    f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, out[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["missing_heads"] == ["classifier"] and results["global_step"] == 3
    assert results["data_sizes"] == {"train": 4, "dev": 4, "test": 4}
    assert results["metrics"]["final"]["val/acc"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    lines = (tmp_path / "run" / "test_predictions" / "swag_test.csv").read_text().splitlines()
    assert lines[0] == "id,label" and [line.split(",")[0] for line in lines[1:]] == ["0", "1", "2", "3"]
    assert {line.split(",")[1] for line in lines[1:]} <= {"0", "1", "2", "3"}


def test_hub_layout(tmp_path, shared_data, minilm_dir):
    """The Hub code path (load_dataset), offline: real rows in allenai/swag's field names (transformers'
    fixture)."""
    hub = tmp_path / "hub"
    hub.mkdir()
    sample = (shared_data / "swag" / "transformers_fixture" / "sample.json").read_text()
    for split in ("train", "validation"):
        (hub / f"{split}.json").write_text(sample)
    rows = [json.loads(line) for line in sample.splitlines() if line]
    # the Hub's test
    (hub / "test.json").write_text("".join(json.dumps({**r, "label": -1}) + "\n" for r in rows))
    data = SwagDataModule(None, hub={"path": str(hub), "name": None}, tokenizer=str(minilm_dir),
                          cache_dir=str(tmp_path / "cache"))
    data.setup()
    assert len(data.datasets["dev"]) == 10 and data.test_splits == ["test"]
    assert data.datasets["test"]["label"] == [-1] * 10
    assert data.datasets["dev"]["label"] == [r["label"] for r in rows]
