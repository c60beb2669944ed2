"""No untrusted pickle: every checkpoint is read with torch.load(weights_only=True), so one carrying a
pickled payload is refused with a message naming it, and the payload never runs; exports are safetensors."""

import ast
import os
import pickle
from pathlib import Path

import pytest
import torch

from bert_repro import convert
from bert_repro.lifecycle.reliability import AtomicCheckpointIO, safe_load
from bert_repro.model import BertConfig, BertForPreTraining

from .conftest import REPO, run_py


class Payload:
    """Unpickling this runs a shell command (creates ``marker``): what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def malicious(tmp_path) -> tuple[Path, Path]:
    """A checkpoint shaped like ours (state_dict, hyper_parameters) with the payload inside."""
    marker = tmp_path / "payload_ran"
    config = BertConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2)
    model = BertForPreTraining(config)
    ckpt = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {"model": config.to_dict(), "optim": {}}, "vocab": ["[PAD]"] * 50,
            "callbacks": {"Innocent": Payload(marker)}}
    path = tmp_path / "evil.ckpt"
    torch.save(ckpt, path)
    with pytest.raises(pickle.UnpicklingError):  # the file really is refused for its payload ...
        torch.load(path, weights_only=True)
    assert not marker.exists()
    return path, marker


def test_payload_proves_itself_when_loaded_unsafely(malicious):
    """Guard against a test that cannot fail: the same file, loaded without weights_only, runs the payload."""
    path, marker = malicious
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_library_loaders_refuse_it(malicious):
    path, marker = malicious
    with pytest.raises(convert.CheckpointError) as err:
        convert.load_checkpoint(path)
    assert (str(path) in str(err.value) and "weights_only=True" in str(err.value)
            and "posix.system" in str(err.value))
    with pytest.raises(convert.CheckpointError):
        AtomicCheckpointIO().load_checkpoint(path)  # what Lightning's resume (ckpt_path=) reads through
    with pytest.raises(convert.CheckpointError):
        safe_load(path)
    from bert_repro.tasks.pretrain import PretrainModule

    with pytest.raises(pickle.UnpicklingError):  # as the selection tool loads a run's last.ckpt
        PretrainModule.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    assert not marker.exists()


@pytest.mark.parametrize("how", ["init", "ckpt_path"])
def test_train_refuses_it_as_init_or_resume(malicious, tmp_path, how):
    path, marker = malicious
    proc = run_py("model=tiny", "scale=smoke", "logger=none", "data.corpus=builtin:pydoc",
                  "optim.max_steps=2", "data.batch_size=8", "scale.pretrain.vocab_size=2000", f"{how}={path}",
                  f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    said = next(line for line in output.splitlines() if f"{path}: not " in line)
    assert "with torch.load(weights_only=True)" in said and "GLOBAL posix.system" in said  # what was refused
    assert "Traceback" not in output
    assert not marker.exists() and not (tmp_path / "run" / "results.json").exists()


@pytest.mark.slow
def test_every_torch_load_in_the_package_is_weights_only():
    """A static check of src/: torch.load always with weights_only=True, no pickle.load at all."""
    offenders = []
    for file in (REPO / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
            if (owner, node.func.attr) in (("pickle", "load"), ("pickle", "loads")):
                offenders.append(f"{file}:{node.lineno}")
            if (owner, node.func.attr) == ("torch", "load"):
                safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant)
                           and k.value.value is True for k in node.keywords)
                if not safe:
                    offenders.append(f"{file}:{node.lineno}")
    assert offenders == []


def test_exports_are_safetensors(tmp_path):
    config = BertConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2)
    out = convert.export_hf(BertForPreTraining(config), tmp_path / "hf",
                            vocab=["[PAD]"] + [f"t{i}" for i in range(49)])
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors",
                                                     "tokenizer_config.json", "vocab.txt"]
    assert convert.load_checkpoint(out).config.hidden_size == 16
