"""One process per run folder: src/train.py or src/evaluate.py started into a folder that a live run holds is
refused at once, naming the holder, instead of both writing the same checkpoints and results.json.

The lock is the OS's (``fcntl.flock`` on ``<folder>/.lock``), so it dies with its process: a killed run leaves
nothing to remove by hand. The file records the holder's pid, host and start (filelock's locks cannot carry
that), for the message; a record found under a free lock was left by a process that died holding it, and is
taken over. Torch-free: the entry scripts stay fast.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shlex
import socket
import time
from pathlib import Path
from typing import Any

from bert_repro.lifecycle.folder import RunFolder

log = logging.getLogger(__name__)

RANKS = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK")  # torchrun, SLURM, Lightning's DDP children
# what flock says on a file system without locks (Lustre mounted without -o flock, NFS with nolock)
NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class FolderInUse(Exception):
    """A live process holds the run folder."""


_refused: dict[Path, FolderInUse] = {}  # folders this process's runs asked for and a live run held (hold)


def is_launcher() -> bool:
    """The process that started the run, not a DDP rank that torchrun, SLURM or Lightning started beside it
    (they rerun the same command into the same folder)."""
    return all(int(os.environ.get(name, 0) or 0) == 0 for name in RANKS)


class RunFolderLock:
    """``with RunFolderLock(folder):`` holds ``folder`` for this run, or raises ``FolderInUse``. Only the
    launching process takes it: the ranks it starts work under its lock."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = RunFolder(self.folder).lock
        self._fd: int | None = None

    def __enter__(self) -> RunFolderLock:
        if not is_launcher():
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            left = _read(fd)
            if not _flock(fd, left):
                left = _read(fd)  # again: the holder may have written its record since
                raise FolderInUse(f"run folder {self.folder} is in use by pid {left.get('pid')} on host "
                                  f"{left.get('host')} (since {left.get('since')}); wait for that run to end "
                                  "or stop it, or choose another folder with hydra.run.dir=...")
            if left:
                log.warning("run folder %s: taking over the lock left by pid %s on host %s (since %s), "
                            "which no longer runs", self.folder, left.get("pid"), left.get("host"),
                            left.get("since"))
            record = {"pid": os.getpid(), "host": socket.gethostname(),
                      "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # released in order: nothing for the next run to take over
        except OSError:  # a full or read-only disk: the record stays, and reads as a dead holder's
            pass
        os.close(self._fd)  # closing releases the flock
        self._fd = None


def hold(folder: str | Path) -> RunFolderLock:
    """``folder`` held for this process's run until the lock's ``__exit__``; where a live run holds it,
    FolderInUse, which ``check_held`` raises again in the run's own error handling."""
    lock = RunFolderLock(folder)
    _refused.pop(lock.folder.resolve(), None)
    try:
        return lock.__enter__()
    except FolderInUse as err:
        _refused[lock.folder.resolve()] = err
        raise


def check_held(folder: str | Path) -> None:
    """Raises the FolderInUse that this process met when it asked for ``folder`` (hold)."""
    if (refused := _refused.pop(Path(folder).resolve(), None)) is not None:
        raise refused


def live_processes(folder: Path) -> list[int]:
    """The processes sweeping into ``folder`` (``hydra.sweep.dir=``), which hold no lock while they start up:
    a killed table runner's, or another's."""
    needle, pids = f"hydra.sweep.dir={folder}", []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            args = (entry / "cmdline").read_bytes().rstrip(b"\0").decode(errors="replace").split("\0")
            args = shlex.split(args[0]) if len(args) == 1 else args  # a warm run's: one string (setproctitle)
        except (OSError, ValueError):  # it ended while we looked, is not ours to read, or is not shell words
            continue
        pids += [int(entry.name)] if needle in args else []
    return sorted(pids)


def _flock(fd: int, holder: dict[str, Any]) -> bool:
    """Takes the OS lock on ``fd``; False when another process holds it. Where the file system has no locks,
    the record alone decides: a holder alive on this host keeps the folder; one on another host cannot be
    asked, and is taken over (a requeued SLURM job comes back on another node)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno not in NO_LOCKS:
            raise
        log.warning("the file system of this run folder has no locks (%s): going by the pid it records",
                    err.strerror)
        return not (holder.get("host") == socket.gethostname() and _alive(holder.get("pid")))
    return True


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def _read(fd: int) -> dict[str, Any]:
    """The holder recorded in the lock file; {} when it is empty (released in order) or unreadable."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
