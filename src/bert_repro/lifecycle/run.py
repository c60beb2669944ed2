"""One run, top to bottom: from the config Hydra composed (src/train.py) to ``results.json`` in its folder.

``main`` says what happens before torch loads: every value is checked (checks.validate), and a finished run is
reported, not rerun (finished.py). ``train`` resolves the config once into a frozen RunSpec (spec.py), builds
the DataModule, the module and the Trainer from it (build.py, trainer.py), fits, validates the final weights
and writes the result. How a run ends when it cannot finish is exits.py's; where its files go, folder.py's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

from omegaconf import DictConfig

from bert_repro.lifecycle.checks import UsageError, validate
from bert_repro.lifecycle.exits import run_ends
from bert_repro.lifecycle.finished import config_summary, report_finished, scale_reads
from bert_repro.lifecycle.locks import is_launcher
from bert_repro.network import set_deadline

log = logging.getLogger(__name__)


def main(cfg: DictConfig) -> float | None:
    """src/train.py's task function; returns the task's monitored metric (what a Hydra sweeper optimises)."""
    with run_ends(cfg):
        validate(cfg)  # every value, range and relation, in seconds: before torch and Lightning load
        set_deadline(cfg.network.timeout_s)  # init= from the Hub, a task's Hub data
        if (done := report_finished(cfg)) is not None:  # its folder's result, same science: nothing rerun
            return done["metrics"]["final"].get(cfg.task.monitor)
        results = train(cfg)
    return results["metrics"]["final"].get(cfg.task.monitor)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Build data, model and trainer from ``cfg``, fit, validate the final weights, write results.json."""
    import lightning as L

    from bert_repro.lifecycle.build import build_data, build_module, check_resume
    from bert_repro.lifecycle.spec import read_spec
    from bert_repro.lifecycle.trainer import build_trainer

    start = time.time()
    if is_launcher():  # once: DDP's other ranks rerun the command
        log.info("%s", config_summary(cfg))
    L.seed_everything(cfg.seed, workers=True)
    spec = read_spec(cfg)  # resolved once, frozen: the resume, init=, the vocabulary, the shape, the science
    ckpt_path, resuming = spec.resume, spec.resuming
    optim = {**spec.config["optim"], **({"resume_step": None} if resuming else {})}  # own progress: no check
    datamodule = build_data(spec)
    module, weights = build_module(spec, datamodule, training=True, optim=optim)
    check_resume(ckpt_path, resuming, cfg, module.identity, module.vocab, spec.vocab_source)
    if cfg.test and not datamodule.writes_predictions:
        raise UsageError(f"test=true: task={spec.task} has no test predictions")
    trainer = build_trainer(spec, resume_strict=resuming, start=start)
    if ckpt_path is not None:
        log.info("resuming from %s", ckpt_path)
    aside = spec.folder.set_aside() if spec.fresh and ckpt_path is None and is_launcher() else None
    if aside is not None:
        log.info("a fresh start: the folder's earlier results and checkpoints moved to %s", aside)

    try:
        if not spec.majority:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        final, test_files = final_metrics(trainer, module, datamodule, spec)
    except BaseException as err:
        from bert_repro.lifecycle.tracking import close_loggers

        close_loggers(trainer.loggers)  # W&B: close a failed run too, so a sweep goes on
        # a fault before its first save leaves the earlier run standing; a kill or Ctrl-C leaves it set aside
        if isinstance(err, Exception) and aside is not None and spec.folder.restore(aside):
            log.info("the attempt wrote nothing of its own: the earlier results and checkpoints are back")
        raise
    results = run_result(spec, trainer, module, datamodule, final, test_files, weights)
    return finish(spec, trainer, results)


def final_metrics(trainer: Any, module: Any, datamodule: Any,
                  spec: Any) -> tuple[dict[str, float | None], dict[str, str]]:
    """Dev of the final weights (the fit's last evaluation when it was one), and the test predictions."""
    from bert_repro.lifecycle.build import predict_test, validated_last
    from bert_repro.lifecycle.results import floats

    if validated_last(trainer):  # Dev of the final weights was the fit's last evaluation: not again
        final = floats({k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")})
    elif spec.majority or not trainer.fast_dev_run:  # one dict per dev set (MNLI: matched, mismatched)
        final = floats({k: v for d in trainer.validate(module, datamodule=datamodule, verbose=False)
                        for k, v in d.items()})
    else:
        final = floats(trainer.callback_metrics)
    if trainer.interrupted or not spec.cfg.test or trainer.fast_dev_run:
        return final, {}
    return final, predict_test(trainer, module, datamodule, spec.folder.path / "test_predictions")


def run_result(spec: Any, trainer: Any, module: Any, datamodule: Any, final: dict[str, float | None],
               test_files: dict[str, str], weights: dict[str, Any], mode: str = "train") -> Any:
    """results.json's content, of a run or (``mode`` evaluate) of an evaluation: the spec's facts, the
    trainer's measurements over every attempt, the final metrics."""
    from bert_repro.lifecycle.build import callback, data_sizes
    from bert_repro.lifecycle.callbacks import Throughput
    from bert_repro.lifecycle.record import RunRecord
    from bert_repro.lifecycle.results import RunResult
    from bert_repro.scores import degenerate_reason

    cfg, monitor = spec.cfg, spec.monitor
    throughput = callback(trainer, Throughput)  # absent where a user removed it (~callbacks.throughput)
    totals = callback(trainer, RunRecord).totals()  # all attempts
    checkpoint = trainer.checkpoint_callback  # callbacks.best: the first ModelCheckpoint
    perf = throughput.summary() if throughput else None  # + model FLOP/s per device and MFU
    if perf is not None:  # what users wait for: this attempt's wall time, start-up included, spent in steps
        perf["step_share"] = round(throughput.step_s / max(totals["attempt_s"], 1e-9), 4)
    best = checkpoint.best_model_score if checkpoint is not None else None
    return RunResult(
        status="interrupted" if trainer.interrupted else "complete", mode=mode, task=spec.task,
        model=spec.model_name, ablation=cfg.ablation.name, scale=cfg.scale.name, seed=cfg.seed,
        init=spec.init, identity=module.identity, resumed_from=spec.resume, predict_majority=spec.majority,
        init_identity=spec.loaded.init_identity if spec.loaded is not None else None,
        monitor=monitor, **weights,
        metrics={"final": final,
                 "best": {monitor: float(best) if best is not None else None} if mode == "train"
                 else {monitor: final.get(monitor)},
                 "best_checkpoint": (checkpoint.best_model_path if checkpoint is not None else None) or None,
                 "per_epoch": getattr(module, "history", None) if mode == "train" else None},
        degenerate=None if spec.majority else degenerate_reason(final),  # e.g. collapsed onto one class
        data_sizes=data_sizes(datamodule), test_predictions=test_files or None,
        global_step=trainer.global_step, global_batch=int(cfg.data.batch_size),
        per_device_batch=spec.per_device, accumulation=spec.accumulation, world_size=trainer.world_size,
        tokens_per_s=throughput.tokens_per_s if throughput else None,
        sequences_per_s=throughput.sequences_per_s if throughput else None,
        perf=perf,
        wall_time_s=totals["wall_time_s"], wall_time_attempt_s=totals["attempt_s"], resumes=totals["resumes"],
        tokens_trained=totals["tokens"], flops_trained=totals["flops"], config=spec.config,
    )


def finish(spec: Any, trainer: Any, results: Any) -> dict[str, Any]:
    """results.json (rank 0), the checkpoints a complete run no longer needs deleted, the result printed,
    the loggers closed with it."""
    from bert_repro.lifecycle.callbacks import retain_checkpoints
    from bert_repro.lifecycle.results import print_results
    from bert_repro.lifecycle.tracking import close_loggers

    result = asdict(results)
    if trainer.is_global_zero:
        spec.folder.write(result)
        if results.status == "complete":  # the resumable state and step checkpoints served an unfinished run
            keep = spec.cfg.checkpoint
            if deleted := retain_checkpoints(spec.folder, keep.keep_last, keep.keep_steps):
                log.info("run complete: deleted %s (checkpoint.keep_last / checkpoint.keep_steps)",
                         ", ".join(p.name for p in deleted))
        print_results(result, scaled=scale_reads(spec.cfg))
    close_loggers(trainer.loggers, result, spec.folder.results)  # W&B: results.json as the summary
    return result
