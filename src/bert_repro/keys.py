"""Which config keys change the science and which only change the speed or the places: the one declaration.

The run folder's name (``hydra_hooks.run_name``), the settings a resumed checkpoint must share (its
identity's science), the restarts ``selection`` groups together and the table collector all derive from
it. A key ending in "." covers a whole node. ``data.group_by_length`` is science: it changes which examples
share a batch. So is ``data.max_eval_examples`` (a debug run's Dev on a subset): its scores are not the full
run's, so it names its own folder and is never taken for the full run, which does not set it.

A science key added after results were recorded is declared in ``ADDED`` with the value that computes what
every run did before it existed (``model.pre_ln: False``). A record without the key is that science: at that
value the key is left out of every comparison and store name (``comparable``), so a new default-off flag
keeps each finished run, stored pre-training and table; any other value, a changed default included, is
other science.
"""

from __future__ import annotations

from typing import Any

# speed (how fast, how many processes, how padded) and places (where files go): never what a run computes
NOT_SCIENCE = (
    "trainer.", "speed.", "logger.", "callbacks.", "paths.", "checkpoint.", "network.", "ckpt_path", "test",
    "data.cache_dir",
    "data.num_workers", "data.num_proc", "data.padding",  # in results.json written before the speed node
    "force",  # +force=true: rerun a finished run from scratch (finished.py)
    "scale.tables.",  # the tables' layer of the scale (conf/tables.yaml): no run reads it
)
# group choices that only change speed or places (an experiment's science keys are in results.json)
NOT_SCIENCE_GROUPS = ("trainer", "logger", "callbacks", "experiment", "hydra/launcher")
# science keys added after results were recorded -> the value every run computed before the key existed (it
# is not the key's default: a later change of default must not make the earlier records that default's)
ADDED: dict[str, Any] = {}
# science, but path-valued (a "/" would nest folders): the run folder's name takes a hash of them instead;
# each covers its sub-keys too (data.files.train=...)
SCIENCE_PATHS = ("init", "data.tokenizer", "data.glue_dir", "data.files", "data.corpus", "data.squad_dir",
                 "data.conll_dir", "data.swag_dir", "predict")  # predict: src/evaluate.py's input file


def is_science(key: str) -> bool:
    """``key``: a dotted config key (``optim.lr``) or a group choice (``trainer``)."""
    key = key.lstrip("+~")
    if key in NOT_SCIENCE_GROUPS or key.startswith("hydra.") or key.startswith("hydra/"):
        return False
    return not any(key == k.rstrip(".") or (k.endswith(".") and key.startswith(k)) for k in NOT_SCIENCE)


def is_path(key: str) -> bool:
    """``key`` (or the node above it) holds a path: ``data.files.train`` as well as ``data.files``."""
    key = key.lstrip("+~")
    return any(key == k or key.startswith(k + ".") for k in SCIENCE_PATHS)


def science(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``config`` (a plain nested dict) less its speed and place keys, nested as it was."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if not is_science(name):
            continue
        out[key] = science(value, f"{name}.") if isinstance(value, dict) else value
    return out


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def comparable(flat: dict[str, Any]) -> dict[str, Any]:
    """A flattened science config as it compares and names a result: the ``ADDED`` keys at the value runs had
    before them left out, so a record written before a key existed equals one written at that value."""
    return {k: v for k, v in flat.items() if k not in ADDED or ADDED[k] != v}
