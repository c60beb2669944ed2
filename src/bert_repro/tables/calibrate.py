"""The plan against reality on this CPU: ``ACTION=rehearse`` prices every rehearsed run on the plan's own
model (tables.plan: training and Dev FLOPs, all-reduce bytes) with this machine's numbers, and sets the
planned seconds beside the measured ones.

- compute: FLOPs / (CPU peak x MFU). The peak is flops.measured_peak_flops (fp32 matmuls, best of 3), the MFU
  a probe of a few training steps of BERT-tiny (the rehearsal's model) at batch 8 x 128 tokens in this
  process (the benchmarks/train_step.py step), both measured once per rehearsal.
- comm: 0. Every rehearsed run is one process (trainer=cpu), so the plan's ring all-reduce term is
  2 (n-1)/n x bytes = 0; no gloo bandwidth is measured.
- fixed: what no FLOP count sees (interpreter and library imports, Hydra, tokenizer and data set up,
  checkpoint writes): a process's start-up and a job's set-up, measured on one sweep of pre-training and of
  each fine-tuning task (SQuAD's set-up is twice GLUE's): its second, where there is one (the first also
  builds the caches the others read, one-off work the plan prices apart). Start-up = its wall time outside
  its jobs' results.json wall_time_s, set-up = a job's wall_time_s beyond its compute. Those calibration
  sweeps are reported but left out of the checked ratio: ``held_out`` is every other sweep, priced only from
  numbers measured elsewhere.
Measured: a sweep's wall time (runner), one process running its jobs in turn; a job's share is its
results.json wall_time_s plus an even share of its process's start-up.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bert_repro.tables import TableError
from bert_repro.tables.plan import Work, plan_work
from bert_repro.tables.spec import Table

PROBE_MODEL, PROBE_BATCH, PROBE_SEQ, PROBE_STEPS = "tiny", 8, 128, 5


def cpu_speed() -> dict:
    """The CPU's fp32 matmul peak and the MFU a BERT-tiny training step reaches on it (FLOP/s)."""
    import torch

    start, threads = time.perf_counter(), torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or threads))  # the runs' threads
    try:
        return _probe(start)
    finally:
        torch.set_num_threads(threads)


def _probe(start: float) -> dict:
    import torch

    from bert_repro.benchmarks import train_step as bench
    from bert_repro.flops import measured_peak_flops, training_flops

    peak = measured_peak_flops("cpu")
    config = bench.model_config(PROBE_MODEL)
    masked = bench.default_predictions(PROBE_SEQ)
    batch = bench.make_batch(config, PROBE_BATCH, PROBE_SEQ, masked, "cpu")
    model = bench.build_ours(config, "mlm_nsp", "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        return bench.timed(lambda: bench.our_step(model, batch), optimizer, "cpu")

    step()  # warm-up: first-call allocations
    seconds = sorted(step() for _ in range(PROBE_STEPS))
    real = int(batch["attention_mask"].sum())
    flops = training_flops(config, real, PROBE_SEQ, PROBE_BATCH * masked)
    achieved = flops / seconds[len(seconds) // 2]  # the median step: the load the runs see, not the best
    return {"peak_flops": peak, "mfu": achieved / peak, "threads": torch.get_num_threads(),
            "probe": f"BERT-{PROBE_MODEL}, batch {PROBE_BATCH} x {PROBE_SEQ}, median of {PROBE_STEPS} steps",
            "probe_s": round(time.perf_counter() - start, 2)}


def _compute_s(work: Work, flops_per_s: float) -> float:
    """tables.plan.hours at the CPU's rate: training (+ Table 7's BiLSTM) and Dev FLOPs, and the all-reduce
    (none in one process)."""
    if work.allreduce_bytes:
        raise TableError("a rehearsed run all-reduces over several processes: no gloo bandwidth measured")
    return (work.flops + work.lstm_flops + work.eval_flops) / flops_per_s


def calibrate(small: Table, summary: list[dict], speed: dict) -> dict:
    """Planned vs measured seconds of every run the rehearsal launched (``summary``: run_table's lines)."""
    rate = speed["peak_flops"] * speed["mfu"]
    by_name = {run.name: work for run, work in plan_work([small])[0]}
    walls = {line["sweep"]: line for line in summary}
    sweeps = []
    for sweep in small.sweeps.values():
        line = walls.get(sweep.name)
        if not line or line["skipped"] or line["failed"] or not line["complete"]:
            continue  # only what ran here, whole: a skipped or failed sweep measured nothing comparable
        jobs = []
        for _, folder in sweep.jobs():
            result = json.loads((folder / "results.json").read_text())
            name = f"{sweep.name}/{folder.name}"
            jobs.append({"name": name, "compute_s": _compute_s(by_name[name], rate),
                         "wall_s": float(result["wall_time_s"])})
        # a fine-tuning's set-up depends on its task (SQuAD's windows and its evaluation: twice GLUE's)
        group = sweep.stage if sweep.stage == "pretrain" else f"{sweep.stage}: {sweep.overrides.get('task')}"
        sweeps.append({"sweep": sweep.name, "stage": sweep.stage, "group": group,
                       "wall_s": float(line["wall_s"]), "jobs": jobs})
    fixed: dict[str, dict] = {}
    for group in dict.fromkeys(s["group"] for s in sweeps):
        # measured on the group's second sweep: the first also builds the caches the others read (vocabulary,
        # tokenized corpus and task), one-off work the plan prices apart (plan.RATES)
        grouped = [s for s in sweeps if s["group"] == group]
        chosen = grouped[1] if len(grouped) > 1 else grouped[0]
        inside = sum(j["wall_s"] for j in chosen["jobs"])
        fixed[group] = {"sweep": chosen["sweep"], "startup_s": max(0.0, chosen["wall_s"] - inside),
                        "setup_s": max(0.0, sum(j["wall_s"] - j["compute_s"] for j in chosen["jobs"])
                                       / len(chosen["jobs"]))}
    runs = []
    for s in sweeps:
        f, n = fixed[s["group"]], len(s["jobs"])
        startup_measured = max(0.0, s["wall_s"] - sum(j["wall_s"] for j in s["jobs"]))
        for j in s["jobs"]:
            planned = j["compute_s"] + f["setup_s"] + f["startup_s"] / n
            measured = j["wall_s"] + startup_measured / n
            runs.append({"name": j["name"], "stage": s["stage"], "calibration": s["sweep"] == f["sweep"],
                         "compute_s": round(j["compute_s"], 3), "planned_s": round(planned, 2),
                         "measured_s": round(measured, 2), "ratio": round(planned / measured, 3)})

    def total(rows: list[dict]) -> dict:
        planned, measured = sum(r["planned_s"] for r in rows), sum(r["measured_s"] for r in rows)
        return {"runs": len(rows), "planned_s": round(planned, 1), "measured_s": round(measured, 1),
                "ratio": round(planned / measured, 3) if measured else None}

    return {"cpu": speed, "comm": "0: every rehearsed run is one process (no all-reduce, no gloo)",
            "fixed": fixed, "runs": runs, "total": total(runs),
            "held_out": total([r for r in runs if not r["calibration"]])}


def write_report(calibration: dict, folder: Path) -> Path:
    """calibration.md beside rehearsal.json: the CPU's numbers, then planned, measured and ratio per run."""
    cpu, fixed = calibration["cpu"], calibration["fixed"]
    lines = ["# Plan vs measured on this CPU", "",
             f"CPU peak {cpu['peak_flops'] / 1e9:.1f} GFLOP/s (fp32 matmul), MFU {cpu['mfu']:.1%} "
             f"({cpu['probe']}, {cpu['threads']} threads); comm {calibration['comm']}.", ""]
    for group, f in fixed.items():
        lines.append(f"- {group}: process start-up {f['startup_s']:.1f} s, job set-up {f['setup_s']:.1f} s "
                     f"(measured on {f['sweep']})")
    lines += ["", "| run | compute s | planned s | measured s | planned/measured |",
              "|---|---:|---:|---:|---:|"]
    for r in calibration["runs"]:
        mark = " (calibration)" if r["calibration"] else ""
        lines.append(f"| {r['name']}{mark} | {r['compute_s']:.2f} | {r['planned_s']:.1f} | "
                     f"{r['measured_s']:.1f} | {r['ratio']:.2f} |")
    for key, label in (("total", "total"), ("held_out", "held out (not calibration)")):
        t = calibration[key]
        lines.append(f"| **{label}** ({t['runs']} runs) | | {t['planned_s']:.1f} | {t['measured_s']:.1f} | "
                     f"{t['ratio']:.2f} |" if t["ratio"] is not None else f"| **{label}** | | | | |")
    path = folder / "calibration.md"
    path.write_text("\n".join(lines) + "\n")
    return path
