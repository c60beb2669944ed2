"""Pre-training through src/train.py on CPU: every ablation config, the two-phase schedule (v2 A.2), and
checkpoints every N steps (§5.3), each loadable by a fine-tuning task."""

import csv
import json
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

from bert_repro.convert import load_checkpoint
from bert_repro.model import BertModel
from bert_repro.tasks.base import BertTaskModule

from .conftest import CONF, train_py

# the pre-training ablations; feature_* choose frozen-encoder features for NER fine-tuning (test_conll_module)
ABLATIONS = sorted(p.stem for p in (CONF / "ablation").glob("*.yaml") if not p.stem.startswith("feature_"))
TINY = ["model=tiny", "scale=smoke", "logger=csv", "data.batch_size=8", "scale.pretrain.vocab_size=1000",
        "scale.pretrain.max_documents=30", "trainer.enable_progress_bar=false"]


def train(*args: str, multirun: bool = False, timeout: int = 600) -> subprocess.CompletedProcess:
    return train_py(*(["--multirun"] if multirun else []), *TINY, *args, timeout=timeout)


class FineTuneProbe(BertTaskModule):
    """What a fine-tuning task is to `init=`: the encoder from plain hyper-parameters plus a new head."""

    def __init__(self, model: dict):
        super().__init__(model, optim={})
        self.model = nn.Module()
        self.model.bert = BertModel(self.config)
        self.model.classifier = nn.Linear(self.config.hidden_size, 2)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """All ablation configs in one Hydra multirun (one process, a shared cache), two steps each."""
    tmp = tmp_path_factory.mktemp("ablations")
    proc = train(f"ablation={','.join(ABLATIONS)}", "optim.max_steps=2", "optim.val_check_interval=2",
                 "optim.limit_val_batches=1", f"paths.cache_dir={tmp / 'cache'}",
                 f"hydra.sweep.dir={tmp / 'sweep'}", multirun=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {}
    for results in (tmp / "sweep").glob("*/results.json"):
        record = json.loads(results.read_text())
        runs[record["ablation"]] = (record, results.parent)
    return runs


def test_every_ablation_runs_and_leaves_a_checkpoint_fine_tuning_loads(sweep):
    assert sorted(sweep) == ABLATIONS
    for name, (results, out) in sweep.items():
        assert results["status"] == "complete" and results["global_step"] == 2, name
        final = results["metrics"]["final"]
        assert final["val/mlm_loss"] is not None and ("val/nsp_acc" in final) == (
            name.startswith("mask") or name == "none")
        loaded = load_checkpoint(out / "checkpoints" / "last.ckpt")
        ltr = name.startswith("ltr")
        # the left-only constraint travels with the checkpoint (§5.1)
        assert loaded.config.causal == ltr, name
        assert loaded.missing_heads == ([] if final.get("val/nsp_acc") is not None else ["nsp"]), name
        assert loaded.vocab is not None and len(loaded.vocab) == loaded.config.vocab_size
        probe = FineTuneProbe(model=loaded.config.to_dict())
        assert probe.load_pretrained(loaded) == ["classifier"], name
        torch.testing.assert_close(probe.model.bert.state_dict()["embeddings.word_embeddings.weight"],
                                   loaded.state_dict["bert.embeddings.word_embeddings.weight"])
        if ltr:  # and a bidirectional fine-tuning run may not drop it
            with pytest.raises(ValueError, match="left-to-right"):
                FineTuneProbe(model={**loaded.config.to_dict(), "causal": False}).load_pretrained(loaded)


def test_ablations_reach_the_run_config(sweep):
    config = {name: results["config"] for name, (results, _) in sweep.items()}
    assert (config["ltr_no_nsp_bilstm"]["ablation"]["bilstm"]
            and config["ltr_no_nsp_bilstm"]["model"]["causal"])
    assert config["mask_0_20_80"]["data"]["mask_shares"] == [0.0, 0.2, 0.8]
    assert not config["no_nsp"]["data"]["nsp"] and not config["no_nsp"]["model"]["causal"]


def _lr_by_step(out: Path) -> dict[int, float]:
    """LearningRateMonitor's lr per step; both parameter groups (decay, no decay) follow the same schedule."""
    with open(out / "csv" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("lr-AdamW/pg1")]
    assert all(row["lr-AdamW/pg1"] == row["lr-AdamW/pg2"] for row in rows)
    return {int(row["step"]): float(row["lr-AdamW/pg1"]) for row in rows}


def test_two_phase_schedule_resumes_phase_one(tmp_path):
    """v2 A.2 at tiny scale: 6 of 10 steps at length 64, then 4 at 128 resuming phase 1's weights, AdamW
    moments, global step and learning-rate schedule (warm-up 2, linear decay to 0 at step 10)."""
    scale = ["scale.pretrain.max_steps=10", "scale.pretrain.warmup_steps=2",
             "scale.pretrain.two_phase.phase1_steps=6", "scale.pretrain.two_phase.phase1_seq_length=64",
             "scale.pretrain.two_phase.phase1_predictions=10",
             "scale.pretrain.two_phase.phase2_seq_length=128",
             "scale.pretrain.two_phase.phase2_predictions=20",
             "scale.pretrain.two_phase.val_check_interval=2", "optim.limit_val_batches=1",
             "trainer.log_every_n_steps=1", f"paths.cache_dir={tmp_path / 'cache'}"]
    one, two = tmp_path / "phase1", tmp_path / "phase2"
    proc = train("experiment=pretrain_phase1", *scale, "scale.pretrain.checkpoint_every_n_steps=3",
                 f"hydra.run.dir={one}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = one / "checkpoints" / "last.ckpt"
    proc = train("experiment=pretrain_phase2", *scale, f"ckpt_path={last}", f"hydra.run.dir={two}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    first, second = (json.loads((out / "results.json").read_text()) for out in (one, two))
    assert first["global_step"] == 6 and second["global_step"] == 10
    assert (first["config"]["data"]["max_seq_length"], second["config"]["data"]["max_seq_length"]) == (64,
                                                                                                       128)
    assert (first["config"]["data"]["max_predictions_per_seq"],
            second["config"]["data"]["max_predictions_per_seq"]) == (10, 20)
    ckpt = torch.load(two / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    # AdamW's own step count: 10 only if phase 2 started from phase 1's 6 (a fresh optimizer would say 4)
    assert {int(s["step"]) for s in ckpt["optimizer_states"][0]["state"].values()} == {10}
    assert ckpt["lr_schedulers"][0]["last_epoch"] == 10
    assert load_checkpoint(two / "checkpoints" / "last.ckpt").vocab == load_checkpoint(last).vocab  # same ids
    # one schedule across both phases: warm-up over 2 steps, then linear decay reaching 0 at step 10
    expected = {s: 5e-4 * ((s + 1) / 2 if s < 2 else (10 - s) / 8) for s in range(10)}
    # (the values in the order they were used: after the resume, the logger labels phase 2's steps one too
    # high, 7..10 for 6..9 - a known logging-label issue, the optimizer and scheduler states above are exact)
    phase1, phase2 = _lr_by_step(one), _lr_by_step(two)
    assert sorted(phase1) == list(range(6)) and len(phase2) == 4
    used = [phase1[s] for s in sorted(phase1)] + [phase2[s] for s in sorted(phase2)]
    assert used == pytest.approx([expected[s] for s in range(10)])
    # checkpoints every 3 steps of phase 1 (Figure 4), each loadable as init=
    assert sorted(p.name for p in (one / "checkpoints").glob("step-*.ckpt")) == ["step-3.ckpt", "step-6.ckpt"]
    assert (load_checkpoint(one / "checkpoints" / "step-3.ckpt").config.vocab_size
            == first["model_config"]["vocab_size"])
    # phase 2 refuses to start from anything but the end of phase 1
    early = one / "checkpoints" / "step-3.ckpt"
    proc = train("experiment=pretrain_phase2", *scale, f"ckpt_path={early}",
                 f"hydra.run.dir={tmp_path / 'wrong'}")
    assert proc.returncode == 2 and "resumes at step 3; phase 2 starts at step 6" in proc.stdout + proc.stderr
    # nor with a vocabulary of the same size whose words have other ids: refused, naming both files
    words = load_checkpoint(last).vocab
    other = tmp_path / "vocab.txt"
    other.write_text("\n".join(words[:-2] + [words[-1], words[-2]]) + "\n")
    proc = train("experiment=pretrain_phase2", *scale, f"ckpt_path={last}", f"data.tokenizer={other}",
                 f"hydra.run.dir={tmp_path / 'other_vocab'}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-3000:]
    assert (f"ckpt_path={last} was trained with another vocabulary than this run's "
            f"(data.tokenizer={other})") in said
    assert not (tmp_path / "other_vocab" / "results.json").exists()
    # the same phase-2 command again: phase 2 is complete, so it is finished (finished.py), not run again
    before = (two / "results.json").read_text()
    proc = train("experiment=pretrain_phase2", *scale, f"ckpt_path={last}", f"hydra.run.dir={two}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "is finished (results.json complete, same settings)" in proc.stdout + proc.stderr
    assert (two / "results.json").read_text() == before


def test_phase_two_needs_phase_one(tmp_path):
    proc = train("experiment=pretrain_phase2", f"hydra.run.dir={tmp_path}", timeout=120)
    assert proc.returncode != 0 and "ckpt_path" in proc.stdout + proc.stderr
    assert not (tmp_path / "results.json").exists()


def test_paper_scale_two_phase_and_corpus_configs():
    """What the paper-scale commands compose to: v2 A.2's lengths and steps, §3.4's corpus from the Hub."""
    from bert_repro.data.hub import hub_spec

    from .test_config import compose_cfg, resolved

    one = resolved(compose_cfg(["experiment=pretrain_phase1", "scale=paper"]))
    two = resolved(compose_cfg(["experiment=pretrain_phase2", "scale=paper",
                                "ckpt_path=/runs/phase1/last.ckpt"]))
    assert (one["data"]["max_seq_length"], one["data"]["max_predictions_per_seq"]) == (128, 20)
    assert (two["data"]["max_seq_length"], two["data"]["max_predictions_per_seq"]) == (512, 80)
    assert (one["optim"]["max_steps"], one["optim"]["schedule_steps"]) == (900_000, 1_000_000)
    assert (two["optim"]["max_steps"], two["optim"]["schedule_steps"], two["optim"]["resume_step"]) == \
        (1_000_000, 1_000_000, 900_000)
    assert two["data"]["tokenizer"] == "/runs/phase1/last.ckpt" and two["optim"]["warmup_steps"] == 10_000
    for cfg in (one, two):
        assert (900_000 % cfg["optim"]["val_check_interval"] == 0
                == 1_000_000 % cfg["optim"]["val_check_interval"])
    assert one["data"]["source"] == "hub"
    specs = [hub_spec(entry) for entry in one["data"]["hub"]]  # every entry is well-formed
    assert [(s["path"], s["format"]) for s in specs] == [("wikimedia/wikipedia", "wiki"),
                                                         ("bookcorpus/bookcorpus", "sentences")]
