"""The table runner's child processes (its ``src/train.py -m`` sweeps), each leading a process group of its
own, so a terminal's Ctrl-C reaches the runner alone. A SIGTERM or SIGINT sends each group SIGTERM once (the
runs save a checkpoint and exit), kills what is left after ``GRACE_S`` and stops the table with
``Interrupted``; a second signal kills at once. Under submitit_slurm a child is submitit's waiter: stopping
it leaves the SLURM jobs queued."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from bert_repro.lifecycle import warm

GRACE_S = 300.0  # a batch to finish and a large checkpoint to be written (a scheduler may kill sooner)


class Interrupted(Exception):
    """The runner was told to stop: its children were stopped, and no job was marked failed."""

    def __init__(self, signum: int, stopped: list[str] | None = None):
        self.signum, self.stopped = signum, stopped or []
        running = f" ({', '.join(self.stopped)})" if self.stopped else ""
        super().__init__(f"{signal.Signals(signum).name} received: the table's running sweeps{running} were "
                         "stopped, each run saving a checkpoint first where it had started training; nothing "
                         "was marked failed. Run the same command again to resume: finished runs are kept")


def _signal_group(pid: int, signum: int) -> None:
    with suppress(ProcessLookupError):  # the whole group has ended
        os.killpg(pid, signum)  # a child started in a session of its own leads a group of its own pid


class Children:
    def __init__(self) -> None:
        self.procs: set = set()
        self.signum: int | None = None  # the signal that stops the table, once one came
        self.stopped_at: float | None = None

    def start(self, cmd: list[str], cwd: Path, env: dict[str, str], log):
        """``cmd``, its output appended to the open file ``log``, forked warm where it can be (warm.py)."""
        if self.signum is not None:
            raise Interrupted(self.signum)
        proc = warm.start(cmd, cwd=cwd, env=env, stdout=log.name) or subprocess.Popen(
            cmd, start_new_session=True, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.add(proc)
        if self.signum is not None:  # the signal came while it started, before it was in self.procs
            _signal_group(proc.pid, signal.SIGTERM)
        return proc

    def wait(self, proc) -> int:
        """Its exit code; once the table is stopping, its group is killed after ``GRACE_S``, and what it left
        behind (a worker that outlived the sweep) as soon as it exits."""
        try:
            while True:
                try:
                    return proc.wait(timeout=1.0)  # polls: the signal arrives in another thread
                except subprocess.TimeoutExpired:
                    if self.stopped_at is not None and time.monotonic() > self.stopped_at + GRACE_S:
                        _signal_group(proc.pid, signal.SIGKILL)
        finally:
            self.procs.discard(proc)
            if self.signum is not None:
                _signal_group(proc.pid, signal.SIGKILL)

    def stop(self, signum: int, frame=None) -> None:
        """The SIGTERM / SIGINT handler: no I/O here (the main thread may be inside a print)."""
        first = self.signum is None
        if first:
            self.signum, self.stopped_at = signum, time.monotonic()
        for proc in list(self.procs):
            _signal_group(proc.pid, signal.SIGTERM if first else signal.SIGKILL)

    @contextmanager
    def handling_signals(self) -> Iterator[Children]:
        """``stop`` handles SIGTERM and SIGINT while the table runs (in the main thread: only it may)."""
        main = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, self.stop) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.signum = self.stopped_at = None  # the next table in this process starts afresh


CHILDREN = Children()


def live_processes(folder: Path) -> list[int]:
    """The processes with ``hydra.sweep.dir=<folder>`` on their command line (Linux's /proc): a sweep a killed
    runner left behind, or another runner's."""
    needle, pids = f"hydra.sweep.dir={folder}", []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            args = (entry / "cmdline").read_bytes().rstrip(b"\0").decode(errors="replace").split("\0")
            args = shlex.split(args[0]) if len(args) == 1 else args  # a warm run's: one string (setproctitle)
        except (OSError, ValueError):  # it ended while we looked, is not ours to read, or is not shell words
            continue
        pids += [int(entry.name)] if needle in args else []
    return sorted(pids)
