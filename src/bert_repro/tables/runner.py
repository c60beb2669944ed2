"""Runs a table's sweeps through ``src/train.py -m``: pre-training first, then the fine-tuning that starts
from it.

A job whose results.json says ``complete`` is skipped (an interrupted table resumes); ``force`` re-runs it.
A job's state is its results.json, which src/train.py writes for every run it started, a failed one with its
reason. The runner writes ``failed.json`` only for what it decides itself: a job its launch never reached (a
Hydra compose error: the launch's output says why), fine-tuning from a failed pre-training run (not started),
a folder it will not re-run without --force. A failure does not stop the table: the jobs a failed multirun
never reached are launched on their own.

The runner owns its children (tables/children.py): SIGTERM or SIGINT stops them, each saving a checkpoint,
and the table with them; a relaunch resumes. Nothing is deleted without --force, and never a folder that a
live process is sweeping into.

A launcher block's ``sweeps_at_once: N`` runs up to N sweeps side by side, each as soon as the pre-training
run it starts from has ended, the longest chain of work first (the plan's FLOPs); ``threads: K`` gives each
sweep's processes K torch threads (OMP_NUM_THREADS), so N sweeps share the cores instead of fighting for them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import yaml

from bert_repro.lifecycle import warm
from bert_repro.lifecycle.checks import TRACEBACK_HINT
from bert_repro.lifecycle.locks import FolderInUse, RunFolderLock
from bert_repro.lifecycle.results import read_results
from bert_repro.tables.children import CHILDREN, Interrupted, live_processes
from bert_repro.tables.progress import TableProgress
from bert_repro.tables.spec import REPO, Sweep, Table, TableError, flatten, hydra_value

log = logging.getLogger(__name__)

TRAIN = REPO / "src" / "train.py"
LOG = "launch.log"  # every launch of a sweep, appended: the children's stdout and stderr
THREADS = "threads"  # a launcher block's torch threads per process (OMP_NUM_THREADS), not a Hydra override
NOISE = ("Set the environment variable HYDRA_FULL_ERROR", "Traceback", "Error executing job")


def job_state(folder: Path) -> tuple[str, str | None]:
    """(complete | failed | missing, reason) of one job folder: its results.json (src/train.py's record, a
    failure's reason in it), else the runner's failed.json, else a folder Hydra made for a run that stopped
    before its record (killed, or stopped by the runner: a relaunch resumes it)."""
    results = folder / "results.json"
    if results.is_file():
        try:
            record = read_results(results)
        except ValueError as err:  # names the file and what it lacks
            raise TableError(str(err)) from None
        status = record["status"]
        return ("complete", None) if status == "complete" else (
            "failed", record.get("reason") or f"run ended with status {status!r}")
    failed = folder / "failed.json"
    if failed.is_file():
        return "failed", json.loads(failed.read_text()).get("reason")
    if (folder / ".hydra").is_dir():
        return "failed", "no results.json (the run stopped early)"
    return "missing", None


def launch_error(output: str) -> str:
    """The line of a failed launch's output that says what went wrong: Hydra's compose error, the error
    src/train.py logged before stopping the whole sweep (run.SweepUsageError), the exception."""
    logged = [line.split("][ERROR] - ", 1)[1] for line in output.splitlines() if "][ERROR] - " in line]
    if logged:
        return logged[-1].replace(f" {TRACEBACK_HINT}", "").strip()
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    lines = [line for line in lines
             if not re.match(r"^\[\d{4}-\d\d-\d\d ", line) and not line.startswith(NOISE)]
    if "Error executing job" in output or "Traceback" in output:
        return lines[-1] if lines else "the run failed"
    return lines[0] if lines else "the run failed without output"


def unrecorded(code: int, output: str) -> str:
    """Why a launch left a job without results.json: it never reached the job (the launch's error), or a
    signal killed the process before it could write one."""
    if code < 0:
        return f"the run was killed by {signal.Signals(-code).name} before writing results.json"
    return launch_error(output) if code else "the launcher ran no job here"


def mark_failed(folder: Path, reason: str, output: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    record = {"reason": reason, "output_tail": output[-4000:]}
    (folder / "failed.json").write_text(json.dumps(record, indent=2) + "\n")


def _live(sweep_folder: Path, job_folders: list[Path]) -> list[str]:
    """What holds a sweep's folders now: a run's lock on a job folder (locks.py), or a process sweeping into
    them, which holds no lock while it starts up."""
    live = [f"process {pid} is sweeping into {sweep_folder}" for pid in live_processes(sweep_folder)]
    for folder in job_folders:
        if folder.is_dir():
            try:
                with RunFolderLock(folder):
                    pass
            except FolderInUse as err:
                live.append(str(err).split(";")[0])  # the holder; its advice is for a single run
    return live


def resumes_itself(folder: Path) -> bool:
    """A re-run in ``folder`` continues from the folder's own last.ckpt (its command has ckpt_path=last)."""
    config = folder / ".hydra" / "config.yaml"
    return config.is_file() and (yaml.safe_load(config.read_text()) or {}).get("ckpt_path") == "last"


def _make_way(folder: Path, force: bool) -> str | None:
    """Readies an earlier attempt's folder for a re-run, or says why it will not be re-run.

    FORCE deletes the folder, saying so. Otherwise nothing of it is deleted (it was not made by this
    invocation) but the runner's own failed.json, the verdict this re-run replaces: src/train.py resumes from
    the folder's last.ckpt and writes its results.json over the old one. Checkpoints that the re-run would not
    resume stay, and so does the job, failed with the reason (Lightning would save new checkpoints beside them
    as last-v1.ckpt)."""
    if not (folder / ".hydra").is_dir() and not (folder / "failed.json").is_file():
        return None  # no earlier attempt here
    if force:
        log.warning("--force: deleting %s, an earlier attempt's run folder, to run it afresh", folder)
        with RunFolderLock(folder):  # no run may start into it meanwhile
            shutil.rmtree(folder)
        return None
    if any((folder / "checkpoints").glob("*.ckpt")) and not resumes_itself(folder):
        return (f"{folder} holds checkpoints of an earlier attempt that a re-run would not resume (its "
                "ckpt_path is not last); run the table with --force to delete that folder and run it afresh")
    (folder / "failed.json").unlink(missing_ok=True)
    return None


def command(sweep: Sweep, swept: list[str], launcher: dict) -> list[str]:
    """The multirun of ``sweep``: every job's folder is ``sweep.folder/<run folder name of the swept keys>``
    (conf/train.yaml's hydra.sweep.subdir, as Sweep.jobs names it)."""
    fixed = sweep.fixed_args()
    excluded = [k for k in sweep.overrides]  # kept out of the folder name: the sweep folder says them
    return [sys.executable, str(TRAIN), "--multirun", *fixed, *swept,
            *(f"{k}={hydra_value(v)}" for k, v in flatten(launcher).items()),
            f"hydra.sweep.dir={sweep.folder}",
            f"hydra.job.config.override_dirname.exclude_keys=[{','.join(k.lstrip('+') for k in excluded)}]"]


def _launch(sweep: Sweep, swept: list[str], launcher: dict, dry_run: bool = False) -> tuple[int, str]:
    threads = launcher.get(THREADS)
    launcher = {k: v for k, v in launcher.items() if k != THREADS}
    cmd = command(sweep, swept, launcher)
    if dry_run:
        print(("" if threads is None else f"OMP_NUM_THREADS={threads} ") + " ".join(cmd))
        return 0, ""
    log.info("%s: launching %s", sweep.name, " ".join(swept) or "one run")
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    if threads is not None:  # torch sizes its intra-op pool from it at start-up
        env["OMP_NUM_THREADS"] = str(threads)
    # the child's output streams into the sweep's folder as it runs (tail -f it), and is read back for errors
    sweep.folder.mkdir(parents=True, exist_ok=True)
    path = sweep.folder / LOG
    with path.open("a") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        out.flush()
        start = out.tell()
        code = CHILDREN.wait(CHILDREN.start(cmd, cwd=REPO, env=env, log=out))
    if CHILDREN.signum is not None:  # stopped by the runner: its jobs are not failed, a relaunch resumes them
        log.warning("%s: stopped (%s)", sweep.name, signal.Signals(CHILDREN.signum).name)
        raise Interrupted(CHILDREN.signum)
    with path.open() as written:
        written.seek(start)
        return code, written.read()


def run_sweep(sweep: Sweep, launcher: dict, force: bool = False, dry_run: bool = False) -> dict[str, int]:
    """Launch the jobs of ``sweep`` that are not complete; returns counts of skipped / complete / failed
    jobs."""
    jobs = sweep.jobs()
    todo = [(swept, folder) for swept, folder in jobs if force or job_state(folder)[0] != "complete"]
    counts = {"skipped": len(jobs) - len(todo), "complete": 0, "failed": 0}
    if not todo:
        return counts
    if dry_run:
        swept = sweep.params_args() if len(todo) == len(jobs) else todo[0][0]
        _launch(sweep, swept, launcher, dry_run=True)
        return counts
    if live := _live(sweep.folder, [folder for _, folder in todo]):
        raise TableError(f"{sweep.name}: {'; '.join(live)} (a sweep that a killed runner left behind, or "
                         "another runner's): wait for it to end or stop it, then run the table again; "
                         "nothing was deleted or launched")
    reason = sweep.skip
    if reason is None and sweep.needs is not None:
        upstream, why = job_state(sweep.needs.jobs()[0][1])
        if upstream != "complete":
            reason = f"pre-training run {sweep.needs.name} {upstream}" + (f": {why}" if why else "")
        elif not sweep.init_path().is_file():
            reason = f"pre-training run {sweep.needs.name} left no {sweep.checkpoint}"
    not_run = {folder: _make_way(folder, force) or reason for _, folder in todo}
    for folder, why in not_run.items():
        if why is not None:
            mark_failed(folder, why)
            counts["failed"] += 1
    todo = [(swept, folder) for swept, folder in todo if not_run[folder] is None]
    if not todo:
        return counts
    # the whole grid in one multirun (the launcher may spread it); a partial grid one job at a time
    if len(todo) == len(jobs):
        batches = [(sweep.params_args(), todo)]
    else:
        batches = [(swept, [(swept, f)]) for swept, f in todo]
    for swept, members in batches:
        code, output = _launch(sweep, swept, launcher)
        unreached = [(s, f) for s, f in members if job_state(f)[0] == "missing"]
        if code != 0 and len(members) > 1 and len(unreached) < len(members):  # stopped at a failed job
            for s, f in unreached:
                code_one, out_one = _launch(sweep, s, launcher)
                if not (f / "results.json").is_file():
                    mark_failed(f, unrecorded(code_one, out_one), out_one)
        for _, folder in members:  # src/train.py recorded every job it ran; the launch says why one is not
            if not (folder / "results.json").is_file() and not (folder / "failed.json").is_file():
                mark_failed(folder, unrecorded(code, output), output)
            counts["complete" if job_state(folder)[0] == "complete" else "failed"] += 1
    return counts


def stage_launcher(launcher: dict | None, stage: str) -> dict:
    """A launcher block's settings for one stage: ``common``, then the stage's own, as dotted override
    keys, and ``threads`` (the runner's own setting, not a Hydra override) where the block sets it."""
    launcher = launcher or {}
    stage_keys = {**flatten(launcher.get("common")), **flatten(launcher.get(stage))}
    return stage_keys if launcher.get(THREADS) is None else {**stage_keys, THREADS: launcher[THREADS]}


def critical_path(table: Table, cost: dict[str, float]) -> dict[str, float]:
    """Each sweep's cost plus that of the costliest chain of sweeps waiting on it: the order in which a
    scheduler with free slots starts the ready sweeps (longest chain first)."""
    after: dict[str, list[str]] = {name: [] for name in table.sweeps}
    for name, sweep in table.sweeps.items():
        if sweep.needs is not None:
            after[sweep.needs.name].append(name)
    chain: dict[str, float] = {}
    for name in reversed(list(table.sweeps)):  # a sweep comes after the one it needs
        chain[name] = cost.get(name, 0.0) + max((chain[n] for n in after[name]), default=0.0)
    return chain


def sweep_costs(plan: dict) -> dict[str, float]:
    """The plan's FLOPs of each sweep (tables.plan.make_plan), summed over its jobs."""
    costs: dict[str, float] = {}
    for run in plan["runs"]:
        sweep = run["name"].rsplit("/", 1)[0]
        costs[sweep] = costs.get(sweep, 0.0) + run["flops"]
    return costs


def run_table(table: Table, launcher: dict | None = None, force: bool = False,
              dry_run: bool = False, plan: dict | None = None) -> list[dict]:
    """Every sweep of ``table``, pre-training first, ``sweeps_at_once`` of them side by side (default 1: in
    table order; more order them by ``plan``'s costs, made here if not given); one line of counts per sweep,
    in table order."""
    at_once = int((launcher or {}).get("sweeps_at_once") or 1)
    if at_once < 1:
        raise TableError(f"launcher sweeps_at_once={at_once}: expected 1 or more")
    if dry_run:
        for sweep in table.sweeps.values():
            run_sweep(sweep, stage_launcher(launcher, sweep.stage), force=force, dry_run=True)
        return []
    order = list(table.sweeps)
    if at_once > 1 and plan is None:
        from bert_repro.tables.plan import make_plan

        plan = make_plan(table)
    if at_once > 1:  # a free slot takes the ready sweep with the longest chain of work behind it
        chain = critical_path(table, sweep_costs(plan))
        order.sort(key=lambda name: -chain[name])
    jobs = {f"{sweep.name}/{folder.name}": folder
            for sweep in table.sweeps.values() for _, folder in sweep.jobs()}
    planned = [r for r in (plan or {}).get("runs", []) if r["name"] in jobs]
    weights = {jobs[r["name"]]: r["flops"] for r in planned}
    kinds = {jobs[r["name"]]: r["kind"] for r in planned}
    lines: dict[str, dict] = {}

    def one(sweep: Sweep) -> None:
        start = time.time()
        progress.started(sweep.name)
        try:
            counts = run_sweep(sweep, stage_launcher(launcher, sweep.stage), force=force)
        finally:
            progress.finished(sweep.name)
        lines[sweep.name] = {"sweep": sweep.name, **counts, "wall_s": round(time.time() - start, 1)}
        log.info("%-50s skipped %d, complete %d, failed %d (%.0f s)", sweep.name, counts["skipped"],
                 counts["complete"], counts["failed"], time.time() - start)

    if force or any(job_state(folder)[0] != "complete" for folder in jobs.values()):
        warm.prestart()  # the first sweep then starts as the others do (and a rehearsal measures that)
    progress = TableProgress(list(jobs.values()), force=force, weights=weights or None, kinds=kinds)
    # SIGTERM / SIGINT stop the children, each saving a checkpoint; the sweeps then end with Interrupted
    with CHILDREN.handling_signals(), progress, ThreadPoolExecutor(at_once) as pool:
        running: dict = {}
        ended: set[str] = set()
        while order or running:
            ready = [n for n in order if table.sweeps[n].needs is None or table.sweeps[n].needs.name in ended]
            for name in ready[:at_once - len(running)]:
                order.remove(name)
                running[pool.submit(one, table.sweeps[name])] = name
            if not running:  # cannot happen for a table build() made: every `needs` is one of its sweeps
                raise TableError(f"sweeps {order} wait on a sweep that is not in the table")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                name = running.pop(future)
                ended.add(name)
                try:
                    future.result()  # a TableError (a malformed results.json) stops the table, as before
                except Interrupted as stop:  # leaving the pool waits for the other sweeps' children to stop
                    raise Interrupted(stop.signum, [name, *running.values()]) from None
        if CHILDREN.signum is not None:  # the signal came as the last sweep ended
            raise Interrupted(CHILDREN.signum)
    return [lines[name] for name in table.sweeps if name in lines]
