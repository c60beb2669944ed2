"""Model selection over sweeps (§3.5, §4.1) and the GLUE server's submission files.

    python -m bert_repro.selection multirun/mrpc/... multirun/rte/...  # best Dev run per task
    python -m bert_repro.selection SWEEP ... --restarts  # mean +- std over seeds per hyper-parameter setting
                                                         # (Table 6)
    python -m bert_repro.selection SWEEP ... --submit    # + test predictions of each selected run, zipped

Runs are the ``results.json`` files under the given folders. A "setting" is what a table cell fixes
(task, model, ablation, scale, init); within one, the paper keeps the run best on Dev by the task's
monitored metric of the final weights. Runs that collapsed onto one class (``metrics.degenerate_reason``)
are flagged and left out of the choice while any other run exists. Writes selection.json and
selection.md (and submission/ + submission.zip) into --out, the first folder by default.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import zipfile
from pathlib import Path
from typing import Any

from bert_repro.config import option
from bert_repro.identity import checkpoint_identity, science_differences
from bert_repro.keys import comparable, flatten, science
from bert_repro.lifecycle.folder import RunFolder, find_runs
from bert_repro.scores import (  # torch-free: the collector uses this
    COLLAPSE_SHARE,
    degenerate_reason,
    glue_score,
)

log = logging.getLogger(__name__)

# the hyper-parameters the summary shows (§3.5's grid and the CPU subset)
SWEPT = {"lr": ("optim", "lr"), "epochs": ("optim", "epochs"), "batch": ("data", "batch_size"),
         "max_train": ("data", "max_train_examples")}
# what restarts of one configuration differ in, besides the keys that change only speed or places (keys.py)
RESTART_KEYS = ("seed", "data.seed")
SETTING = ("task", "model", "ablation", "scale", "init")  # what a table cell fixes


def _science(config: dict) -> dict:
    """The science config (keys.science) flattened, less the seeds: runs that share it are restarts of each
    other."""
    return {k: v for k, v in comparable(flatten(science(config))).items() if k not in RESTART_KEYS}


def load_runs(folders: list[Path], collapse_share: float = COLLAPSE_SHARE,
              failed: list[dict] | None = None) -> tuple[list[dict], list[str]]:
    """Completed runs (one dict each) under ``folders`` (``folder.find_runs``: each run once, never a
    logger's copy), and a note for each run that is not usable. ``failed``: a list that receives each failed
    run's folder, setting and reason (its results.json says status "failed"), so the summary can mark the
    cell. A results.json that is not one is an error."""
    runs, skipped = [], []
    for folder in find_runs(folders):
        results = RunFolder(folder).read()
        config, monitor, final = results["config"], results["monitor"], results["metrics"]["final"]
        if results.get("status") != "complete" or final.get(monitor) is None:
            reason = results.get("reason")
            skipped.append(f"{folder}: status {results.get('status')}, {monitor}={final.get(monitor)}"
                           + (f" ({reason})" if reason else ""))
            if failed is not None and results.get("status") == "failed":
                failed.append({"dir": str(folder), "reason": reason or "no reason recorded",
                               "setting": {k: results.get(k) for k in SETTING}})
            continue
        runs.append({
            "dir": str(folder), "task": results["task"], "seed": results["seed"], "monitor": monitor,
            "mode": config["task"].get("monitor_mode", "max"), "score": final[monitor], "final": final,
            "setting": {k: results.get(k) for k in SETTING},
            "hparams": {name: config.get(group, {}).get(key) for name, (group, key) in SWEPT.items()},
            "science": _science(config),
            "degenerate": (None if results.get("predict_majority")
                           else degenerate_reason(final, collapse_share)),
            "results": results,
        })
    return runs, skipped


def _groups(runs: list[dict], key) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for run in runs:
        groups.setdefault(json.dumps(key(run), sort_keys=True), []).append(run)
    return groups


def _dev_loss(run: dict) -> float:
    loss = run["final"].get("val/loss")
    return loss if loss is not None and math.isfinite(loss) else math.inf


def _best(runs: list[dict]) -> dict:
    """The run best on Dev, among the healthy ones while any exists; a tie (every run collapsed onto the
    same class scores the same) goes to the lowest Dev loss, then to the folder, never to folder order
    alone."""
    sign = -1 if runs[0]["mode"] == "min" else 1
    healthy = [r for r in runs if not r["degenerate"]] or runs
    return min(healthy, key=lambda r: (-sign * r["score"], _dev_loss(r), r["dir"]))


def scored_on(runs: list[dict], metric: str) -> list[dict]:
    """``runs`` scored on ``metric`` (a score: higher is better) instead of each run's task monitor, so a
    table selects on the number it reports (MRPC: F1 in Table 1, accuracy in Tables 5 and 6). A run without it
    scores -inf: never chosen while another has it."""
    return [{**r, "monitor": metric, "mode": r["mode"] if metric == r["monitor"] else "max",
             "score": r["final"][metric] if r["final"].get(metric) is not None else -math.inf}
            for r in runs]


def select(runs: list[dict], restarts: bool = False, failed: list[dict] | None = None,
           metric: str | None = None) -> list[dict]:
    """One entry per setting: the run best on Dev, or (``restarts``) the hyper-parameters best on mean Dev
    over seeds, with every metric's mean and std over those seeds. ``failed`` runs (``load_runs``) are
    listed in their setting's entry with their reasons; a setting with no completed run is an entry too.
    ``metric``: select on it (``scored_on``) rather than on each run's task monitor."""
    runs = scored_on(runs, metric) if metric else runs
    chosen = []
    failures = _groups(failed or [], lambda f: f["setting"])
    for key, members in _groups(runs, lambda r: r["setting"]).items():
        entry = {"setting": members[0]["setting"], "monitor": members[0]["monitor"], "runs": len(members),
                 "degenerate": [{"dir": r["dir"], "reason": r["degenerate"]}
                                for r in members if r["degenerate"]],
                 "failed": [{"dir": f["dir"], "reason": f["reason"]} for f in failures.pop(key, [])]}
        if not restarts:
            best = _best(members)
            entry.update(selected=best["dir"], hparams=best["hparams"], seed=best["seed"],
                         metrics=best["final"], collapsed=best["degenerate"])
        else:
            # every seed counts in the mean (Table 6 averages 5 restarts), collapsed ones included and flagged
            sign = -1 if members[0]["mode"] == "min" else 1
            by_hparams = _groups(members, lambda r: r["science"]).values()
            group = min(by_hparams, key=lambda g: (-sign * statistics.fmean(r["score"] for r in g),
                                                   statistics.fmean(_dev_loss(r) for r in g), g[0]["dir"]))
            names = sorted({k for r in group for k, v in r["final"].items() if v is not None})
            stats = {}
            for name in names:
                values = [r["final"][name] for r in group if r["final"].get(name) is not None]
                stats[name] = {"mean": statistics.fmean(values),
                               "std": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values)}
            best = _best(group)
            entry.update(hparams=group[0]["hparams"], seeds=sorted(r["seed"] for r in group), restarts=stats,
                         runs_selected=[r["dir"] for r in group], selected=best["dir"],
                         metrics={k: v["mean"] for k, v in stats.items()}, collapsed=best["degenerate"])
        chosen.append(entry)
    for members in failures.values():  # settings where every run failed: the cell shows why
        chosen.append({"setting": members[0]["setting"], "monitor": None, "runs": 0, "degenerate": [],
                       "failed": [{"dir": f["dir"], "reason": f["reason"]} for f in members],
                       "selected": None, "hparams": dict.fromkeys(SWEPT), "metrics": {}})
    return sorted(chosen, key=lambda e: json.dumps(e["setting"], sort_keys=True))


def table1_scores(entries: list[dict]) -> list[dict]:
    """Per pre-trained model (model, ablation, scale, init): the Table 1 columns x 100 and the GLUE
    average."""
    from bert_repro.data.glue import (
        GLUE_TASKS,  # here, not at the top: the table collector must not load torch
    )

    rows = []
    for members in _groups(entries,
                           lambda e: {k: v for k, v in e["setting"].items() if k != "task"}).values():
        scores: dict[str, float | None] = {}
        for entry in members:
            task = entry["setting"]["task"]
            for metric in GLUE_TASKS[task].score if task in GLUE_TASKS else ():
                column = metric.removesuffix("_acc") if task == "mnli" else task
                value = entry["metrics"].get(f"val/{metric}")
                scores[column] = None if value is None else 100 * value
        if scores:
            rows.append({"model": {k: v for k, v in members[0]["setting"].items() if k != "task"},
                         "scores": scores, "average": glue_score(scores)})
    return rows


def _fmt(value: Any, spec: str = ".4f") -> str:
    if isinstance(value, float):
        return "n/a" if not math.isfinite(value) else format(value, spec)
    return "n/a" if value is None else str(value)


def render(entries: list[dict], glue: list[dict], skipped: list[str], restarts: bool) -> str:
    lines = ["# Selection on Dev"
             + (" (mean +- std over restarts)" if restarts else " (best run per setting)"), "",
             "| task | model | ablation | monitor | Dev | lr | epochs | batch | runs | degenerate | failed | "
             "selected |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        s, h, monitor = e["setting"], e["hparams"], e["monitor"]
        if e["selected"] is None:  # every run of this setting failed
            dev = "failed: " + "; ".join(f["reason"] for f in e["failed"])[:200]
        elif restarts:
            stats = e["restarts"][monitor]
            dev = f"{stats['mean']:.4f} +- {stats['std']:.4f} (n={stats['n']})"
        else:
            dev = _fmt(e["metrics"].get(monitor))
        if e.get("collapsed"):  # the number is a collapsed run's: never shown as a result without saying so
            dev += f" **collapsed** ({e['collapsed']})"
        lines.append(f"| {s['task']} | {s['model']} | {s['ablation']} | {monitor} | {dev} | "
                     f"{_fmt(h['lr'], 'g')} | {_fmt(h['epochs'])} | {_fmt(h['batch'])} | {e['runs']} | "
                     f"{len(e['degenerate'])} | {len(e.get('failed', []))} | {e['selected']} |")
    for row in glue:
        cells = ", ".join(f"{k} {_fmt(v, '.1f')}" for k, v in row["scores"].items())
        lines += ["", f"GLUE average (Table 1 columns, WNLI excluded) for {row['model']}: "
                      f"{_fmt(row['average'], '.1f')}"
                  + ("" if row["average"] is not None else " (needs all nine columns)") + f"; {cells}"]
    flagged = [d for e in entries for d in e["degenerate"]]
    if flagged:
        lines += ["", "Degenerate runs (collapsed; not selected while another run exists):"]
        lines += [f"- {d['dir']}: {d['reason']}" for d in flagged]
    failed = [f for e in entries for f in e.get("failed", [])]
    if failed:
        lines += ["", "Failed runs (no number reported):"] + [f"- {f['dir']}: {f['reason']}" for f in failed]
    if skipped:
        lines += ["", "Not used:"] + [f"- {s}" for s in skipped]
    return "\n".join(lines) + "\n"


def predict_run(run_dir: Path, results: dict) -> dict[str, str]:
    """Test predictions of a finished run, in its test_predictions/: its final weights where the run kept
    them (checkpoints/last.ckpt, checkpoint.keep_last), else its weights best on Dev (best.ckpt)."""
    import lightning as L
    from hydra.utils import get_class, instantiate
    from omegaconf import OmegaConf

    from bert_repro.convert.safe import CheckpointError
    from bert_repro.lifecycle.build import predict_test
    from bert_repro.lifecycle.spec import resolve_vocab

    config = results["config"]
    if results.get("predict_majority"):  # nothing was trained: the majority class needs only the data
        vocab, lowercase, _ = resolve_vocab(OmegaConf.create(config))
        # a run folder written before resolve_vocab
        if vocab is None and (run_dir / "init_vocab.txt").is_file():
            vocab = (run_dir / "init_vocab.txt").read_text(encoding="utf-8").splitlines()
        module = instantiate(config["module"], model=results["model_config"], optim=config["optim"])
    else:
        run = RunFolder(run_dir)
        ckpt = run.final_weights()
        if ckpt is None:
            raise FileNotFoundError(f"{run.checkpoints} holds neither {run.last.name} nor {run.best.name}; "
                                    f"rerun {run_dir} with test=true to predict its test set")
        if ckpt == run.best:
            log.info("%s: predicting with %s, the epoch best on Dev (the final weights were not kept: "
                     "checkpoint.keep_last=false)", run_dir, ckpt.name)
        _of_this_result(ckpt, results)
        try:
            module = get_class(config["module"]["_target_"]).load_from_checkpoint(ckpt, map_location="cpu",
                                                                                  weights_only=True)
        except Exception as err:  # Lightning raises KeyError, RuntimeError ... for a file it cannot restore
            raise CheckpointError(f"{ckpt}: not a checkpoint of {run_dir}'s task module that Lightning can "
                                  f"restore ({type(err).__name__}: {err}); rerun {run_dir} with test=true "
                                  "to predict its test set") from None
        vocab, lowercase = module.vocab, module.lowercase
    # the vocabulary to the partial, not instantiate's kwargs (OmegaConf nodes: seconds for 30k tokens)
    make = instantiate(config["data"], _convert_="all", _partial_=True)
    datamodule = make(tokenizer=vocab, lowercase=lowercase)
    trainer = L.Trainer(accelerator="auto", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    return predict_test(trainer, module, datamodule, run_dir / "test_predictions")


def _of_this_result(ckpt: Path, results: dict) -> None:
    """``ckpt`` is readable and was written by the run that wrote ``results`` (same science settings; a
    last.ckpt at its final step): an interrupted rerun's checkpoint is not predicted under its Dev score."""
    from bert_repro.convert.safe import CheckpointError, safe_torch_load  # torch: not for the collector

    saved = safe_torch_load(ckpt, what="a readable bert_repro Lightning checkpoint")
    identity = checkpoint_identity(saved)
    differ = science_differences((identity or {}).get("science"), science(results.get("config") or {}))
    if identity is not None and differ:
        raise CheckpointError(f"{ckpt} was written with other settings than the run's results "
                              f"({'; '.join(differ[:3])}): it is not the selected result's weights; rerun "
                              "the run to finish it")
    final_step, step = results.get("global_step"), saved.get("global_step")
    if ckpt.name == RunFolder(ckpt.parent.parent).last.name and None not in (final_step, step) \
            and step != final_step:
        raise CheckpointError(f"{ckpt} is at step {step}, the run's results at step {final_step}: another "
                              "attempt's checkpoint (an interrupted rerun), not the selected result's "
                              "weights; rerun the run to finish it")


def write_submission(entries: list[dict], runs: list[dict], out: Path,
                     allow_collapsed: bool = False) -> tuple[Path, list[str]]:
    """The selected runs' test predictions as the GLUE server takes them: one <TASK>.tsv each (AX from the
    MNLI model, WNLI from its majority-class run), zipped. Returns the zip and the server files missing. A
    selected run that collapsed is refused unless ``allow_collapsed``."""
    from bert_repro.data.glue import GLUE_TASKS

    by_dir = {r["dir"]: r for r in runs}
    collapsed = [f"{e['selected']} ({e['collapsed']})" for e in entries if e.get("collapsed")]
    if collapsed and not allow_collapsed:
        raise ValueError(f"the selected run of {len(collapsed)} setting(s) collapsed: "
                         f"{'; '.join(collapsed)}; its test predictions are one class, not a result. Train "
                         "more restarts, or pass --allow-collapsed to submit them anyway")
    tasks = [e["setting"]["task"] for e in entries]
    repeated = sorted({t for t in tasks if tasks.count(t) > 1})
    if repeated:
        raise ValueError(f"several settings (models/ablations) for {repeated}: select one model's runs to "
                         "submit")
    folder = out / "submission"
    folder.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if entry["selected"] is None:  # every run failed: nothing to submit for it
            continue
        run = by_dir[entry["selected"]]
        files = run["results"].get("test_predictions") or {}
        if not files or not all(Path(f).is_file() for f in files.values()):
            files = predict_run(Path(run["dir"]), run["results"])
        for path in files.values():
            (folder / Path(path).name).write_bytes(Path(path).read_bytes())
    expected = [f"{name}.tsv" for spec in GLUE_TASKS.values() for name in spec.server.values()]
    zipped = out / "submission.zip"
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in expected:
            if (folder / name).is_file():
                archive.write(folder / name, arcname=name)
    return zipped, [name for name in expected if not (folder / name).is_file()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.selection",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="sweep folders (searched for results.json)")
    parser.add_argument("--restarts", action="store_true",
                        help="mean +- std over seeds per hyper-parameter setting")
    parser.add_argument("--submit", action="store_true",
                        help="write the GLUE server's files for the selected runs")
    parser.add_argument("--allow-collapsed", action="store_true",
                        help="--submit the selected runs even where one collapsed onto one class")
    parser.add_argument("--metric", help="select on this Dev metric, e.g. val/acc (default: each run's "
                                         "task.monitor)")
    parser.add_argument("--collapse", default=COLLAPSE_SHARE,
                        type=option(float, lambda v: 0 < v <= 1, "a share of the Dev predictions in (0, 1]"),
                        help="share of one predicted class that flags a run as collapsed (default "
                             "%(default)s)")
    parser.add_argument("--out", type=Path, help="where the summary goes (default: the first folder)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        failed: list[dict] = []
        runs, skipped = load_runs(args.folders, args.collapse, failed=failed)
        if not runs and not failed:
            raise ValueError(f"no completed run (results.json) under {', '.join(map(str, args.folders))}")
        entries = select(runs, restarts=args.restarts, failed=failed, metric=args.metric)
        glue = table1_scores(entries)
        out = args.out or args.folders[0]
        out.mkdir(parents=True, exist_ok=True)
        summary = {"mode": "restarts" if args.restarts else "best", "selection": entries, "glue": glue,
                   "skipped": skipped}
        if args.submit:
            zipped, missing = write_submission(entries, runs, out, args.allow_collapsed)
            summary["submission"] = {"zip": str(zipped), "missing": missing}
            if missing:
                log.warning("the GLUE server wants every task; missing: %s", ", ".join(missing))
        (out / "selection.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        text = render(entries, glue, skipped, args.restarts)
        (out / "selection.md").write_text(text)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text, end="")
    print(f"wrote {out / 'selection.json'} and {out / 'selection.md'}"
          + (f"; submission: {summary['submission']['zip']}" if args.submit else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
