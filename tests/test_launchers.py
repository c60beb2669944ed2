"""Where a table's sweeps run: the local launcher shares a node's GPUs and cores out among the sweeps it runs
side by side (each sweep's process sees its own CUDA_VISIBLE_DEVICES); explicit settings win over defaults."""

import json
import sys

import pytest

from bert_repro.tables import runner
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
