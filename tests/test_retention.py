"""Checkpoint retention (conf/train.yaml checkpoint:): a complete fine-tune keeps a weights-only best.ckpt and
nothing resumable; an unfinished run keeps last.ckpt; pre-training's step checkpoints only where asked."""

import json

import pytest
import torch
from omegaconf import OmegaConf

from bert_repro.convert import load_checkpoint
from bert_repro.lifecycle.build import check_resume
from bert_repro.lifecycle.callbacks import retain_checkpoints
from bert_repro.lifecycle.checks import UsageError
from bert_repro.lifecycle.folder import RunFolder
from bert_repro.lifecycle.reliability import safe_load

from .conftest import train_py


def touch(folder, *names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"x")


def test_a_complete_run_keeps_best_and_the_steps_a_table_reads(tmp_path):
    run = RunFolder(tmp_path / "run")
    touch(run.checkpoints, "best.ckpt", "last.ckpt", "recent-3.ckpt", "step-100.ckpt", "step-200.ckpt",
          "step-x.ckpt")
    retain_checkpoints(run, keep_last=False, keep_steps=[200])
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["best.ckpt", "step-200.ckpt", "step-x.ckpt"]

    kept = RunFolder(tmp_path / "pretrain")  # pre-training: last.ckpt is the model; keep_steps=null keeps all
    touch(kept.checkpoints, "best.ckpt", "last.ckpt", "step-100.ckpt")
    assert retain_checkpoints(kept, keep_last=True, keep_steps=None) == []

    no_best = RunFolder(tmp_path / "no_best")  # never validated: last.ckpt is all the run has, so it stays
    touch(no_best.checkpoints, "last.ckpt")
    assert retain_checkpoints(no_best, keep_last=False, keep_steps=[]) == []


@pytest.mark.e2e
def test_finished_minilm_fine_tune_leaves_its_weights_once(tmp_path, minilm_dir, shared_data):
    """~1.1x the weights on disk, best.ckpt without AdamW moments, no last.ckpt; best.ckpt reads back as init=
    (what evaluation, export and fine-tuning use) and is refused as a resume point with a message."""
    out = tmp_path / "run"
    common = ["task=mrpc", f"init={minilm_dir}", "logger=none", "trainer.enable_progress_bar=false",
              "data.max_train_examples=8", "data.batch_size=8", "data.max_seq_length=32", "optim.epochs=1",
              "optim.limit_val_batches=1", f"paths.shared_data={shared_data}",
              f"paths.cache_dir={tmp_path / 'cache'}"]
    proc = train_py(*common, f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    best = out / "checkpoints" / "best.ckpt"
    assert results["status"] == "complete" and results["metrics"]["best_checkpoint"] == str(best)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["best.ckpt"]
    saved = safe_load(best)
    assert "optimizer_states" not in saved and saved["identity"]["task"] == "mrpc"

    weights = sum(t.numel() * t.element_size() for t in load_checkpoint(str(minilm_dir)).state_dict.values())
    on_disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert weights > 80e6 and on_disk <= 1.1 * weights, (on_disk, weights)
    loaded = load_checkpoint(str(best))
    assert loaded.vocab and torch.equal(loaded.state_dict["bert.embeddings.word_embeddings.weight"],
                                        saved["state_dict"]["model.bert.embeddings.word_embeddings.weight"])

    # ckpt_path=best.ckpt of the same run's settings: refused before training, not Lightning's KeyError
    with pytest.raises(UsageError, match=rf"ckpt_path={best} holds weights only.*init={best}"):
        check_resume(str(best), False, OmegaConf.create({"optim": {}}), saved["identity"])
