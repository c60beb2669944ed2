"""Progress over a table's jobs, read from their folders (done: a result or a failure record): a line each
time the count or the running sweeps change, with an ETA, and the running runs' own progress lines passed on
from their launch logs."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TextIO

from bert_repro.lifecycle.folder import RunFolder

PASSED = "][bert_repro.lifecycle.callbacks][INFO] - "  # a run's progress and Dev lines (ProgressLines)


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class TableProgress:
    def __init__(self, folders: list[Path], stream: TextIO | None = None, every_s: float = 5.0,
                 weights: dict[Path, float] | None = None, kinds: dict[Path, str] | None = None):
        self.folders, self.stream, self.every_s = folders, stream or sys.stderr, every_s
        self.weights = {f: (weights or {}).get(f, 1.0) for f in folders}  # a job's share of the work: FLOPs
        self.kinds = {f: (kinds or {}).get(f, "") for f in folders}
        self._walls: dict[Path, float | None] = {}  # a finished job's own wall_time_s, read once
        self.running: list[str] = []  # the sweeps running now, in the order they started
        self.logs: dict[str, tuple[Path, int]] = {}  # a running sweep's launch log, and how far it was read
        self.start = time.time()
        self.before = {f for f in folders if self._done(f)}  # done before this launch: not in the ETA
        self._last: tuple | None = None

    @staticmethod
    def _done(folder: Path) -> bool:
        return RunFolder(folder).results.is_file() or RunFolder(folder).failed.is_file()

    def _wall(self, folder: Path) -> float | None:
        if folder not in self._walls:
            try:
                self._walls[folder] = float(json.loads(RunFolder(folder).results.read_text())["wall_time_s"])
            except (OSError, ValueError, KeyError, TypeError):  # a failure record, or a result without it
                self._walls[folder] = None
        return self._walls[folder]

    def line(self) -> tuple[int, int, str]:
        """(done, total, ETA): the work left, a job's its weight at the seconds per weight of its kind's jobs
        finished in this launch (of all kinds, while none of its kind is)."""
        done = {f for f in self.folders if self._done(f)}
        timed = {f: w for f in done - self.before if (w := self._wall(f)) is not None and self.weights[f]}
        cost = self.weights
        if timed:
            def rate(kind: str | None) -> float:  # seconds per weight of a kind's finished jobs (None: all)
                jobs = [f for f in timed if kind in (None, self.kinds[f])]
                return sum(timed[f] for f in jobs) / sum(self.weights[f] for f in jobs)

            kinds = {self.kinds[f] for f in timed}
            cost = {f: self.weights[f] * rate(self.kinds[f] if self.kinds[f] in kinds else None)
                    for f in self.folders}
        ran = sum(cost[f] for f in done - self.before)
        left = sum(cost[f] for f in self.folders if f not in done)
        eta = _duration((time.time() - self.start) / ran * left) if ran and left else \
            "?" if len(done) < len(self.folders) else "0s"
        return len(done), len(self.folders), eta

    def _pass_on(self) -> None:
        """The running runs' progress lines written since the last look."""
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

    def refresh(self, current: str | None = None) -> None:
        current = current or ", ".join(self.running)
        done, total, eta = self.line()
        self._pass_on()
        if (done, current) != self._last:
            print(f"[{done}/{total} jobs] running {current or '-'}; ETA {eta}", file=self.stream, flush=True)
        self._last = (done, current)

    def started(self, name: str, log: Path | None = None) -> None:
        if log is not None:
            self.logs[name] = (log, log.stat().st_size if log.is_file() else 0)
        self.running.append(name)
        self.refresh()

    def finished(self, name: str) -> None:
        self._pass_on()
        self.logs.pop(name, None)
        self.running.remove(name)
        self.refresh()

    def __enter__(self) -> TableProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.refresh("done" if exc[0] is None else "stopped")  # an interrupt or an error ended it
