"""W&B runs carry the resolved config, results.json as their summary, a name that tells a sweep's jobs
apart and their sweep's group. wandb runs for real, offline; its ``init`` is wrapped at the boundary to read
back what the run held when it finished."""

import json
import os
import sys

import pytest
from omegaconf import OmegaConf

from bert_repro.lifecycle.tracking import (
    GROUP_ENV,
    SWEEP_ENV,
    SweepGroup,
    logger_kwargs,
    sweep_group,
    wandb_group,
    wandb_run_name,
)

from .conftest import REPO
from .helpers import ended, started

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
    log = tmp_path / "output.log"
    code, output = ended(started([sys.executable, str(driver), str(record), str(REPO / "src" / "train.py"),
                                  *args], log, env=env), log)
    assert code == 0, output[-6000:]
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


def test_the_sweep_group_is_set_when_an_override_holds_an_interpolation(monkeypatch):
    """A table's sweep passes data.files.train={path:${paths.shared_data}/...}: before any job, Hydra's
    runtime (which paths.shared_data reads) is not set, so the overrides are read as typed, unresolved."""
    monkeypatch.delenv(SWEEP_ENV, raising=False)
    override = "data.files.train={path:${paths.shared_data}/glue/RTE/train.tsv}"
    config = OmegaConf.create({"paths": {"shared_data": "${hydra:runtime.cwd}/../shared/data"},
                               "hydra": {"sweep": {"dir": "multirun/rte"},
                                         "overrides": {"task": ["task=rte", override]}}})
    SweepGroup().on_multirun_start(config)
    assert os.environ[SWEEP_ENV] == sweep_group("multirun/rte", ["task=rte", override])


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



@pytest.mark.slow
def test_tensorboard_and_mlflow_hold_the_config_and_the_final_metrics(tmp_path):
    """Lightning's own TensorBoard and MLflow loggers from conf/logger/, through a short fit: the resolved
    config as hyper-parameters, results.json's final metrics and the file (MLflow) at the end."""
    import lightning as L
    from hydra import compose, initialize_config_dir
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from bert_repro.lifecycle.tracking import close_loggers, instantiate_logger

    from .conftest import CONF
    from .test_progress import Tiny, loader

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[
            "task=mrpc", "logger=[tensorboard,mlflow]", "seed=7",
            f"logger.mlflow.tracking_uri=file:{tmp_path}/mlruns",
            *(f"paths.{key}={tmp_path / key}" for key in ("output_dir", "cache_dir", "shared_data"))])
    out = tmp_path / "output_dir"
    tb, ml = (instantiate_logger(cfg.logger[name], cfg) for name in ("tensorboard", "mlflow"))
    trainer = L.Trainer(max_steps=2, logger=[tb, ml], enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, default_root_dir=out)
    trainer.fit(Tiny(), loader())
    out.mkdir(exist_ok=True)
    results = {"status": "complete", "global_step": 2, "metrics": {"final": {"val/f1": 0.8125}}, "config": {}}
    (out / "results.json").write_text(json.dumps(results))
    close_loggers([tb, ml], results, out / "results.json")

    events = EventAccumulator(str(out / "tensorboard")).Reload()
    assert [e.value for e in events.Scalars("final/val/f1")] == [0.8125]
    text = events.Tensors("results.json/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads(text.strip("`\n"))["metrics"]["final"] == {"val/f1": 0.8125}
    hparams = OmegaConf.load(out / "tensorboard" / "hparams.yaml")
    assert hparams.cfg.seed == 7 and hparams.cfg.task.name == "mrpc"
    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    run = client.get_run(ml.run_id)
    assert run.data.params["cfg/seed"] == "7" and run.data.params["cfg/task/name"] == "mrpc"
    assert run.data.metrics["final/val/f1"] == 0.8125 and run.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(ml.run_id)] == ["results.json"]


@pytest.mark.slow
def test_an_offline_wandb_run_keeps_its_config_and_summary_readable(good):
    """The good run logged to W&B offline: beside the binary .wandb file, its resolved config as YAML and
    results.json less the config as JSON, the same as the run folder's."""
    _, out, _, _ = good
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and len(list(runs[0].glob("*.wandb"))) == 1, runs
    results = json.loads((out / "results.json").read_text())
    config = OmegaConf.to_container(OmegaConf.load(runs[0] / "config.yaml"))
    assert config == results["config"] and config["optim"]["max_steps"] == 4
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary == {k: v for k, v in results.items() if k != "config"} and summary["status"] == "complete"
