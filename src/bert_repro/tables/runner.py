"""Runs a table's sweeps through ``src/train.py -m``: pre-training first, then the fine-tuning that starts
from it.

A job whose results.json says ``complete`` is skipped (an interrupted table resumes); ``force`` re-runs it.
A job that fails leaves ``failed.json`` (the reason) in its folder and does not stop the table: the jobs a
failed multirun never reached are launched on their own, and fine-tuning from a failed pre-training run is
marked failed with that reason instead of being started.

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
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import yaml

from bert_repro.tables.progress import TableProgress
from bert_repro.tables.spec import REPO, Sweep, Table, TableError, flatten, hydra_value

log = logging.getLogger(__name__)

TRAIN = REPO / "src" / "train.py"
LOG = "launch.log"  # every launch of a sweep, appended: the children's stdout and stderr
THREADS = "threads"  # a launcher block's torch threads per process (OMP_NUM_THREADS), not a Hydra override
NOISE = ("Set the environment variable HYDRA_FULL_ERROR", "Traceback", "Error executing job")


def job_state(folder: Path) -> tuple[str, str | None]:
    """(complete | failed | missing, reason) of one job folder, from the files it left."""
    results = folder / "results.json"
    if results.is_file():
        try:
            record = json.loads(results.read_text())
        except json.JSONDecodeError as err:
            raise TableError(f"{results}: malformed results.json ({err})") from None
        if not isinstance(record, dict):
            raise TableError(f"{results}: malformed results.json (not a JSON object)")
        status = record.get("status")
        return ("complete", None) if status == "complete" else (
            "failed", record.get("reason") or f"run ended with status {status!r}")
    failed = folder / "failed.json"
    if failed.is_file():
        return "failed", json.loads(failed.read_text()).get("reason")
    logged = logged_error(folder)
    if logged:
        return "failed", logged
    if (folder / ".hydra").is_dir():
        return "failed", "no results.json (the run stopped early)"
    return "missing", None


def logged_error(folder: Path) -> str | None:
    """The last ERROR line of a job's Hydra log (run.py logs a wrong input there before exiting)."""
    for log_file in sorted(folder.glob("*.log")):
        errors = [line for line in log_file.read_text(errors="replace").splitlines() if "][ERROR] - " in line]
        if errors:
            message = errors[-1].split("][ERROR] - ", 1)[1]
            return message.replace(" (set BERT_REPRO_TRACEBACK=1 for the traceback)", "")
    return None


def launch_error(output: str) -> str:
    """The line of a failed launch's output that says what went wrong (Hydra's compose error, the
    exception)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    lines = [line for line in lines
             if not re.match(r"^\[\d{4}-\d\d-\d\d ", line) and not line.startswith(NOISE)]
    if "Error executing job" in output or "Traceback" in output:
        return lines[-1] if lines else "the run failed"
    return lines[0] if lines else "the run failed without output"


def mark_failed(folder: Path, reason: str, output: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    record = {"reason": reason, "output_tail": output[-4000:]}
    (folder / "failed.json").write_text(json.dumps(record, indent=2) + "\n")


def resumable(folder: Path) -> bool:
    """A run killed before its results.json that src/train.py continues from its own last.ckpt
    (ckpt_path=last)."""
    config = folder / ".hydra" / "config.yaml"
    return ((folder / "checkpoints" / "last.ckpt").is_file() and not (folder / "results.json").exists()
            and not (folder / "failed.json").exists() and config.is_file()
            and (yaml.safe_load(config.read_text()) or {}).get("ckpt_path") == "last")


def _clear(folder: Path, force: bool) -> None:
    """An earlier attempt's folder, before a re-run (Lightning would version new checkpoints beside old ones),
    unless it is a killed run that resumes itself; FORCE clears that too."""
    if not folder.is_dir() or (not force and resumable(folder)):
        return
    if (folder / ".hydra").is_dir() or (folder / "failed.json").is_file():
        shutil.rmtree(folder)


def command(sweep: Sweep, swept: list[str], launcher: dict) -> list[str]:
    """The multirun of ``sweep``: every job's folder is ``sweep.folder/<override_dirname of the swept
    keys>``."""
    fixed = sweep.fixed_args()
    excluded = [k for k in sweep.overrides]  # kept out of the folder name: the sweep folder says them
    subdir = "${hydra.job.override_dirname}" if sweep.params else "default"
    return [sys.executable, str(TRAIN), "--multirun", *fixed, *swept,
            *(f"{k}={hydra_value(v)}" for k, v in flatten(launcher).items()),
            f"hydra.sweep.dir={sweep.folder}", f"hydra.sweep.subdir={subdir}",
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
        code = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True,
                              env=env).returncode
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
    reason = sweep.skip
    if reason is None and sweep.needs is not None:
        upstream, why = job_state(sweep.needs.jobs()[0][1])
        if upstream != "complete":
            reason = f"pre-training run {sweep.needs.name} {upstream}" + (f": {why}" if why else "")
        elif not sweep.init_path().is_file():
            reason = f"pre-training run {sweep.needs.name} left no {sweep.checkpoint}"
    for _, folder in todo:
        _clear(folder, force)
    if reason is not None:
        for _, folder in todo:
            mark_failed(folder, reason)
        counts["failed"] = len(todo)
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
                _, out_one = _launch(sweep, s, launcher)
                if job_state(f)[0] == "missing":
                    mark_failed(f, launch_error(out_one), out_one)
        for _, folder in members:
            state, _ = job_state(folder)
            if state == "missing":  # nothing ran (a compose error): the launch's own message is the reason
                mark_failed(folder, launch_error(output) if code else "the launcher ran no job here", output)
            elif state == "failed" and not (folder / "failed.json").is_file():
                mark_failed(folder, job_state(folder)[1] or launch_error(output), output)
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

    progress = TableProgress(list(jobs.values()), force=force, weights=weights or None, kinds=kinds)
    with progress, ThreadPoolExecutor(at_once) as pool:
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
                ended.add(running.pop(future))
                future.result()  # a TableError (a malformed results.json) stops the table, as before
    return [lines[name] for name in table.sweeps if name in lines]
