"""SIGINT and SIGTERM outside the training loop: one exception, one handler and one line, with nothing of the
run's lifecycle below them, so that every entry point can hold them from its first line."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Stopped(BaseException):
    """SIGINT or SIGTERM outside the training loop (start-up, composing, set-up, evaluation): a BaseException
    as KeyboardInterrupt is, so no ``except Exception`` swallows it, but not one, so Lightning does not turn
    it into exit 1."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"{signal.Signals(signum).name} received")


_OWNER: list[int] = []  # the processes that installed the handlers: forked workers inherit them


def _stop(signum: int, frame: object) -> None:
    if os.getpid() not in _OWNER:  # a DataLoader or datasets worker: as Python would, its parent reports
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Stopped(signum)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Stopped`` in the block (src/train.py's, src/evaluate.py's and the table
    runner's whole command); the training loop (reliability.Preemption) and the table runner's children
    (tables.runner) put their own handlers over it while they run."""
    _OWNER.append(os.getpid())
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _OWNER.remove(os.getpid())


def stop_message(err: Stopped, where: str, checkpoint: Path | None = None) -> str:
    """The one line a stop says: where, what was kept, how to go on."""
    if checkpoint is not None and checkpoint.is_file():
        return (f"{err} {where}: stopped; its last checkpoint {checkpoint} is kept, run the same command "
                "again to resume from it")
    return f"{err} {where}: stopped before its first checkpoint; run the same command again to start it"


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block's files are whole, then stop the process as they would have
    (main thread only, as every handler)."""
    got: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: got.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if got:
            os.kill(os.getpid(), got[0])  # delivered now, to the handler that was there before
