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


def finish(running: dict[str, float], pending: list[str], left: dict[str, float], needs: dict[str, set[str]],
           share: dict[str, float]) -> float:
    """Seconds until the last unit (a sweep, or a job under Ray) ends: the running ones (``running``: seconds
    left), then each of ``pending`` in turn once what it ``needs`` has ended and its ``share`` of the capacity
    is free, as the runner and Ray hand them out."""
    ends, now, pending = sorted((t, n) for n, t in running.items()), 0.0, list(pending)
    while pending or ends:
        busy, free = set(pending) | {n for _, n in ends}, 1 - sum(share[n] for _, n in ends)
        for name in [n for n in pending if not needs.get(n, set()) & busy]:
            if share[name] <= free + 1e-9:  # a float sum of shares may miss 1 in its last digit
                pending.remove(name)
                free -= share[name]
                bisect.insort(ends, (now + left[name], name))
        if not ends:  # what is left waits on a unit that no longer runs
            break
        now, _ = ends.pop(0)
    return now


class TableProgress:
    """``sweeps``: each sweep's jobs, in the order the runner takes them, a sweep waiting for the one
    ``needs`` names (default: each job a sweep); a sweep's jobs one after another in one of ``at_once`` slots,
    or under Ray (``on_ray``: how many of each stage's jobs Ray runs at once) each job a task of its own."""

    def __init__(self, folders: list[Path], stream: TextIO | None = None, every_s: float = 5.0,
                 weights: dict[Path, float] | None = None, kinds: dict[Path, str] | None = None,
                 sweeps: dict[str, list[Path]] | None = None, needs: dict[str, str] | None = None,
                 at_once: int = 1, on_ray: dict[str, float] | None = None):
        self.folders, self.stream, self.every_s = folders, stream or sys.stderr, every_s
        self.weights = {f: (weights or {}).get(f, 1.0) for f in folders}  # a job's share of the work: FLOPs
        self.kinds = {f: (kinds or {}).get(f, "") for f in folders}
        self.sweeps = sweeps or {str(f): [f] for f in folders}
        self.needs, self.at_once, self.on_ray = needs or {}, at_once, on_ray
        self.running: list[str] = []  # the sweeps running now, in the order they started
        self.began: dict[str, float] = {}  # when each sweep started
        self._ends: dict[Path, tuple[float, float | None]] = {}  # a finished job's end and start (_ended)
        self.logs: dict[str, tuple[Path, int]] = {}  # a running sweep's launch log, and how far it was read
        self.start = time.time()
        self.before = {f for f in folders if self._done(f)}  # done before this launch: not in the ETA
        self._last: tuple | None = None

    @staticmethod
    def _done(folder: Path) -> bool:
        return RunFolder(folder).results.is_file() or RunFolder(folder).failed.is_file()

    @staticmethod
    def _started(folder: Path) -> float | None:
        """When a job's run started: Hydra writes its config first."""
        config = RunFolder(folder).hydra / "config.yaml"
        return config.stat().st_mtime if config.is_file() else None

    def _ended(self, folder: Path) -> tuple[float, float | None]:
        """When a finished job wrote its result (or failure), and when it started, read once: a line comes
        every few seconds."""
        if folder not in self._ends:
            run = RunFolder(folder)
            ended = (run.results if run.results.is_file() else run.failed).stat().st_mtime
            self._ends[folder] = ended, self._started(folder)
        return self._ends[folder]

    def _in_slots(self, done: set[Path], kept: set[Path]) -> tuple[dict, dict, dict, set]:
        """Each sweep a unit, its jobs one after another: a finished job took from the one before's end (its
        sweep's start for the first, whose time holds the sweep's start-up) to its own; a running sweep's
        first job left runs since the one before ended."""
        took, since, firsts = {}, {}, set()
        for name, jobs in self.sweeps.items():
            previous = self.began.get(name, self.start)
            for i, folder in enumerate(f for f in jobs if f not in kept):
                if folder not in done:
                    if name in self.running:
                        since[name] = previous
                    break
                if i == 0:
                    firsts.add(folder)
                ended, _ = self._ended(folder)
                took[folder], previous = max(ended - previous, 0.0), ended
        return self.sweeps, took, since, firsts

    def _as_tasks(self, done: set[Path], kept: set[Path]) -> tuple[dict, dict, dict, set]:
        """Each job a unit (a Ray task), in the order they go to Ray (the started sweeps' first): a finished
        job took from its run's start to its end; one whose run started since its sweep did is running, the
        rest wait for Ray."""
        took, since = {}, {}
        for name, jobs in self.sweeps.items():
            began = self.began.get(name, self.start)
            for folder in (f for f in jobs if f not in kept):
                ended, started = self._ended(folder) if folder in done else (None, self._started(folder))
                if started is None or started < began:  # not started, or in an earlier launch
                    continue
                if ended is not None:
                    took[folder] = max(ended - started, 0.0)
                elif name in self.running:
                    since[str(folder)] = started
        order = sorted(self.sweeps, key=lambda n: self.began.get(n, float("inf")))  # as handed to Ray
        return {str(f): [f] for n in order for f in self.sweeps[n]}, took, since, set()

    def line(self) -> tuple[int, int, str]:
        """(done, total, ETA): the work left packed as the launcher runs it (finish): the sweeps onto the
        slots, or under Ray each job in its share of the cluster."""
        done = {f for f in self.folders if self._done(f)}
        kept = self.before & done  # a failure before runs again
        units, took, since, firsts = (self._as_tasks if self.on_ray else self._in_slots)(done, kept)
        if len(done) == len(self.folders):
            return len(done), len(self.folders), "0s"
        if not took:
            return len(done), len(self.folders), "?"
        sweep = {f: jobs for jobs in self.sweeps.values() for f in jobs}

        def rate(jobs: list[Path]) -> float | None:  # seconds per weight
            weight = sum(self.weights[f] for f in jobs)
            return sum(took[f] for f in jobs) / weight if jobs and weight else None

        def seconds(folder: Path) -> float:
            """In a sweep under way: its later jobs' time (the same work, started up), else its kind's later
            jobs' rate, else its first's; else (start-up included) its kind's rate, its stage's, all's."""
            kind = [f for f in took if self.kinds[f] == self.kinds[folder]]
            if ran := [f for f in sweep[folder] if f in took]:
                tiers = [[f for f in ran if f not in firsts], [f for f in kind if f not in firsts], ran]
            else:
                stage = [f for f in took if _stage(self.kinds[f]) == _stage(self.kinds[folder])]
                tiers = [kind, stage, list(took)]
            return self.weights[folder] * next((r for r in map(rate, tiers) if r is not None), 0.0)

        now, left = time.time(), {}
        for unit, jobs in units.items():
            todo = [f for f in jobs if f not in done]
            left[unit] = sum(seconds(f) for f in todo)
            if unit in since:  # its first job left runs since then
                first = seconds(todo[0])
                left[unit] += max(first - (now - since[unit]), FLOOR * first) - first
        if self.on_ray:  # a job waits for every job of the sweep its sweep waits for
            needs = {str(f): {str(g) for g in self.sweeps.get(self.needs.get(n), [])}
                     for n, jobs in self.sweeps.items() for f in jobs}
            share = {u: 1 / self.on_ray[_stage(self.kinds[jobs[0]])] for u, jobs in units.items()}
        else:
            needs = {u: {self.needs[u]} for u in units if u in self.needs}
            share = dict.fromkeys(units, 1 / self.at_once)
        pending = [u for u in units if u not in since and left[u]]
        return len(done), len(self.folders), _duration(finish(
            {u: left[u] for u in since}, pending, left, needs, share))

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
