"""The table runner's child processes (its ``src/train.py -m`` sweeps), owned by the runner.

Each child starts in its own session: its process group holds what it starts (DataLoader and joblib workers,
DDP ranks), and a terminal's Ctrl-C reaches the runner alone. On SIGTERM or SIGINT the runner sends every
child's group SIGTERM once (src/train.py saves a checkpoint at the end of the batch and exits:
reliability.Preemption), waits up to ``GRACE_S``, kills what is left, and the table stops with
``Interrupted``: nothing is marked failed, and a relaunch resumes. A second signal kills at once. Under
hydra/launcher=submitit_slurm the child is submitit's waiter: stopping it leaves the SLURM jobs queued.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bert_repro.lifecycle import warm
from bert_repro.lifecycle.warm import WarmProcess

GRACE_S = 300.0  # a batch to finish and a large checkpoint to be written (a scheduler may kill sooner)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(Exception):
    """The runner was told to stop: its children were stopped, and no job was marked failed."""

    def __init__(self, signum: int, stopped: list[str] | None = None):
        self.signum, self.stopped = signum, stopped or []
        running = f" ({', '.join(self.stopped)})" if self.stopped else ""
        super().__init__(f"{signal.Signals(signum).name} received: the table's running sweeps{running} were "
                         "stopped, each run saving a checkpoint first where it had started training; nothing "
                         "was marked failed. Run the same command again to resume: finished runs are kept")


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)  # a child started with start_new_session leads a group of its own pid
    except ProcessLookupError:  # the whole group has ended
        pass


class Children:
    def __init__(self) -> None:
        self.procs: set[subprocess.Popen | WarmProcess] = set()
        self.signum: int | None = None  # the signal that stops the table, once one came
        self.stopped_at: float | None = None

    def start(self, cmd: list[str], cwd: Path, env: dict[str, str], log) -> subprocess.Popen | WarmProcess:
        """``cmd`` with its output (both streams) appended to the open file ``log``: forked warm from the
        forkserver where it can be (bert_repro.lifecycle.warm), else a new process."""
        if self.signum is not None:
            raise Interrupted(self.signum)
        proc = warm.start(cmd, cwd=cwd, env=env, stdout=log.name) or subprocess.Popen(
            cmd, start_new_session=True, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.add(proc)
        if self.signum is not None:  # the signal came while it started, before it was in self.procs
            _signal_group(proc.pid, signal.SIGTERM)
        return proc

    def wait(self, proc: subprocess.Popen | WarmProcess) -> int:
        """Its exit code; once the table is stopping, its group is killed after ``GRACE_S``, and what the
        group leaves behind (a worker that outlived the sweep) right after it exits."""
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
        """``stop`` as the SIGTERM and SIGINT handler while the table runs (Python lets only the main thread
        set one; elsewhere, as in a test calling the runner from a thread, the signals stay as they were)."""
        main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.signal(sig, self.stop) for sig in STOP_SIGNALS} if main else {}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.signum = self.stopped_at = None  # the next table in this process starts afresh


CHILDREN = Children()


def live_processes(folder: Path) -> list[int]:
    """The processes running a sweep into ``folder`` (their command line names it as ``hydra.sweep.dir``):
    a sweep a killed runner left behind, or another runner's. Read from Linux's /proc; none elsewhere."""
    needle = f"hydra.sweep.dir={folder}".encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            args = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:  # it ended while we looked, or is not ours to read
            continue
        if len(args) == 1:  # a warm run's command line is one string (setproctitle): shlex.join of its args
            try:
                args = [a.encode() for a in shlex.split(args[0].decode(errors="replace"))]
            except ValueError:
                pass
        if needle in args:
            pids.append(int(entry.name))
    return sorted(pids)
