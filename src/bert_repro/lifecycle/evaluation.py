"""Evaluate a checkpoint on a task's Dev set, and predict a file, without training (``src/evaluate.py``).

    python src/evaluate.py task=mrpc init=outputs/mrpc/default/checkpoints/best.ckpt
    python src/evaluate.py task=mrpc init=<ckpt> predict=my_pairs.tsv            # + predictions for a file
    python src/evaluate.py task=sst2 init=<ckpt> 'predict={path: a.csv, format: csv, columns: {text_a: text}}'

``init=`` is read as training reads it (run.setup_run). Our .ckpt of the same task and label set brings its
trained head; one fine-tuned on another task or label set is refused (identity.py); a checkpoint with no task
head (pre-training, the Hub's) brings the encoder only, and the head stays random (results.json lists it under
``missing_heads``). results.json has the training run's format (results.RunResult), with no steps taken.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from bert_repro.lifecycle.checks import TRACEBACK_HINT, check_writable
from bert_repro.lifecycle.folder import RunFolder
from bert_repro.lifecycle.locks import FolderInUse, RunFolderLock
from bert_repro.lifecycle.reliability import MachineFault, machine_faults_named
from bert_repro.lifecycle.results import RunResult, floats, print_results
from bert_repro.lifecycle.run import USER_ERRORS, UsageError, _plain, _sizes, predict_test, setup_run
from bert_repro.metrics import degenerate_reason

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    start = time.time()
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if OmegaConf.is_missing(cfg, "init") or not cfg.init:
        raise UsageError(f"task={cfg.task.name}: evaluate needs init=<our .ckpt | Hub id | HF directory | "
                         "TF checkpoint>")
    if cfg.predict is not None:  # the user's file as the test split, in the task's layout or column-mapped
        if "files" not in cfg.data:
            raise UsageError(f"predict={cfg.predict}: task={cfg.task.name} takes no files to predict; "
                             "GLUE-style tasks do")
        with open_dict(cfg):
            cfg.data.files = {**_plain(cfg.data.files), "test": _plain(cfg.predict)}
    run = setup_run(cfg, training=False)
    if run.missing_heads:
        log.warning("evaluating with untrained %s: the numbers are a random head's",
                    ", ".join(run.missing_heads))
    module, datamodule = run.module, run.datamodule

    trainer = instantiate(cfg.trainer, devices=1, num_nodes=1, strategy="auto", logger=False,
                          enable_checkpointing=False, limit_val_batches=cfg.optim.limit_val_batches,
                          default_root_dir=str(output_dir))
    dev = trainer.validate(module, datamodule=datamodule, verbose=False)  # one dict per dev set (MNLI: two)
    final = floats({k: v for d in dev for k, v in d.items()})
    predictions = {}
    if cfg.predict is not None or cfg.test:
        if not hasattr(datamodule, "write_predictions"):
            raise UsageError(f"task={cfg.task.name} has no prediction files")
        predictions = predict_test(trainer, module, datamodule, output_dir / "predictions")
    wall = round(time.time() - start, 2)
    results = RunResult(
        status="complete", mode="evaluate", task=cfg.task.name, model=run.model, model_config=run.model_cfg,
        identity=run.identity, ablation=cfg.ablation.name, scale=cfg.scale.name, seed=cfg.seed, init=run.init,
        missing_heads=run.missing_heads, init_head_dropped=run.init_head_dropped, monitor=cfg.task.monitor,
        metrics={"final": final, "best": {cfg.task.monitor: final.get(cfg.task.monitor)},
                 "best_checkpoint": None, "per_epoch": None},
        degenerate=degenerate_reason(final), data_sizes=_sizes(datamodule),
        test_predictions=predictions or None,
        global_batch=int(cfg.data.batch_size), per_device_batch=int(cfg.data.batch_size),
        wall_time_s=wall, wall_time_attempt_s=wall, config=_plain(cfg),
    )
    RunFolder(output_dir).write(asdict(results))
    print_results(asdict(results))
    if predictions:
        log.info("predictions: %s", ", ".join(predictions.values()))
    return asdict(results)


def main(cfg: DictConfig) -> float | None:
    output_dir, cache_dir = Path(cfg.paths.output_dir), Path(cfg.paths.cache_dir)
    places = {"hydra.run.dir": output_dir, "paths.cache_dir": cache_dir}
    try:  # as run.main: one process per folder, the machine's faults named
        with machine_faults_named(places), RunFolderLock(output_dir):
            check_writable(output_dir, cache_dir)
            results = evaluate(cfg)
    except FolderInUse as err:
        log.error("%s", err)
        raise SystemExit(2) from None
    except MachineFault as err:
        log.error("%s", err)
        raise SystemExit(74) from None  # EX_IOERR, as run.main
    except USER_ERRORS as err:  # a wrong input: a message naming it, exit 2, earlier results untouched
        if os.environ.get("BERT_REPRO_TRACEBACK"):
            raise
        log.error("%s %s", err, TRACEBACK_HINT)
        raise SystemExit(2) from None
    return results["metrics"]["final"].get(cfg.task.monitor)

