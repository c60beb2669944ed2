"""Figure 4's budget-scale plan rehearsed end to end on this CPU (ACTION=rehearse; a file of its own so that
the suite's two rehearsals run on two pytest-xdist workers at once)."""

import json

import pytest

from .helpers import assert_plan_holds, rehearse

# 500k (phase 1's step-10.ckpt) and 1M (phase 2's last.ckpt): 200k, 600k and 800k are other step checkpoints
# of the same phase, fine-tuned the way 500k is
OTHER_STEPS = [f"--set=columns.{column}=null" for column in ("k200k", "k600k", "k800k")]


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory, shared_data):
    """Both two-phase pre-trainings and MNLI from a checkpoint of each phase, each learning-rate grid's first
    point (GRID=first; every point of a grid runs in the table5_demo tests)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return rehearse("figure4", "budget", tmp_path_factory.mktemp("figure4"), monkeypatch,
                        "--rehearse-grid", "first", *OTHER_STEPS)


@pytest.mark.slow
def test_figure4_rehearses_at_budget_scale(rehearsed):
    folder, cells, record = rehearsed
    assert record["divisor"] == 50_000 and record["runs"] == 4 + 2 * 2 * 3
    assert record["rehearsed_jobs"] == 4 + 2 * 2 and record["planned_s"] > 0
    assert {(c["row"], c["column"], c["status"]) for c in cells} == {
        (row, column, "ok") for row in ("mlm", "ltr") for column in ("k500k", "k1m")}
    mnli = folder / "finetune" / "mlm" / "mnli_k500k"
    jobs = sorted(p.name for p in mnli.iterdir() if p.is_dir())
    assert len(jobs) == 1 and jobs[0].startswith("optim.lr-")  # the grid's first point
    store = sorted(folder.parents[1].glob("pretrain/steps-over-50000/budget/*"))  # MLM's and LTR's
    assert len(store) == 2 and all(s.name.startswith("L12_H768_A12-") for s in store)
    assert sorted(p.name for p in (store[0] / "phase1" / "default" / "checkpoints").glob("step-*.ckpt")) == [
        f"step-{n}.ckpt" for n in sorted(range(2, 19, 2), key=str)]  # every 100k of 900k steps, / 50k
    two = json.loads((store[0] / "default" / "results.json").read_text())
    assert two["global_step"] == 20 and two["config"]["data"]["max_seq_length"] == 512
    assert (store[0] / "launch.log").stat().st_size > 0  # the child's output, kept


@pytest.mark.slow
def test_figure4_cpu_plan_holds_within_125x(rehearsed):
    folder, _, record = rehearsed
    assert_plan_holds(record, folder)
