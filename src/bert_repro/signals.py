"""SIGINT and SIGTERM outside the training loop: one exception, one handler and one line, in the standard
library alone and below the rest of the package, so that every entry point holds them from its first line."""

from __future__ import annotations

import os
import signal
import sys
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


_DEFAULT = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}  # Python's own
_OWNER: list[int] = []  # the processes that installed the handlers: forked workers inherit them


def _stop(signum: int, frame: object) -> None:
    if os.getpid() not in _OWNER:  # a DataLoader or datasets worker: as Python would, its parent reports
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Stopped(signum)


def _stop_at_start(signum: int, frame: object) -> None:
    print(f"{Stopped(signum)} while starting: stopped before anything ran or was written; run the same "
          "command again to start it", file=sys.stderr)
    sys.exit(128 + signum)


def stop_at_start() -> None:
    """An entry's first statement (src/train.py, src/evaluate.py, the table runner): SIGINT and SIGTERM while
    its modules load end the process with one line and 128 + n, until ``stop_on_signals`` takes over."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stop_at_start)


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
        for signum, handler in previous.items():  # once started, never "before anything ran" again
            signal.signal(signum, _DEFAULT[signum] if handler is _stop_at_start else handler)
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
