"""``ACTION=rehearse``: a scale's exact plan, shrunk to run on this CPU in minutes on the local data.

Kept from the plan: every run (each pre-training phase, every fine-tuning job of every grid), the phases and
their sequence lengths, the checkpoint cadence relative to the steps (step-<N>.ckpt becomes step-<N/D>.ckpt
for one divisor D of every step count), which checkpoint each fine-tuning starts from, and the selection.
Changed: a tiny model (BERT-tiny for our pre-trainings, all-MiniLM-L6-v2 for an external checkpoint), the
pre-training corpus (CPython's documentation) and its steps / D, the fine-tuning data (the smoke scale's local
files, REHEARSAL_EXAMPLES train examples, one Dev batch), the CPU trainer and the csv logger. ``grid="first"``
cuts each grid to its first value of every swept key (the same keys and job folders; every point is still
composed and checked by the plan) for a quicker check: a sweep is one process of some 8 s on a 2-core CPU,
each further job of its grid some 3 s. Runs go to <runs>/rehearsal/<table>/<scale>/, the table to
<results>/rehearsal/. Afterwards each fine-tuning's checkpoint is checked to hold the step the plan says
(Figure 4's x), and every cell to be a number or a mark with a reason.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from bert_repro.tables import TableError
from bert_repro.tables.calibrate import calibrate, cpu_speed, write_report
from bert_repro.tables.plan import make_plan
from bert_repro.tables.runner import run_table
from bert_repro.tables.schedule import STEP_CKPT, Schedule
from bert_repro.tables.spec import Table, build, flatten, load_spec

PRETRAIN_STEPS = 20  # the longest pre-training of a rehearsal
REHEARSAL_EXAMPLES = 32  # train examples (questions, sentences) per fine-tuning run
CPU = {"trainer": "cpu", "logger": "csv", "trainer.enable_progress_bar": False,
       "+trainer.enable_model_summary": False, "+trainer.num_sanity_val_steps": 0}
# the GPU's settings (speed.grad_allreduce=bf16 needs NCCL) and the real shapes
DROPPED = ("trainer.", "logger.", "++logger.", "model.", "hydra", "speed.")


def divisor(table: Table) -> int:
    """D: the longest pre-training over PRETRAIN_STEPS, rounded so that every step count of the schedule
    (steps, phase 1, checkpoint cadence, the checkpoints the spec names) divides by it."""
    schedules = [s.schedule for s in table.sweeps.values() if s.stage == "pretrain"]
    if not schedules:
        return 1
    counts = {n for s in schedules for n in (s.max_steps, s.phase1_steps, s.every) if n}
    counts |= {int(m.group(1)) for s in table.sweeps.values() if (m := STEP_CKPT.match(s.checkpoint))}
    want = max(1, max(s.max_steps for s in schedules) // PRETRAIN_STEPS)
    common = math.gcd(*counts)
    found = max((d for d in range(1, common + 1) if common % d == 0 and d <= want), default=1)
    return found


def _shrink_pretrain(s: Schedule, d: int) -> dict:
    shrunk = {"scale.pretrain.source": "files", "scale.pretrain.corpus": "builtin:pydoc",
              "scale.pretrain.vocab_size": 2000, "scale.pretrain.dupe_factor": 1,
              "scale.pretrain.batch_size": 8,
              "scale.pretrain.max_steps": s.max_steps // d, "scale.pretrain.warmup_steps": 1,
              "scale.pretrain.lr": 5e-4, "scale.pretrain.limit_val_batches": 1,
              "scale.pretrain.checkpoint_every_n_steps": s.every // d if s.every else None}
    if s.phases == 2:  # validation where it divides both phases' ends: last.ckpt is each phase's final state
        first = s.phase1_steps // d
        shrunk |= {"scale.pretrain.two_phase.phase1_steps": first,
                   "scale.pretrain.two_phase.val_check_interval": math.gcd(first, s.max_steps // d)}
    else:
        shrunk["scale.pretrain.val_check_interval"] = s.max_steps // d
    return shrunk


def shrink(table: Table, runs_dir: Path, d: int, grid: str = "full", sets: list[str] | None = None) -> Table:
    """The rehearsal's table: the same sweeps (``sets``: the table's --set) over <runs>/rehearsal, each with
    the overrides above."""
    # a store of its own per divisor: a shrunk pre-training depends on D beside the real one's science
    small = build(table.name, table.scale, runs_dir / "rehearsal", {"*": "minilm"}, sets, logger="csv",
                  store=runs_dir / "rehearsal" / "pretrain" / f"steps-over-{d}")
    small.spec |= {"logger": "csv", "data_note": None,
                   "scale_note": f"a rehearsal of the {table.scale} plan on CPU: tiny models, steps / {d}, "
                                 f"{REHEARSAL_EXAMPLES}-example subsets of ../shared/data; it proves the "
                                 "path, not the numbers"}
    smoke_data = load_spec(table.name, "smoke")["task_data"]  # the local files each task reads
    for sweep in small.sweeps.values():
        kept = {k: v for k, v in sweep.overrides.items() if not k.startswith(DROPPED)}
        if sweep.stage == "pretrain":
            kept |= {"model": "tiny", **_shrink_pretrain(sweep.schedule, d)}
        else:
            task = sweep.overrides["task"]
            for key in flatten(small.spec["task_data"].get(task)):  # the scale's data (the Hub), not here
                kept.pop(key, None)
            kept |= {k: v for k, v in flatten(smoke_data.get(task)).items() if not k.startswith("optim.")}
            kept |= {"data.max_train_examples": REHEARSAL_EXAMPLES, "optim.limit_val_batches": 1}
            if task.startswith("squad"):  # every window of a few questions: the official scorer needs all
                kept |= {"data.max_dev_examples": 8, "optim.limit_val_batches": 1.0}
            kept["model"] = "tiny" if sweep.needs is not None else "minilm_l6"
            if sweep.needs is not None and (found := STEP_CKPT.match(sweep.checkpoint)):
                sweep.checkpoint = f"step-{int(found.group(1)) // d}.ckpt"
        sweep.overrides = {**kept, **CPU}
        if grid == "first":
            sweep.params = {k: v.split(",")[0] for k, v in sweep.params.items()}
        if sweep.needs is not None:  # phase 2's resume point, fine-tuning's init=
            sweep.overrides["ckpt_path" if sweep.stage == "pretrain" else "init"] = str(sweep.init_path())
    return small


def check_steps(table: Table, small: Table, d: int) -> list[str]:
    """Each fine-tuning's checkpoint holds the global step the plan gives it (real step / D), and records
    (its pre-training data's max_seq_length) the position length the plan says it was trained at."""
    from bert_repro.convert.safe import safe_torch_load

    problems = []
    for name, sweep in small.sweeps.items():
        if sweep.stage != "finetune" or sweep.needs is None or not sweep.init_path().is_file():
            continue
        real = table.sweeps[name]
        schedule = real.needs.schedule
        planned = schedule.checkpoint_step(real.checkpoint, name)
        ckpt = safe_torch_load(sweep.init_path(), what="a Lightning checkpoint")
        held, length = ckpt["global_step"], ckpt["datamodule_hyper_parameters"]["max_seq_length"]
        if held * d != planned:
            problems.append(f"{name}: {sweep.checkpoint} holds step {held} x {d}, the plan says {planned}")
        if length != schedule.trained_length(real.phase):
            problems.append(f"{name}: {sweep.checkpoint} was trained at length {length}, the plan says "
                            f"{schedule.trained_length(real.phase)}")
    return problems


def rehearse(table: Table, runs_dir: Path, results_dir: Path, force: bool = False, grid: str = "first",
             sets: list[str] | None = None) -> tuple[Table, Path]:
    """Plan (the spec checked at its real scale), shrink, run, check; returns the table to collect and
    where."""
    if table.scale == "smoke":
        raise TableError("ACTION=rehearse shrinks budget or paper scale; SCALE=smoke runs as it is")
    start = time.time()
    plan = make_plan(table)
    d = divisor(table)
    small = shrink(table, runs_dir, d, grid, sets)
    speed = cpu_speed()  # once, before the runs: the CPU plan's rate
    summary = run_table(small, {}, force=force)
    problems = check_steps(table, small, d)
    folder = runs_dir / "rehearsal" / table.name / table.scale
    calibration = calibrate(small, summary, speed)
    record = {"divisor": d, "runs": len(plan["runs"]), "grid": grid,
              "rehearsed_jobs": sum(len(s.jobs()) for s in small.sweeps.values()),
              "wall_s": round(time.time() - start, 1), "sweeps": summary, "step_problems": problems,
              "calibration": calibration}
    (folder / "rehearsal.json").write_text(json.dumps(record, indent=2) + "\n")
    report = write_report(calibration, folder)
    if problems:
        raise TableError("rehearsal: " + "; ".join(problems))
    print(f"rehearsal of {table.name} at scale={table.scale}: {record['rehearsed_jobs']} of "
          f"{len(plan['runs'])} planned runs ({grid} grid), steps / {d}, {time.time() - start:.0f} s")
    for key in ("total", "held_out"):
        t = calibration[key]
        if t["ratio"] is not None:
            print(f"CPU plan vs measured ({key}, {t['runs']} runs): {t['planned_s']:.0f} s planned, "
                  f"{t['measured_s']:.0f} s measured, ratio {t['ratio']:.2f} ({report})")
    return small, results_dir / "rehearsal"
