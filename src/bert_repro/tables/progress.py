"""Progress over a table's jobs: done / total, the sweep running now and an ETA, read from the job folders
(a job is done when its results.json or failed.json is there), so it also counts the jobs a multirun finishes
one by one. rich draws it when the output is a terminal, as the training loop's bar does; otherwise one plain
line each time the count or the running sweep changes (a log file, SLURM's output)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TextIO


def _done(folder: Path, since: float | None = None) -> bool:
    """A results.json or failed.json there (written at ``since`` or later: --force re-runs complete jobs)."""
    files = [folder / "results.json", folder / "failed.json"]
    return any(f.is_file() and (since is None or f.stat().st_mtime >= since) for f in files)


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class TableProgress:
    def __init__(self, folders: list[Path], stream: TextIO | None = None, every_s: float = 5.0,
                 force: bool = False):
        self.folders, self.stream, self.every_s = folders, stream or sys.stderr, every_s
        self.current, self.start = "", time.time()
        self.since = self.start if force else None  # with --force, only what this launch writes is done
        self.at_start = sum(_done(f, self.since) for f in folders)  # done before this launch: not in the ETA
        self._last: tuple | None = None
        self._stop = threading.Event()
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
        """(done, total, ETA) now: the rate of the jobs finished during this launch times the jobs left."""
        done = sum(_done(f, self.since) for f in self.folders)
        ran, left = done - self.at_start, len(self.folders) - done
        if ran and left:
            eta = _duration((time.time() - self.start) / ran * left)
        else:
            eta = "?" if left else "0s"
        return done, len(self.folders), eta

    def refresh(self) -> None:
        done, total, eta = self.line()
        if self._rich is not None:
            self._rich.update(self._task, completed=done, description=self.current, eta=eta)
        elif (done, self.current) != self._last:
            print(f"[{done}/{total} jobs] running {self.current or '-'}; ETA {eta}", file=self.stream,
                  flush=True)
        self._last = (done, self.current)

    def sweep(self, name: str) -> None:
        self.current = name
        self.refresh()

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            self.refresh()

    def __enter__(self) -> TableProgress:
        if self._rich is not None:
            self._rich.start()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.current = "done"
        self.refresh()
        if self._rich is not None:
            self._rich.stop()
