"""W&B runs carry the resolved config, results.json as their summary, a name that tells a sweep's jobs
apart and their sweep's group. wandb runs for real, offline; its ``init`` is wrapped at the boundary to read
back what the run held when it finished."""

import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from bert_repro.tracking import GROUP_ENV, SWEEP_ENV, logger_kwargs, sweep_group, wandb_group, wandb_run_name

from .conftest import REPO

DRIVER = """
import json, pathlib, runpy, sys
import wandb

record, real_init = [], wandb.init


def init(*args, **kwargs):
    run = real_init(*args, **kwargs)
    real_finish = run.finish

    def finish(*a, **k):
        files = sorted(p.name for p in pathlib.Path(run.dir).iterdir())
        record.append({"name": run.name, "group": run.group, "offline": run.offline,
                       "config": dict(run.config), "summary": run.summary._as_dict(), "files": files})
        return real_finish(*a, **k)

    run.finish = finish
    return run


wandb.init = init
out, sys.argv = sys.argv[1], [sys.argv[2], *sys.argv[3:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    open(out, "w").write(json.dumps(record, default=str))
"""


@pytest.mark.slow
def test_a_sweeps_runs_carry_config_results_their_names_and_one_group(tmp_path, minilm_dir):
    driver, record = tmp_path / "driver.py", tmp_path / "record.json"
    driver.write_text(DRIVER)
    sweep = tmp_path / "sweep"
    args = ["-m", "task=mrpc", "model=tiny", f"data.tokenizer={minilm_dir / 'vocab.txt'}", "seed=7",
            "optim.lr=1e-3,2e-3",
            "data.max_train_examples=16", "optim.max_steps=2", "optim.limit_val_batches=1", "logger=wandb",
            "trainer.enable_progress_bar=false", f"paths.cache_dir={tmp_path / 'cache'}",
            f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    for name in (GROUP_ENV, SWEEP_ENV):  # a table's or an earlier sweep's group
        env.pop(name, None)
    proc = subprocess.run([sys.executable, str(driver), str(record), str(REPO / "src" / "train.py"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = json.loads(record.read_text())
    folders = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/results.json")}
    # each job's name is the task, the model and its folder's name, which carries the swept lr
    assert sorted(r["name"] for r in runs) == sorted(f"mrpc/tiny/{name}" for name in folders)
    assert {"optim.lr-0.001", "optim.lr-0.002"} == {k for r in runs for k in r["name"].split("+")
                                                     if k.startswith("optim.lr")}
    assert {r["group"] for r in runs} == {sweep_group(str(sweep), args[1:])}  # one group, this sweep's
    run, results = runs[0], folders[runs[0]["name"].rsplit("/", 1)[1]]
    assert run["offline"]
    cfg = run["config"]["cfg"]  # the resolved Hydra config, not only the module's hyper-parameters
    assert cfg["seed"] == 7 and cfg["task"]["name"] == "mrpc" and cfg["data"]["max_train_examples"] == 16
    summary = run["summary"]
    assert summary["status"] == "complete" and summary["global_step"] == 2
    assert summary["metrics"]["final"]["val/f1"] == results["metrics"]["final"]["val/f1"]
    assert "results.json" in run["files"]


def test_sweeps_that_share_a_task_folder_get_groups_of_their_own():
    lrs = sweep_group("multirun/mrpc", ["task=mrpc", "optim.lr=5e-5,3e-5"])
    assert lrs.startswith("multirun/mrpc#") and lrs != sweep_group("multirun/mrpc", ["task=mrpc", "seed=1,2"])
    # the same science on other hardware is the same sweep, in the same folders: rerun, it continues its group
    assert lrs == sweep_group("multirun/mrpc", ["optim.lr=5e-5,3e-5", "trainer=gpu", "task=mrpc"])


def test_wandb_run_name_is_task_model_and_run_folder():
    assert wandb_run_name("mrpc", "L4_H256_A4", "optim.lr-5e-05") == "mrpc/L4_H256_A4/optim.lr-5e-05"
    assert wandb_run_name("mrpc", None, "default") == "mrpc/default"


def test_group_comes_from_the_table_runner_then_the_sweep(monkeypatch):
    monkeypatch.setenv(GROUP_ENV, "table5-smoke")
    assert wandb_group() == "table5-smoke"
    monkeypatch.delenv(GROUP_ENV)
    assert wandb_group() is None  # a single run outside a sweep: no group


def test_only_the_wandb_logger_gets_the_config():
    cfg = OmegaConf.create({"seed": 1, "x": "${seed}"})
    wandb_cfg = OmegaConf.create({"_target_": "lightning.pytorch.loggers.WandbLogger", "group": "mine"})
    assert logger_kwargs(wandb_cfg, cfg) == {"config": {"cfg": {"seed": 1, "x": 1}}, "group": "mine"}
    # the run's name, with the shape that ran (run.py), unless the logger's config names it
    assert logger_kwargs(wandb_cfg, cfg, name="mrpc/base/default")["name"] == "mrpc/base/default"
    named = OmegaConf.merge(wandb_cfg, {"name": "theirs"})
    assert logger_kwargs(named, cfg, name="mrpc/base/default")["name"] == "theirs"
    assert logger_kwargs(OmegaConf.create({"_target_": "lightning.pytorch.loggers.CSVLogger"}), cfg) == {}

