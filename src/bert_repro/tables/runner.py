"""Runs a table's sweeps through ``src/train.py -m``, each after the pre-training it starts from.

Every job is composed and checked first; a job whose folder holds a result of its science as composed now is
complete, so a relaunch after an edit reruns exactly the changed jobs (earlier results are set aside, never
deleted). Each child leads a process group of its own, so a Ctrl-C reaches the runner alone: SIGTERM or
SIGINT sends each group SIGTERM once (the runs checkpoint and exit), kills what is left after ``GRACE_S`` and
ends in ``Interrupted``; a second signal kills at once. Under submitit_slurm a child is submitit's waiter.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bert_repro.keys import flatten as flat_keys
from bert_repro.keys import is_path, is_science
from bert_repro.lifecycle.checks import UsageError, validate
from bert_repro.lifecycle.exits import launch_error
from bert_repro.lifecycle.folder import RunFolder
from bert_repro.lifecycle.locks import FolderInUse, RunFolderLock, live_processes
from bert_repro.progress import counted
from bert_repro.tables import REPO, TableError, ray_jobs, warm
from bert_repro.tables.compose import compose_job, composing_jobs, hydra_value
from bert_repro.tables.machine import refusal
from bert_repro.tables.progress import TableProgress
from bert_repro.tables.spec import Sweep, Table, flatten

log = logging.getLogger(__name__)

TRAIN = REPO / "src" / "train.py"
LOG = "launch.log"  # every launch of a sweep, appended: the children's stdout and stderr
THREADS = "threads"  # a launcher block's torch threads per process (OMP_NUM_THREADS), not a Hydra override
STAGES = ("pretrain", "finetune")
GPUS = "gpus"  # a local launcher block's devices, shared out among its sweeps_at_once (CUDA_VISIBLE_DEVICES)
ENV = {"CUDA_VISIBLE_DEVICES": GPUS, "OMP_NUM_THREADS": THREADS}  # what the runner's own keys set in a run
PING_S, SILENT_S = 5.0, 30.0  # a SLURM controller that stopped answering is named within a minute
GRACE_S = 300.0  # a batch to finish and a large checkpoint to be written (a scheduler may kill sooner)


class Interrupted(Exception):
    """The runner was told to stop: its children were stopped, and no job was marked failed."""

    def __init__(self, signum: int, stopped: list[str] | None = None):
        self.signum = signum
        running = f" ({', '.join(stopped)})" if stopped else ""
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
        self.signals = 0  # how many came: a second stops at once

    def start(self, cmd: list[str], cwd: Path, env: dict[str, str], log):
        if self.signum is not None:
            raise Interrupted(self.signum)
        proc = warm.start(cmd, cwd=cwd, env=env, stdout=log.name) or subprocess.Popen(
            cmd, start_new_session=True, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.add(proc)
        if self.signum is not None:  # the signal came while it started, before it was in self.procs
            _signal_group(proc.pid, signal.SIGTERM)
        return proc

    def wait(self, proc) -> int:
        """Its exit code; once stopping, its group is killed after GRACE_S, and any leftovers on exit."""
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
        self.signals += 1
        if first:
            self.signum, self.stopped_at = signum, time.monotonic()
        for proc in list(self.procs):
            _signal_group(proc.pid, signal.SIGTERM if first else signal.SIGKILL)

    @contextmanager
    def handling_signals(self):
        """``stop`` handles SIGTERM and SIGINT while the table runs (in the main thread: only it may)."""
        main = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, self.stop) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.signum = self.stopped_at = None  # the next table in this process starts afresh
            self.signals = 0


CHILDREN = Children()


def job_state(folder: Path, config: dict | None = None) -> tuple[str, str | None]:
    """RunFolder.state: (complete | failed | missing, why); a damaged result stops the table, naming it. With
    ``config`` (the job's science as composed now, job_configs), a complete result of other science is
    ``other``, naming the keys that differ: run would run it again, so no table shows it as this job's."""
    try:
        state, why = RunFolder(folder).state()
        if state == "complete" and config is not None and RunFolder(folder).result_for(config) is None:
            return "other", RunFolder(folder).in_the_way(config)
        return state, why
    except ValueError as err:
        raise TableError(str(err)) from None


def job_configs(table: Table, root: Path | None = None) -> dict[Path, dict]:
    """Every job's science as composed now, by folder (job_config; checked as the run will be, when
    ``root``)."""
    jobs = [(s, swept, f) for s in table.sweeps.values() if s.skip is None for swept, f in s.jobs()]
    copies: dict = {}  # each sweep's config, its jobs' values (the same keys) set over the last job's
    with composing_jobs():
        return {f: job_config(s, swept, root, copies.setdefault(s.name, {}))
                for s, swept, f in counted(jobs, "jobs composed", every_s=10)}


def job_config(sweep: Sweep, swept: list[str], root: Path | None, copies: dict | None = None) -> dict:
    """The job's science as src/train.py composes it now (within ``composing_jobs``), checked as its run
    will check it when ``root`` (the folder it writes under) is given, writing nothing; what fails is a
    TableError naming the job. ``copies``: its sweep's config composed so far (compose_job)."""
    where = " ".join([sweep.name, *swept])
    try:
        cfg = compose_job(sweep.compose_args(), swept, {} if copies is None else copies)
        if root is not None:
            validate(cfg, next(p for p in (root, *root.parents) if p.is_dir()))
        plain = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
                 for k in cfg if is_science(k)}
    except (HydraException, OmegaConfBaseException, UsageError, ValueError) as err:
        raise TableError(f"job {where}: {str(err).split(chr(10) * 2)[0]}") from None  # less Hydra's paths
    ours = str(sweep.needs.folder) if sweep.needs is not None else None  # what the table writes first
    for key, value in flat_keys(plain).items() if root is not None else ():  # a local path the run reads
        if is_path(key) and isinstance(value, str) and value.startswith("/") and not Path(value).exists() \
                and not (ours and value.startswith(ours)):
            raise TableError(f"job {where}: {key}={value} does not exist")
    return plain


def command(sweep: Sweep, swept: list[str], launcher: dict, folder: Path | None = None) -> list[str]:
    """The multirun of ``sweep``: each job's folder is ``sweep.folder/<run name of the swept keys>``. With
    ``folder``: the one job, run there (a Ray task: a run, whose command Lightning's DDP may start again)."""
    keys = [*sweep.fixed_args(), *swept, *(f"{k}={hydra_value(v)}" for k, v in flatten(launcher).items())]
    if folder is not None:
        return [sys.executable, str(TRAIN), *keys, f"hydra.run.dir={folder}"]
    excluded = ",".join(k.lstrip("+") for k in sweep.overrides)  # the sweep's folder says them
    return [sys.executable, str(TRAIN), "--multirun", *keys, f"hydra.sweep.dir={sweep.folder}",
            f"hydra.job.config.override_dirname.exclude_keys=[{excluded}]"]


def _launch(sweep: Sweep, swept: list[str], launcher: dict, dry_run: bool = False) -> tuple[int, str]:
    cmd = command(sweep, swept, {k: v for k, v in launcher.items() if k not in ENV.values()})
    # torch sizes its intra-op pool from OMP_NUM_THREADS at start-up; CUDA numbers the devices it is given
    own = {name: str(launcher[key]) for name, key in ENV.items() if launcher.get(key) is not None}
    if dry_run:
        print("".join(f"{k}={v} " for k, v in own.items()) + " ".join(cmd))
        return 0, ""
    log.info("%s: launching %s", sweep.name, " ".join(swept) or "one run")
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **own}
    sweep.folder.mkdir(parents=True, exist_ok=True)
    with (sweep.folder / LOG).open("a+") as out:  # read back for the errors
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        out.flush()
        start = out.tell()
        code = CHILDREN.wait(CHILDREN.start(cmd, cwd=REPO, env=env, log=out))
        if CHILDREN.signum is not None:  # stopped by the runner: not failed, a relaunch resumes them
            log.warning("%s: stopped (%s)", sweep.name, signal.Signals(CHILDREN.signum).name)
            raise Interrupted(CHILDREN.signum)
        out.seek(start)
        return code, out.read()


def _ray_launch(sweep: Sweep, batch: list, launcher: dict) -> list[tuple[int, str]]:
    """Each job of ``batch`` a Ray task at once (ray_jobs); a job whose worker died is marked failed, why."""
    ours = (*ENV.values(), *(f"{ray_jobs.KEY}.{k}" for k in ray_jobs.resources(launcher)))
    keys = {k: v for k, v in launcher.items() if k not in ours}
    commands = [(command(sweep, swept, keys, folder), folder) for swept, [(_, folder)] in batch]
    log.info("%s: %d jobs to Ray", sweep.name, len(commands))
    sweep.folder.mkdir(parents=True, exist_ok=True)
    outcomes = ray_jobs.run_jobs(commands, launcher, {**os.environ, "HYDRA_FULL_ERROR": "0"}, GRACE_S,
                                 lambda: CHILDREN.signals)
    if CHILDREN.signum is not None:  # stopped by the runner: not failed, a relaunch resumes them
        raise Interrupted(CHILDREN.signum)
    for (_, folder), (_, output, died) in zip(commands, outcomes):
        if died is not None:
            RunFolder(folder).fail(died, output)
    return [(code, output) for code, output, _ in outcomes]


def run_sweep(sweep: Sweep, launcher: dict, todo: list[tuple[list[str], Path]] | None = None
              ) -> dict[str, int]:
    """Launch ``todo`` (default: the jobs without a complete result); counts of skipped, complete, failed."""
    jobs = sweep.jobs()
    todo = [(s, f) for s, f in jobs if job_state(f)[0] != "complete"] if todo is None else todo
    counts = {"skipped": len(jobs) - len(todo), "complete": 0, "failed": 0}
    if not todo:
        return counts
    reason = sweep.skip
    if reason is None and sweep.needs is not None:
        upstream, why = job_state(sweep.needs.jobs()[0][1])
        if upstream != "complete":
            reason = f"pre-training run {sweep.needs.name} {upstream}" + (f": {why}" if why else "")
        elif not sweep.init_path().is_file():
            reason = f"pre-training run {sweep.needs.name} left no {sweep.checkpoint}"
    for _, folder in todo:
        RunFolder(folder).failed.unlink(missing_ok=True)  # the verdict this launch replaces
        if reason is not None:
            RunFolder(folder).fail(reason)
    if reason is not None:
        return {**counts, "failed": len(todo)}
    on_ray = bool(ray_jobs.resources(launcher))  # every job a Ray task of its own, all at once
    whole = len(todo) == len(jobs) and not on_ray  # the whole grid in one multirun (a launcher may spread it)
    launches = [(sweep.params_args(), todo)] if whole else [(s, [(s, f)]) for s, f in todo]
    while launches:
        batch = launches[:] if on_ray else launches[:1]
        outcomes = _ray_launch(sweep, batch, launcher) if on_ray else [_launch(sweep, batch[0][0], launcher)]
        del launches[:len(batch)]
        for (_, members), (code, output) in zip(batch, outcomes):
            _record(members, code, output, launches, counts)
    return counts


def _record(members: list, code: int, output: str, launches: list, counts: dict) -> None:
    """After a launch of ``members``: why each job without a result has none, or its relaunch queued."""
    unreached = [(s, f) for s, f in members if job_state(f)[0] == "missing"]
    if code != 0 and 0 < len(unreached) < len(members):  # stopped at a failed job: the rest one by one
        launches.extend((s, [(s, f)]) for s, f in unreached)
        members = [m for m in members if m not in unreached]
    for _, folder in members:  # src/train.py recorded every job it ran; the launch says why one is not
        run = RunFolder(folder)
        if not run.results.is_file() and not run.failed.is_file():
            why = launch_error(output) if code > 0 else "the launcher ran no job here" if not code else \
                f"the run was killed by {signal.Signals(-code).name} before writing its result"
            run.fail(why, output)
        counts["complete" if job_state(folder)[0] == "complete" else "failed"] += 1


def plan_jobs(table: Table, force: bool = False) -> tuple[dict[str, list], list[tuple[Path, str]]]:
    """Every sweep's jobs to run, and the folders whose earlier results make way for them with why; a complete
    result of its science now is not run again, unless ``force`` or its pre-training runs again."""
    rerun: set[str] = set()  # pre-training sweeps that run again in this launch
    todo: dict[str, list] = {}
    moves: list[tuple[Path, str]] = []
    configs = job_configs(table, table.root)
    for name, sweep in table.sweeps.items():  # a sweep comes after the one it needs
        upstream = sweep.needs is not None and sweep.needs.name in rerun
        why = "--force" if force else "its pre-training runs again" if upstream else None
        todo[name] = [(swept, f) for swept, f in sweep.jobs()
                      if why or f not in configs or RunFolder(f).result_for(configs[f]) is None]
        moves += [(f, way) for _, f in todo[name]
                  if f.is_dir() and (way := RunFolder(f).in_the_way(configs.get(f, {})) or why)]
        if todo[name] and sweep.stage == "pretrain":
            rerun.add(name)
    return todo, moves


def stage_launcher(launcher: dict | None, stage: str) -> dict:
    launcher = launcher or {}
    keys = {**flatten(launcher.get("common")), **flatten(launcher.get(stage))}
    return keys if launcher.get(THREADS) is None else {**keys, THREADS: launcher[THREADS]}


def slots(launcher: dict | None, sweeps: int = 1) -> tuple[dict, list[str | None]]:
    """The launcher block with its ``sweeps_at_once`` and ``threads`` filled, and each slot's devices. A local
    block (no Hydra launcher of its own) fills what it leaves unset from the cores this process may use and
    its ``gpus``: a slot a GPU (or a share of them), else a slot a core (small models use cores better as
    processes than as threads), the cores shared out among the slots. A Ray block hands Ray every one of the
    table's ``sweeps`` as it is ready: Ray queues and places their jobs."""
    given, launcher = launcher is not None, dict(launcher or {})
    gpus = [str(g) for g in launcher.get(GPUS) or []]
    local = not any("hydra/launcher" in flatten(launcher.get(part)) for part in ("common", *STAGES))
    if ray_jobs.KEY in launcher:
        launcher["sweeps_at_once"] = launcher.get("sweeps_at_once") or sweeps
    elif local and given:  # no block at all (a rehearsal, a test): one sweep at a time, torch's threads
        cores = len(os.sched_getaffinity(0))
        launcher["sweeps_at_once"] = launcher.get("sweeps_at_once") or len(gpus) or \
            max(1, cores // int(launcher.get(THREADS) or 1))
        launcher[THREADS] = launcher.get(THREADS) or max(1, cores // int(launcher["sweeps_at_once"]))
    at_once = int(launcher.get("sweeps_at_once") or 1)
    if at_once < 1:
        raise TableError(f"launcher sweeps_at_once={at_once}: expected 1 or more")
    n = len(gpus)
    share = [gpus[i % n] if n < at_once else ",".join(gpus[i * n // at_once:(i + 1) * n // at_once])
             for i in range(at_once)] if n else [None] * at_once  # fewer GPUs than sweeps: sweeps share them
    return launcher, share


def critical_path(table: Table, cost: dict[str, float]) -> dict[str, float]:
    """Each sweep's cost plus that of the costliest chain of sweeps waiting on it."""
    chain: dict[str, float] = {}
    for name in reversed(list(table.sweeps)):  # a sweep comes after the one it needs
        after = [n for n, s in table.sweeps.items() if s.needs is not None and s.needs.name == name]
        chain[name] = cost.get(name, 0.0) + max((chain[n] for n in after), default=0.0)
    return chain


def sweep_costs(plan: dict) -> dict[str, float]:
    costs: Counter[str] = Counter()
    for run in plan["runs"]:
        costs[run["name"].rsplit("/", 1)[0]] += run["flops"]
    return costs


def failed_jobs(table: Table) -> list[str]:
    return [name for name, folder in table.jobs().items() if job_state(folder)[0] == "failed"]


def _hold(table: Table, todo: dict) -> ExitStack:
    """The table's folder and each store pre-training it uses, locked for the runner's life, once no live
    process sweeps into or holds the folders to run; else a TableError naming who holds them."""
    stack = ExitStack()
    try:
        for folder in sorted({table.root} | {s.folder for s in table.sweeps.values()
                                             if s.stage == "pretrain" and s.phase != 1}):
            stack.enter_context(RunFolderLock(folder))
    except FolderInUse as err:
        stack.close()
        raise TableError(f"{str(err).split(';')[0]}: another table runner; wait for it to end or stop it. "
                         "Nothing was moved or launched") from None
    folders = [f for jobs in todo.values() for _, f in jobs]  # a sweep holds no lock while it starts up
    live = [f"process {pid} is sweeping into {f}" for f in {f.parent for f in folders}
            for pid in live_processes(f)]
    for folder in (f for f in folders if f.is_dir()):
        try:
            with RunFolderLock(folder):
                pass
        except FolderInUse as err:
            live.append(str(err).split(";")[0])  # the holder; its advice is for a single run
    if live:
        stack.close()
        raise TableError(f"{'; '.join(live)} (a sweep that a killed runner left behind, or another "
                         "runner's): wait for it to end or stop it; nothing was moved or launched")
    return stack


def _watch_slurm(said: list[str], done: threading.Event) -> None:
    """Asks the SLURM controller every PING_S whether it answers; after SILENT_S without an answer, stops
    the runner's children (submitit's waiters: the jobs stay with SLURM) and says why in ``said``."""
    since = None
    while not done.wait(PING_S):
        try:
            ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=PING_S)
            answer, ok = (ping.stdout + ping.stderr).strip(), ping.returncode == 0
        except (OSError, subprocess.TimeoutExpired) as err:
            answer, ok = str(err), False
        since = None if ok and "DOWN" not in answer else since or time.monotonic()
        if since is not None and time.monotonic() - since >= SILENT_S:
            said.append(answer or "no answer")
            CHILDREN.stop(signal.SIGTERM)
            return


def run_table(table: Table, launcher: dict | None = None, force: bool = False,
              dry_run: bool = False, plan: dict | None = None) -> list[dict]:
    """Every sweep of ``table``, ``sweeps_at_once`` side by side (ordered by ``plan``'s costs, made here if
    not given); one line of counts per sweep, in table order."""
    launcher, devices = slots(launcher, len(table.sweeps))
    todo, moves = plan_jobs(table, force)
    if dry_run:  # each sweep's multirun, or the first of its jobs left
        for name, sweep in ((n, s) for n, s in table.sweeps.items() if todo[n]):
            swept = sweep.params_args() if len(todo[name]) == len(sweep.jobs()) else todo[name][0][0]
            _launch(sweep, swept, stage_launcher(launcher, sweep.stage), dry_run=True)
        return []
    if why := refusal(table, todo, launcher):  # before any job: not hundreds of failures in its place
        raise TableError(why)
    said, done = [], threading.Event()
    with _hold(table, todo):
        for folder, why in moves:
            with RunFolderLock(folder):  # no run may start into it meanwhile
                aside = RunFolder(folder).set_aside()
            if aside is not None:
                print(f"{folder}: {why}; moved to {aside} (kept), to run again", flush=True)
        if any("submitit_slurm" in str(v) for v in flatten(launcher).values()):
            threading.Thread(target=_watch_slurm, args=(said, done), daemon=True).start()
        try:
            with ray_jobs.cluster(launcher[ray_jobs.KEY], {s: stage_launcher(launcher, s) for s in STAGES}) \
                    if ray_jobs.KEY in launcher else nullcontext() as on_ray:
                return _sweeps(table, launcher, todo, devices, plan, on_ray)
        except Interrupted:
            if not said:
                raise
            left = [name for name, folder in table.jobs().items() if job_state(folder)[0] != "complete"]
            raise TableError(f"the SLURM controller stopped answering for {SILENT_S:.0f} s (scontrol ping: "
                             f"{said[0]}); still queued or running: {', '.join(left)}. Jobs already "
                             "submitted stay with SLURM; when it answers again, the same command resumes the "
                             "table") from None
        finally:
            done.set()


def _sweeps(table: Table, launcher: dict, todo: dict, devices: list, plan: dict | None,
            on_ray: dict[str, float] | None = None) -> list[dict]:
    """The sweeps, each in a slot of ``devices`` as it is ready; ``on_ray``: how many of each stage's jobs Ray
    runs at once (ray_jobs.cluster), for the ETA."""
    order, at_once, free = list(table.sweeps), len(devices), queue.SimpleQueue()
    for slot in devices:
        free.put(slot)
    if at_once > 1:  # a free slot takes the ready sweep with the longest chain of work behind it
        if plan is None:
            from bert_repro.tables.plan import make_plan

            plan = make_plan(table)
        chain = critical_path(table, sweep_costs(plan))
        order.sort(key=lambda name: -chain[name])
    jobs = table.jobs()
    planned = [r for r in (plan or {}).get("runs", []) if r["name"] in jobs]
    progress = TableProgress(list(jobs.values()), weights={jobs[r["name"]]: r["flops"] for r in planned},
                             kinds={f: s.kind for s in table.sweeps.values() for _, f in s.jobs()},
                             sweeps={n: [f for _, f in table.sweeps[n].jobs()] for n in order},
                             needs={n: s.needs.name for n, s in table.sweeps.items() if s.needs is not None},
                             at_once=at_once, on_ray=on_ray)
    lines: dict[str, dict] = {}  # by sweep, once it ended

    def one(sweep: Sweep) -> dict:
        start, slot = time.time(), free.get()  # a slot's devices are its sweep's alone while it runs
        try:
            counts = run_sweep(sweep, {**stage_launcher(launcher, sweep.stage), GPUS: slot}, todo[sweep.name])
        finally:
            free.put(slot)
        log.info("%-50s skipped %d, complete %d, failed %d (%.0f s)", sweep.name, counts["skipped"],
                 counts["complete"], counts["failed"], time.time() - start)
        return {"sweep": sweep.name, **counts, "wall_s": round(time.time() - start, 1)}

    if any(todo.values()):
        warm.prestart()  # the first sweep then starts as the others do (and a rehearsal measures that)
    with CHILDREN.handling_signals(), progress, ThreadPoolExecutor(at_once) as pool:
        running: dict = {}
        while order or running:
            ready = [n for n in order if table.sweeps[n].needs is None or table.sweeps[n].needs.name in lines]
            for name in ready[:at_once - len(running)]:
                order.remove(name)
                progress.started(name, table.sweeps[name].folder / LOG)
                running[pool.submit(one, table.sweeps[name])] = name
            done, _ = wait(running, progress.every_s, FIRST_COMPLETED)
            for future in done:
                progress.finished(name := running.pop(future))
                try:
                    lines[name] = future.result()  # a TableError (a malformed result) stops the table
                except Interrupted as stop:  # leaving the pool waits for the other sweeps' children to stop
                    raise Interrupted(stop.signum, [name, *running.values()]) from None
            progress.refresh()
        if CHILDREN.signum is not None:  # the signal came as the last sweep ended
            raise Interrupted(CHILDREN.signum)
    return [lines[name] for name in table.sweeps if name in lines]
