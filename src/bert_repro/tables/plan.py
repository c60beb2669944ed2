"""``ACTION=plan``: every run a table will launch, before anything runs, and what it costs.

Each run is composed by Hydra exactly as src/train.py will compose it (the sweep's overrides plus the job's
swept values), so a misspelled key, a checkpoint the schedule never writes or a fine-tuning length beyond the
positions its checkpoint was trained at fails here, not on the GPU. Training FLOPs are bert_repro.flops'
formula (the one the runs log); GPU-hours divide them by the accelerator's bf16 peak times the MFU that
``python -m bert_repro.bench --device cuda`` measured (a JSON line under experiments/results/gpu/), or an
assumed 30% MFU when no such file exists. Fine-tuning steps come from the train sizes in
conf/table/table_tasks.yaml (``train_sizes``), capped by ``data.max_train_examples``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from hydra import compose
from hydra.errors import HydraException
from omegaconf import OmegaConf

from bert_repro.tables import REPO, TableError
from bert_repro.tables.spec import Sweep, Table, composing

ACCELERATORS = {"h100": "h100-sxm/bf16", "h200": "h200/bf16", "a100": "a100/bf16"}  # flops.PEAK_TFLOPS keys
ASSUMED_MFU = 0.30  # eager PyTorch on BERT-base (conf/scale/budget.yaml); bench --device cuda replaces it
BENCH_DIR = REPO / "experiments" / "results" / "gpu"
# disk: a checkpoint holds fp32 weights and AdamW's two moments (12 bytes a parameter); pre-training instances
# hold ~6 bytes a token (int32 ids, int8 segments and mask) for dupe_factor passes over the corpus
CKPT_BYTES_PER_PARAM, INSTANCE_BYTES_PER_TOKEN = 12, 6
CORPUS_TOKENS = {"hub": 4.3e9}  # §3.4: 3.3B words, ~1.3 WordPiece tokens a word (our estimate)
FIELDS = ("name", "kind", "phase", "steps", "seq_length", "tokens", "flops", "gpu_hours")  # plan.json's runs


@dataclass
class Run:
    name: str
    kind: str  # pretrain | finetune
    phase: int | None
    steps: int
    seq_length: int
    tokens: int
    flops: float
    gpu_hours: float
    disk_gb: float  # printed; plan.json keeps the fields of FIELDS


def peak_and_mfu(accelerator: str) -> tuple[float, float, str]:
    """(peak FLOP/s, MFU, where the MFU comes from) for ``accelerator``."""
    from bert_repro.flops import PEAK_TFLOPS

    if accelerator not in ACCELERATORS or ACCELERATORS[accelerator] not in PEAK_TFLOPS:
        raise TableError(f"unknown ACCELERATOR {accelerator!r}; expected one of {', '.join(ACCELERATORS)}")
    measured = []
    for path in sorted(BENCH_DIR.glob("*.json*")) if BENCH_DIR.is_dir() else []:
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("device") == "cuda" and record.get("ours_mfu"):
                measured.append((record["ours_mfu"], f"measured by bench --device cuda ({path.name})"))
    assumed = (f"assumed {ASSUMED_MFU:.0%} (no bench --device cuda results under "
               f"{BENCH_DIR.relative_to(REPO)})")
    mfu, source = max(measured) if measured else (ASSUMED_MFU, assumed)
    return PEAK_TFLOPS[ACCELERATORS[accelerator]] * 1e12, float(mfu), source


# overrides that change no step count, length or shape and name no config: runs that differ only in them share
# one composition (each ablation is composed, so a misspelled one fails the plan)
COST_FREE = ("seed=", "optim.lr=", "init=", "ckpt_path=", "logger=", "++logger.")


def compose_job(sweep: Sweep, swept: list[str], cache: dict) -> dict:
    """The run's config as src/train.py composes it (hydra.* launcher keys left out), the keys a plan needs
    resolved; a compose error names the run."""
    key = tuple(s for s in sweep.compose_args() + swept if not s.startswith(COST_FREE))
    if key not in cache:
        cache[key] = _compose(sweep, swept)
    return cache[key]


def _compose(sweep: Sweep, swept: list[str]) -> dict:
    try:
        cfg = compose("train", overrides=sweep.compose_args() + swept)
    except HydraException as err:
        raise TableError(f"{sweep.name} {' '.join(swept)}: does not compose ({err})") from None
    keys = ("model", "optim", "data.batch_size", "data.max_seq_length", "data.max_predictions_per_seq",
            "data.max_train_examples", "data.train_examples", "data.dupe_factor", "data.source", "task.name",
            "module.features", "ablation.ltr", "data.vocab_size")
    out = {}
    for key in keys:
        node = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
        out[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    return out


def _model(config: dict):
    from bert_repro.model import BertConfig

    fields = set(BertConfig.__dataclass_fields__)
    return BertConfig(**{k: v for k, v in config.items() if k in fields})


def plan_job(sweep: Sweep, swept: list[str], folder: Path, peak: float, mfu: float, sizes: dict,
             cache: dict) -> Run:
    from bert_repro.flops import encoder_parameters, training_flops

    cfg = compose_job(sweep, swept, cache)
    # pre-training trains a WordPiece of at most data.vocab_size; a fine-tuning's is its checkpoint's
    trained = sweep.stage == "pretrain" and cfg["data.vocab_size"]
    vocab = {"vocab_size": cfg["data.vocab_size"]} if trained else {}
    model, optim = _model({**cfg["model"], **vocab}), cfg["optim"]
    seq, batch = int(cfg["data.max_seq_length"]), int(cfg["data.batch_size"])
    params = encoder_parameters(model) + (model.vocab_size + model.max_position) * model.hidden_size
    if sweep.stage == "pretrain":
        start = int(optim.get("resume_step") or 0)
        steps = int(optim["max_steps"]) - start
        tokens = steps * batch * seq
        # the left-to-right LM predicts every next token (seq - 1 a sequence), the masked LM its masked ones
        per_seq = seq - 1 if cfg["ablation.ltr"] else int(cfg["data.max_predictions_per_seq"])
        flops = training_flops(model, tokens, seq, steps * batch * per_seq)
        every = sweep.schedule.every
        saved = 2 + (len(range(start + every, int(optim["max_steps"]) + 1, every)) if every else 0)
        corpus = CORPUS_TOKENS.get(cfg["data.source"], 0) * int(cfg["data.dupe_factor"] or 1)
        instances = corpus * INSTANCE_BYTES_PER_TOKEN if start == 0 else 0
        disk = saved * params * CKPT_BYTES_PER_PARAM + instances
    else:
        # data.train_examples: how many rows the demonstration tasks (data/pydoc_tasks.py) write
        task, cap = cfg["task.name"], cfg["data.max_train_examples"] or cfg["data.train_examples"]
        if task not in sizes and not cap:
            raise TableError(f"{sweep.name}: no train size for task {task!r} in conf/table/table_tasks.yaml "
                             "train_sizes, and no data.max_train_examples (or data.train_examples)")
        examples = min(sizes.get(task, cap), cap or sizes[task])
        sequences = examples * (4 if task == "swag" else 1)  # SWAG: four [CLS] A [SEP] B_i sequences
        steps = int(optim["max_steps"]) if (optim.get("max_steps") or -1) > 0 else \
            math.ceil(examples / batch) * int(optim["epochs"])
        tokens = steps * min(batch, examples) * seq * (sequences // examples)
        flops = training_flops(model, tokens, seq)  # padded tokens: an upper bound on the real ones
        disk = 2 * params * CKPT_BYTES_PER_PARAM  # best.ckpt and last.ckpt
    phase = sweep.phase if sweep.stage == "pretrain" else None
    return Run(f"{sweep.name}/{folder.name}", sweep.stage, phase, steps, seq, tokens, flops,
               flops / (peak * mfu) / 3600, disk / 1e9)


def check_lengths(sweep: Sweep, run: Run) -> None:
    """A fine-tuning run longer than the positions its checkpoint was trained at is refused."""
    if sweep.stage != "finetune" or sweep.needs is None:
        return
    trained = sweep.needs.schedule.trained_length(sweep.phase)
    if run.seq_length > trained:
        raise TableError(f"{sweep.name}: fine-tunes at data.max_seq_length={run.seq_length} from "
                         f"{sweep.checkpoint}, whose position embeddings were trained up to {trained} tokens "
                         f"only (phase {sweep.phase} of the pre-training schedule); lower the length or "
                         "start from a later checkpoint")


def make_plan(table: Table, accelerator: str = "h100") -> dict:
    peak, mfu, source = peak_and_mfu(accelerator)
    sizes = table.spec.get("train_sizes") or {}
    runs, cache = [], {}
    with composing():
        for sweep in table.sweeps.values():
            for swept, folder in sweep.jobs():
                run = plan_job(sweep, swept, folder, peak, mfu, sizes, cache)
                check_lengths(sweep, run)
                runs.append(run)
    return {"table": table.name, "scale": table.scale, "accelerator": accelerator,
            "peak_tflops": peak / 1e12, "mfu": mfu, "mfu_source": source,
            "runs": [asdict(r) for r in runs],
            "total_gpu_hours": sum(r.gpu_hours for r in runs), "total_flops": sum(r.flops for r in runs),
            "total_disk_gb": sum(r.disk_gb for r in runs)}


def print_plan(plan: dict) -> None:
    print(f"{plan['table']} at scale={plan['scale']}: {len(plan['runs'])} runs on {plan['accelerator']} "
          f"({plan['peak_tflops']:.0f} TFLOP/s bf16 peak, MFU {plan['mfu']:.0%}: {plan['mfu_source']})")
    print(f"{'run':58} {'kind':8} {'ph':>2} {'steps':>9} {'len':>4} {'tokens':>9} {'FLOPs':>9} "
          f"{'GPU-h':>8} {'disk GB':>8}")
    for r in plan["runs"]:
        print(f"{r['name'][-58:]:58} {r['kind']:8} {r['phase'] or '':>2} {r['steps']:>9,} "
              f"{r['seq_length']:>4} {r['tokens']:>9.2e} {r['flops']:>9.2e} {r['gpu_hours']:>8.2f} "
              f"{r['disk_gb']:>8.2f}")
    print(f"total: {plan['total_flops']:.3e} FLOPs = {plan['total_gpu_hours']:,.1f} GPU-hours on "
          f"{plan['accelerator']}, {plan['total_disk_gb']:,.1f} GB of instances and checkpoints")


def write_plan(plan: dict, runs_dir: Path) -> Path:
    """plan.json: ``runs`` (the fields of FIELDS), ``total_gpu_hours`` and ``accelerator``."""
    path = runs_dir / plan["table"] / plan["scale"] / "plan.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"runs": [{k: r[k] for k in FIELDS} for r in plan["runs"]],
              "total_gpu_hours": plan["total_gpu_hours"], "accelerator": plan["accelerator"]}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
