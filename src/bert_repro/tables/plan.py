"""``ACTION=plan``: every run a table will launch, and what it costs, each fact asked of its owner on the
config Hydra composes for the run. GPU-hours: compute (FLOPs at the bf16 peak x the measured MFU, else the
table's ``assumed_mfu``), comm (DDP's ring all-reduce over the slowest link, not overlapped: an upper bound)
and eval; beside them CPU-core-hours of data preparation and disk (docs/tables.md)."""

from __future__ import annotations

import bisect
import functools
import heapq
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf

from bert_repro.flops import PEAK_TFLOPS, head_flops, training_flops
from bert_repro.progress import counted
from bert_repro.tables import CONF_DIR, REPO, TableError
from bert_repro.tables.compose import compose_job, composing
from bert_repro.tables.spec import Sweep, Table

# bf16 peak (flops.PEAK_TFLOPS), GB/s a GPU, one way, over NVLink and over InfiniBand (a NIC a GPU):
# H100/H200 NVLink 4 (900 GB/s both ways), NDR 400 Gb/s; A100 NVLink 3 (600 GB/s), HDR 200 Gb/s
ACCELERATORS = {"h100": ("h100-sxm/bf16", 450, 50), "h200": ("h200/bf16", 450, 50),
                "a100": ("a100/bf16", 300, 25)}
GPUS_PER_NODE = 8  # trainer.devices=auto on an HGX/DGX node
RATES = REPO / "experiments" / "results" / "cpu" / "rates.json"  # benchmarks/instances.py --rates writes it
MAX_RUNS = 10_000  # a grid beyond this is planned only with --yes
FACTS = ("train_sizes", "dev_sizes", "token_lengths", "corpus_tokens")  # conf/table/table_tasks.yaml's


@dataclass
class Run:
    """A run's work, whatever the accelerator; ``row`` prices it as plan.json lists it."""

    name: str
    kind: str  # pretrain | finetune
    phase: int | None
    steps: int
    seq_length: int
    tokens: int
    flops: float  # training
    lstm_flops: float  # a BiLSTM's (Table 5's + BiLSTM, Table 7's features), at lstm_mfu
    eval_flops: float
    allreduce_bytes: float  # per device, over all steps
    devices: int
    nodes: int
    hidden: int
    disk_gb: float  # the checkpoints it keeps, and the data caches it builds first
    folder: str  # the run folder: the same pre-training in two tables is one folder
    data: dict  # pre-training data caches: key -> (CPU-core-hours, bytes)
    prep_hours: float = 0.0  # CPU-core-hours, of the data caches it builds first
    after: str | None = None  # the folder of the pre-training run it starts from


def cpu_rates() -> dict:
    """The data-preparation rates and cache sizes benchmarks/instances.py measured, with its machine."""
    try:
        return json.loads(RATES.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise TableError(f"{RATES}: {err}; measure it with `python -m bert_repro.benchmarks.instances "
                         "--copies 1 --num-proc 1 --rates`") from None


def mfu_for(hidden: int, seq: int, measured: dict, assumed: dict) -> tuple[float, str]:
    if (hidden, seq) in measured:
        return measured[(hidden, seq)]
    size = min((int(h) for h in assumed if hidden <= int(h)), default=max(map(int, assumed)))
    return assumed[size], f"assumed {assumed[size]:.0%} for H<={size}"


def row(run: Run, accelerator: str, mfu: dict, share: float = 1.0) -> dict:
    """``run`` as plan.json lists it, with its hours on ``accelerator``; ``mfu``: measured, assumed, lstm.
    ``share``: the part of a GPU a one-device fine-tuning holds (Ray's fractional num_gpus); it runs as fast
    as alone (a small run leaves most of the GPU idle) and is charged its share of the GPU-hours."""
    peak_name, nvlink, infiniband = ACCELERATORS[accelerator]
    peak = PEAK_TFLOPS[peak_name] * 1e12
    n = run.devices * run.nodes
    link, gbs = ("none", math.inf) if n == 1 else ("infiniband", infiniband) if run.nodes > 1 \
        else ("nvlink", nvlink)
    util = mfu_for(run.hidden, run.seq_length, mfu["measured"], mfu["assumed"])[0]
    hours = {"compute_hours": (run.flops / util + run.lstm_flops / mfu["lstm"]) / peak / 3600,
             "comm_hours": run.allreduce_bytes / (gbs * 1e9) * n / 3600,
             "eval_hours": run.eval_flops / (peak * util) / 3600}
    gpus = share if run.kind == "finetune" and n == 1 else n
    return {"name": run.name, "kind": run.kind, "phase": run.phase, "steps": run.steps,
            "seq_length": run.seq_length, "tokens": run.tokens, "flops": run.flops + run.lstm_flops,
            "gpu_hours": sum(hours.values()) * gpus / n, **{k: v * gpus / n for k, v in hours.items()},
            "wall_hours": sum(hours.values()) / n, "prep_hours": run.prep_hours, "disk_gb": run.disk_gb,
            "devices": n, "gpus": gpus, "interconnect": link, "folder": run.folder, "after": run.after}


def _val_sequences(limit, batch: int, available: int) -> int:
    """Dev sequences one evaluation reads: optim.limit_val_batches (batches, or a share) of ``available``."""
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(available, limit * batch)
    return int(available * float(limit if limit is not None else 1.0))


@dataclass(frozen=True)
class Work:
    """What one job trains and evaluates, before devices, bytes and prices."""

    steps: int
    length: float  # the (mean padded) sequence length a step trains at
    tokens: int
    flops: float
    val: int  # Dev sequences over the run
    per_seq: int = 0  # the positions a Dev sequence predicts (pre-training's MLM or LM)
    lstm_flops: float = 0.0
    written: tuple[int, ...] = ()  # the steps of its step checkpoints
    caches: dict[str, tuple[float, float]] | None = None


def plan_job(sweep: Sweep, swept: list[str], folder: Path, facts: dict, cache: dict) -> Run:
    """One job's run, composed as src/train.py composes it and checked as it checks it (config.check);
    ``facts``: the table's FACTS and the CPU's data rates."""
    from bert_repro.config import check
    from bert_repro.lifecycle.callbacks import kept_bytes_per_parameter
    from bert_repro.model import BertConfig, checkpoint_parameters

    try:
        cfg = compose_job(sweep.compose_args(), swept, cache.setdefault("copies", {}))
        check(cfg)
    except HydraException as err:
        raise TableError(f"{sweep.name} {' '.join(swept)}: does not compose ({err})") from None
    except ValueError as err:
        raise TableError(f"{sweep.name} {' '.join(swept)}: {err}") from None
    data, pretraining = cfg.data, sweep.stage == "pretrain"
    # pre-training trains a WordPiece of at most data.vocab_size; a fine-tuning's is its checkpoint's
    node, vocab = OmegaConf.to_container(cfg.model, resolve=True), pretraining and data.vocab_size
    key = (json.dumps(node, sort_keys=True), pretraining, vocab)
    if key not in cache:
        config = BertConfig(**node, **({"vocab_size": vocab} if vocab else {}))
        cache[key] = config, checkpoint_parameters(config, pretraining)
    model, params = cache[key]
    devices = cfg.trainer.devices
    devices = GPUS_PER_NODE if devices in (None, "auto", -1) else int(devices)
    nodes = int(cfg.trainer.get("num_nodes") or 1)
    n = devices * nodes
    work = (pretraining_work(cfg, sweep, model, facts) if pretraining
            else finetuning_work(cfg, sweep, model, facts, cache, n))
    # forward only, at each evaluation (pre-training: every val_check_interval; fine-tuning: each epoch's end)
    val, length = work.val, work.length
    eval_flops = training_flops(model, round(val * length), length, val * work.per_seq) / 3
    grad_bytes = params * (2 if cfg.speed.grad_allreduce == "bf16" else 4)
    disk_gb = kept_bytes_per_parameter(cfg.checkpoint, list(work.written)) * params / 1e9
    after = str(sweep.needs.jobs()[0][1]) if sweep.needs is not None else None
    steps = work.steps
    return Run(f"{sweep.name}/{folder.name}", sweep.stage, sweep.phase if pretraining else None, steps,
               int(data.max_seq_length), work.tokens, work.flops, work.lstm_flops, eval_flops,
               steps * 2 * (n - 1) / n * grad_bytes, devices, nodes, model.hidden_size, disk_gb, str(folder),
               work.caches or {}, after=after)


def pretraining_work(cfg, sweep: Sweep, model, facts: dict) -> Work:
    """A pre-training's steps from its resume step to optim.max_steps, every sequence at full length, its
    masked positions (the LTR ablation: every next token) predicted; its step checkpoints and data caches."""
    from bert_repro.lifecycle.trainer import optimizer_steps, run_length

    optim, data = cfg.optim, cfg.data
    seq, batch = int(data.max_seq_length), int(data.batch_size)
    start = int(optim.resume_step or 0)
    # its instances are not counted: optim.max_steps ends it (an upper bound where optim.epochs is set)
    end = optimizer_steps(**run_length(optim), batches_per_epoch=math.inf)
    if end == math.inf:
        raise TableError(f"{sweep.name}: a pre-training is planned by optim.max_steps, and it is unset "
                         f"(optim.epochs={optim.epochs}); give optim.max_steps")
    steps = end - start
    tokens = steps * batch * seq
    # the left-to-right LM predicts every next token (seq - 1 a sequence), the masked LM its masked ones
    per_seq = seq - 1 if cfg.ablation.ltr else int(data.max_predictions_per_seq)
    flops = training_flops(model, tokens, seq, steps * batch * per_seq)
    val = steps // int(optim.val_check_interval) * _val_sequences(optim.limit_val_batches, batch,
                                                                    batch * 10**6)
    every = sweep.schedule.every
    written = tuple(range(start + every, end + 1, every)) if every else ()
    return Work(steps, seq, tokens, flops, val, per_seq, written=written,
                caches=_data_caches(cfg, sweep, seq, facts))


def finetuning_work(cfg, sweep: Sweep, model, facts: dict, cache: dict, n: int) -> Work:
    """A fine-tuning's steps (the run's length over the train set), each device's share of a batch padded to
    its longest (the table's measured length quantiles), its head's FLOPs, Dev after each epoch."""
    from bert_repro.data.batching import PadCollator
    from bert_repro.lifecycle.checks import UsageError, split_batch
    from bert_repro.lifecycle.trainer import optimizer_steps, run_length

    optim, data = cfg.optim, cfg.data
    seq, batch = int(data.max_seq_length), int(data.batch_size)
    if sweep.needs is not None and seq > (trained := sweep.needs.schedule.trained_length(sweep.phase)):
        raise TableError(f"{sweep.name}: fine-tunes at data.max_seq_length={seq} from "
                         f"{sweep.checkpoint}, whose position embeddings were trained up to {trained} "
                         f"tokens only (phase {sweep.phase} of the pre-training schedule); lower the "
                         "length or start from a later checkpoint")
    sizes, dev_sizes = facts.get("train_sizes") or {}, facts.get("dev_sizes") or {}
    task = cfg.task.name
    # data.train_examples: the rows the demonstration tasks (data/pydoc_tasks.py) write
    cap = data.get("max_train_examples") or data.get("train_examples")
    if task not in sizes and not cap:
        raise TableError(f"{sweep.name}: no train size for task {task!r} in conf/table/table_tasks.yaml "
                         "train_sizes, and no data.max_train_examples (or data.train_examples)")
    examples = min(sizes.get(task, cap), cap or sizes[task])
    choices = int(cfg.task.get("num_choices") or 1)  # SWAG: four [CLS] A [SEP] B_i sequences
    try:
        per_device, accumulation = split_batch(batch, n, cfg.speed.per_device_batch_size)
    except UsageError as err:
        raise TableError(f"{sweep.name}: {err}") from None
    batches = math.ceil(examples / (per_device * n))  # a rank's loader: its share of each global batch
    per_epoch = optimizer_steps(-1, 1, batches, accumulation)
    steps = optimizer_steps(**run_length(optim), batches_per_epoch=batches, accumulation=accumulation)
    # each device pads its own share of the batch; the released code's fixed 128: speed.padding=max_length
    pad_to = seq if cfg.speed.padding == "max_length" else None
    quantiles = (facts.get("token_lengths") or {}).get(task)
    key = ("padded", json.dumps(quantiles), per_device, seq, pad_to)
    if key not in cache:
        try:
            cache[key] = PadCollator(pad_to).mean_padded_length(quantiles, per_device, seq)
        except ValueError as err:  # the table's token_lengths
            raise TableError(f"{sweep.name}: conf/table/table_tasks.yaml {err}") from None
    length = cache[key]
    tokens = round(steps * min(batch, examples) * length * choices)
    flops = training_flops(model, tokens, length)  # padded tokens: an upper bound on the real ones
    dev = dev_sizes.get(task, examples)
    dev = min(dev, data.get("max_dev_examples") or dev)
    val = math.ceil(steps / per_epoch) * _val_sequences(optim.limit_val_batches, batch, dev) * choices
    lstm_flops = head_flops(model, cfg.module, tokens)
    if cfg.module.get("features"):  # Table 7: the encoder frozen (forward only), its BiLSTM trained
        flops /= 3
    return Work(steps, length, tokens, flops, val, lstm_flops=lstm_flops)


def _data_caches(cfg, sweep: Sweep, seq: int, facts: dict) -> dict[str, tuple[float, float]]:
    """A pre-training's data caches, keyed as data/pretraining.py keys them (cache_settings): (CPU-core-hours,
    bytes) of the corpus's tokens, and of each dupe_factor round of instances (each phase's own length)."""
    from bert_repro.data.pretraining import cache_settings

    rates, data = facts["rates"], cfg.data
    corpus = float((facts.get("corpus_tokens") or {}).get(data.source, 0))
    settings = cache_settings(data, static=data.masking == "static")
    tokens, round_ = ({k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                       for k, v in part.items()} for part in settings)
    if sweep.needs is not None:
        tokens["tokenizer"] = None  # phase 2: the vocabulary phase 1 trained on this corpus (its checkpoint)
    sizes = rates["instance_bytes_per_token"]
    measured = min(sizes, key=lambda length: abs(math.log(int(length) / seq)))
    caches = {"tokens " + json.dumps(tokens, sort_keys=True):
              (corpus / rates["text_tokens_per_s"] / 3600, corpus * rates["text_cache_bytes_per_token"])}
    for dupe in range(int(data.dupe_factor or 1)):
        key = f"instances {dupe} " + json.dumps({**tokens, **round_, "seed": data.seed}, sort_keys=True)
        caches[key] = (corpus / rates["round_tokens_per_s"] / 3600, corpus * sizes[measured])
    return caches


def gate(tables: list[Table], yes: bool) -> None:
    """More than MAX_RUNS runs only with ``yes``: asked by every path that plans (plan, run, --dry-run,
    rehearse, collect) before a job is composed, from the grids' sizes alone (Sweep.count), in seconds."""
    count = sum(t.count() for t in tables)
    if count > MAX_RUNS and not yes:
        raise TableError(f"{'+'.join(t.name for t in tables)}: {count:,} runs, more than {MAX_RUNS:,}; "
                         "check the grid (--set grid....), or pass --yes to take them all")


def plan_work(tables: list[Table]) -> tuple[list[Run], list[Run]]:
    """Every job's run, unpriced: each run folder once, each data cache charged to the first run that builds
    it; and every table's runs as asked (a shared pre-training as often as asked)."""
    jobs = [(one, sweep, job) for one in tables for sweep in one.sweeps.values() for job in sweep.jobs()]
    planned: dict[str, Run] = {}
    asked, cache, rates = [], {}, cpu_rates()
    with composing():
        for one, sweep, (swept, folder) in counted(jobs, "planning: runs composed", every_s=10):
            facts = {**{k: one.spec.get(k) for k in FACTS}, "rates": rates}
            run = plan_job(sweep, swept, folder, facts, cache)
            asked.append(run)
            planned.setdefault(run.folder, run)
    built: set[str] = set()
    unique = []
    for run in planned.values():  # a copy: ``asked`` keeps each run without its data caches
        fresh = [cost for key, cost in run.data.items() if key not in built]
        built.update(run.data)
        unique.append(replace(run, prep_hours=sum(h for h, _ in fresh),
                              disk_gb=run.disk_gb + sum(b for _, b in fresh) / 1e9))
    return unique, asked


def wall_time(runs: list[dict], gpus: int) -> dict:
    """The plan's ``runs`` on ``gpus`` GPUs as the table runner hands them out: a run starts once the
    pre-training it starts from ended and its GPUs (or its share of one) are free, the ready run with the
    longest chain of work behind it first, a smaller one filling a gap meanwhile. A run of more GPUs than
    there are takes them all, its GPU-hours spread over them (accumulation keeps its global batch)."""
    need = {r["folder"]: min(r["gpus"], gpus) for r in runs}
    hours = {r["folder"]: r["gpu_hours"] / need[r["folder"]] for r in runs}
    waits_on: dict[str | None, list[str]] = {}
    for r in runs:
        waits_on.setdefault(r["after"] if r["after"] in hours else None, []).append(r["folder"])

    @functools.cache
    def chain(folder: str) -> float:
        return hours[folder] + max(map(chain, waits_on.get(folder, [])), default=0.0)

    ready, smallest = sorted(waits_on.get(None, []), key=lambda f: -chain(f)), min(need.values(), default=0)
    free, now, running = float(gpus), 0.0, []
    while ready or running:
        for folder in list(ready):
            if free < smallest - 1e-9:
                break
            if need[folder] <= free + 1e-9:  # shares of a GPU add up in floats
                ready.remove(folder)
                free -= need[folder]
                heapq.heappush(running, (now + hours[folder], folder))
        now, folder = heapq.heappop(running)
        free += need[folder]
        for after in waits_on.get(folder, []):
            bisect.insort(ready, after, key=lambda f: -chain(f))
    busy = sum(r["gpu_hours"] for r in runs)
    return {"gpus": gpus, "wall_hours": now, "critical_path_hours": max(map(chain, hours), default=0.0),
            "busy": busy / (gpus * now) if now else 0.0}


def make_plan(table: Table | list[Table], accelerator: str = "h100", gpus: int | None = None,
              share: float = 1.0) -> dict:
    """One table's plan, or several tables' together: a run folder two tables share (the pre-training store)
    is counted once, and ``shared`` says what that saved. ``gpus``: the wall time on that many (wall_time);
    ``share``: the part of a GPU each fine-tuning holds (row)."""
    from bert_repro.benchmarks import gpu_check  # torch: not for `collect`, whose CLI imports this module

    tables = table if isinstance(table, list) else [table]
    spec = tables[0].spec
    try:
        measured = gpu_check.best_mfu(REPO / gpu_check.OUT_DIR, CONF_DIR)
    except ValueError as err:
        raise TableError(str(err)) from None
    mfu = {"measured": measured, "lstm": float(spec["lstm_mfu"]),
           "assumed": {int(k): float(v) for k, v in spec["assumed_mfu"].items()}}
    unique, asked = plan_work(tables)
    rows = {acc: [row(run, acc, mfu, share) for run in unique] for acc in ACCELERATORS}
    totals = {acc: {k: sum(r[k] for r in runs) for k in ("gpu_hours", "compute_hours", "comm_hours",
                                                          "eval_hours")} for acc, runs in rows.items()}
    runs, total = rows[accelerator], totals[accelerator]["gpu_hours"]
    saved = sum(row(run, accelerator, mfu, share)["gpu_hours"] for run in asked) - total
    return {"table": "+".join(t.name for t in tables), "tables": [t.name for t in tables],
            "scale": tables[0].scale, "accelerator": accelerator,
            "peak_tflops": PEAK_TFLOPS[ACCELERATORS[accelerator][0]],
            "mfu": {f"H{h}/T{t}": mfu_for(h, t, mfu["measured"], mfu["assumed"])
                    for h, t in sorted({(r.hidden, r.seq_length) for r in unique})},
            "runs": runs, "totals": totals, "total_gpu_hours": total,
            "shared": {"runs_asked": len(asked), "runs_unique": len(unique), "gpu_hours_saved": saved},
            "total_flops": sum(r["flops"] for r in runs), "total_disk_gb": sum(r["disk_gb"] for r in runs),
            "total_prep_hours": sum(r["prep_hours"] for r in runs), "finetune_share": share,
            "wall": wall_time(runs, gpus) if gpus else None}


def print_plan(plan: dict) -> None:
    print(f"{plan['table']} at scale={plan['scale']}: {len(plan['runs'])} runs on {plan['accelerator']} "
          f"({plan['peak_tflops']:.0f} TFLOP/s bf16 peak); MFU by width and length: "
          + ", ".join(f"{k} {v[0]:.0%} ({v[1]})" for k, v in plan["mfu"].items()))
    line = "{:58} {:8} {:>2} {:>9} {:>4} {:>3} {:>10} {:>9} {:>8} {:>7} {:>6} {:>8} {:>8}".format
    print(line("run", "kind", "ph", "steps", "len", "dev", "link", "FLOPs", "compute", "comm", "eval",
               "GPU-h", "disk GB"))
    for r in plan["runs"]:
        hours = (f"{r[k]:.2f}" for k in ("compute_hours", "comm_hours", "eval_hours", "gpu_hours", "disk_gb"))
        print(line(r["name"][-58:], r["kind"], r["phase"] or "", f"{r['steps']:,}", r["seq_length"],
                   r["devices"], r["interconnect"], f"{r['flops']:.2e}", *hours))
    for acc, t in plan["totals"].items():
        print(f"total on {acc}: {t['gpu_hours']:,.1f} GPU-hours (compute {t['compute_hours']:,.1f}, comm "
              f"{t['comm_hours']:,.1f}, eval {t['eval_hours']:,.1f})")
    shared = plan["shared"]
    print(f"total: {plan['total_flops']:.3e} FLOPs, {plan['total_disk_gb']:,.1f} GB of data caches and "
          f"checkpoints, {plan['total_prep_hours']:,.1f} CPU-core-hours of data preparation")
    if plan["finetune_share"] != 1:
        print(f"fine-tunings on {plan['finetune_share']:g} of a GPU each: as fast as alone, charged that")
    if wall := plan["wall"]:
        print(f"wall time on {wall['gpus']} {plan['accelerator']}: {wall['wall_hours']:,.2f} hours (critical "
              f"path {wall['critical_path_hours']:,.2f} hours; GPUs busy {wall['busy']:.0%} of it)")
    if shared["runs_asked"] > shared["runs_unique"]:
        print(f"sharing: {shared['runs_asked']} runs asked for, {shared['runs_unique']} unique; the shared "
              f"pre-training store saves {shared['gpu_hours_saved']:,.1f} GPU-hours on {plan['accelerator']}")


def write_plan(plan: dict, runs_dir: Path) -> Path:
    """plan.json; several tables' at <runs>/tables/<scale>."""
    path = runs_dir / ("tables" if len(plan["tables"]) > 1 else plan["table"]) / plan["scale"] / "plan.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = ("runs", "total_gpu_hours", "accelerator", "totals", "shared", "tables", "finetune_share", "wall")
    path.write_text(json.dumps({k: plan[k] for k in keys}, indent=2) + "\n")
    return path
