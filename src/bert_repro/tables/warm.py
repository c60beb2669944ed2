"""Warm starts: ``python src/train.py ARGS`` forked from an interpreter that has already imported torch,
Lightning (with torchmetrics) and Hydra, through multiprocessing's forkserver.

Those imports take CPU-seconds at every run's start (``python -X importtime -c "import lightning.pytorch"``;
docs/benchmarks.md), more than a smoke run trains: the table runner's local sweeps (`make demo`,
smoke tables, rehearsals) and the test suite start hundreds of runs. The forkserver imports them once; each
run is a fork of it that behaves as the command would: a session (process group) of its own, the given
environment, working directory and output files, ``sys.argv``, SIGINT as KeyboardInterrupt, its torch threads
from OMP_NUM_THREADS, atexit handlers at its end, its exit status, and its command line in ``ps`` and /proc
(setproctitle). Modules other than the preloaded ones import afresh in each run.

A cold process starts instead where a warm one could differ: a variable the preloaded libraries read when they
are imported (huggingface_hub's HF_HOME and HF_HUB_OFFLINE, torch's TORCH_* ...) differs from the one the
forkserver started with; the command is not a Python script or module run by this interpreter; or
``BERT_REPRO_WARM=0``. As with any multiprocessing start, the parent's main module must keep its work under
``if __name__ == "__main__":`` (each child imports it; `python -m` mains and pytest's are not).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

# What every run imports before its first line of work, none of which starts a thread or touches a device.
PRELOAD = ["torch", "lightning.pytorch", "hydra", "omegaconf"]
OPTION = "BERT_REPRO_WARM"
# what the preloaded libraries (and transformers, huggingface_hub, scipy, which they import) read at import;
# Lightning's PL_* (PL_GLOBAL_SEED, which seed_everything sets in its caller) are read at run time
READ_AT_IMPORT = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "CUDA", "NCCL_", "MKL_",
                  "KMP_", "OMP_", "GOMP_", "USE_", "PYTHON", "LD_", "XLA_", "SCIPY_", "NUMPY_", "OPENBLAS_")
# and by name: the rank Lightning's and torchmetrics' rank_zero_only take at import, a warnings switch
READ_AT_IMPORT_NAMES = {"RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "POSSIBLE_USER_WARNINGS"}
THREADS = "OMP_NUM_THREADS"  # applied in the child with torch.set_num_threads: it may differ
# what Lightning (at its import) and torch's inductor (at first use) set as they run, read when used: a run in
# this process leaves them set, and every later run would start cold; scikit-learn's (at its import: seqeval's
# CoNLL scoring) are read by an Intel OpenMP, which the preload does not load (torch's is GNU libgomp); a Ray
# driver's breakpoint hook stays after ray.shutdown, and Python reads it at each breakpoint()
SET_AS_THEY_RUN = {"PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_CACHE_DIR", "KMP_DUPLICATE_LIB_OK",
                   "KMP_INIT_AT_FORK", "PYTHONBREAKPOINT"}

_lock = threading.Lock()
_server_env: dict[str, str] | None = None  # the environment the forkserver started with


def _read_at_import(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if (k.startswith(READ_AT_IMPORT) or k in READ_AT_IMPORT_NAMES) and k != THREADS
            and k not in SET_AS_THEY_RUN}


def _forkserver() -> multiprocessing.context.BaseContext:
    global _server_env
    with _lock:
        context = multiprocessing.get_context("forkserver")
        if _server_env is None:
            context.set_forkserver_preload(PRELOAD)
            multiprocessing.forkserver.ensure_running()
            _server_env = dict(os.environ)
    return context


def environment() -> dict[str, str]:
    """The environment warm runs are compared with: the forkserver's, or this process's before it starts."""
    return dict(_server_env if _server_env is not None else os.environ)


def prestart() -> None:
    """Starts the forkserver where this process's runs could be warm and returns once it has imported its
    preload (seconds): the table runner's first sweep then starts as the others do, and a rehearsal measures
    that start-up, not the imports."""
    if _environment_allows(os.environ):
        ready = _forkserver().Process(target=_nothing, name="warm-ready")  # forked once the imports are done
        ready.start()
        ready.join()


def _nothing() -> None:
    """prestart's forked run."""


def _script(cmd: list[str]) -> tuple[str, str] | None:
    """("path", script) or ("module", name) of ``[sys.executable, script | -m module, ...]``, else None."""
    if len(cmd) < 2 or cmd[0] != sys.executable:
        return None
    if cmd[1] == "-m" and len(cmd) > 2:
        return "module", cmd[2]
    return ("path", cmd[1]) if cmd[1].endswith(".py") else None


def _environment_allows(env) -> bool:
    if env.get(OPTION, "1") == "0" or sys.platform != "linux":
        return False
    if _server_env is None:
        return True  # the forkserver starts with this process's environment: compared in start()
    # without OMP_NUM_THREADS of its own the child keeps the threads OpenMP gave the forkserver
    same_threads = THREADS in env or THREADS not in _server_env
    return same_threads and _read_at_import(env) == _read_at_import(_server_env)


def warm_possible(cmd: list[str], env: dict[str, str]) -> bool:
    return _script(cmd) is not None and _environment_allows(env)


class WarmProcess:
    """The Popen methods the runner (which signals the child's process group by its pid) and the tests use,
    over a forkserver child."""

    def __init__(self, process: multiprocessing.Process, args: list[str]):
        self.process, self.args = process, args

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.process.exitcode


def start(cmd: list[str], *, cwd: str | Path, env: dict[str, str], stdout: str | Path,
          stderr: str | Path | None = None) -> WarmProcess | None:
    """``cmd`` forked from the forkserver, its output appended to the files ``stdout`` and ``stderr`` (None:
    to ``stdout``); None where it must start cold (see the module's docstring)."""
    if not warm_possible(cmd, env):
        return None
    context = _forkserver()
    if not warm_possible(cmd, env):  # the forkserver has just started, with another environment
        return None
    process = context.Process(target=_child, args=(cmd, str(cwd), dict(env), str(stdout),
                                                   str(stderr if stderr is not None else stdout)),
                              name=shlex.join(cmd[1:3]))
    process.start()
    return WarmProcess(process, cmd)


class _LightningConsole(logging.Handler):
    """Lightning gives its loggers a console handler of their own and stops them propagating when it is
    imported before logging is configured, as in the forkserver; a run imports it after Hydra configured
    logging, and its messages reach Hydra's handlers (train.log). This handler takes the place of Lightning's
    and applies the same rule at the first message instead of at import."""

    def __init__(self, logger: logging.Logger, lightnings: list[logging.Handler]):
        super().__init__()
        self.logger, self.lightnings = logger, lightnings

    def handle(self, record: logging.LogRecord) -> bool:
        self.logger.removeHandler(self)
        if logging.getLogger().handlers:
            self.logger.propagate = True  # read once this logger's handlers are done: the record goes on up
        else:
            for handler in self.lightnings:
                self.logger.addHandler(handler)
                handler.handle(record)
        return True


def _lightning_console_as_at_import() -> None:
    for name in ("lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        if logger.propagate or not logger.handlers:
            continue  # imported with logging configured: nothing to undo
        lightnings = list(logger.handlers)
        for handler in lightnings:
            logger.removeHandler(handler)
        logger.addHandler(_LightningConsole(logger, lightnings))


def _redirect(path: str, fd: int) -> None:
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _child(cmd: list[str], cwd: str, env: dict[str, str], stdout: str, stderr: str) -> None:
    """The forked run: the state a fresh ``python`` would have, then the script or module as __main__."""
    try:
        from setproctitle import setproctitle

        # /proc/<pid>/cmdline names the run (locks.live_processes); before the environment changes:
        # setproctitle finds the argument area through it
        setproctitle(shlex.join(cmd))
    except ImportError:
        pass
    os.setsid()  # its group holds what it starts (DataLoader workers, DDP ranks): the runner signals groups
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the forkserver ignores SIGINT
    sys.stdout.flush()
    sys.stderr.flush()
    _redirect(stdout, 1)
    _redirect(stderr, 2)
    os.environ.clear()
    os.environ.update(env)
    _lightning_console_as_at_import()
    os.chdir(cwd)
    if THREADS in env:  # OpenMP read the forkserver's value when torch loaded
        import torch

        torch.set_num_threads(int(env[THREADS]))
    kind, target = _script(cmd)
    try:
        if kind == "module":
            sys.argv = [target, *cmd[3:]]
            sys.path.insert(0, os.getcwd())  # as `python -m` does
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = cmd[1:]
            sys.path.insert(0, str(Path(target).resolve().parent))  # as `python script.py` does
            runpy.run_path(target, run_name="__main__")
    finally:
        atexit._run_exitfuncs()  # multiprocessing ends its children with os._exit, which skips them
        sys.stdout.flush()
        sys.stderr.flush()
