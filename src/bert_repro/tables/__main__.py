"""``python -m bert_repro.tables run|collect|plan|rehearse <table> --scale smoke|budget|paper`` (make tableN).

plan: every run and its cost, written to <runs>/<table>/<scale>/plan.json; nothing runs.
rehearse: the same plan shrunk (tiny model, steps and data divided down) run on this CPU, then collected.
run, rehearse: SIGTERM or SIGINT (Ctrl-C) stops the runs, each saving a checkpoint, and exits non-zero; the
same command again resumes them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from bert_repro.signals import Stopped, signals_held, stop_at_start, stop_on_signals
from bert_repro.tables import DEMOS, REPO, SCALES, TABLES, TableError

if __name__ == "__main__":
    stop_at_start()  # before the imports below load Hydra and the runner (hence their noqa: E402)

from bert_repro.config import option  # noqa: E402
from bert_repro.tables.plan import ACCELERATORS, MAX_RUNS, gate, make_plan, print_plan, write_plan  # noqa: E402
from bert_repro.tables.runner import Interrupted, failed_jobs, run_table  # noqa: E402
from bert_repro.tables.spec import build, flatten  # noqa: E402


def parse_inits(values: list[str]) -> dict[str, str]:
    """``INIT=/ckpt`` (every external checkpoint) or ``INIT=base=/ckpt/base,large=/ckpt/large``."""
    inits = {}
    for item in (i for value in values for i in value.split(",")):
        key, sep, path = item.partition("=")
        inits.update({key: path} if sep and "/" not in key else {"*": item})
    return inits


def gpu_list(value: str) -> list[int]:
    """``GPUS=4``: the first four devices; ``GPUS=2,3``: those two."""
    try:
        devices = [int(g) for g in value.split(",")]
    except ValueError:
        devices = []
    devices = list(range(devices[0])) if len(devices) == 1 and "," not in value else devices
    if not devices or min(devices) < 0 or len(set(devices)) < len(devices):
        raise argparse.ArgumentTypeError(f"{value!r}: expected a positive number of GPUs (4) or distinct "
                                         "CUDA device numbers (0,1,2,3)")
    return devices


def main(argv: list[str] | None = None) -> int:
    try:
        with stop_on_signals():  # before the runs start and after (planning, imports, collecting) too
            return commands(argv)
    except Stopped as err:  # outside the runs (the runner stops those): each file it writes is whole
        print(f"error: {err} during `python -m bert_repro.tables`: stopped; what finished is kept, run the "
              "same command again to go on", file=sys.stderr)
        return 128 + err.signum


def commands(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.tables", description=__doc__)
    parser.add_argument("action", choices=("run", "collect", "plan", "rehearse"))
    names, scales = ", ".join(TABLES + DEMOS), ", ".join(SCALES)
    parser.add_argument("table", nargs="+",
                        type=option(str, (*TABLES, *DEMOS).__contains__, f"one of {names}"),
                        help=f"one or more of {names}; several (make tables) are planned together, each "
                        "shared pre-training once, and run in turn")
    parser.add_argument("--scale", default="smoke", type=option(str, SCALES.__contains__, f"one of {scales}"),
                        help=f"one of {scales} (default %(default)s)")
    parser.add_argument("--force", action="store_true",
                        help="re-run complete runs too, setting their earlier results aside first")
    parser.add_argument("--init", action="append", default=[],
                        help="external checkpoint(s): PATH or KEY=PATH,...")
    parser.add_argument("--launcher", default="local", choices=("local", "joblib", "slurm", "ray"),
                        help="where the runs execute")
    parser.add_argument("--gpus", type=gpu_list, help="run: the local launcher's devices, 4 (the first "
                        "four) or 0,1,2,3, each of its sweeps_at_once (default: one a GPU) on its own; plan: "
                        "the wall time on that many")
    parser.add_argument("--logger", choices=("csv", "wandb", "none"), help="default: the table's, per scale")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        type=option(str, lambda v: "=" in v or v.startswith("~"),
                                    "KEY=VALUE (or ~KEY to remove one)"),
                        help="a Hydra override of the table spec's `table:` node, e.g. grid.seed=1,2")
    parser.add_argument("--runs-dir", type=Path, default=REPO / "experiments" / "runs")
    parser.add_argument("--results-dir", type=Path, default=REPO / "experiments" / "results")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--rehearse-grid", choices=("full", "first"), default="first",
                        help="rehearse each grid's first point (default: each kind of run once), or all")
    parser.add_argument("--yes", action="store_true", help=f"take a table of more than {MAX_RUNS:,} runs")
    parser.add_argument("--accelerator", default="h100", choices=tuple(ACCELERATORS),
                        help="the GPU the plan's GPU-hours are for (default %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.action == "plan":  # several tables together: each shared pre-training once
        return guarded(plan_all, args)
    codes = [guarded(one_table, args, name) for name in args.table]  # a later table reuses what one trained
    return next((code for code in codes if code), 0)


def guarded(work, *args) -> int:
    try:
        return work(*args)
    except (TableError, Interrupted) as err:  # Interrupted: the runs were stopped first, each checkpointed
        print(f"error: {err}", file=sys.stderr)
        return 128 + err.signum if isinstance(err, Interrupted) else 2  # as a shell reports a signal's end


def table(args: argparse.Namespace, name: str):
    return build(name, args.scale, args.runs_dir.resolve(), parse_inits(args.init), args.set, args.logger)


def plan_all(args: argparse.Namespace) -> int:
    tables = [table(args, name) for name in args.table]
    gate(tables, args.yes)  # several tables: their runs together
    launcher = tables[0].spec.get("launchers", {}).get(args.launcher) or {}
    share = float(flatten(launcher.get("finetune")).get("ray.num_gpus") or 1)  # Ray's fractional GPUs
    plan = make_plan(tables, args.accelerator, len(args.gpus or []) or None, share)
    print_plan(plan)
    with signals_held():
        written = write_plan(plan, args.runs_dir)
    print(f"wrote {written}")
    return 0


def one_table(args: argparse.Namespace, name: str) -> int:
    from bert_repro.tables.collect import collect, load_reference  # scipy and pandas: not for a plan
    from bert_repro.tables.render import log_wandb, write_all

    start, spec, results_dir = time.time(), table(args, name), args.results_dir
    gate([spec], args.yes)  # before a job is composed, on every path: run, --dry-run, rehearse, collect
    reference = load_reference()
    os.environ.setdefault("BERT_REPRO_WANDB_GROUP", spec.name)  # the child runs join the table's group
    if args.action == "rehearse":
        from bert_repro.tables.rehearse import rehearse

        spec, results_dir = rehearse(spec, args.runs_dir.resolve(), results_dir, args.force,
                                     args.rehearse_grid, args.set)
    elif args.action == "run":
        launcher = spec.spec.get("launchers", {}).get(args.launcher)
        if launcher is None:
            raise TableError(f"conf/table/{name}.yaml has no launchers.{args.launcher}")
        if args.gpus:
            launcher = {**launcher, "gpus": args.gpus}
        # a run is planned (its spec checked) before it starts; its ETA weighs each job by the plan's FLOPs
        plan = None if args.dry_run else make_plan(spec, args.accelerator)
        if plan is not None and args.scale != "smoke":
            print(f"plan: {len(plan['runs'])} runs, {plan['total_gpu_hours']:,.1f} GPU-hours on "
                  f"{args.accelerator} (`ACTION=plan` for each run)")
        summary = run_table(spec, launcher, force=args.force, dry_run=args.dry_run, plan=plan)
        if args.dry_run:
            return 0
        spec.root.mkdir(parents=True, exist_ok=True)
        (spec.root / "summary.json").write_text(json.dumps({"wall_s": round(time.time() - start, 1),
                                                            "sweeps": summary}, indent=2) + "\n")
    collected = collect(spec, reference)
    with signals_held():  # the table's files are written whole, all of them
        written = write_all(spec, collected, reference, results_dir)
    if (args.logger or spec.spec.get("logger")) == "wandb":  # the table itself too, beside its runs
        log_wandb(spec, collected, written, args.runs_dir / name / args.scale)
    print((results_dir / f"{name}.md").read_text(), end="")
    print(f"wrote {', '.join(str(p) for p in written)} in {time.time() - start:.0f} s")
    if args.action != "collect" and (failed := failed_jobs(spec)):  # the table marks them; the exit says so
        more = " ..." if len(failed) > 5 else ""
        print(f"error: {len(failed)} jobs failed: {', '.join(failed[:5])}{more}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
