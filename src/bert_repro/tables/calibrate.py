"""The plan against this CPU: each rehearsed run priced on the plan's own model (tables.plan's training,
BiLSTM and Dev FLOPs; no all-reduce in one process) at this machine's measured rate, plus what no FLOP count
sees: a process's start-up and a job's set-up (interpreter, Hydra, tokenizer, data, checkpoints), measured on
one sweep of each kind of run (its second where there is one: the first also builds the caches the others
read). Those sweeps are left out of ``held_out``: the runs priced only from numbers measured elsewhere.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bert_repro.lifecycle.folder import RunFolder
from bert_repro.tables import TableError
from bert_repro.tables.plan import plan_work
from bert_repro.tables.spec import Sweep, Table

PROBE_MODEL, PROBE_BATCH, PROBE_SEQ, PROBE_STEPS = "tiny", 8, 128, 5


def cpu_speed() -> dict:
    """The CPU's fp32 matmul peak and the MFU a training step of BERT-tiny (the rehearsal's model) reaches on
    it, with the runs' threads (the benchmarks/train_step.py step, median of PROBE_STEPS)."""
    import torch

    from bert_repro.benchmarks import train_step as bench
    from bert_repro.flops import measured_peak_flops, training_flops

    start, threads = time.perf_counter(), torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or threads))
    try:
        peak = measured_peak_flops("cpu")
        config = bench.model_config(PROBE_MODEL)
        masked = bench.default_predictions(PROBE_SEQ)
        batch = bench.make_batch(config, PROBE_BATCH, PROBE_SEQ, masked, "cpu")
        model = bench.build_ours(config, "mlm_nsp", "cpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        steps = [bench.timed(lambda: bench.our_step(model, batch), optimizer, "cpu")
                 for _ in range(PROBE_STEPS + 1)]
        seconds = sorted(steps[1:])  # the first: a warm-up's allocations
        flops = training_flops(config, int(batch["attention_mask"].sum()), PROBE_SEQ, PROBE_BATCH * masked)
        return {"peak_flops": peak, "mfu": flops / seconds[len(seconds) // 2] / peak,
                "threads": torch.get_num_threads(), "probe_s": round(time.perf_counter() - start, 2),
                "probe": f"BERT-{PROBE_MODEL}, batch {PROBE_BATCH} x {PROBE_SEQ}, median of {PROBE_STEPS}"}
    finally:
        torch.set_num_threads(threads)


def compute_seconds(small: Table, flops_per_s: float) -> dict[str, float]:
    """Each rehearsed job's seconds of compute at ``flops_per_s``, by run name."""
    seconds = {}
    for run, work in plan_work([small])[0]:
        if work.allreduce_bytes:
            raise TableError(f"{run.name}: all-reduces over several processes: no gloo bandwidth measured")
        seconds[run.name] = (work.flops + work.lstm_flops + work.eval_flops) / flops_per_s
    return seconds


def _kind(sweep: Sweep) -> str:
    """A kind of run, which shares its fixed costs: pre-training, or fine-tuning one task (SQuAD's set-up is
    twice GLUE's)."""
    return sweep.stage if sweep.stage == "pretrain" else f"{sweep.stage}: {sweep.overrides.get('task')}"


def planned_s(small: Table, compute: dict[str, float], fixed: dict) -> float:
    """The rehearsal's wall time on this model: a process a sweep (start-up), each job its compute and set-up;
    a kind of run ``fixed`` has not measured costs its compute only."""
    total = 0.0
    for sweep in small.sweeps.values():
        cost = fixed.get(_kind(sweep), {})
        names = [f"{sweep.name}/{folder.name}" for _, folder in sweep.jobs()]
        total += cost.get("startup_s", 0.0) + sum(compute[n] + cost.get("setup_s", 0.0) for n in names)
    return total


def calibrate(small: Table, summary: list[dict], speed: dict, compute: dict[str, float]) -> dict:
    """Planned vs measured seconds of every run the rehearsal launched (``summary``: run_table's lines). A
    job's measured share is its results.json wall_time_s and an even share of its process's start-up."""
    walls = {line["sweep"]: line for line in summary}
    sweeps = []
    for sweep in small.sweeps.values():
        line = walls.get(sweep.name)
        if not line or line["skipped"] or line["failed"] or not line["complete"]:
            continue  # only what ran here, whole
        jobs = {f"{sweep.name}/{f.name}": RunFolder(f).read()["wall_time_s"] for _, f in sweep.jobs()}
        sweeps.append((sweep.name, sweep.stage, _kind(sweep), line["wall_s"] - sum(jobs.values()), jobs))
    fixed: dict[str, dict] = {}
    for kind in dict.fromkeys(s[2] for s in sweeps):
        same = [s for s in sweeps if s[2] == kind]
        name, _, _, startup, jobs = same[1] if len(same) > 1 else same[0]
        fixed[kind] = {"sweep": name, "startup_s": max(0.0, startup),
                       "setup_s": max(0.0, sum(wall - compute[j] for j, wall in jobs.items()) / len(jobs))}
    runs = []
    for name, stage, kind, startup, jobs in sweeps:
        cost, n = fixed[kind], len(jobs)
        for job, wall in jobs.items():
            planned = compute[job] + cost["setup_s"] + cost["startup_s"] / n
            measured = wall + max(0.0, startup) / n
            runs.append({"name": job, "stage": stage, "calibration": name == cost["sweep"],
                         "compute_s": round(compute[job], 3), "planned_s": round(planned, 2),
                         "measured_s": round(measured, 2), "ratio": round(planned / measured, 3)})

    def total(rows: list[dict]) -> dict:
        planned, measured = sum(r["planned_s"] for r in rows), sum(r["measured_s"] for r in rows)
        return {"runs": len(rows), "planned_s": round(planned, 1), "measured_s": round(measured, 1),
                "ratio": round(planned / measured, 3) if measured else None}

    return {"cpu": speed, "comm": "0: every rehearsed run is one process", "fixed": fixed, "runs": runs,
            "total": total(runs), "held_out": total([r for r in runs if not r["calibration"]])}


def write_report(calibration: dict, folder: Path) -> Path:
    """calibration.md beside rehearsal.json: the CPU's numbers, fixed costs, planned vs measured per run."""
    cpu = calibration["cpu"]
    lines = ["# Plan vs measured on this CPU", "",
             f"CPU peak {cpu['peak_flops'] / 1e9:.1f} GFLOP/s (fp32 matmul), MFU {cpu['mfu']:.1%} "
             f"({cpu['probe']}, {cpu['threads']} threads); comm {calibration['comm']}.", ""]
    lines += [f"- {kind}: process start-up {f['startup_s']:.1f} s, job set-up {f['setup_s']:.1f} s "
              f"(measured on {f['sweep']})" for kind, f in calibration["fixed"].items()]
    lines += ["", "| run | compute s | planned s | measured s | planned/measured |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['name']}{' (calibration)' * r['calibration']} | {r['compute_s']:.2f} | "
              f"{r['planned_s']:.1f} | {r['measured_s']:.1f} | {r['ratio']:.2f} |"
              for r in calibration["runs"]]
    for key, label in (("total", "total"), ("held_out", "held out (not calibration)")):
        t = calibration[key]
        lines.append(f"| **{label}** ({t['runs']} runs) | | {t['planned_s']:.1f} | {t['measured_s']:.1f} | "
                     f"{t['ratio'] if t['ratio'] is not None else ''} |")
    path = folder / "calibration.md"
    path.write_text("\n".join(lines) + "\n")
    return path
