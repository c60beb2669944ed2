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

import copy
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from bert_repro.lifecycle.checks import UsageError, check_writable, validate
from bert_repro.lifecycle.exits import run_ends
from bert_repro.lifecycle.results import floats, print_results
from bert_repro.network import set_deadline

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    import lightning as L

    from bert_repro.lifecycle.build import build_data, build_module, predict_test
    from bert_repro.lifecycle.record import RunRecord
    from bert_repro.lifecycle.run import run_result
    from bert_repro.lifecycle.spec import read_spec

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
        cfg = copy.deepcopy(cfg)  # the composed config stays as Hydra made it
        with open_dict(cfg):
            test = OmegaConf.to_container(cfg.predict)
            cfg.data.files = {**OmegaConf.to_container(cfg.data.files), "test": test}
    L.seed_everything(cfg.seed, workers=True)
    spec = read_spec(cfg, training=False)
    datamodule = build_data(spec)
    module, weights = build_module(spec, datamodule, training=False)
    if weights["missing_heads"]:
        log.warning("evaluating with untrained %s: the numbers are a random head's",
                    ", ".join(weights["missing_heads"]))

    trainer = instantiate(cfg.trainer, devices=1, num_nodes=1, strategy="auto", logger=False,
                          enable_checkpointing=False, limit_val_batches=cfg.optim.limit_val_batches,
                          default_root_dir=str(output_dir), callbacks=[RunRecord(start)])
    dev = trainer.validate(module, datamodule=datamodule, verbose=False)  # one dict per dev set (MNLI: two)
    final = floats({k: v for d in dev for k, v in d.items()})
    predictions = {}
    if cfg.predict is not None or cfg.test:
        if not datamodule.writes_predictions:
            raise UsageError(f"task={cfg.task.name} has no prediction files")
        predictions = predict_test(trainer, module, datamodule, output_dir / "predictions")
    results = run_result(spec, trainer, module, datamodule, final, predictions, weights, mode="evaluate")
    spec.folder.write(asdict(results))
    print_results(asdict(results))
    if predictions:
        log.info("predictions: %s", ", ".join(predictions.values()))
    return asdict(results)


def main(cfg: DictConfig) -> float | None:
    with run_ends(cfg, record=False):  # as a run: one process per folder, each failure named, no record
        validate(cfg)
        set_deadline(cfg.network.timeout_s)
        check_writable(Path(cfg.paths.output_dir), Path(cfg.paths.cache_dir))
        results = evaluate(cfg)
    return results["metrics"]["final"].get(cfg.task.monitor)
