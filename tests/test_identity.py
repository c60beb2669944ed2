"""Every result, checkpoint and run folder knows what it is and refuses to be something else: runs are found
once under the default W&B logger, a checkpoint carries its task, head, labels, science settings and sequence
length, and ckpt_path= / init= / src/evaluate.py act on that identity; results.json records the encoder that
ran, not the model= default."""

import glob
import hashlib
import json
import os
import subprocess

import pytest
import torch

from bert_repro import selection
from bert_repro.lifecycle.folder import find_runs

from .conftest import run_py, train_py

pytestmark = pytest.mark.e2e

# a tiny encoder over all-MiniLM-L6-v2's real vocabulary, three steps of RTE from the shared GLUE files
TINY = ["model=tiny", "optim.max_steps=3", "optim.limit_val_batches=2", "data.max_train_examples=32",
        "trainer.enable_progress_bar=false", "data.batch_size=8"]


def evaluate_py(*args: str) -> subprocess.CompletedProcess:
    return run_py(*args, script="evaluate.py")


def digest(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "wandb" not in p.parts}


@pytest.fixture(scope="module")
def rte(tmp_path_factory, minilm_dir, shared_data):
    """An RTE fine-tuning run with the default W&B logger (offline): its folder and the common arguments."""
    tmp = tmp_path_factory.mktemp("identity")
    common = [f"data.tokenizer={minilm_dir / 'vocab.txt'}", f"paths.cache_dir={tmp / 'cache'}"]
    folder = tmp / "sweep" / "rte"
    env_before = os.environ.get("WANDB_MODE")
    os.environ["WANDB_MODE"] = "offline"
    try:
        # checkpoint.keep_last: the resume refusals below need a resumable last.ckpt
        proc = train_py("task=rte", *TINY, *common, "logger=wandb", "checkpoint.keep_last=true",
                        f"hydra.run.dir={folder}")
    finally:
        os.environ.pop("WANDB_MODE") if env_before is None else os.environ.update(WANDB_MODE=env_before)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, folder, common


def test_runs_are_found_once_though_wandb_keeps_a_copy(rte, capsys):
    tmp, folder, _ = rte
    copies = glob.glob(str(folder / "wandb" / "*" / "files" / "results.json"))
    assert copies, "W&B kept no copy of results.json: this test would prove nothing"
    assert find_runs([tmp / "sweep"]) == [folder]
    runs, skipped = selection.load_runs([tmp / "sweep"])
    assert [r["dir"] for r in runs] == [str(folder)] and skipped == []
    assert selection.main([str(tmp / "sweep"), "--restarts", "--out", str(tmp / "sel")]) == 0
    said = capsys.readouterr().out
    assert "(n=1)" in said and "(n=2)" not in said


def test_a_checkpoint_carries_its_identity(rte):
    _, folder, _ = rte
    ckpt = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    identity = ckpt["identity"]
    assert identity["task"] == "rte" and identity["labels"] == ["entailment", "not_entailment"]
    assert identity["head"]["module"] == "SequenceClassificationModule"
    assert identity["head"]["parameters"]["model.classifier.weight"][0] == 2
    assert identity["max_seq_length"] == 128 and identity["science"]["task"]["name"] == "rte"
    results = json.loads((folder / "results.json").read_text())
    assert results["identity"] == identity


def test_resuming_another_tasks_checkpoint_is_refused(rte, tmp_path):
    _, folder, common = rte
    before = digest(folder)
    ckpt = folder / "checkpoints" / "last.ckpt"
    proc = train_py("task=mrpc", *TINY, *common, "logger=none", f"ckpt_path={ckpt}",
                    f"hydra.run.dir={tmp_path / 'mrpc'}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-3000:]
    assert f"ckpt_path={ckpt} is a checkpoint of task=rte (labels entailment, not_entailment)" in said
    assert "not of this run's task=mrpc (labels 0, 1)" in said and "Traceback" not in said
    assert not (tmp_path / "mrpc" / "results.json").exists() and digest(folder) == before


def test_resuming_a_checkpoint_of_other_settings_is_refused(rte, tmp_path):
    _, folder, common = rte
    ckpt = folder / "checkpoints" / "last.ckpt"
    proc = train_py("task=rte", *TINY, *common, "logger=none", "optim.lr=1e-3", f"ckpt_path={ckpt}",
                    f"hydra.run.dir={tmp_path / 'rte_lr'}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "was written with other settings than this run's" in said, said[-3000:]
    assert "optim.lr: checkpoint 2e-05, now 0.001" in said and "Traceback" not in said


def test_evaluating_another_tasks_head_is_refused(rte, tmp_path):
    _, folder, common = rte
    ckpt = folder / "checkpoints" / "last.ckpt"
    proc = evaluate_py("task=mrpc", "model=tiny", *common, f"init={ckpt}", f"hydra.run.dir={tmp_path / 'ev'}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-3000:]
    assert (f"init={ckpt}: it was fine-tuned on task=rte (labels entailment, not_entailment), not task=mrpc "
            "(labels 0, 1)") in said
    assert "Traceback" not in said and not (tmp_path / "ev" / "results.json").exists()


def test_init_from_another_task_keeps_the_encoder_and_records_the_shape_that_ran(rte, tmp_path):
    """No model= on the command line: the encoder is init='s tiny one, and the record says so (config.model
    included, which W&B and the science keys read), not the default BERT-base."""
    _, folder, common = rte
    out = tmp_path / "mrpc"
    args = [a for a in TINY if not a.startswith("model=")]
    proc = train_py("task=mrpc", *args, *common, "logger=none", "optim.max_steps=1",
                    f"init={folder / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={out}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert said.count("was fine-tuned on task=rte (labels entailment, not_entailment): its encoder is taken, "
                      "its head dropped") == 1
    results = json.loads((out / "results.json").read_text())
    assert "task=rte" in results["init_head_dropped"] and results["missing_heads"] == ["classifier"]
    tiny = results["model_config"]
    shape = f"L{tiny['num_layers']}_H{tiny['hidden_size']}_A{tiny['num_heads']}"
    assert tiny["num_layers"] < 12 and results["model"] == shape
    assert {k: results["config"]["model"][k] for k in ("num_layers", "hidden_size", "num_heads")} == {
        k: tiny[k] for k in ("num_layers", "hidden_size", "num_heads")}


def test_an_exported_folder_carries_the_identity_and_is_refused_as_another_tasks_head(rte, tmp_path):
    from bert_repro.convert import load_checkpoint
    from bert_repro.convert.cli import main as convert
    from bert_repro.lifecycle.build import load_weights
    from bert_repro.lifecycle.checks import UsageError

    _, folder, _ = rte
    ckpt = folder / "checkpoints" / "last.ckpt"
    assert convert(["to-hf", str(ckpt), str(tmp_path / "hf")]) == 0
    saved = torch.load(ckpt, weights_only=True, map_location="cpu")["identity"]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["bert_repro"] == saved
    loaded = load_checkpoint(tmp_path / "hf")
    assert loaded.identity == saved and loaded.ignored  # the RTE classifier, beside the encoder
    now = {**saved, "task": "mrpc", "labels": ["0", "1"]}
    with pytest.raises(UsageError, match="it was fine-tuned on task=rte .*, not task=mrpc"):
        load_weights(None, loaded, now, whole_module=True)


# -- a checkpoint's identity is its whole model node (an architectural flag this encoder does not have) ------
def pre_ln(ckpt, out):
    """``ckpt`` as a version of bert-repro with a ``model.pre_ln`` switch would write it: the flag in its
    model node and identity, and the final LayerNorm that pre-LN adds."""
    saved = torch.load(ckpt, weights_only=True, map_location="cpu")
    saved["hyper_parameters"]["model"]["pre_ln"] = True
    saved["identity"]["science"]["model"]["pre_ln"] = True
    hidden = saved["hyper_parameters"]["model"]["hidden_size"]
    saved["state_dict"]["model.bert.encoder.final_norm.weight"] = torch.ones(hidden)
    torch.save(saved, out)
    return out


def test_an_architectural_flag_is_refused_by_name_by_every_loader(rte, tmp_path):
    from bert_repro.convert import CheckpointError, load_checkpoint
    from bert_repro.convert.cli import main as convert

    _, folder, common = rte
    before = digest(folder)
    flagged = pre_ln(folder / "checkpoints" / "last.ckpt", tmp_path / "pre_ln.ckpt")
    with pytest.raises(CheckpointError, match=r"its model sets model\.pre_ln=True, which this version's"):
        load_checkpoint(flagged)  # the pre-training store, init=, evaluate and convert all read through it
    # init= (the fine-tuning run), evaluate, and the export: each refuses, naming the flag
    runs = {"init": train_py("task=rte", *TINY, *common, "logger=none", f"init={flagged}",
                             f"hydra.run.dir={tmp_path / 'init'}"),
            "evaluate": evaluate_py("task=rte", "model=tiny", *common, f"init={flagged}",
                                    f"hydra.run.dir={tmp_path / 'ev'}")}
    for what, proc in runs.items():
        said = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "model.pre_ln=True" in said, (what, said[-3000:])
        assert "Traceback" not in said
    # ckpt_path= (a resume): the flag is a science key the run does not have
    proc = train_py("task=rte", *TINY, *common, "logger=none", f"ckpt_path={flagged}",
                    f"hydra.run.dir={tmp_path / 'resume'}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "model.pre_ln: checkpoint True, now None" in said, said[-3000:]
    assert convert(["to-hf", str(flagged), str(tmp_path / "hf")]) == 2 and not (tmp_path / "hf").exists()
    assert digest(folder) == before
    # the extra weight alone, without the flag, is refused too: never dropped or passed through
    extra = torch.load(flagged, weights_only=True)
    del extra["hyper_parameters"]["model"]["pre_ln"]
    torch.save(extra, tmp_path / "extra.ckpt")
    with pytest.raises(CheckpointError, match="parameters the encoder does not have.*final_norm"):
        load_checkpoint(tmp_path / "extra.ckpt")


def test_an_exported_folder_with_a_flag_is_refused_and_an_export_refuses_what_transformers_lacks(rte,
                                                                                               tmp_path):
    from dataclasses import dataclass

    from bert_repro.convert import CheckpointError, hf_config, load_checkpoint
    from bert_repro.convert.cli import main as convert
    from bert_repro.model import BertConfig

    _, folder, _ = rte
    assert convert(["to-hf", str(folder / "checkpoints" / "last.ckpt"), str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["bert_repro"]["science"]["model"]["pre_ln"] = True
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model\.pre_ln=True"):
        load_checkpoint(tmp_path / "hf")

    @dataclass
    class PreLN(BertConfig):  # an encoder with a switch transformers' BertModel has no setting for
        pre_ln: bool = False

    assert hf_config(PreLN(hidden_size=128, num_layers=2, num_heads=2), "BertModel")["hidden_size"] == 128
    with pytest.raises(CheckpointError, match=r"model\.pre_ln=True: transformers' BERT classes have no such"):
        hf_config(PreLN(hidden_size=128, num_layers=2, num_heads=2, pre_ln=True), "BertModel")


def test_a_flag_of_another_value_is_refused_and_an_export_brings_its_own_head(rte, tmp_path):
    from bert_repro.convert import load_checkpoint
    from bert_repro.convert.cli import main as convert
    from bert_repro.tasks.classification import SequenceClassificationModule

    _, folder, _ = rte
    ckpt = folder / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True, map_location="cpu")
    hparams = saved["hyper_parameters"]
    causal = SequenceClassificationModule({**hparams["model"], "causal": True}, hparams["optim"], "rte", 2)
    with pytest.raises(ValueError, match="model.causal: checkpoint False, this run True"):
        causal.load_pretrained(load_checkpoint(ckpt))
    # the export holds the trained classifier: loading it into the same task's module takes it
    assert convert(["to-hf", str(ckpt), str(tmp_path / "hf")]) == 0
    module = SequenceClassificationModule(hparams["model"], hparams["optim"], "rte", 2)
    module.identity = saved["identity"]
    assert module.load_pretrained(load_checkpoint(tmp_path / "hf")) == []
    torch.testing.assert_close(module.model.classifier.weight, saved["state_dict"]["model.classifier.weight"])


def test_evaluate_takes_a_checkpoint_as_the_model_it_is(rte, tmp_path):
    """Table 5's left-to-right fine-tune evaluated without its ablation, and a checkpoint of a flag
    (pre-LN-like) evaluated by a run with the flag off: refused before a number is computed, as init= is."""
    from dataclasses import dataclass, replace

    from bert_repro.convert import load_checkpoint
    from bert_repro.lifecycle.build import load_weights
    from bert_repro.model import BertConfig
    from bert_repro.tasks.classification import SequenceClassificationModule

    _, folder, common = rte
    ckpt = folder / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True, map_location="cpu")
    ltr = json.loads(json.dumps(saved["identity"]))
    ltr["science"]["model"]["causal"] = True
    torch.save({**saved, "identity": ltr, "hyper_parameters": {
        **saved["hyper_parameters"], "model": {**saved["hyper_parameters"]["model"], "causal": True}}},
        tmp_path / "ltr.ckpt")
    proc = evaluate_py("task=rte", "model=tiny", *common, f"init={tmp_path / 'ltr.ckpt'}",
                       f"hydra.run.dir={tmp_path / 'ev'}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-3000:]
    assert "model.causal: checkpoint True, this run False" in said and "ablation=ltr_no_nsp" in said
    assert "Traceback" not in said and not (tmp_path / "ev" / "results.json").exists()

    @dataclass
    class PreLN(BertConfig):  # an encoder with a switch, as docs/extending.md adds one
        pre_ln: bool = False

    hparams = saved["hyper_parameters"]
    module = SequenceClassificationModule(hparams["model"], hparams["optim"], "rte", 2)
    module.config, module.identity = PreLN(**module.config.to_dict()), saved["identity"]
    loaded = load_checkpoint(ckpt)
    loaded = replace(loaded, config=PreLN(**loaded.config.to_dict()))
    assert load_weights(module, loaded, module.identity, whole_module=True) == ([], None)
    flagged = replace(loaded, config=replace(loaded.config, pre_ln=True))
    with pytest.raises(ValueError, match="model.pre_ln: checkpoint True, this run False"):
        load_weights(module, flagged, module.identity, whole_module=True)


def test_submit_refuses_a_checkpoint_of_another_attempt(rte, tmp_path, capsys):
    """An interrupted rerun left its checkpoint behind a finished run's results: not predicted under them."""
    import shutil

    from bert_repro.lifecycle.folder import RunFolder

    _, folder, _ = rte
    copy = RunFolder(shutil.copytree(folder, tmp_path / "runs" / "rte",
                                     ignore=shutil.ignore_patterns("wandb")))
    results = json.loads(copy.results.read_text())
    copy.results.write_text(json.dumps({**results, "global_step": 200}))
    # the three-step run predicts one class: --allow-collapsed lets the submission reach its checkpoint
    assert selection.main([str(tmp_path / "runs"), "--submit", "--allow-collapsed", "--out",
                           str(tmp_path / "sel")]) == 2
    said = capsys.readouterr().err
    assert f"{copy.last} is at step 3, the run's results at step 200: another attempt's checkpoint" in said
