r"""Training-step throughput of our pre-training step against transformers', side by side in one process.

    python -m bert_repro.benchmarks.train_step     # MLM + NSP at small and base, seq 128, batch 8, CPU
    python -m bert_repro.benchmarks.train_step --objective no_nsp --objective ltr --model small
    python -m bert_repro.benchmarks.train_step --model base --steps 20 --foreach
    python -m bert_repro.benchmarks.train_step --device cuda --precision bf16 --peak-tflops 989 --model base \
        --model large --seq 128 --seq 512 --batch 64 --unpad  # the GPU path: MFU vs the H100/H200 bf16 peak
    python -m bert_repro.benchmarks.train_step --device cuda --precision bf16 --model large \
        --seq 128 --seq 512 --max-batch

Both sides do one full step (forward, backward, AdamW step, zero_grad) on the same batch, shapes, threads,
optimizer and dropout (train mode), for each objective of the pre-training ablations (§5.1):

  mlm_nsp  ours: BertForPreTraining, MLM at the 20 masked positions + NSP   ref: BertForPreTraining
  no_nsp   ours: no NSP head, MLM only, one segment                         ref: BertForMaskedLM
  ltr      ours: causal encoder, every next token predicted                 ref: BertLMHeadModel (is_decoder)

Ours gathers the predicted positions before the vocabulary projection, as google-research/bert does, and
makes the calls PretrainModule makes; transformers is given ``labels`` (-100 where nothing is predicted),
the way its users train it. Steps are interleaved (ours, theirs, theirs, ours ...) so machine noise hits both;
medians and the median of the per-pair ratios are reported as one JSON line per model and objective.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from bert_repro.convert import hf_config
from bert_repro.data.batching import PadCollator, draw_lengths
from bert_repro.flops import accelerator_peak_flops, matmul_probe, training_flops
from bert_repro.model import BertConfig, BertForPreTraining
from bert_repro.speed import SpeedOptions, compile_model

CONF_DIR = Path("conf")  # run from the repository root, as src/train.py; --conf elsewhere
VOCAB = 30522  # the released uncased vocabulary


OBJECTIVES = ("mlm_nsp", "no_nsp", "ltr")
REFERENCE = {"mlm_nsp": "BertForPreTraining", "no_nsp": "BertForMaskedLM", "ltr": "BertLMHeadModel"}


def model_config(name: str, causal: bool = False, conf_dir: Path = CONF_DIR) -> BertConfig:
    """conf/model/<name>.yaml with the ablation's ``causal`` interpolation pinned (False: the paper's MLM)."""
    from omegaconf import OmegaConf

    path = conf_dir / "model" / f"{name}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in (conf_dir / "model").glob("*.yaml"))
        raise SystemExit(f"error: no model config {path}; expected one of {options or 'conf/model/*.yaml'}")
    from hydra import compose, initialize_config_dir

    # model files compose on a base
    with initialize_config_dir(config_dir=str(conf_dir.resolve()), version_base="1.3"):
        model = OmegaConf.to_container(compose("train", overrides=[f"model={name}"]).model, resolve=True)
    return BertConfig(**{**model, "causal": causal, "vocab_size": VOCAB})


def make_batch(config: BertConfig, batch: int, seq: int, masked: int, device: str,
               pairs: bool = True, lengths: list[int] | None = None) -> dict[str, torch.Tensor]:
    """Sentence pairs (one segment unless ``pairs``) with a few padded positions at the end of most rows and
    ``masked`` predictions per row; ``next_labels`` are the left-to-right LM's targets (-100 on padding).
    ``lengths``: each row's real tokens instead (a real distribution, --lengths); the batch is then padded
    to its longest as PadCollator pads, and a row predicts the released rule's min(masked, 15 % of its
    tokens)."""
    g = torch.Generator().manual_seed(0)
    if lengths is None:
        lengths = seq - torch.randint(0, max(1, seq // 16), (batch,), generator=g)  # up to 8 pads at seq 128
        lengths[0] = seq
        counts = torch.full((batch,), masked)
    else:
        seq = PadCollator().padded_length(lengths)
        lengths = torch.tensor(lengths)
        counts = (lengths * 0.15).round().long().clamp(1, masked)  # the released num_to_predict
    real = torch.arange(seq)[None] < lengths[:, None]  # (B, T)
    ids = torch.randint(1000, config.vocab_size, (batch, seq), generator=g) * real
    types = (torch.arange(seq)[None] >= (lengths[:, None] // 2)).long() * real * pairs
    predicted = torch.arange(masked)[None] < counts[:, None]  # (B, P): the slots that hold a prediction
    positions = torch.stack([F.pad(1 + torch.randperm(n - 1, generator=g)[:k].sort().values, (0, masked - k))
                             for n, k in zip(lengths.tolist(), counts.tolist())])  # empty slots: [CLS]
    targets = ids.gather(1, positions)  # (B, P)
    labels = torch.full_like(ids, -100).scatter(1, positions, targets.masked_fill(~predicted, -100))  # HF's
    tensors = {"input_ids": ids, "token_type_ids": types, "attention_mask": real.long(),
               "masked_positions": positions, "predicted": predicted, "mlm_targets": targets,
               "labels": labels,
               "next_sentence_label": torch.randint(0, 2, (batch,), generator=g),
               "next_labels": ids.masked_fill(~real, -100)}  # HF's causal loss shifts these itself
    return {k: v.to(device) for k, v in tensors.items()}


def our_step(model: BertForPreTraining, b: dict[str, torch.Tensor],
             objective: str = "mlm_nsp") -> torch.Tensor:
    """The call PretrainModule makes: ([CLS] and) the predicted positions leave the last layer, real ones are
    scored."""
    if objective == "ltr":  # position t predicts token t + 1 (PretrainModule._predictions)
        B, T = b["input_ids"].shape
        positions, real = (torch.arange(T - 1, device=b["input_ids"].device).expand(B, -1),
                           b["attention_mask"][:, 1:].bool())
        targets = b["input_ids"][:, 1:][real]  # (N,)
    else:
        positions, real = b["masked_positions"], b["predicted"]
        targets = b["mlm_targets"][real]
    out = model(b["input_ids"], b["token_type_ids"], b["attention_mask"], masked_positions=positions,
                prediction_mask=real)
    loss = F.cross_entropy(out.mlm_logits, targets)  # (N, V)
    if objective == "mlm_nsp":
        loss = loss + F.cross_entropy(out.nsp_logits, b["next_sentence_label"])
    return loss


def their_step(model, b: dict[str, torch.Tensor], objective: str = "mlm_nsp") -> torch.Tensor:
    inputs = {"input_ids": b["input_ids"], "token_type_ids": b["token_type_ids"],
              "attention_mask": b["attention_mask"]}
    if objective == "ltr":
        return model(**inputs, labels=b["next_labels"], use_cache=False).loss
    if objective == "no_nsp":
        return model(**inputs, labels=b["labels"]).loss
    return model(**inputs, labels=b["labels"], next_sentence_label=b["next_sentence_label"]).loss


def timed(step: Callable[[], torch.Tensor], optimizer: torch.optim.Optimizer, device: str,
          precision: str = "fp32") -> float:
    """Seconds for one training step: forward + loss (under bf16 autocast with ``precision="bf16"``, as
    Lightning's bf16-mixed runs it), backward, optimizer step, zero_grad."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = step()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - start


def profile(step: Callable[[], torch.Tensor], optimizer: torch.optim.Optimizer, device: str, precision: str,
            steps: int = 3, top: int = 15) -> dict:
    """torch.profiler over ``steps`` training steps: per step, the ATen operators the host dispatches (all,
    and those called from Python rather than from another operator), the kernels launched and the device
    time; and the ``top`` operators or kernels by device time (on CPU, by CPU time)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profiler(activities=activities) as prof:
        for _ in range(steps):
            timed(step, optimizer, device, precision)
    events = prof.events()
    aten = [e for e in events if e.name.startswith("aten::")]
    outer = [e for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    key = "device_time_total" if cuda else "cpu_time_total"
    table = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    return {
        "profile_steps": steps,
        "aten_ops_per_step": round(len(aten) / steps), "outer_aten_ops_per_step": round(len(outer) / steps),
        "kernels_per_step": round(len(kernels) / steps),
        "device_ms_per_step": round(sum(e.device_time for e in kernels) / 1e3 / steps, 2),
        "top": [{"name": e.key[:80], "ms_per_step": round(getattr(e, key) / 1e3 / steps, 3),
                 "calls_per_step": round(e.count / steps, 1)} for e in table[:top]],
    }


def default_predictions(seq: int) -> int:
    """The released recipe's max_predictions_per_seq: 20 at 128 tokens, 80 at 512 (v2 A.2)."""
    return max(1, round(seq * 20 / 128))


def peak_probe(device: str, precision: str) -> Callable[[], float]:
    """The MFU denominator where no datasheet peak is given: a square matmul of the run's dtype, timed between
    the steps (so machine noise hits it as it hits them) and taken at its best."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return matmul_probe(device, n=8192 if device.startswith("cuda") else 2048, reps=5, dtype=dtype)


def real_lengths(source: str, seq: int, batch: int, overrides: list[str]) -> list[int]:
    """``batch`` row lengths drawn from the train examples of task ``source`` (``pretrain``: its instances),
    as the run's own data path makes them at ``seq`` tokens (benchmarks/lengths.py; ``overrides`` choose the
    data, e.g. data.corpus=wikitext:<file>)."""
    import numpy as np

    from bert_repro.benchmarks.lengths import measure_lengths

    quantiles = measure_lengths(source, seq, overrides)
    return np.maximum(draw_lengths(quantiles, batch, seq), 3).astype(int).tolist()  # [CLS] a [SEP] at least


def first_loss(step: Callable[[], torch.Tensor], model: torch.nn.Module, device: str,
               precision: str) -> float:
    """The loss before any update, without dropout: equal for padded and unpadded runs of the same weights."""
    model.eval()
    bf16 = precision == "bf16"
    with torch.no_grad(), torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
        loss = float(step())
    model.train()
    return loss


def build_ours(config: BertConfig, objective: str, device: str, unpad: bool = False,
               checkpointing: bool = False, compile: bool = False, readable: bool = False,
               attention: str = "auto") -> BertForPreTraining:
    """Our model as a training run builds it: the speed path (fast kernels on) unless ``readable``."""
    speed = SpeedOptions(fast_kernels=not readable, unpad=unpad, activation_checkpointing=checkpointing,
                         attention=attention)
    model = BertForPreTraining(config, nsp=objective == "mlm_nsp", speed=speed).to(device).train()
    if compile:
        compile_model(model, torch.device(device).type)
    return model


def bench(name: str, batch: int, seq: int, masked: int | None, steps: int, warmup: int, device: str,
          fused: bool, objective: str = "mlm_nsp", precision: str = "fp32", peak_tflops: float | None = None,
          unpad: bool = False, checkpointing: bool = False, compile: bool = False, readable: bool = False,
          attention: str = "auto", conf_dir: Path = CONF_DIR, lengths: list[int] | None = None,
          lengths_from: str = "synthetic", profile_steps: int = 0) -> dict:
    import transformers

    transformers.logging.set_verbosity_error()
    masked = masked or default_predictions(seq)
    config = model_config(name, causal=objective == "ltr", conf_dir=conf_dir)
    torch.manual_seed(0)
    ours = build_ours(config, objective, device, unpad, checkpointing, compile, readable, attention)
    reference = REFERENCE[objective]
    hf_kwargs = {k: v for k, v in hf_config(config, reference).items() if not k.startswith("bert_repro")}
    if objective == "ltr":
        hf_kwargs["is_decoder"] = True  # BertLMHeadModel's causal mask
    theirs = getattr(transformers, reference)(
        transformers.BertConfig(**hf_kwargs, attn_implementation="sdpa"))
    theirs = theirs.to(device).train()
    # Same AdamW for both: fused, as our training runs it (tasks/base.py), or torch's default with --foreach.
    opt = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.01,
           "fused": True if fused else None}
    ours_opt, their_opt = torch.optim.AdamW(ours.parameters(), **opt), torch.optim.AdamW(theirs.parameters(),
                                                                                         **opt)
    b = make_batch(config, batch, seq, masked, device, pairs=objective == "mlm_nsp", lengths=lengths)
    seq = b["input_ids"].shape[1]  # with ``lengths``: the batch's longest
    runs = {"ours": (lambda: our_step(ours, b, objective), ours_opt),
            "ref": (lambda: their_step(theirs, b, objective), their_opt)}
    losses = {side: first_loss(step, model, device, precision)
              for (side, (step, _)), model in zip(runs.items(), (ours, theirs))}
    for _ in range(warmup):
        for step, optimizer in runs.values():
            timed(step, optimizer, device, precision)
    probe = peak_probe(device, precision)
    times, probes = {"ours": [], "ref": []}, []
    for i in range(steps):
        for side in ("ours", "ref") if i % 2 == 0 else ("ref", "ours"):  # A B, B A: neither always goes first
            times[side].append(timed(*runs[side], device, precision))
        probes.append(probe())
    ours_s, ref_s = statistics.median(times["ours"]), statistics.median(times["ref"])
    profiled = profile(*runs["ours"], device, precision, profile_steps) if profile_steps else {}
    paired = statistics.median(r / o for o, r in zip(times["ours"], times["ref"]))  # robust to load drifting
    tokens = batch * seq
    real = int(b["attention_mask"].sum())
    predictions = int(b["attention_mask"][:, 1:].sum()) if objective == "ltr" else int(b["predicted"].sum())
    model_flops = training_flops(config, real, seq, predictions)  # the same work for both sides
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    # an accelerator's MFU is against its datasheet's dense peak, as the plan's (flops.PEAK_TFLOPS)
    peak, peak_source = ((peak_tflops * 1e12, "given") if peak_tflops else
                         accelerator_peak_flops(torch.device(device), dtype) if device.startswith("cuda") else
                         (None, ""))
    if not peak:
        peak, peak_source = (max(probes),
                             f"measured {'bf16' if precision == 'bf16' else 'fp32'} matmul, best of {steps}")
    return {
        "model": name, "objective": objective, "reference": reference, "seq": seq, "batch": batch,
        "masked_per_seq": seq - 1 if objective == "ltr" else masked, "device": device, "precision": precision,
        "threads": torch.get_num_threads(), "fused_adamw": fused, "unpad": unpad,
        "checkpointing": checkpointing,
        "compile": compile, "readable": readable, "attention": attention, "steps": steps,
        "lengths": lengths_from, "real_tokens": real,
        "ours_tokens_per_s": round(tokens / ours_s, 1), "ref_tokens_per_s": round(tokens / ref_s, 1),
        "ours_loss": round(losses["ours"], 5), "ref_loss": round(losses["ref"], 5),
        "ratio": round(ref_s / ours_s, 3), "paired_ratio": round(paired, 3),
        "ours_step_ms": round(1e3 * ours_s, 1), "ref_step_ms": round(1e3 * ref_s, 1),
        "ours_train_tflops": round(model_flops / ours_s / 1e12, 4),
        "ref_train_tflops": round(model_flops / ref_s / 1e12, 4),
        "peak_tflops": round(peak / 1e12, 4), "peak_source": peak_source,
        "matmul_tflops": round(max(probes) / 1e12, 4),
        "ours_mfu": round(model_flops / ours_s / peak, 3), "ref_mfu": round(model_flops / ref_s / peak, 3),
        **profiled,
    }


def step_flops_per_s(name: str, batch: int, seq: int, steps: int = 5, conf_dir: Path = CONF_DIR) -> float:
    """Model FLOP/s of our MLM + NSP training step in fp32 on the CPU, at torch's threads now: the median of
    ``steps`` after one warm-up step (its allocations)."""
    config = model_config(name, conf_dir=conf_dir)
    masked = default_predictions(seq)
    b = make_batch(config, batch, seq, masked, "cpu")
    model = build_ours(config, "mlm_nsp", "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    seconds = [timed(lambda: our_step(model, b), optimizer, "cpu") for _ in range(steps + 1)]
    flops = training_flops(config, int(b["attention_mask"].sum()), seq, batch * masked)
    return flops / statistics.median(seconds[1:])


def cpu_speed(conf_dir: Path = CONF_DIR) -> dict:
    """``step_flops_per_s`` of BERT-tiny (a rehearsal's model, tables/rehearse.py) at the threads the runs
    get (OMP_NUM_THREADS), with its probe's threads and shape."""
    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or threads))
    try:
        return {"flops_per_s": step_flops_per_s("tiny", 8, 128, conf_dir=conf_dir),
                "threads": torch.get_num_threads(), "probe": "BERT-tiny, batch 8 x 128"}
    finally:
        torch.set_num_threads(threads)


def largest_batch(name: str, seq: int, device: str, precision: str, checkpointing: bool, limit: int = 4096,
                  conf_dir: Path = CONF_DIR) -> int:
    """The largest per-device batch whose training step fits in the accelerator's memory (doubling, then
    bisection on out-of-memory), for activation checkpointing's trade."""
    if not device.startswith("cuda"):
        raise SystemExit("error: --max-batch probes accelerator memory; it needs --device cuda")
    config = model_config(name, conf_dir=conf_dir)

    def step(batch: int) -> None:
        model = build_ours(config, "mlm_nsp", device, checkpointing=checkpointing)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        b = make_batch(config, batch, seq, default_predictions(seq), device)
        timed(lambda: our_step(model, b), optimizer, device, precision)

    def fits(batch: int) -> bool:
        try:
            step(batch)  # model, optimizer and activations are freed when it returns or raises
            return True
        except torch.OutOfMemoryError:
            return False
        finally:
            torch.cuda.empty_cache()

    low, high = 0, 8
    while high <= limit and fits(high):
        low, high = high, high * 2
    while high - low > 1:  # low fits, high does not
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.benchmarks.train_step",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append",
                        help="conf/model/<name>.yaml; repeatable (default: small, base)")
    parser.add_argument("--objective", action="append", choices=OBJECTIVES,
                        help="pre-training objective; repeatable (default: mlm_nsp). " + ", ".join(
                            f"{o}: vs transformers {r}" for o, r in REFERENCE.items()))
    parser.add_argument("--seq", type=int, action="append", help="sequence length; repeatable (default: 128)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, help="tokens a batch instead of --batch: tokens // seq rows")
    parser.add_argument("--lengths", metavar="TASK",
                        help="row lengths drawn from TASK's train examples (pretrain: its instances) as the "
                             "run's data path makes them (default: full rows, a few pads)")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override for --lengths' data, e.g. data.corpus=wikitext:<file>; "
                             "repeatable")
    parser.add_argument("--compare-unpad", action="store_true",
                        help="each configuration padded, then unpadded (--unpad), on the same batch")
    parser.add_argument("--masked", type=int, help="predictions per sequence (default: 20 at 128, 80 at 512)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: autocast on both sides, as trainer/gpu.yaml's bf16-mixed")
    parser.add_argument("--peak-tflops", type=float,
                        help="MFU denominator, e.g. 989 (H100/H200 bf16) (default: a measured matmul)")
    parser.add_argument("--unpad", action="store_true", help="ours: projections and MLP on real tokens only")
    parser.add_argument("--checkpointing", action="store_true", help="ours: activation checkpointing")
    parser.add_argument("--compile", action="store_true", help="ours: torch.compile")
    parser.add_argument("--readable", action="store_true",
                        help="ours: model.py's readable path, no fast kernels")
    parser.add_argument("--attention", default="auto",
                        help="ours with --unpad: auto | flash | nested | padded")
    parser.add_argument("--conf", type=Path, default=CONF_DIR, help="the conf/ folder (default: ./conf)")
    parser.add_argument("--max-batch", action="store_true",
                        help="instead of timing: the largest per-device batch that fits, with and without "
                             "checkpointing")
    parser.add_argument("--foreach", dest="fused", action="store_false",
                        help="torch's default (foreach) AdamW for both sides instead of the fused one "
                             "training uses")
    parser.add_argument("--threads", type=int, help="torch threads for both sides (default: torch's choice)")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="after timing, profile STEPS of ours: operators and kernels a step, top ones")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for seq in args.seq or [128]:
        batch = args.tokens // seq if args.tokens else args.batch
        lengths = real_lengths(args.lengths, seq, batch, args.data) if args.lengths else None
        for name in args.model or ["small", "base"]:
            if args.max_batch:
                for checkpointing in (False, True):
                    print(json.dumps({"model": name, "seq": seq, "precision": args.precision,
                                      "checkpointing": checkpointing,
                                      "largest_batch": largest_batch(name, seq, args.device, args.precision,
                                                                     checkpointing, conf_dir=args.conf)}),
                          flush=True)
                continue
            for objective, unpad in itertools.product(args.objective or ["mlm_nsp"],
                                                      (False, True) if args.compare_unpad else (args.unpad,)):
                print(json.dumps(bench(name, batch, seq, args.masked, args.steps, args.warmup,
                                       args.device, args.fused, objective, args.precision, args.peak_tflops,
                                       unpad, args.checkpointing, args.compile, args.readable,
                                       args.attention, args.conf, lengths, args.lengths or "synthetic",
                                       args.profile)),
                      flush=True)


if __name__ == "__main__":
    main()
