"""Where a table's sweeps run: the local launcher shares a node's GPUs and cores out among the sweeps it runs
side by side (each sweep's process sees its own CUDA_VISIBLE_DEVICES); explicit settings win over defaults.
The plan's wall time: its runs packed onto the GPUs there are, each after the pre-training it starts from."""

import json
import sys

import pytest

from bert_repro.tables import plan as planning
from bert_repro.tables import runner
from bert_repro.tables.plan import make_plan
from bert_repro.tables.spec import build

from .test_tables import write_results

ONE_TASK = ["columns.mnli_m_acc=null", "columns.sst2_acc=null", "columns.squad_v1_f1=null",
            "columns.qnli_acc=null"]  # three pre-trainings, then four fine-tuning sweeps of one job each
# a run's stand-in: it records the devices it was given and when it ran
RECORD = ("import json, os, sys, time; start = time.time(); time.sleep(0.4); json.dump({'devices': "
          "os.environ.get('CUDA_VISIBLE_DEVICES'), 'start': start, 'end': time.time()}, "
          "open(sys.argv[1], 'w'))")


@pytest.mark.parametrize(("block", "cores", "expected"), [
    ({}, 8, (8, 1, [None] * 8)),  # a sweep a core
    ({"threads": 2}, 8, (4, 2, [None] * 4)),
    ({"sweeps_at_once": 2}, 8, (2, 4, [None] * 2)),  # the cores shared out among the sweeps
    ({"sweeps_at_once": 3, "threads": 5}, 8, (3, 5, [None] * 3)),  # explicit settings win
    ({"gpus": [0, 1, 2, 3]}, 16, (4, 4, ["0", "1", "2", "3"])),  # a sweep a GPU
    ({"gpus": [0, 1, 2, 3, 4, 5, 6, 7], "sweeps_at_once": 4}, 16, (4, 4, ["0,1", "2,3", "4,5", "6,7"])),
    ({"gpus": [0, 1], "sweeps_at_once": 4}, 4, (4, 1, ["0", "1", "0", "1"])),  # two sweeps share a GPU
    (None, 8, (1, None, [None])),  # no launcher block (a rehearsal): one sweep at a time, torch's threads
    ({"common": {"hydra/launcher": "submitit_slurm"}}, 8, (1, None, [None])),  # SLURM places its own
])
def test_the_local_launcher_fills_what_is_unset_from_the_cores_and_gpus(monkeypatch, block, cores, expected):
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: set(range(cores)))
    launcher, devices = runner.slots(block)
    assert (int(launcher.get("sweeps_at_once") or 1), launcher.get("threads"), devices) == expected


@pytest.mark.slow
def test_each_sweep_side_by_side_sees_its_own_gpu(tmp_path, monkeypatch):
    """GPUS=0,1,2,3: four sweeps at once, never two on one GPU at the same time, each on one GPU alone."""
    table = build("table5", "smoke", tmp_path / "runs", sets=ONE_TASK)
    real_launch = runner._launch

    def command(sweep, swept, launcher):
        return [sys.executable, "-c", RECORD, str(sweep.folder / "seen.json")]

    def launch(sweep, swept, launcher, dry_run=False):  # the real launch of the stand-in, then its results
        code, output = real_launch(sweep, swept, launcher)
        for _, folder in sweep.jobs():
            write_results(folder, sweep.overrides["task"], {"val/acc": 0.7})
            if sweep.stage == "pretrain":
                (folder / "checkpoints").mkdir()
                (folder / "checkpoints" / "last.ckpt").write_bytes(b"ckpt")
        return code, output

    monkeypatch.setattr(runner, "command", command)
    monkeypatch.setattr(runner, "_launch", launch)
    monkeypatch.setattr(runner, "sweep_costs", lambda plan: {})
    runner.run_table(table, {"gpus": [0, 1, 2, 3]}, plan={"runs": []})
    seen = [json.loads((s.folder / "seen.json").read_text()) for s in table.sweeps.values()]
    assert sorted({s["devices"] for s in seen}) == ["0", "1", "2", "3"]
    overlapping = [(a, b) for i, a in enumerate(seen) for b in seen[i + 1:]
                   if a["start"] < b["end"] and b["start"] < a["end"]]
    assert overlapping, "no two sweeps ran side by side"
    assert all(a["devices"] != b["devices"] for a, b in overlapping)


def test_the_plans_wall_time_is_the_schedule_worked_out_by_hand():
    """Two GPUs. P2 (1 GPU, 2 h) has the longest chain and starts first; P1 (2 GPUs, 1 h) waits for both,
    2 h to 3 h; its three fine-tunings (1 GPU, 0.5 h) follow two at a time: 3 to 3.5 h, then 3.5 to 4 h."""
    runs = [{"folder": "p1", "gpus": 2, "gpu_hours": 2.0, "after": None},
            {"folder": "p2", "gpus": 1, "gpu_hours": 2.0, "after": None},
            *({"folder": f"f{i}", "gpus": 1, "gpu_hours": 0.5, "after": "p1"} for i in range(3))]
    wall = planning.wall_time(runs, 2)
    assert (wall["wall_hours"], wall["critical_path_hours"], wall["busy"]) == (4.0, 2.0, 5.5 / 8)
    # four fine-tunings of 2 h on a quarter of a GPU each run at once after their pre-training, on one GPU
    shared = [{"folder": "p", "gpus": 1, "gpu_hours": 1.0, "after": None},
              *({"folder": f"f{i}", "gpus": 0.25, "gpu_hours": 0.5, "after": "p"} for i in range(4))]
    assert planning.wall_time(shared, 1)["wall_hours"] == 3.0
    # a run of more GPUs than there are takes them all, its GPU-hours spread over them
    wide = [{"folder": "p", "gpus": 32, "gpu_hours": 64.0, "after": None}]
    assert planning.wall_time(wide, 8)["wall_hours"] == 8.0


@pytest.mark.slow
def test_a_small_tables_wall_time_on_one_gpu_and_on_eight_and_a_fine_tunings_share(tmp_path):
    """Table 5 cut to one task: three pre-trainings, four fine-tunings after them. On one GPU the runs follow
    one another; on eight, the wall time is the longest pre-training + fine-tuning chain. At 0.25 of a GPU a
    fine-tuning is charged a quarter of its GPU-hours, its wall time unchanged."""
    table = build("table5", "smoke", tmp_path / "runs", sets=ONE_TASK)
    plan = make_plan(table, gpus=1)
    runs, hours = plan["runs"], {r["folder"]: r["gpu_hours"] for r in plan["runs"]}
    assert plan["wall"]["wall_hours"] == pytest.approx(sum(hours.values()))
    chains = [hours[str(s.needs.jobs()[0][1])] + hours[str(s.jobs()[0][1])] for s in table.sweeps.values()
              if s.needs is not None]
    assert planning.wall_time(runs, 8)["wall_hours"] == pytest.approx(max(chains))
    quarter = {r["folder"]: r for r in make_plan(table, share=0.25)["runs"]}
    for r in runs:
        share = 0.25 if r["kind"] == "finetune" else 1
        assert quarter[r["folder"]]["gpu_hours"] == pytest.approx(share * r["gpu_hours"])
        assert quarter[r["folder"]]["wall_hours"] == pytest.approx(r["wall_hours"])
