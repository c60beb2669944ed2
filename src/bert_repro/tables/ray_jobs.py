"""``LAUNCHER=ray``: each job of a table a Ray task that asks for its share of a node (``num_gpus``,
fractional to share a GPU; ``num_cpus``). Ray places the tasks on a local instance or a running cluster
(``ray.address``) and sets each one's ``CUDA_VISIBLE_DEVICES``; the table runner keeps its order (a
pre-training before its fine-tunings), its identity checks, locks and signals. A task runs the job's
``src/train.py``, its output in ``<sweep>/<job>.log``; a task whose worker dies is the job's failure, named
with its folder, and the table's other jobs go on. Not hydra-ray-launcher: its pins (cloudpickle<3, boto3's
python-dateutil<3) conflict with constraints.txt.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable
from contextlib import contextmanager, suppress
from pathlib import Path

from bert_repro.tables import REPO, TableError

log = logging.getLogger(__name__)

KEY = "ray"  # a launcher block's node: top level, the cluster (address, init); per stage, a job's resources
POLL_S = 1.0
RESOURCE = {"num_gpus": "GPU", "num_cpus": "CPU"}  # a task's asks and the cluster's resources
DEFAULT = {"num_cpus": 1}  # what a Ray task asks unless told otherwise
PR_SET_PDEATHSIG = 1  # prctl(2)


def resources(launcher: dict) -> dict:
    """A stage's ``ray.*`` keys (stage_launcher's flat keys): the task's options (num_gpus, num_cpus, ...)."""
    return {k.removeprefix(f"{KEY}."): v for k, v in launcher.items() if k.startswith(f"{KEY}.")}


def fits(have: dict[str, float], launcher: dict) -> float:
    """How many of a stage's tasks the cluster's resources ``have`` (ray.cluster_resources) run at once: for
    each resource the task asks, how many of its asks the cluster holds; the fewest."""
    asks = {**DEFAULT, **resources(launcher)}
    return min((int(have.get(name, 0) / float(asks[key]) + 1e-9)  # 0.3 / 0.1 falls a hair short of 3
                for key, name in RESOURCE.items() if float(asks.get(key) or 0)), default=math.inf)


@contextmanager
def cluster(block: dict, stages: dict[str, dict]):
    """Ray connected for the table's life: ``block['address']``'s cluster, else a Ray instance on this node
    (``block['init']``: ray.init's arguments); it yields how many of each stage's jobs run at once (fits). A
    stage asking more than the cluster has is a TableError."""
    try:
        import ray
    except ImportError:
        raise TableError("LAUNCHER=ray needs Ray: pip install -e '.[ray]'") from None
    try:
        ray.init(address=block.get("address"), **(block.get("init") or {}))
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise TableError(f"Ray did not start (launchers.ray.ray: {block}): {type(err).__name__}: "
                         f"{err}") from None
    try:
        have = ray.cluster_resources()
        for stage, launcher in stages.items():
            for key, asked in {**DEFAULT, **resources(launcher)}.items():
                name = RESOURCE.get(key)
                if name and float(asked or 0) > have.get(name, 0):
                    raise TableError(f"launchers.ray.{stage}.ray.{key}={asked}: the Ray cluster has "
                                     f"{have.get(name, 0):g} {name}; ask for less, or give Ray more "
                                     f"(launchers.ray.ray.init.{key}=N declares them on a local instance)")
        yield {stage: fits(have, launcher) for stage, launcher in stages.items()}
    finally:
        ray.shutdown()


def _die_with_parent() -> None:
    """A job's process ends (SIGTERM: it checkpoints) when the Ray worker that started it dies."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def job(cmd: list[str], env: dict[str, str], out: str, grace_s: float) -> int:
    """The Ray task: ``cmd`` on the devices and cores Ray gave this worker, its exit code. ray.cancel (the
    runner stopped) arrives as KeyboardInterrupt: the run gets SIGTERM, saves a checkpoint and exits; a second
    cancel (a second Ctrl-C) kills it."""
    given = {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS") if k in os.environ}
    with open(out, "a") as log_file:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**env, **given}, stdout=log_file,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        try:
            while True:
                with suppress(subprocess.TimeoutExpired):
                    return proc.wait(timeout=POLL_S)  # a poll: the cancel is raised between two
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                return proc.wait(timeout=grace_s)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                os.killpg(proc.pid, signal.SIGKILL)
                return proc.wait()


def run_jobs(commands: list[tuple[list[str], Path]], launcher: dict, env: dict[str, str], grace_s: float,
             stopping: Callable[[], int]) -> list[tuple[int, str, str | None]]:
    """Each (command, job folder) a Ray task at once; for each, its exit code, output and, where its worker
    died, why. ``stopping``: how many stop signals the table got; each is passed on as a cancel (job)."""
    import ray
    from ray.exceptions import RayError, TaskCancelledError

    task = ray.remote(job).options(max_retries=0, **resources(launcher))  # a dead worker: the job failed
    logs = [folder.parent / f"{folder.name}.log" for _, folder in commands]
    refs = [task.remote(cmd, env, str(out), grace_s) for (cmd, _), out in zip(commands, logs)]
    pending, cancelled, passed = list(refs), None, 0
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
        if passed < stopping():  # one a poll: a task handles the first while the second comes
            passed, cancelled = passed + 1, cancelled or time.monotonic()
            for ref in pending:
                ray.cancel(ref)
        elif cancelled is not None and time.monotonic() > cancelled + grace_s + 30:
            for ref in pending:
                ray.cancel(ref, force=True)
    outcomes = []
    for ref, out, (_, folder) in zip(refs, logs, commands):
        output = out.read_text() if out.is_file() else ""
        try:
            outcomes.append((ray.get(ref), output, None))
        except TaskCancelledError:
            outcomes.append((-signal.SIGTERM, output, None))
        except RayError as err:
            why = f"its Ray worker died ({type(err).__name__}: {str(err).splitlines()[0]})"
            log.warning("%s: %s", folder, why)
            outcomes.append((1, output, why))
    return outcomes
