"""What lets a run be killed, preempted or diverge without losing work or reporting a wrong number.

- ``AtomicCheckpointIO``: checkpoints written to a temporary file in the same folder, synced, then renamed
  over the old one, so ``last.ckpt`` is always a whole checkpoint; read back with ``weights_only=True`` only.
- ``machine_faults_named``: a full disk, a read-only folder, a missing permission reported as what it is,
  with the path and the checkpoint that is kept (``MachineFault``), not as a traceback.
- ``RNGState``: the torch / numpy / python RNG states in every checkpoint (Lightning saves none), put back
  when training resumes, so dropout continues the uninterrupted run's stream.
- ``SameRun``: a checkpoint found in the run folder (``ckpt_path=last``) is resumed only by the same settings.
- ``NonFiniteLossGuard``: a NaN/inf training loss stops the run before a checkpoint of it is written.
- ``Preemption``: SIGTERM / SIGUSR1 (and submitit's preemption signal) and Ctrl-C save ``last.ckpt`` at the
  next batch boundary and stop; under submitit its own handler then requeues the job (the one requeue
  mechanism).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.plugins.io import TorchCheckpointIO

from bert_repro.convert.safe import safe_torch_load
from bert_repro.identity import science_differences
from bert_repro.lifecycle.exits import FAULTS, NonFiniteLoss, Preempted
from bert_repro.lifecycle.results import plain_file_mode
from bert_repro.signals import Stopped

log = logging.getLogger(__name__)


def safe_load(path: str | Path, map_location: Any = "cpu") -> Any:
    """``torch.load`` with ``weights_only=True`` only (convert.safe_torch_load): a refusal names the file."""
    return safe_torch_load(path, map_location=map_location)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint IO, made atomic (temporary file + fsync + rename in the same folder) and
    safe to read (``weights_only=True``). Lightning's own save goes through a temporary file in /tmp that
    is moved, which is a copy, not a rename, when /tmp is another file system. A failed write is raised as
    the OSError it is, with the checkpoint's path: torch.save reports one as ``RuntimeError: [enforce fail at
    inline_container.cc:...]``, raised while handling the OSError of the write."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path,
                        storage_options: Any = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            plain_file_mode(fd)
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as err:
            with suppress(FileNotFoundError):
                os.unlink(tmp)
            cause = _os_error(err)
            if cause is not None and cause.errno in FAULTS:
                raise OSError(cause.errno, cause.strerror, str(path)) from err
            raise
        folder = os.open(path.parent, os.O_RDONLY)  # the rename itself survives a power cut
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def load_checkpoint(self, path: str | Path, map_location: Any = None,
                        weights_only: bool | None = None) -> dict:
        if not Path(path).is_file():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        return safe_load(path, map_location=map_location or "cpu")


def _os_error(err: BaseException | None) -> OSError | None:
    """``err`` when it is an OSError, else the one it was raised while handling."""
    while err is not None and not isinstance(err, OSError):
        err = err.__cause__ or err.__context__
    return err




def slurm_plugins() -> list:
    """Under SLURM, Lightning's SLURMEnvironment without its auto-requeue: submitit's requeue is the one
    mechanism (two would requeue a job twice, or race to checkpoint from inside a signal handler)."""
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


# -- RNG state ---------------------------------------------------------------------------------------
def collect_rng_states() -> dict[str, Any]:
    """Every global RNG a training step may draw from, in types ``torch.load(weights_only=True)`` accepts."""
    numpy_state = np.random.get_state(legacy=False)
    states = {"torch": torch.get_rng_state(), "python": random.getstate(),
              "numpy": {"key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                        "pos": int(numpy_state["state"]["pos"]), "has_gauss": int(numpy_state["has_gauss"]),
                        "gauss": float(numpy_state["gauss"])}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    n = states["numpy"]
    np.random.set_state({"bit_generator": "MT19937", "state": {"key": n["key"].numpy().astype(np.uint32),
                         "pos": n["pos"]}, "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class RNGState(L.Callback):
    """Saves the RNG states with every checkpoint and restores them when training starts from one.

    Restored in ``on_train_start``, after the sanity check and the loaders' first ``iter()``: the state at
    the save was the state just before the next training batch, and so it is again. (Our loaders carry
    their own generators, so building them draws nothing from the global RNG.) Under DDP every rank gets
    rank 0's states: ranks are seeded alike and draw alike, so their states are equal anyway."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return collect_rng_states()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _reload_loader_states(trainer)
        if self._pending is not None:
            set_rng_states(self._pending)
            self._pending = None


def _reload_loader_states(trainer: L.Trainer) -> None:
    """Work around Lightning #20550: when ``configure_optimizers`` reads
    ``trainer.estimated_stepping_batches`` (our schedule does) the train loader is built and iterated before
    the checkpoint is restored, and its saved position is then never loaded: the resumed epoch would start
    again from its first batch."""
    loop = trainer.fit_loop
    if (loop._combined_loader_states_to_load and loop._combined_loader is not None
            and loop._data_fetcher is not None):
        loop._load_combined_loader_states()
        iter(loop._data_fetcher)  # a fresh iterator from the restored position


class SameRun(L.Callback):
    """Records the run's settings in its checkpoints; ``strict``: refuse to resume one written by other
    settings (a checkpoint found in the run folder, where a different command may have left it)."""

    def __init__(self, settings: dict[str, Any], strict: bool):
        self.settings, self.strict = settings, strict

    def state_dict(self) -> dict[str, Any]:
        return {"settings": self.settings}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self.strict:
            return
        differ = science_differences(state_dict.get("settings") or {}, self.settings)
        if differ:
            shown = "; ".join(differ[:6])
            raise ResumeMismatch("the run folder's checkpoints/last.ckpt was written with other settings "
                                 f"({shown}); resume it with its own command, or start afresh with "
                                 "ckpt_path=null (this folder's checkpoints will then be replaced) or in "
                                 "another folder (hydra.run.dir=...)")


class ResumeMismatch(ValueError):
    pass


# -- numerical guard ---------------------------------------------------------------------------------
class NonFiniteLossGuard(L.Callback):
    """Stops the run at the first non-finite training loss (on any rank), before ModelCheckpoint (which
    Lightning runs after the other callbacks) could save the diverged weights: the last good checkpoint
    stays."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        bad = loss is not None and not bool(torch.isfinite(loss.detach()).all())
        if trainer.strategy.reduce_boolean_decision(bad, all=False):
            value = float(loss.detach().float().mean()) if loss is not None else float("nan")
            raise NonFiniteLoss(f"training loss is {value} at step {trainer.global_step} (epoch "
                                f"{trainer.current_epoch}, batch {batch_idx}); the run stopped and kept its "
                                "last good checkpoint. Lower optim.lr, or check the data and precision "
                                "(trainer.precision)")


# -- preemption --------------------------------------------------------------------------------------
def preemption_signals() -> list[signal.Signals]:
    """SLURM's pre-emption signals: SIGTERM (preemption, scancel), SIGUSR1 (``--signal=USR1@...``), and the
    one submitit asks SLURM for before a time limit (SUBMITIT_PREEMPT_SIGNAL, USR2 by default)."""
    names = ["SIGTERM", "SIGUSR1",
             "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").removeprefix("SIG")]
    return list(dict.fromkeys(getattr(signal, n) for n in names if hasattr(signal, n)))


class Preemption(L.Callback):
    """On a preemption signal: finish the current batch, save ``last.ckpt`` (all ranks stop at the same
    batch), then hand the signal to the handler that was there before (submitit's, which requeues the job), or
    stop the run with ``Preempted``."""

    def __init__(self, checkpoint: Path):
        self.checkpoint = Path(checkpoint)
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:  # Ctrl-C twice: now, from the last save
            raise Stopped(signum)
        log.warning("%s received: saving a checkpoint at the end of this batch", signal.Signals(signum).name)
        self.received = self.received or signum

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # replaces Lightning's SIGTERM handler, which waits for the epoch's end; Ctrl-C saves as a pre-emption
        for sig in (*preemption_signals(), signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handler)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        trainer.save_checkpoint(self.checkpoint)  # every rank takes part; rank 0 writes
        signum = self.received or signal.SIGTERM
        previous = self._previous.get(signum) if signum != signal.SIGINT else None  # requeue: pre-emption
        self._restore()
        if callable(previous) and "lightning" not in getattr(type(previous), "__module__", ""):
            previous(signum, None)  # submitit: requeue this job, then exit
        raise Preempted(signum, trainer.global_step, self.checkpoint)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            with suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        self._previous = {}

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        self._restore()
