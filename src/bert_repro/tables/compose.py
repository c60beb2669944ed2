"""Hydra's composition of conf/ for the tables, cached once a process: table specs (spec.load_spec) and the
configs src/train.py composes for a table's runs (spec.build, schedule.schedule_of, plan). Below both spec and
schedule, which each compose runs."""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from bert_repro.tables import CONF_DIR

_COMPOSED: dict[tuple[str, ...], Any] = {}


def compose_once(config: str, args: list[str]):
    """conf/<config>.yaml composed with ``args`` (Hydra initialised by the caller: ``composing``), once a
    process: build, plan and rehearse compose the same runs again and again (a composition is ~0.5 s).
    Read-only, so no caller changes what another reads."""
    key = (str(CONF_DIR), config, *args)
    if key not in _COMPOSED:
        cfg = compose(config, overrides=list(args))
        OmegaConf.set_readonly(cfg, True)
        _COMPOSED[key] = cfg
    return _COMPOSED[key]


def compose_run(args: list[str]):
    """conf/train.yaml composed with a run's ``args`` (Hydra initialised by the caller), read-only: Hydra's
    own two steps, split where Hydra splits them, so runs that choose the same configs share the first. The
    overrides that choose configs (Hydra's test: the key names a config group) build the defaults list,
    once for all runs that share them; the rest are then set on it by Hydra's own function (as compose)."""
    parsed = OverridesParser.create().parse_overrides(list(args))
    repo = GlobalHydra.instance().config_loader().repository
    chooses = [o for o in parsed if repo.group_exists(o.key_or_group) and not isinstance(o.value(), dict)]
    base = compose_once("train", [o.input_line for o in chooses])
    values = [o for o in parsed if o not in chooses]
    if not values:
        return base
    cfg = copy.deepcopy(base)
    OmegaConf.set_readonly(cfg, False)
    ConfigLoaderImpl._apply_overrides_to_config(values, cfg)  # typed nodes refuse a wrong value here
    OmegaConf.set_readonly(cfg, True)
    return cfg


@contextmanager
def composing():
    """Hydra over conf/, for compose(): table specs and the runs' configs (cleared after)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            yield
    finally:
        GlobalHydra.instance().clear()
