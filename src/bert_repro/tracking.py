"""W&B carries the whole run: the resolved Hydra config at its start, results.json as its summary at its end,
and a group that gathers a sweep's (or a table's) runs. Offline by default (conf/logger/wandb.yaml).

Groups: ``BERT_REPRO_WANDB_GROUP`` when set (a table runner sets it to the table's name, the group its
collected table is logged in: tables.render.log_wandb), else a multirun's sweep folder, else none.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

GROUP_ENV = "BERT_REPRO_WANDB_GROUP"
WANDB_LOGGER = "lightning.pytorch.loggers.WandbLogger"


def wandb_group() -> str | None:
    """The runs' group: the table runner's (env), or the multirun sweep's folder, the same for every job."""
    if os.environ.get(GROUP_ENV):
        return os.environ[GROUP_ENV]
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return str(HydraConfig.get().sweep.dir)
    return None


def logger_kwargs(logger_cfg: DictConfig, cfg: DictConfig) -> dict[str, Any]:
    """What a logger's config cannot say itself: for W&B, the run's resolved config and its group."""
    if logger_cfg.get("_target_") not in (WANDB_LOGGER, "lightning.pytorch.loggers.wandb.WandbLogger"):
        return {}
    # under its own key: the module's hyper-parameters, logged at fit start, reuse names like "task"
    kwargs: dict[str, Any] = {"config": {"cfg": OmegaConf.to_container(cfg, resolve=True)}}
    group = logger_cfg.get("group") or wandb_group()
    if group:
        kwargs["group"] = group
    return kwargs


def instantiate_logger(logger_cfg: DictConfig, cfg: DictConfig) -> Any:
    """The logger of ``logger_cfg`` (conf/logger/), given what ``logger_kwargs`` adds (``config`` is also the
    first argument of Hydra's instantiate, hence the partial)."""
    from hydra.utils import instantiate

    return instantiate(logger_cfg, _partial_=True)(**logger_kwargs(logger_cfg, cfg))


def close_loggers(loggers: list[Any], results: dict[str, Any] | None = None,
                  results_file: Path | None = None) -> None:
    """Finish every W&B run, with ``results`` (results.json, less the config it already has) as its summary;
    called on failure too (no results), so one failed run does not leave a sweep's next run attached to it."""
    for logger in loggers:
        run = getattr(logger, "experiment", None) if hasattr(logger, "experiment") else None
        if run is None or not hasattr(run, "finish"):
            continue
        try:
            if results is not None and hasattr(run, "summary"):
                run.summary.update({k: v for k, v in results.items() if k != "config"})
                if results_file is not None and results_file.is_file() and hasattr(run, "save"):
                    run.save(str(results_file), base_path=str(results_file.parent), policy="end")
        finally:
            run.finish()
