"""A run's config composed as src/train.py composes it, for callers that compose many runs in one process (the
tables): Hydra over conf/, each composition cached, and the values a run sets over its config choices."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from typing import Any

import hydra
import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, read_write

from bert_repro.lifecycle.hydra_hooks import parse_override
from bert_repro.tables import CONF_DIR, REPO

CACHE = REPO / ".cache" / "compositions"
_COMPOSED: dict[tuple[str, ...], Any] = {}
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: a third faster where it is built


@contextmanager
def composing():
    """Hydra over conf/ for compose(); Hydra restores the state before it (here: cleared) after."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield


@contextmanager
def composing_jobs():
    """``composing`` with the runtime src/train.py's children have (their cwd is the repository)."""
    with composing():
        HydraConfig.instance().set_config(_job_runtime())
        try:
            yield
        finally:
            HydraConfig.instance().cfg = None


@functools.cache
def _job_runtime():
    """train.yaml's Hydra node as a child of src/train.py has it, composed once a process: a table enters
    composing_jobs each time it reads its jobs, and this compose is Hydra's whole defaults tree."""
    hydra = compose("train", [], return_hydra_config=True)
    hydra.hydra.runtime.cwd = hydra.hydra.runtime.output_dir = str(REPO)
    return hydra


def compose_once(config: str, args: list[str]):
    """conf/<config>.yaml composed with ``args`` (inside ``composing``), read-only, once a process and kept
    in .cache/compositions/ keyed by conf/'s files: tables compose the same runs
    again (docs/benchmarks.md, plan wall time)."""
    key = (str(CONF_DIR), config, *args)
    if key not in _COMPOSED:
        digest = hashlib.sha256(json.dumps([_tree(), hydra.__version__, config, *args]).encode()).hexdigest()
        path = CACHE / f"{digest[:32]}.yaml"
        try:  # YAML keeps interpolations and integer keys (JSON would not); a safe loader runs no code
            cfg = OmegaConf.create(yaml.load(path.read_text(), Loader=_LOADER))
            OmegaConf.set_struct(cfg, True)
        except Exception:  # none yet, or a damaged one: composed again
            cfg = compose(config, overrides=list(args))
            CACHE.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=CACHE, suffix=".yaml", delete=False) as tmp:
                tmp.write(OmegaConf.to_yaml(cfg))
            os.replace(tmp.name, path)
        OmegaConf.set_readonly(cfg, True)
        _COMPOSED[key] = cfg
    return _COMPOSED[key]


@functools.cache
def _tree() -> str:
    digest = hashlib.sha256()
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        digest.update(str(path.relative_to(CONF_DIR)).encode() + b"\0" + path.read_bytes())
    # the typed nodes conf/ composes (config.py) declare defaults too: a changed one composes anew
    for name, node in sorted(ConfigStore.instance().repo.get("schema", {}).items()):
        digest.update(name.encode() + b"\0" + OmegaConf.to_yaml(node.node).encode())
    return digest.hexdigest()


def _chooses(override) -> bool:
    """Hydra's test (hydra._internal.defaults_list): an override of a config group chooses a config."""
    repo = GlobalHydra.instance().config_loader().repository
    return repo.group_exists(override.key_or_group) and not isinstance(override.value(), dict)


def compose_run(args: list[str], own: bool = False):
    """conf/train.yaml composed with a run's ``args``, read-only, in Hydra's own two steps: the overrides that
    choose configs build the defaults list (once for all runs that share them), then Hydra sets the rest.
    ``own``: always a copy of the caller's, never the shared cache's."""
    parsed = [parse_override(arg) for arg in args]
    chooses = [o for o in parsed if _chooses(o)]
    base = compose_once("train", [o.input_line for o in chooses])
    values = [o for o in parsed if o not in chooses]
    if not values and not own:
        return base
    cfg = copy.deepcopy(base)
    with read_write(cfg):
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)  # typed nodes refuse a wrong value here
    return cfg


def compose_job(fixed: list[str], swept: list[str], copies: dict):
    """compose_run(fixed + swept), but a sweep's jobs set the same keys, so each job's values are set over
    the last job's on one copy of the sweep's config (``copies``); a grid choosing configs composes each."""
    parsed = [parse_override(arg) for arg in swept]
    if any(map(_chooses, parsed)):
        return compose_run(fixed + swept)
    if tuple(fixed) not in copies:
        copies[tuple(fixed)] = compose_run(fixed, own=True)
        OmegaConf.set_readonly(copies[tuple(fixed)], False)
    cfg = copies[tuple(fixed)]
    ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
    return cfg


def hydra_value(value: Any) -> str:
    """A YAML value as a Hydra command-line override value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(hydra_value, value)) + "]"
    return str(value)
