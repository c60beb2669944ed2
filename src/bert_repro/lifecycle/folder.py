"""``RunFolder``: the one owner of a run folder's layout and of what its result is.

A run folder holds one result: ``results.json`` (the run's record, lifecycle/results.py), the table runner's
``failed.json`` for a job its launch never reached, ``checkpoints/`` (``last.ckpt`` to resume, ``best.ckpt``
on Dev, pre-training's ``step-<N>.ckpt``), the ``.lock`` of the live run (locks.py), Hydra's ``.hydra/`` and
the run's log. No other module spells these names: each asks the folder.

A result is its science, not its folder's name (DESIGN 21): ``result_for`` gives the folder's complete result
only when its science (keys.py, every key from the command line or any file) equals the asking run's, and
``differences`` names the keys that differ, for a refusal.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from bert_repro.identity import science_differences
from bert_repro.keys import science

RESULTS, FAILED, LOCK, CHECKPOINTS = "results.json", "failed.json", ".lock", "checkpoints"
PREVIOUS = ".previous"  # earlier results set aside by a fresh attempt (a dot: find_runs never counts them)
LAST, BEST = "last.ckpt", "best.ckpt"
RECENT = "recent-*.ckpt"  # checkpoint.keep_recent's (conf/callbacks/default.yaml: recent-{step})


def step_checkpoint_name(step: int) -> str:
    """Pre-training's checkpoint at global step ``step`` (callbacks.StepCheckpoint writes it)."""
    return f"step-{int(step)}.ckpt"


def step_of(name: str) -> int | None:
    """The global step a ``step-<N>.ckpt`` name holds; None for another name."""
    stem, _, suffix = name.partition(".")
    if suffix != "ckpt" or not stem.startswith("step-") or not stem[5:].isdigit():
        return None
    return int(stem[5:])


def compared(record: dict[str, Any], config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A result's recorded config and ``config``, each with ``init`` as its checkpoint's identity and step (as
    the result recorded it, and as the file at ``config``'s init= holds it now) where both are known, not as
    the path it lay at: a table moved to another folder is the same run, another checkpoint there is not."""
    saved, init = record.get("config") or {}, config.get("init")
    if record.get("init_identity") is None or not isinstance(init, str):
        return saved, config
    from bert_repro.convert.loaders import read_init_identity  # torch: only for a run from one of our .ckpt

    now = read_init_identity(init)
    if now is None:
        return saved, config
    return {**saved, "init": record["init_identity"]}, {**config, "init": now}


def differences(saved: dict[str, Any] | None, now: dict[str, Any] | None,
                ignore: tuple[str, ...] = ()) -> list[str]:
    """``key: was X, now Y`` for each science key of two run configs that differs, less ``ignore``."""
    return science_differences(science(saved or {}), science(now or {}), ignore, was="was")


class RunFolder:
    """One run's folder. ``path`` need not exist yet."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    # -- the layout ---------------------------------------------------------------------------------------
    @property
    def results(self) -> Path:
        return self.path / RESULTS

    @property
    def failed(self) -> Path:
        """The table runner's record of a job it decided failed without the run writing one."""
        return self.path / FAILED

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def last(self) -> Path:
        return self.checkpoints / LAST

    @property
    def best(self) -> Path:
        return self.checkpoints / BEST

    def step(self, step: int) -> Path:
        return self.checkpoints / step_checkpoint_name(step)

    def checkpoint(self, name: str) -> Path:
        """A checkpoint of this folder by its file name (``last.ckpt``, ``step-<N>.ckpt``)."""
        return self.checkpoints / name

    @property
    def lock(self) -> Path:
        return self.path / LOCK

    @property
    def hydra(self) -> Path:
        """Hydra's record of the command (``.hydra/config.yaml``, ``overrides.yaml``)."""
        return self.path / ".hydra"

    def log(self, job: str = "train") -> Path:
        """The run's log file, as Hydra names it after the job (src/train.py: train.log)."""
        return self.path / f"{job}.log"

    def recent(self) -> list[Path]:
        """The ``recent-<step>.ckpt`` files kept beside last.ckpt (checkpoint.keep_recent)."""
        return sorted(self.checkpoints.glob(RECENT))

    def steps(self) -> dict[int, Path]:
        """Pre-training's step checkpoints by global step."""
        found = {step_of(p.name): p for p in self.checkpoints.glob("step-*.ckpt")}
        return dict(sorted((step, path) for step, path in found.items() if step is not None))

    def final_weights(self) -> Path | None:
        """The run's final weights where kept (last.ckpt, checkpoint.keep_last), else its best on Dev."""
        return next((p for p in (self.last, self.best) if p.is_file()), None)

    # -- the result --------------------------------------------------------------------------------------
    def status(self) -> str | None:
        """The ``status`` of its results.json; None when there is none or it cannot be read."""
        try:
            return json.loads(self.results.read_text()).get("status")
        except (OSError, ValueError, AttributeError):
            return None

    def read(self) -> dict[str, Any]:
        """Its results.json, checked (a ValueError naming the file when it is not one)."""
        from bert_repro.lifecycle.results import read_results

        return read_results(self.results)

    def write(self, record: dict[str, Any]) -> None:
        from bert_repro.lifecycle.results import write_results

        write_results(self.results, record)

    def complete(self) -> dict[str, Any] | None:
        """Its complete result, or None (absent, damaged, not complete)."""
        if self.status() != "complete":
            return None
        try:
            return self.read()
        except (OSError, ValueError):
            return None

    def state(self) -> tuple[str, str | None]:
        """(complete | failed | missing, why): its result, else the table runner's failure record, else a run
        that stopped before writing one (a relaunch resumes it). A damaged results.json is a ValueError."""
        if self.results.is_file():
            record = self.read()
            if record["status"] == "complete":
                return "complete", None
            return "failed", record.get("reason") or f"run ended with status {record['status']!r}"
        if self.failed.is_file():
            try:
                return "failed", json.loads(self.failed.read_text())["reason"]
            except (ValueError, KeyError, TypeError):
                why = "is damaged (not the runner's record): a relaunch reruns the job"
                return "failed", f"{self.failed} {why}"
        return ("failed", "no result (the run stopped early)") if self.hydra.is_dir() else ("missing", None)

    def fail(self, reason: str, output: str = "") -> None:
        """The table runner's record of a job its launch left without a result, and why."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.failed.write_text(json.dumps({"reason": reason, "output_tail": output[-4000:]}) + "\n")

    def in_the_way(self, config: dict[str, Any]) -> str | None:
        """Why a run of ``config`` cannot go on in this folder (its earlier result and checkpoints set aside
        first): a result of other science (``compared``), a damaged one, or checkpoints its command would not
        resume."""
        try:
            record = self.read() if self.results.is_file() else {}
        except ValueError as err:
            return f"its result is damaged ({err})"
        if record and (changed := differences(*compared(record, config))):
            return "; ".join(changed[:4])
        command = self.hydra / "config.yaml"
        if any(self.checkpoints.glob("*")) and command.is_file() \
                and (yaml.safe_load(command.read_text()) or {}).get("ckpt_path") != "last":
            return "it holds checkpoints of an attempt that a rerun would not resume (ckpt_path is not last)"
        return None

    def set_aside(self) -> Path | None:
        """A fresh attempt's start (``+force``, a table job rerun): its earlier results.json and checkpoints
        move to ``.previous/<time>/``, kept, so nothing in the folder is read as the new run's (a rerun killed
        half-way leaves a folder that says it is unfinished). Where they went; None when there was nothing."""
        earlier = [p for p in (self.results, self.checkpoints) if p.exists()]
        if not earlier:
            return None
        aside = self.path / PREVIOUS / time.strftime("%Y%m%d-%H%M%S")
        while aside.exists():
            aside = aside.with_name(aside.name + "+")
        aside.mkdir(parents=True)
        for path in earlier:
            path.rename(aside / path.name)
        return aside

    def restore(self, aside: Path) -> bool:
        """Undo ``set_aside`` for an attempt that failed before it wrote a result or checkpoint of its own:
        the earlier run is the folder's again, as it was. False (nothing moved) once it wrote either."""
        own = self.results.exists() or (self.checkpoints.exists() and any(self.checkpoints.iterdir()))
        if own:
            return False
        if self.checkpoints.exists():
            self.checkpoints.rmdir()
        for path in aside.iterdir():
            path.rename(self.path / path.name)
        aside.rmdir()
        with contextlib.suppress(OSError):  # other attempts' folders may still be there
            aside.parent.rmdir()
        return True

    def result_for(self, config: dict[str, Any], ignore: tuple[str, ...] = ()) -> dict[str, Any] | None:
        """The folder's complete result when it is ``config``'s science (``compared``), else None."""
        done = self.complete()
        if done is None or differences(*compared(done, config), ignore):
            return None
        return done


def find_runs(folders: Iterable[str | Path]) -> list[Path]:
    """The run folders under ``folders`` (each a run folder, or a folder of them, e.g. a sweep's): those
    holding their own results.json, in path order. A run folder is not searched further: the copies that
    loggers keep inside it (W&B's ``wandb/offline-run-*/files/results.json``) are not runs."""
    found: list[Path] = []
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is not a folder of runs")
        for root, dirs, files in os.walk(folder):
            if RESULTS in files:
                found.append(Path(root))
                dirs.clear()  # nothing inside a run folder is another run
            else:
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(dict.fromkeys(found))
