"""Friendlier compose errors: Hydra names a misspelled key but not the keys that exist."""

from __future__ import annotations

import difflib
import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from bert_repro.keys import SCIENCE_PATHS, is_science

MAX_NAME = 160


def run_name(overrides: list[str]) -> str:
    """A run's folder name from its command alone (never the clock): the science overrides (``keys``), sorted
    and joined as Hydra's override_dirname, "default" when there are none, and a hash of the path-valued
    science overrides when there are any (so init=A and init=B do not share a folder)."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    science = [o for o in parsed if is_science(o.key_or_group)]
    named = sorted(o.input_line for o in science if o.key_or_group not in SCIENCE_PATHS)
    name = ",".join(named) or "default"
    paths = sorted(o.input_line for o in parsed if o.key_or_group in SCIENCE_PATHS)
    if paths:
        name += ",paths=" + hashlib.sha256("\n".join(paths).encode()).hexdigest()[:8]
    if len(name) > MAX_NAME:  # file systems stop at 255 bytes: keep a readable head, and a hash of the whole
        name = name[:MAX_NAME - 12] + ",h=" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return name


def cpu_precision() -> str:
    """``${cpu_precision:}``, Lightning's precision for a CPU run that may take bf16: bf16-mixed where the CPU
    multiplies bf16 in hardware (x86 AVX512-BF16 or AMX: 1.4-1.8x a tiny BERT's fp32 step on an AMD EPYC,
    measured), 32-true where bf16 would be emulated, slower than fp32."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch's own CPU feature probes
    native = any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)
    return "bf16-mixed" if native else "32-true"


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("run_name"):
        OmegaConf.register_new_resolver("run_name", lambda overrides: run_name(list(overrides)))
    if not OmegaConf.has_resolver("cpu_precision"):
        OmegaConf.register_new_resolver("cpu_precision", cpu_precision)


class OutputFolderCheck(Callback):
    """Hydra creates the run (or sweep) folder before src/train.py gets control: one that cannot be created or
    written to ends the run here with a message naming it, not a traceback (conf/train.yaml
    hydra.callbacks)."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        _check_writable(Path(str(config.hydra.run.dir)), "hydra.run.dir")

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        _check_writable(Path(str(config.hydra.sweep.dir)), "hydra.sweep.dir")


def _check_writable(folder: Path, key: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        print(f"output folder {folder} cannot be written ({err.strerror}); choose another with {key}=...",
              file=sys.stderr)
        raise SystemExit(2) from None


def unknown_key_hints(overrides: list[str], config_dir: Path, config_name: str = "train") -> list[str]:
    """For each plain ``a.b=v`` override whose key the composed config lacks, the keys that do exist there."""
    parsed = OverridesParser.create().parse_overrides(
        [o for o in overrides if "=" in o and not o.startswith("-")])
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
