"""Progress over a table's jobs, read from their folders (done: a result or a failure record): a line each
time the count or the running sweeps change, with an ETA, and the running runs' own progress lines passed on
from their launch logs."""

from __future__ import annotations

import bisect
import sys
import time
from pathlib import Path
from typing import TextIO

from bert_repro.lifecycle.folder import RunFolder

FLOOR = 0.1  # a running job past its predicted time: a tenth of it still to go
PASSED = "][bert_repro.lifecycle.callbacks][INFO] - "  # a run's progress and Dev lines (ProgressLines)


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _stage(kind: str) -> str:
    return kind.split(":")[0]  # Sweep.kind: a stage, or a stage and its task


def finish(running: dict[str, float], pending: list[str], left: dict[str, float], needs: dict[str, str],
           at_once: int) -> float:
    """Seconds until the last sweep ends: the running ones in their slots (``running``: seconds left), then
    each free slot takes the first of ``pending`` whose ``needs`` has ended, as the runner does."""
    ends, now, pending = sorted((t, n) for n, t in running.items()), 0.0, list(pending)
    while pending or ends:
        busy = set(pending) | {n for _, n in ends}
        for name in [n for n in pending if needs.get(n) not in busy][:max(at_once - len(ends), 0)]:
            pending.remove(name)
            bisect.insort(ends, (now + left[name], name))
        if not ends:  # what is left waits on a sweep that no longer runs
            break
        now, _ = ends.pop(0)
    return now


class TableProgress:
    """``sweeps``: each sweep's jobs, in the order the runner takes them, a sweep's jobs one after another in
    one of ``at_once`` slots, a sweep waiting for the one ``needs`` names (default: each job a sweep)."""

    def __init__(self, folders: list[Path], stream: TextIO | None = None, every_s: float = 5.0,
                 weights: dict[Path, float] | None = None, kinds: dict[Path, str] | None = None,
                 sweeps: dict[str, list[Path]] | None = None, needs: dict[str, str] | None = None,
                 at_once: int = 1):
        self.folders, self.stream, self.every_s = folders, stream or sys.stderr, every_s
        self.weights = {f: (weights or {}).get(f, 1.0) for f in folders}  # a job's share of the work: FLOPs
        self.kinds = {f: (kinds or {}).get(f, "") for f in folders}
        self.sweeps = sweeps or {str(f): [f] for f in folders}
        self.needs, self.at_once = needs or {}, at_once
        self.running: list[str] = []  # the sweeps running now, in the order they started
        self.began: dict[str, float] = {}  # when each sweep started
        self._ends: dict[Path, float] = {}  # a finished job's end (_ended)
        self.logs: dict[str, tuple[Path, int]] = {}  # a running sweep's launch log, and how far it was read
        self.start = time.time()
        self.before = {f for f in folders if self._done(f)}  # done before this launch: not in the ETA
        self._last: tuple | None = None

    @staticmethod
    def _done(folder: Path) -> bool:
        return RunFolder(folder).results.is_file() or RunFolder(folder).failed.is_file()

    def _ended(self, folder: Path) -> float:
        """When a finished job wrote its result (or failure), read once: a line comes every few seconds."""
        if folder not in self._ends:
            run = RunFolder(folder)
            self._ends[folder] = (run.results if run.results.is_file() else run.failed).stat().st_mtime
        return self._ends[folder]

    def line(self) -> tuple[int, int, str]:
        """(done, total, ETA): the sweeps' work left packed onto the slots (finish)."""
        done = {f for f in self.folders if self._done(f)}
        now, took, since = time.time(), {}, {}  # a finished job's time in its slot; a running one's start
        firsts = set()  # each sweep's first job in this launch: its time holds the sweep's start-up
        kept = self.before & done  # a failure before runs again
        for name, jobs in self.sweeps.items():
            previous = self.began.get(name, self.start)  # a sweep's jobs run in order, each after the last
            for i, folder in enumerate(f for f in jobs if f not in kept):
                if folder not in done:
                    since[name] = previous
                    break
                if i == 0:
                    firsts.add(folder)
                ended = self._ended(folder)
                took[folder], previous = max(ended - previous, 0.0), ended
        if len(done) == len(self.folders):
            return len(done), len(self.folders), "0s"
        if not took:
            return len(done), len(self.folders), "?"

        def rate(jobs: list[Path]) -> float | None:  # seconds per weight
            weight = sum(self.weights[f] for f in jobs)
            return sum(took[f] for f in jobs) / weight if jobs and weight else None

        def seconds(folder: Path, sweep: list[Path]) -> float:
            """In a sweep under way: its later jobs' time (the same work, started up), else its kind's later
            jobs' rate, else its first's; else (start-up included) its kind's rate, its stage's, all's."""
            kind = [f for f in took if self.kinds[f] == self.kinds[folder]]
            if ran := [f for f in sweep if f in took]:
                tiers = [[f for f in ran if f not in firsts], [f for f in kind if f not in firsts], ran]
            else:
                stage = [f for f in took if _stage(self.kinds[f]) == _stage(self.kinds[folder])]
                tiers = [kind, stage, list(took)]
            return self.weights[folder] * next((r for r in map(rate, tiers) if r is not None), 0.0)

        left = {}
        for name, jobs in self.sweeps.items():
            todo = [f for f in jobs if f not in done]
            left[name] = sum(seconds(f, jobs) for f in todo)
            if name in self.running and todo:  # its first job left runs since the one before it ended
                first = seconds(todo[0], jobs)
                left[name] += max(first - (now - since[name]), FLOOR * first) - first
        pending = [n for n in self.sweeps if n not in self.began and left[n]]
        return len(done), len(self.folders), _duration(finish(
            {n: left[n] for n in self.running if n in left}, pending, left, self.needs, self.at_once))

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
        self.began[name] = time.time()
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
