"""Hydra's composition of conf/ for the tables, cached once a process: table specs (spec.load_spec) and the
configs src/train.py composes for a table's runs (spec.build, schedule.schedule_of, plan). Below both spec and
schedule, which each compose runs."""

from __future__ import annotations

import copy
import warnings
from contextlib import contextmanager
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
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


# groups whose node other nodes only interpolate (``${ablation.nsp}``, ``${model.max_position}``): no config
# chooses its defaults by them or sets their keys, so a run's config is its composition without them with
# each one's own file (conf/model/<name>.yaml, composed alone) set on it. Table 6's ten shapes x four tasks
# are then four compositions, Table 5's four ablations one (tests/test_tables_plan.py checks it equal).
LEAF_GROUPS = ("model", "ablation")
_RUNS: dict[tuple[str, ...], Any] = {}


def compose_run(args: list[str]):
    """conf/train.yaml composed with a run's ``args`` (Hydra initialised by the caller), read-only."""
    key = (str(CONF_DIR), *args)
    if key in _RUNS:
        return _RUNS[key]
    leaves = [a for a in args if a.split("=", 1)[0] in LEAF_GROUPS]
    keys = [a.lstrip("+~").split("=", 1)[0] for a in args]
    if not leaves or any("." in k and k.split(".")[0] in LEAF_GROUPS for k in keys):
        return compose_once("train", args)  # a key of theirs set on the command line: Hydra's order
    cfg = copy.deepcopy(compose_once("train", [a for a in args if a not in leaves]))
    OmegaConf.set_readonly(cfg, False)
    for leaf in leaves:
        group, name = leaf.split("=", 1)
        with warnings.catch_warnings():  # a group file composed alone has no _self_ in its defaults list
            warnings.simplefilter("ignore", UserWarning)
            node = compose_once(f"{group}/{name}", [])
        OmegaConf.update(cfg, group, node[group], merge=False)
    OmegaConf.set_readonly(cfg, True)
    _RUNS[key] = cfg
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
