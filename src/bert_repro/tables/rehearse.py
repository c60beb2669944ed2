"""``ACTION=rehearse``: a budget or paper table's plan shrunk to minutes on this CPU, as
conf/table_scale/rehearsal.yaml composes it over the table at its real scale, run by the table runner.

Kept: every sweep, each pre-training phase and its length, the checkpoint cadence (step-<N>.ckpt becomes
step-<N/D>.ckpt, D dividing every step count), the checkpoint each fine-tuning starts from, the selection;
``grid="first"`` runs each grid's first point only, ``"full"`` every point. Runs go to
<runs>/rehearsal/<table>/<scale>/, the table to <results>/rehearsal/; afterwards each fine-tuning's checkpoint
is checked to hold the step and length the plan says, and the plan is priced against the measured seconds.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from omegaconf import OmegaConf

from bert_repro.tables import TableError
from bert_repro.tables.calibrate import calibrate, compute_seconds, cpu_speed, planned_s, write_report
from bert_repro.tables.compose import compose_once, composing
from bert_repro.tables.plan import make_plan
from bert_repro.tables.runner import run_table
from bert_repro.tables.schedule import STEP_CKPT
from bert_repro.tables.spec import Table, build, flatten, load_spec

OmegaConf.register_new_resolver("floordiv", lambda n, d: None if n is None else n // d, replace=True)
OmegaConf.register_new_resolver("gcd", math.gcd, replace=True)


def _composed(table: Table, *args: str):
    """conf/table_scale/rehearsal.yaml over ``table`` at its scale (``args``: rehearsal.divisor=D)."""
    with composing():
        return compose_once("tables", [f"table={table.name}", f"scale={table.scale}", "table_scale=rehearsal",
                                       *args])


def divisor(table: Table) -> int:
    """D: the longest pre-training over the rehearsal's ``longest`` steps, rounded so that every step count of
    the schedule (steps, phase 1, checkpoint cadence, the checkpoints the spec names) divides by it."""
    schedules = [s.schedule for s in table.sweeps.values() if s.stage == "pretrain"]
    if not schedules:
        return 1
    counts = {n for s in schedules for n in (s.max_steps, s.phase1_steps, s.every) if n}
    counts |= {int(m.group(1)) for s in table.sweeps.values() if (m := STEP_CKPT.match(s.checkpoint))}
    want = max(1, max(s.max_steps for s in schedules) // _composed(table).rehearsal.longest)
    common = math.gcd(*counts)
    return max(d for d in range(1, min(common, want) + 1) if common % d == 0)


def shrink(table: Table, runs_dir: Path, d: int, grid: str = "full", sets: list[str] | None = None) -> Table:
    """The rehearsal's table: the same sweeps (``sets``: the table's --set) over <runs>/rehearsal, each run's
    overrides followed by the rehearsal's."""
    cfg = _composed(table, f"rehearsal.divisor={d}")
    rehearsal = OmegaConf.to_container(cfg.rehearsal, resolve=True)
    task_data = load_spec(table.name, "smoke")["task_data"]  # the local files
    # a store of its own per divisor: a shrunk pre-training depends on D beside the real one's science
    small = build(table.name, table.scale, runs_dir / "rehearsal", {"*": "minilm"}, sets, logger="csv",
                  store=runs_dir / "rehearsal" / "pretrain" / f"steps-over-{d}")
    small.spec |= {"logger": "csv", "data_note": None,
                   "scale_note": f"a rehearsal of the {table.scale} plan on CPU: tiny models, steps / {d}, "
                                 "subsets of ../shared/data; it proves the path, not the numbers"}
    for sweep in small.sweeps.values():
        if sweep.stage == "pretrain":
            layers = [rehearsal["pretrain"]]
        else:
            task = sweep.overrides["task"]
            for key in flatten(small.spec["task_data"].get(task)):  # the scale's data (the Hub) gives way
                sweep.overrides.pop(key, None)
            layers = [task_data.get(task), rehearsal["finetune"], rehearsal["tasks"].get(task),
                      rehearsal["from_init" if sweep.needs is None else "from_pretraining"]]
            if sweep.needs is not None and (found := STEP_CKPT.match(sweep.checkpoint)):
                sweep.checkpoint = f"step-{int(found.group(1)) // d}.ckpt"
                sweep.overrides["init"] = str(sweep.init_path())
        for layer in (*layers, rehearsal["every_run"]):
            sweep.overrides |= flatten(layer)
        if grid == "first":  # the first job of Hydra's sweep, in its folder
            sweep.params = dict(o.split("=", 1) for o in sweep.jobs()[0][0])
    return small


def check_steps(table: Table, small: Table, d: int) -> list[str]:
    """Each fine-tuning's checkpoint holds the global step the plan gives it (real step / D), and was trained
    (its data's max_seq_length) at the position length the plan says."""
    from bert_repro.convert.safe import safe_torch_load

    problems = []
    for name, sweep in small.sweeps.items():
        if sweep.stage != "finetune" or sweep.needs is None or not sweep.init_path().is_file():
            continue
        real = table.sweeps[name]
        schedule = real.needs.schedule
        planned = schedule.checkpoint_step(real.checkpoint, name)
        trained = schedule.trained_length(real.phase)
        ckpt = safe_torch_load(sweep.init_path(), what="a Lightning checkpoint")
        held, length = ckpt["global_step"], ckpt["datamodule_hyper_parameters"]["max_seq_length"]
        if held * d != planned:
            problems.append(f"{name}: {sweep.checkpoint} holds step {held} x {d}, the plan says {planned}")
        if length != trained:
            problems.append(f"{name}: {sweep.checkpoint} trained at length {length}, the plan says {trained}")
    return problems


def measured_fixed(rehearsals: Path) -> dict:
    """The start-up and set-up costs the newest rehearsal under ``rehearsals`` measured ({}: none yet)."""
    for path in sorted(rehearsals.glob("*/*/rehearsal.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            return json.loads(path.read_text())["calibration"]["fixed"]
        except (OSError, ValueError, KeyError):
            continue
    return {}


def rehearse(table: Table, runs_dir: Path, results_dir: Path, force: bool = False, grid: str = "first",
             sets: list[str] | None = None) -> tuple[Table, Path]:
    """Plan (the spec checked at its real scale), shrink, state the planned wall time, run, check; returns the
    table to collect and where."""
    if table.scale == "smoke":
        raise TableError("ACTION=rehearse shrinks budget or paper scale; SCALE=smoke runs as it is")
    start = time.time()
    plan = make_plan(table)
    d = divisor(table)
    small = shrink(table, runs_dir, d, grid, sets)
    speed = cpu_speed()  # once, before the runs: the CPU plan's rate
    compute = compute_seconds(small, speed["peak_flops"] * speed["mfu"])
    fixed = measured_fixed(runs_dir / "rehearsal")
    planned, rate = planned_s(small, compute, fixed), speed["peak_flops"] * speed["mfu"] / 1e9
    jobs = sum(len(s.jobs()) for s in small.sweeps.values())
    fixed_note = "as last measured" if fixed else "not measured yet"
    print(f"rehearsal of {table.name} at scale={table.scale}: {jobs} of {len(plan['runs'])} planned runs "
          f"({grid} grid), steps / {d}; planned {planned:.0f} s on this CPU ({sum(compute.values()):.0f} s "
          f"of compute at {rate:.1f} GFLOP/s, start-up and set-up {fixed_note})", flush=True)
    summary = run_table(small, {}, force=force)
    problems = check_steps(table, small, d)
    folder = runs_dir / "rehearsal" / table.name / table.scale
    calibration = calibrate(small, summary, speed, compute)
    record = {"divisor": d, "runs": len(plan["runs"]), "grid": grid, "rehearsed_jobs": jobs,
              "planned_s": round(planned, 1), "wall_s": round(time.time() - start, 1), "sweeps": summary,
              "step_problems": problems, "calibration": calibration}
    (folder / "rehearsal.json").write_text(json.dumps(record, indent=2) + "\n")
    report = write_report(calibration, folder)
    if problems:
        raise TableError("rehearsal: " + "; ".join(problems))
    t = calibration["held_out"]
    print(f"rehearsal of {table.name}: {time.time() - start:.0f} s ({planned:.0f} s planned); CPU plan vs "
          f"measured of the {t['runs']} runs not calibrated on: ratio {t['ratio']} ({report})")
    return small, results_dir / "rehearsal"
