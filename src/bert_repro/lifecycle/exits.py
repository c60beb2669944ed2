"""How a run ends when it cannot finish: each way named once, with its exit code, torch-free (the checks
before torch use it too). A wrong input exits 2 with a message naming it, a diverged run 3, a Hub that does
not answer 69 (sysexits.h EX_UNAVAILABLE), a fault of the machine 74 (EX_IOERR), a pre-empted run 128 + the
signal, as a shell says; a multirun's job records its failure in its folder and the sweep goes on. A folder
that a live run holds is never touched."""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import signal
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException, InstantiationException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from bert_repro.lifecycle.checks import TRACEBACK_HINT, SweepUsageError, UsageError
from bert_repro.lifecycle.folder import RunFolder
from bert_repro.lifecycle.locks import FolderInUse, check_held, is_launcher
from bert_repro.network import Unreachable
from bert_repro.signals import Stopped, stop_message

log = logging.getLogger(__name__)


class JobFailed(CompactHydraException):
    """One job of a multirun failed: Hydra's launcher records it, runs the others, and fails at the end with
    this message alone (a CompactHydraException: no traceback)."""


class NonFiniteLoss(RuntimeError):
    """The training loss went non-finite (reliability.NonFiniteLossGuard)."""


# -- faults of the machine ---------------------------------------------------------------------------
FAULTS = {  # errno -> what it is, what to do
    errno.ENOSPC: ("no space left on device writing", "free space and rerun"),
    errno.EDQUOT: ("disk quota exceeded writing", "free space or raise the quota, and rerun"),
    errno.EROFS: ("read-only file system writing", "make it writable and rerun"),
    errno.EACCES: ("permission denied on", "give this user access and rerun"),
    errno.EPERM: ("operation not permitted on", "give this user access and rerun"),
    errno.EIO: ("input/output error on", "the disk or network file system failed: check it and rerun"),
}
FULL = 1 << 20  # bytes free under which a file system counts as full


class MachineFault(Exception):
    """A fault of the machine, not of the input or the code: a full disk, a read-only or forbidden folder."""


@contextmanager
def machine_faults_named(places: dict[str, Path], checkpoint: Path | None = None) -> Iterator[None]:
    """Turns an OSError of the machine (``FAULTS``) into a ``MachineFault`` that says what it is, the path,
    the config key that chose the folder (``places``: key -> folder) and the last good ``checkpoint`` kept
    (checkpoints and results.json are written atomically: a failed write leaves the earlier file whole)."""
    try:
        yield
    except OSError as err:
        if err.errno not in FAULTS:
            raise
        what, advice = FAULTS[err.errno]
        path = err.filename
        if path is None:  # a write to an open file (results.json, a log) names none: the place that is full
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise  # no path, and no way to find one: as it came
            path = next((p for p in places.values() if _free(p) < FULL), next(iter(places.values())))
        key = next((k for k, p in places.items() if _within(Path(path), p)), None)
        if key is not None:
            now = f" (now {places[key]})" if Path(path) != places[key] else ""
            advice += f", or choose another folder with {key}=...{now}"
        if checkpoint is not None and checkpoint.is_file():
            advice += f"; the last good checkpoint {checkpoint} is kept"
        raise MachineFault(f"{what} {path}: {advice}") from err


def _free(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return FULL


def _within(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


class Preempted(Exception):
    def __init__(self, signum: int, step: int, checkpoint: Path):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        name = signal.Signals(signum).name
        super().__init__(f"{name} received: saved {checkpoint} at step {step} and stopped; run the same "
                         "command again to resume from it")


# what Hydra prints around a failed job's error, never the error itself
NOISE = ("Set the environment variable HYDRA_FULL_ERROR", "Traceback", "Error executing job")
# wrong input: a message naming it, not a traceback (InstantiationException: a constructor refused its input)
USER_ERRORS = (UsageError, FileNotFoundError, ValueError, PermissionError, InstantiationException,
               OmegaConfBaseException)


def record_failure(cfg: DictConfig, err: BaseException) -> None:
    """results.json with status "failed" and the reason, so a sweep's collector shows the cell as failed;
    never over a completed run's results, and only on rank 0 (the others' folder is the same)."""
    from bert_repro.lifecycle.results import failure_record

    if not is_launcher():
        return
    try:
        folder = RunFolder(cfg.paths.output_dir)
        if folder.status() != "complete":
            choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
            folder.write(asdict(failure_record(cfg, err, choices.get("model"))))
    except (OSError, OmegaConfBaseException) as write_err:  # e.g. an unwritable folder: the message says why
        log.debug("no failure record written: %s", write_err)


def _no_tip(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("💡 Tip")


def one_voice() -> None:
    """Each Lightning message once, through Hydra's handlers (the console and the run's log file): the
    ``lightning`` package adds a console handler of its own beside them. Its tips to install more go, and the
    srun hint (SLURM runs go through Hydra's submitit launcher, not srun)."""
    if logging.getLogger().handlers:  # Hydra configured logging
        logging.getLogger("lightning").handlers.clear()
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_no_tip)  # added once however often
    warnings.filterwarnings("ignore", message=r"The `srun` command is available")


@contextmanager
def run_ends(cfg: DictConfig, record: bool = True) -> Iterator[None]:
    """Every way the run can fail turned into its exit, a folder that a live run holds among them (locks.py;
    hydra_hooks.OutputFolderCheck holds a run's): a message, an exit code or, in a multirun, a JobFailed for
    Hydra's launcher. ``record``: a failure leaves its record in the folder (an evaluation's does not)."""
    one_voice()
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    folder = RunFolder(cfg.paths.output_dir)
    places = {"hydra.run.dir": folder.path, "paths.cache_dir": Path(cfg.paths.cache_dir)}

    def fail(err: BaseException, code: int, message: str, written: bool = record) -> None:
        if written:
            record_failure(cfg, err)
        log.error("%s", message)
        if multirun:
            raise JobFailed(f"a job of the sweep failed in {folder}: {err}; the others ran, and each job's "
                            "folder holds its own record") from None
        raise SystemExit(code) from None

    try:
        with machine_faults_named(places, folder.last):
            check_held(folder.path)  # one process per folder: Hydra's callback took it (OutputFolderCheck)
            yield
    except FolderInUse as err:  # another live run's folder: nothing of it is touched, no failure recorded
        fail(err, 2, str(err), written=False)
    except Preempted as err:  # checkpoint saved: rerunning the command resumes
        log.warning("%s", err)
        raise SystemExit(128 + int(err.signum)) from None
    except Stopped as err:  # before the first step or outside the loop: nothing recorded over what is there
        log.error("%s", stop_message(err, f"in {folder.path}", folder.last))
        raise SystemExit(128 + err.signum) from None
    except SweepUsageError as err:  # a SystemExit is not a job failure to Hydra: the sweep stops here
        log.error("%s", err)
        raise SystemExit(2) from None
    except USER_ERRORS as err:
        if os.environ.get("BERT_REPRO_TRACEBACK"):
            raise
        fail(err, 2, f"{err} {TRACEBACK_HINT}", written=record and multirun)
    except NonFiniteLoss as err:  # the run diverged: failed in results.json, never a number
        fail(err, 3, str(err))
    except MachineFault as err:  # a full disk, a read-only folder: the last good checkpoint is kept
        fail(err, 74, str(err))
    except Unreachable as err:  # the Hub silent or refusing within network.timeout_s
        fail(err, 69, str(err))
    except Exception as err:
        if peer_stopped(err):  # another rank failed first and said why: one message, not a gloo traceback
            log.error("another rank stopped (its message is above); this one stops too (%s)",
                      type(err).__name__)
            raise SystemExit(1) from None
        if record:  # a bug, not an input: keep the traceback, but leave the cell marked failed
            record_failure(cfg, err)
        raise


def launch_error(output: str) -> str:
    """What a failed launch's output (a sweep's children, to a table runner) says went wrong: the error a run
    logged here (``run_ends``), else the exception, else Hydra's compose error."""
    logged = [line.split("][ERROR] - ", 1)[1] for line in output.splitlines() if "][ERROR] - " in line]
    if logged:
        return logged[-1].replace(f" {TRACEBACK_HINT}", "").strip()
    lines = [s for line in output.splitlines() if (s := line.strip())
             and not re.match(r"^\[\d{4}-\d\d-\d\d ", s) and not s.startswith(NOISE)]
    crashed = "Error executing job" in output or "Traceback" in output
    return (lines[-1] if crashed else lines[0]) if lines else "the run failed without output"


def peer_stopped(err: BaseException) -> bool:
    """A collective broken because another rank's process ended (torch.distributed's DistError kinds, gloo's
    or NCCL's words for a closed peer)."""
    kinds = {c.__name__ for c in type(err).__mro__}
    said = str(err).lower()
    return bool(kinds & {"DistError", "DistBackendError", "DistNetworkError"}) or any(
        words in said for words in ("connection closed by peer", "connection reset by peer", "gloo", "nccl"))
