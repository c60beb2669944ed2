"""Figure 4's budget-scale plan rehearsed end to end on this CPU (ACTION=rehearse; a file of its own so that
the suite's two rehearsals run on two pytest-xdist workers at once)."""

import json

import pytest

from .helpers import rehearse


@pytest.mark.slow
def test_figure4_rehearses_at_budget_scale(tmp_path, monkeypatch, shared_data):
    """The whole plan by default: both two-phase pre-trainings, every point of the ten learning-rate grids."""
    folder, cells, record = rehearse("figure4", "budget", tmp_path, monkeypatch)
    assert record["divisor"] == 50_000 and record["runs"] == record["rehearsed_jobs"] == 4 + 2 * 5 * 3
    assert all(c["status"] == "ok" for c in cells if c["row"] in ("mlm", "ltr")) and len(cells) >= 10
    mnli = folder / "finetune" / "mlm" / "mnli_k200k"
    jobs = sorted(p.name for p in mnli.iterdir() if p.is_dir())
    assert jobs == [f"optim.lr-{lr}" for lr in ("2e-05", "3e-05", "5e-05")]
    phase1 = folder / "pretrain" / "mlm" / "phase1" / "default"
    assert sorted(p.name for p in (phase1 / "checkpoints").glob("step-*.ckpt")) == [
        f"step-{n}.ckpt" for n in sorted(range(2, 19, 2), key=str)]  # every 100k of 900k steps, / 50k
    two = json.loads((folder / "pretrain" / "mlm" / "default" / "results.json").read_text())
    assert two["global_step"] == 20 and two["config"]["data"]["max_seq_length"] == 512
    assert (folder / "pretrain" / "mlm" / "launch.log").stat().st_size > 0  # the child's output, kept
