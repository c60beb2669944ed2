"""Evaluate a checkpoint on a task's Dev set, and predict a file, without training (``src/evaluate.py``).

    python src/evaluate.py task=mrpc init=outputs/mrpc/default/checkpoints/best.ckpt
    python src/evaluate.py task=mrpc init=<ckpt> predict=my_pairs.tsv            # + predictions for a file
    python src/evaluate.py task=sst2 init=<ckpt> 'predict={path: a.csv, format: csv, columns: {text_a: text}}'

``init=`` is read as training reads it (pretrained.py). Our .ckpt of the same task brings its trained head;
any other checkpoint brings the encoder only, and the head stays random (results.json lists it under
``missing_heads``). results.json has the training run's format, with no steps taken.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from bert_repro.convert import LoadedCheckpoint, load_checkpoint, safe_torch_load
from bert_repro.metrics import degenerate_reason
from bert_repro.pretrained import model_name, model_on_command_line, model_shape, resolve_init
from bert_repro.results import floats, git_revision, print_results, write_results
from bert_repro.run import USER_ERRORS, UsageError, _plain, build_data, predict_test, resolve_vocab

log = logging.getLogger(__name__)


def restore(module: L.LightningModule, path: str, loaded: LoadedCheckpoint) -> list[str]:
    """The whole trained module when ``path`` is our checkpoint of this task (the same parameters and
    shapes), else the encoder (``load_pretrained``). Returns the heads left at random."""
    if Path(path).is_file() and Path(path).suffix == ".ckpt":
        state = safe_torch_load(path, what="a bert_repro Lightning checkpoint").get("state_dict", {})
        own = module.state_dict()
        if set(state) == set(own) and all(state[k].shape == own[k].shape for k in own):
            module.load_state_dict(state)
            return []
        log.warning("init=%s is not a checkpoint of task=%s: its encoder only", path,
                    module.hparams.get("task"))
    heads = module.load_pretrained(loaded)
    if heads:
        log.warning("evaluating with untrained %s: the numbers are a random head's", ", ".join(heads))
    return heads


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    start = time.time()
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if OmegaConf.is_missing(cfg, "init") or not cfg.init:
        raise UsageError(f"task={cfg.task.name}: evaluate needs init=<our .ckpt | Hub id | HF directory | "
                         "TF checkpoint>")
    init, init_path = resolve_init(cfg)
    L.seed_everything(cfg.seed, workers=True)
    loaded = load_checkpoint(init_path)
    vocab, lowercase = resolve_vocab(cfg, loaded)
    if cfg.predict is not None:  # the user's file as the test split, in the task's layout or column-mapped
        if "files" not in cfg.data:
            raise UsageError(f"predict={cfg.predict}: task={cfg.task.name} takes no files to predict; "
                             "GLUE-style tasks do")
        with open_dict(cfg):
            cfg.data.files = {**_plain(cfg.data.files), "test": _plain(cfg.predict)}
    datamodule = build_data(cfg, vocab, lowercase, int(cfg.data.batch_size))
    datamodule.prepare_tokenizer()

    explicit = model_on_command_line()
    model_cfg = model_shape({**_plain(cfg.model), "vocab_size": len(vocab)}, loaded.config, explicit)
    module = instantiate(cfg.module, model=model_cfg, optim=_plain(cfg.optim), vocab=vocab,
                         lowercase=lowercase, _convert_="all")
    missing_heads = restore(module, init_path, loaded)

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
    results = {
        "status": "complete", "mode": "evaluate", "task": cfg.task.name,
        "model": model_name(_plain(cfg.model), model_cfg, explicit), "model_config": model_cfg,
        "ablation": cfg.ablation.name, "scale": cfg.scale.name, "seed": cfg.seed, "init": init,
        "resumed_from": None, "missing_heads": missing_heads, "predict_majority": False,
        "monitor": cfg.task.monitor,
        "metrics": {"final": final, "best": {cfg.task.monitor: final.get(cfg.task.monitor)},
                    "best_checkpoint": None, "per_epoch": None},
        "degenerate": degenerate_reason(final),
        "data_sizes": {split: len(d) for split, d in getattr(datamodule, "datasets", {}).items()} or None,
        "test_predictions": predictions or None,
        "global_step": 0, "global_batch": int(cfg.data.batch_size),
        "per_device_batch": int(cfg.data.batch_size),
        "accumulation": 1, "world_size": 1, "tokens_per_s": None, "sequences_per_s": None, "perf": None,
        "wall_time_s": round(time.time() - start, 2), "wall_time_attempt_s": round(time.time() - start, 2),
        "resumes": 0, "tokens_trained": 0, "flops_trained": 0.0,
        "git": git_revision(), "config": _plain(cfg),
    }
    write_results(output_dir / "results.json", results)
    print_results(results)
    if predictions:
        log.info("predictions: %s", ", ".join(predictions.values()))
    return results


def main(cfg: DictConfig) -> float | None:
    try:
        results = evaluate(cfg)
    except USER_ERRORS as err:  # a wrong input: a message naming it, exit 2, earlier results untouched
        if os.environ.get("BERT_REPRO_TRACEBACK"):
            raise
        log.error("%s (set BERT_REPRO_TRACEBACK=1 for the traceback)", err)
        raise SystemExit(2) from None
    return results["metrics"]["final"].get(cfg.task.monitor)

