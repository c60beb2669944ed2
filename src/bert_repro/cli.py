"""Friendlier compose errors: Hydra names a misspelled key but not the keys that exist."""

from __future__ import annotations

import difflib
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf


def unknown_key_hints(overrides: list[str], config_dir: Path, config_name: str = "train") -> list[str]:
    """For each plain ``a.b=v`` override whose key the composed config lacks, the keys that do exist there."""
    parsed = OverridesParser.create().parse_overrides([o for o in overrides if "=" in o and not o.startswith("-")])
    group_choices = [o.input_line for o in parsed if "." not in o.key_or_group and not o.is_add()]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = compose(config_name, overrides=group_choices)
    except Exception:  # the choices themselves are wrong: Hydra's own message already lists the options
        return []
    finally:
        GlobalHydra.instance().clear()
    hints = []
    for o in parsed:
        key = o.key_or_group
        if o.is_add() or o.is_delete() or "." not in key or key.startswith("hydra."):
            continue
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key)
        if parent is None or leaf in parent:
            continue
        valid = sorted(str(k) for k in parent.keys())
        close = difflib.get_close_matches(leaf, valid, n=1)
        hint = f"unknown key '{key}'" + (f" (did you mean '{parent_key}.{close[0]}'?)" if close else "")
        hints.append(f"{hint}; valid keys under '{parent_key}': {', '.join(valid)}")
    return hints
