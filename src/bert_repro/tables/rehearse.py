"""``ACTION=rehearse``: a budget or paper table's plan shrunk to minutes on this CPU, as
conf/table_scale/rehearsal.yaml composes it, run by the table runner. Kept: every sweep, each pre-training
phase and length, the checkpoints (step-<N>.ckpt becomes step-<N/D>.ckpt) and the selection; each grid's first
point (or all). It states its planned wall time first and checks the checkpoints' steps and lengths after."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

from omegaconf import OmegaConf

from bert_repro.lifecycle.folder import RunFolder, step_checkpoint_name, step_of
from bert_repro.tables import CONF_DIR, TableError
from bert_repro.tables.compose import compose_once, composing
from bert_repro.tables.plan import make_plan, plan_work
from bert_repro.tables.runner import run_table
from bert_repro.tables.spec import Sweep, Table, build, checkpoint_path, flatten, load_spec


def _composed(table: Table, *args: str):
    with composing():
        return compose_once("tables", [f"table={table.name}", f"scale={table.scale}", "table_scale=rehearsal",
                                       *args])


def divisor(table: Table) -> int:
    """D: the longest pre-training over the rehearsal's ``longest`` steps, lowered to divide every step count
    of the schedule (steps, phase 1, checkpoint cadence, the checkpoints the spec names)."""
    schedules = [s.schedule for s in table.sweeps.values() if s.stage == "pretrain"]
    if not schedules:
        return 1
    counts = {n for s in schedules for n in (s.max_steps, s.phase1_steps, s.every) if n}
    counts |= {step for s in table.sweeps.values() if (step := step_of(s.checkpoint))}
    want = max(1, max(s.max_steps for s in schedules) // _composed(table).rehearsal.longest)
    common = math.gcd(*counts)
    return max(d for d in range(1, min(common, want) + 1) if common % d == 0)


def shrink(table: Table, runs_dir: Path, d: int, grid: str = "full", sets: list[str] | None = None) -> Table:
    """The same sweeps (``sets``: the table's --set) over <runs>/rehearsal, the rehearsal's overrides last."""
    rehearsal = OmegaConf.to_container(_composed(table, f"rehearsal.divisor={d}").rehearsal, resolve=True)
    task_data = load_spec(table.name, "smoke")["task_data"]  # the local files
    # a store of its own per divisor: a shrunk pre-training depends on D beside the real one's science
    small = build(table.name, table.scale, runs_dir / "rehearsal", {"*": "minilm"}, sets, logger="csv",
                  store=runs_dir / "rehearsal" / "pretrain" / f"steps-over-{d}")
    spec = {**small.spec, "logger": "csv", "data_note": None,
            "scale_note": f"a rehearsal of the {table.scale} plan on CPU: tiny models, steps / {d}, "
                          "subsets of ../shared/data; it proves the path, not the numbers"}
    sweeps: dict[str, Sweep] = {}
    for name, sweep in small.sweeps.items():  # each after the sweep it needs, which is shrunk already
        needs = sweeps[sweep.needs.name] if sweep.needs is not None else None
        overrides, checkpoint = dict(sweep.overrides), sweep.checkpoint
        if sweep.stage == "pretrain":
            layers = [rehearsal["pretrain"]]
        else:
            task = overrides["task"]
            for key in flatten(spec["task_data"].get(task)):  # the scale's data (the Hub) gives way
                overrides.pop(key, None)
            layers = [task_data.get(task), rehearsal["finetune"], rehearsal["tasks"].get(task),
                      rehearsal["from_init" if needs is None else "from_pretraining"]]
            if needs is not None and (step := step_of(checkpoint)):
                checkpoint = step_checkpoint_name(step // d)
                overrides["init"] = str(checkpoint_path(needs, checkpoint))
        for layer in (*layers, rehearsal["every_run"]):
            overrides |= flatten(layer)
        shrunk = replace(sweep, overrides=overrides, checkpoint=checkpoint, needs=needs)
        if grid == "first":  # the first job of Hydra's sweep, in its folder
            shrunk = replace(shrunk, params=dict(o.split("=", 1) for o in shrunk.jobs()[0][0]))
        sweeps[name] = shrunk
    return replace(small, spec=spec, sweeps=sweeps)


def check_steps(table: Table, small: Table, d: int) -> list[str]:
    """Each fine-tuning's checkpoint holds the plan's global step / D, trained at the plan's length."""
    from bert_repro.convert.safe import safe_torch_load

    problems = []
    for name, sweep in small.sweeps.items():
        if sweep.stage != "finetune" or sweep.needs is None or not sweep.init_path().is_file():
            continue
        real = table.sweeps[name]
        planned = real.needs.schedule.checkpoint_step(real.checkpoint, name)
        trained = real.needs.schedule.trained_length(real.phase)
        ckpt = safe_torch_load(sweep.init_path(), what="a Lightning checkpoint")
        held, length = ckpt["global_step"], ckpt["datamodule_hyper_parameters"]["max_seq_length"]
        if held * d != planned:
            problems.append(f"{name}: {sweep.checkpoint} holds step {held} x {d}, the plan says {planned}")
        if length != trained:
            problems.append(f"{name}: {sweep.checkpoint} trained at length {length}, the plan says {trained}")
    return problems


def compute_seconds(small: Table, flops_per_s: float) -> dict[str, float]:
    """Each rehearsed job's seconds of compute at ``flops_per_s`` (one process: no all-reduce) by name."""
    runs = plan_work([small])[0]
    return {run.name: (run.flops + run.lstm_flops + run.eval_flops) / flops_per_s for run in runs}


def planned_s(sweep: Sweep, compute: dict[str, float], fixed: dict) -> dict[str, float]:
    """Each job's seconds: its compute and set-up, and its share of its sweep's process start-up (``fixed``'s:
    none for a kind not measured yet)."""
    cost, names = fixed.get(sweep.kind, {}), [f"{sweep.name}/{f.name}" for _, f in sweep.jobs()]
    return {n: compute[n] + cost.get("setup_s", 0.0) + cost.get("startup_s", 0.0) / len(names) for n in names}


def measured_fixed(rehearsals: Path) -> dict:
    """The start-up and set-up costs the newest rehearsal under ``rehearsals`` measured ({}: none yet)."""
    for path in sorted(rehearsals.glob("*/*/rehearsal.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            return json.loads(path.read_text())["calibration"]["fixed"]
        except (OSError, ValueError, KeyError):
            continue
    return {}


def calibrate(small: Table, summary: list[dict], compute: dict[str, float]) -> dict:
    """Planned vs measured seconds of each job of the sweeps that ran whole, each kind's start-up (a sweep's
    wall time less its jobs') and set-up measured on its second sweep (the first also builds the caches the
    others read); ``held_out``: the other sweeps'."""
    walls = {line["sweep"]: line for line in summary}
    ran = []  # (sweep, its process's start-up, each job's wall time)
    for sweep in small.sweeps.values():
        line = walls.get(sweep.name)
        if line and line["complete"] and not (line["skipped"] or line["failed"]):
            jobs = {f"{sweep.name}/{f.name}": RunFolder(f).read()["wall_time_s"] for _, f in sweep.jobs()}
            ran.append((sweep, max(0.0, line["wall_s"] - sum(jobs.values())), jobs))
    fixed = {}
    for kind in dict.fromkeys(sweep.kind for sweep, _, _ in ran):
        same = [one for one in ran if one[0].kind == kind]
        sweep, startup, jobs = same[min(1, len(same) - 1)]
        fixed[kind] = {"sweep": sweep.name, "startup_s": startup,
                       "setup_s": max(0.0, sum(wall - compute[j] for j, wall in jobs.items()) / len(jobs))}
    runs = [{"name": job, "calibration": sweep.name == fixed[sweep.kind]["sweep"],
             "planned_s": round(planned, 2), "measured_s": round(jobs[job] + startup / len(jobs), 2)}
            for sweep, startup, jobs in ran for job, planned in planned_s(sweep, compute, fixed).items()]

    def total(rows: list[dict]) -> dict:
        planned, measured = sum(r["planned_s"] for r in rows), sum(r["measured_s"] for r in rows)
        return {"runs": len(rows), "planned_s": round(planned, 1), "measured_s": round(measured, 1),
                "ratio": round(planned / measured, 3) if measured else None}

    return {"fixed": fixed, "runs": runs, "total": total(runs),
            "held_out": total([r for r in runs if not r["calibration"]])}


def rehearse(table: Table, runs_dir: Path, results_dir: Path, force: bool = False, grid: str = "first",
             sets: list[str] | None = None) -> tuple[Table, Path]:
    """Plan at the real scale, shrink, state the planned time, run, check: the table to collect, and where."""
    from bert_repro.benchmarks import train_step  # torch
    if table.scale == "smoke":
        raise TableError("ACTION=rehearse shrinks budget or paper scale; SCALE=smoke runs as it is")
    start = time.time()
    plan = make_plan(table)
    d = divisor(table)
    small = shrink(table, runs_dir, d, grid, sets)
    cpu = train_step.cpu_speed(CONF_DIR)  # once, before the runs: the CPU plan's rate
    compute = compute_seconds(small, cpu["flops_per_s"])
    fixed = measured_fixed(runs_dir / "rehearsal")
    planned = sum(sum(planned_s(sweep, compute, fixed).values()) for sweep in small.sweeps.values())
    jobs = sum(len(s.jobs()) for s in small.sweeps.values())
    print(f"rehearsal of {table.name} at scale={table.scale}: {jobs} of {len(plan['runs'])} planned runs "
          f"({grid} grid), steps / {d}; planned {planned:.0f} s on this CPU ({sum(compute.values()):.0f} s "
          f"of compute at {cpu['flops_per_s'] / 1e9:.1f} GFLOP/s, start-up and set-up "
          f"{'as last measured' if fixed else 'not measured yet'})", flush=True)
    summary = run_table(small, None, force=force)  # one sweep at a time: the rehearsal times each alone
    problems = check_steps(table, small, d)
    calibration = {"cpu": cpu, **calibrate(small, summary, compute)}
    record = {"divisor": d, "runs": len(plan["runs"]), "grid": grid, "rehearsed_jobs": jobs,
              "planned_s": round(planned, 1), "wall_s": round(time.time() - start, 1), "sweeps": summary,
              "step_problems": problems, "calibration": calibration}
    path = runs_dir / "rehearsal" / table.name / table.scale / "rehearsal.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    if problems:
        raise TableError("rehearsal: " + "; ".join(problems))
    t = calibration["held_out"]
    print(f"rehearsal of {table.name}: {time.time() - start:.0f} s ({planned:.0f} s planned); CPU plan vs "
          f"measured of the {t['runs']} runs not calibrated on: ratio {t['ratio']} ({path})")
    return small, results_dir / "rehearsal"
