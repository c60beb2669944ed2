"""init= as from_pretrained reads it: the released checkpoint by default, Hub ids through huggingface_hub
(mocked at its boundary: never the network), the checkpoint's shape when model= is not given."""

import json
import shutil
import time

import pytest
from huggingface_hub.errors import LocalEntryNotFoundError

from bert_repro.lifecycle import pretrained
from bert_repro.lifecycle.pretrained import InitError, default_init, is_hub_id, resolve_init
from bert_repro.tables.compose import compose_once, composing

from .conftest import train_py


def composed(*overrides: str):
    with composing():
        return compose_once("train", list(overrides))


@pytest.mark.parametrize("overrides, expected", [
    (["model=large", "task=squad_v1"], "google-bert/bert-large-uncased"),
    (["model=base", "task=mrpc"], "google-bert/bert-base-uncased"),
    (["model=base", "task=conll2003"], "google-bert/bert-base-cased"),  # §4.3: NER is cased
    (["model=tiny", "task=sst2"], "google/bert_uncased_L-2_H-128_A-2"),
    (["model=base", "task=pretrain"], None),
    (["model=base", "task=mrpc", "data.tokenizer=/some/vocab.txt"], None),  # the user's own vocabulary
    (["model=base", "task=mrpc", "ablation=mask_100_0_0"], None),  # its own pre-training is the point
    (["model=base", "task=mrpc", "init=/my/ckpt"], None),
])
def test_the_released_checkpoint_is_the_default(overrides, expected):
    assert default_init(composed(*overrides)) == expected


def test_no_release_of_that_shape_and_casing_is_a_clear_refusal():
    with pytest.raises(InitError, match="no cased checkpoint of L=2 H=128 A=2; give init="):
        default_init(composed("model=tiny", "task=conll2003"))


def test_hub_ids_and_local_paths(tmp_path):
    (tmp_path / "tf").mkdir()
    (tmp_path / "tf" / "bert_model.ckpt.index").write_text("")
    assert is_hub_id("google-bert/bert-base-uncased") and is_hub_id("bert-base-uncased")
    assert not is_hub_id(str(tmp_path))  # an existing directory
    assert not is_hub_id(str(tmp_path / "tf" / "bert_model.ckpt"))  # a TF prefix: its .index exists
    assert not is_hub_id("outputs/mrpc/default/checkpoints/best.ckpt") and not is_hub_id("./model")


def test_a_hub_id_is_fetched_with_huggingface_hub(monkeypatch, tmp_path, minilm_dir):
    calls = []

    def snapshot_download(repo_id, allow_patterns=None, **kwargs):  # a local fake of the Hub's snapshot
        calls.append((repo_id, list(allow_patterns)))
        folder = tmp_path / "snapshot"
        folder.mkdir(exist_ok=True)
        for name in ("config.json", "vocab.txt", "tokenizer_config.json", "model.safetensors"):
            if any(name == p or name.startswith(p.split("*")[0]) and "*" in p for p in allow_patterns):
                shutil.copy(minilm_dir / name, folder / name)
        return str(folder)

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    spec, path = resolve_init(composed("task=mrpc", "init=sentence-transformers/all-MiniLM-L6-v2"))
    assert spec == "sentence-transformers/all-MiniLM-L6-v2" and path == str(tmp_path / "snapshot")
    assert calls[0][0] == spec  # safetensors only, where the repository has them
    assert "model.safetensors" in calls[0][1] and "pytorch_model.bin" not in calls[0][1]


def test_offline_and_not_cached_says_how_to_download(monkeypatch):
    def snapshot_download(repo_id, **kwargs):
        raise LocalEntryNotFoundError("offline")

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    said = (r"init=google-bert/bert-large-uncased is not in the Hugging Face cache "
            r"and HF_HUB_OFFLINE is set; .*hf download google-bert/bert-large-uncased")
    with pytest.raises(InitError, match=said):
        resolve_init(composed("model=large", "task=squad_v1"))


@pytest.mark.slow
def test_the_cards_command_offline_stops_at_once_with_the_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache, whatever this machine has cached
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    began = time.monotonic()
    proc = train_py("model=large", "task=squad_v1", f"hydra.run.dir={tmp_path / 'run'}", timeout=300)
    took = time.monotonic() - began
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-2000:]
    assert "hf download google-bert/bert-large-uncased" in said and "Traceback" not in said
    assert took < 60  # imports on a busy machine; no data is read, nothing waits on the network


@pytest.mark.slow
def test_an_hf_directory_gives_its_shape_without_model(tmp_path, minilm_dir, shared_data):
    out = tmp_path / "run"
    proc = train_py("task=mrpc", f"init={minilm_dir}", "optim.max_steps=2", "data.max_train_examples=16",
                    "data.batch_size=4", "optim.limit_val_batches=1", "logger=none",
                    "trainer.enable_progress_bar=false", f"paths.cache_dir={tmp_path / 'cache'}",
                    f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["model"] == "L6_H384_A12" and results["init"] == str(minilm_dir)
    keys = ("hidden_size", "num_layers", "num_heads", "intermediate_size")
    shape = {k: results["model_config"][k] for k in keys}
    assert shape == {"hidden_size": 384, "num_layers": 6, "num_heads": 12, "intermediate_size": 1536}

    refused = train_py("task=mrpc", "model=tiny", f"init={minilm_dir}", "optim.max_steps=2", "logger=none",
                       "data.max_train_examples=16", f"paths.cache_dir={tmp_path / 'cache'}",
                       f"hydra.run.dir={tmp_path / 'refused'}")
    said = refused.stdout + refused.stderr
    assert refused.returncode == 2 and "model.hidden_size: checkpoint 384, this run 128" in said
    assert "Traceback" not in said


def test_model_shape_keeps_the_runs_dropout():
    from bert_repro.model import BertConfig

    ckpt = BertConfig(hidden_size=384, num_layers=6, num_heads=12, hidden_dropout=0.0)
    run = {**BertConfig(hidden_dropout=0.1).to_dict()}
    shaped = pretrained.model_shape(run, ckpt, explicit=False)
    assert (shaped["hidden_size"], shaped["num_layers"], shaped["hidden_dropout"]) == (384, 6, 0.1)
    assert pretrained.model_shape(run, ckpt, explicit=True) == run
