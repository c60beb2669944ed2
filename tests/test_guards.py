"""Numerical guards and failing sweeps: a diverged run stops at the step that went non-finite, keeps its last
good checkpoint and is marked failed (never a number); a sweep goes on past a failed job, and the selection
tool shows the failed cell with its reason; collapsed fine-tuning runs are flagged."""

import json

import pytest
import torch

from bert_repro import selection
from bert_repro.lifecycle.reliability import safe_load

from .conftest import run_py
from .test_resume import PRETRAIN, command, run

DIVERGES = "optim.lr=1e30"  # Adam's steps are ~lr in size: the weights overflow within two steps
SHORT = [o for o in PRETRAIN if not o.startswith("optim.max_steps=")] + ["optim.max_steps=6"]


@pytest.mark.e2e
def test_non_finite_loss_stops_keeps_last_good_checkpoint_and_fails_the_run(tmp_path):
    out = tmp_path / "diverged"
    proc = run(command(out, tmp_path / "cache", *SHORT, DIVERGES))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 3 and "Traceback" not in output, output[-3000:]
    assert "training loss is nan at step 2 (epoch 0, batch 1)" in output
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "failed" and "at step 2" in results["reason"]
    assert results["metrics"]["final"] == {}  # no number from a diverged run
    last = safe_load(out / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 1  # the step before the loss went non-finite, not the diverged weights
    assert all(torch.isfinite(t).all() for t in last["state_dict"].values())


@pytest.mark.e2e
def test_sweep_goes_on_past_a_failed_job_and_selection_marks_it(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    proc = run_py("-m", *SHORT, "optim.lr=5e-4,1e30,1e-3", f"paths.cache_dir={tmp_path / 'cache'}",
                  f"hydra.sweep.dir={sweep}", timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]  # the sweep reports its failure, after every job ran
    results = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/results.json")}
    status = {r["config"]["optim"]["lr"]: r["status"] for r in results.values()}
    assert status == {5e-4: "complete", 1e30: "failed", 1e-3: "complete"}  # the job after the failure ran too
    failed_dir = next(d for d, r in results.items() if r["status"] == "failed")
    assert "optim.lr-1e30" in failed_dir  # folders named by the command, not the clock

    assert selection.main([str(sweep)]) == 0
    summary = json.loads((sweep / "selection.json").read_text())
    (entry,) = summary["selection"]
    assert entry["runs"] == 2 and entry["failed"][0]["dir"] == str(sweep / failed_dir)
    assert "training loss is nan at step 2" in entry["failed"][0]["reason"]
    text = (sweep / "selection.md").read_text()
    assert f"- {sweep / failed_dir}: NonFiniteLoss: training loss is nan at step 2" in text


def test_a_setting_whose_runs_all_failed_is_a_cell_with_its_reason(tmp_path):
    folder = tmp_path / "rte_lr=1"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({
        "status": "failed", "reason": "NonFiniteLoss: training loss is inf at step 7", "task": "rte",
        "model": "base",
        "ablation": "none", "scale": "smoke", "init": None, "seed": 1, "monitor": "val/acc",
        "metrics": {"final": {}}, "config": {"task": {"monitor_mode": "max"}}}))
    failed: list = []
    runs, _ = selection.load_runs([tmp_path], failed=failed)
    (entry,) = selection.select(runs, failed=failed)
    assert runs == [] and entry["selected"] is None and entry["failed"][0]["reason"].endswith("at step 7")
    assert "failed: NonFiniteLoss: training loss is inf at step 7" in selection.render([entry], [], [], False)


def test_collapse_is_flagged_in_results_and_by_selection(tmp_path):
    """results.json carries `degenerate` (scores.degenerate_reason), and the selection tool passes the run
    over."""
    from bert_repro.scores import degenerate_reason

    collapsed = {"val/acc": 0.53, "val/top_class_share": 1.0}
    assert degenerate_reason(collapsed)
    for name, final in (("collapsed", collapsed), ("healthy", {"val/acc": 0.51, "val/top_class_share": 0.6})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({
            "status": "complete", "task": "rte", "model": "base", "ablation": "none", "scale": "smoke",
            "init": None,
            "seed": 1, "monitor": "val/acc", "metrics": {"final": final},
            "degenerate": degenerate_reason(final),
            "config": {"task": {"monitor_mode": "max"},
                       "optim": {"lr": 1e-5 if name == "healthy" else 2e-5}}}))
    (entry,) = selection.select(selection.load_runs([tmp_path])[0])
    assert entry["selected"].endswith("healthy") and entry["degenerate"][0]["dir"].endswith("collapsed")
