"""Progress over a table's jobs: done / total, the sweeps running now and an ETA, read from the job folders
(done: a result or the runner's failure record there), so it counts the jobs a multirun finishes one by
one. The ETA weighs each job by the plan's FLOPs, at each kind's (pretrain, finetune) seconds per FLOP read
from its finished jobs' ``wall_time_s``. rich draws it on a terminal; otherwise one plain line each time the
count or the running sweeps change, and the running runs' own progress lines (step, tokens/s, ETA, Dev),
which they write to their sweep's launch log, are passed on as they come."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from bert_repro.lifecycle.folder import RunFolder

PASSED = "][bert_repro.lifecycle.callbacks][INFO] - "  # a run's progress and Dev lines (ProgressLines)


def _done(folder: Path, since: float | None = None) -> bool:
    """A result or failure record there (written at ``since`` or later, where given)."""
    files = [RunFolder(folder).results, RunFolder(folder).failed]
    return any(f.is_file() and (since is None or f.stat().st_mtime >= since) for f in files)


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class TableProgress:
    def __init__(self, folders: list[Path], stream: TextIO | None = None, every_s: float = 5.0,
                 force: bool = False, weights: dict[Path, float] | None = None,
                 kinds: dict[Path, str] | None = None):
        self.folders, self.stream, self.every_s = folders, stream or sys.stderr, every_s
        # each job's share of the work (the plan's FLOPs): a pre-training run is not one fine-tuning's worth
        self.weights = {f: (weights or {}).get(f, 1.0) for f in folders}
        self.kinds = {f: (kinds or {}).get(f, "") for f in folders}  # pretrain | finetune (the plan's)
        self._walls: dict[Path, float | None] = {}  # a finished job's own wall_time_s, read once
        self.running: list[str] = []  # the sweeps running now, in the order they started
        self.logs: dict[str, tuple[Path, int]] = {}  # a running sweep's launch log, and how far it was read
        self.current, self.start = "", time.time()
        self.since = self.start if force else None  # with --force, only what this launch writes is done
        self.before = {f for f in folders if _done(f, self.since)}  # done before this launch: not in the ETA
        self._last: tuple | None = None
        self._stop = threading.Event()
        self._lock = threading.RLock()  # sweeps start and end from the runner's threads
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._rich = None
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._rich = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
                                  console=Console(file=self.stream))
            self._task = self._rich.add_task("table", total=len(folders), eta="?")

    def line(self) -> tuple[int, int, str]:
        """(done, total, ETA) now: the work left at the rate of the work finished during this launch (jobs
        weighted by ``weights``)."""
        done = {f for f in self.folders if _done(f, self.since)}
        cost = self._costs(done - self.before)
        ran = sum(cost[f] for f in done - self.before)
        left = sum(cost[f] for f in self.folders if f not in done)
        if ran and left:
            eta = _duration((time.time() - self.start) / ran * left)
        else:
            eta = "?" if len(done) < len(self.folders) else "0s"
        return len(done), len(self.folders), eta

    def _wall(self, folder: Path) -> float | None:
        if folder not in self._walls:
            try:
                self._walls[folder] = float(json.loads(RunFolder(folder).results.read_text())["wall_time_s"])
            except (OSError, ValueError, KeyError, TypeError):  # a failure record, or a result without it
                self._walls[folder] = None
        return self._walls[folder]

    def _costs(self, finished: set[Path]) -> dict[Path, float]:
        """Each job's weight in seconds of its kind: the seconds per weight of the finished jobs of its kind
        (of all finished jobs while none of its kind has finished); the weights as they are while no
        finished job says how long it took."""
        timed = [(f, w) for f in finished if (w := self._wall(f)) is not None and self.weights[f] > 0]
        if not timed:
            return self.weights
        rate = {kind: sum(w for f, w in timed if self.kinds[f] == kind)
                / sum(self.weights[f] for f, _ in timed if self.kinds[f] == kind)
                for kind in {self.kinds[f] for f, _ in timed}}
        overall = sum(w for _, w in timed) / sum(self.weights[f] for f, _ in timed)
        return {f: self.weights[f] * rate.get(self.kinds[f], overall) for f in self.folders}

    def _pass_on(self) -> None:
        """The running runs' progress lines written since the last look (plain output only)."""
        for name, (path, seen) in list(self.logs.items()):
            try:
                with path.open("rb") as f:
                    f.seek(seen)
                    new = f.read()
            except OSError:
                continue
            new = new[:new.rfind(b"\n") + 1]  # whole lines only
            self.logs[name] = (path, seen + len(new))
            for line in new.decode(errors="replace").splitlines():
                if PASSED in line:
                    print(f"  {line.split(PASSED, 1)[1]}", file=self.stream, flush=True)

    def refresh(self) -> None:
        if self._rich is None:
            self._pass_on()
        done, total, eta = self.line()
        if self._rich is not None:
            self._rich.update(self._task, completed=done, description=self.current, eta=eta)
        elif (done, self.current) != self._last:
            print(f"[{done}/{total} jobs] running {self.current or '-'}; ETA {eta}", file=self.stream,
                  flush=True)
        self._last = (done, self.current)

    def started(self, name: str, log: Path | None = None) -> None:
        with self._lock:
            if log is not None:
                self.logs[name] = (log, log.stat().st_size if log.is_file() else 0)
            self.running.append(name)
            self.current = ", ".join(self.running)
            self.refresh()

    def finished(self, name: str) -> None:
        with self._lock:
            self._pass_on()
            self.logs.pop(name, None)
            self.running.remove(name)
            self.current = ", ".join(self.running)
            self.refresh()

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                self.refresh()

    def __enter__(self) -> TableProgress:
        if self._rich is not None:
            self._rich.start()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            self.current = "done" if exc[0] is None else "stopped"  # an interrupt or an error ended it
            self.refresh()
        if self._rich is not None:
            self._rich.stop()
