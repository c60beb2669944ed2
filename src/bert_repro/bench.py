"""Training-step throughput of our pre-training step against transformers', side by side in one process.

    python -m bert_repro.bench                        # MLM + NSP at small and base, seq 128, batch 8, CPU
    python -m bert_repro.bench --objective no_nsp --objective ltr --model small
    python -m bert_repro.bench --model base --steps 20 --foreach

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
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from bert_repro.convert import hf_config
from bert_repro.model import BertConfig, BertForPreTraining, count_parameters

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
VOCAB = 30522  # the released uncased vocabulary


OBJECTIVES = ("mlm_nsp", "no_nsp", "ltr")
REFERENCE = {"mlm_nsp": "BertForPreTraining", "no_nsp": "BertForMaskedLM", "ltr": "BertLMHeadModel"}


def model_config(name: str, causal: bool = False) -> BertConfig:
    """conf/model/<name>.yaml with the ablation's ``causal`` interpolation pinned (False: the paper's MLM)."""
    from omegaconf import OmegaConf

    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
        raise SystemExit(f"error: no model config {path}; expected one of {options or 'conf/model/*.yaml'}")
    cfg = OmegaConf.load(path)
    cfg.causal = causal  # replaces ${ablation.causal}, which only resolves inside a composed Hydra config
    return BertConfig(**{**OmegaConf.to_container(cfg, resolve=True), "vocab_size": VOCAB})


def make_batch(config: BertConfig, batch: int, seq: int, masked: int, device: str,
               pairs: bool = True) -> dict[str, torch.Tensor]:
    """Sentence pairs (one segment unless ``pairs``) with a few padded positions at the end of most rows and
    ``masked`` predictions per row; ``next_labels`` are the left-to-right LM's targets (-100 on padding)."""
    g = torch.Generator().manual_seed(0)
    lengths = seq - torch.randint(0, max(1, seq // 16), (batch,), generator=g)  # up to 8 pads at seq 128
    lengths[0] = seq
    real = torch.arange(seq)[None] < lengths[:, None]  # (B, T)
    ids = torch.randint(1000, config.vocab_size, (batch, seq), generator=g) * real
    types = (torch.arange(seq)[None] >= (lengths[:, None] // 2)).long() * real * pairs
    positions = torch.stack([1 + torch.randperm(int(n) - 1, generator=g)[:masked].sort().values for n in lengths])
    targets = ids.gather(1, positions)  # (B, P)
    labels = torch.full_like(ids, -100).scatter(1, positions, targets)  # (B, T): HF's form
    tensors = {"input_ids": ids, "token_type_ids": types, "attention_mask": real.long(), "masked_positions": positions,
               "mlm_targets": targets, "labels": labels, "next_sentence_label": torch.randint(0, 2, (batch,), generator=g),
               "next_labels": ids.masked_fill(~real, -100)}  # HF's causal loss shifts these itself
    return {k: v.to(device) for k, v in tensors.items()}


def our_step(model: BertForPreTraining, b: dict[str, torch.Tensor], objective: str = "mlm_nsp") -> torch.Tensor:
    """The call PretrainModule makes: ([CLS] and) the predicted positions leave the last layer, real ones are scored."""
    if objective == "ltr":  # position t predicts token t + 1 (PretrainModule._predictions)
        B, T = b["input_ids"].shape
        positions, real = torch.arange(T - 1, device=b["input_ids"].device).expand(B, -1), b["attention_mask"][:, 1:].bool()
        targets = b["input_ids"][:, 1:][real]  # (N,)
    else:
        positions = b["masked_positions"]
        real = torch.ones_like(positions, dtype=torch.bool)  # every one of the P slots is a prediction here
        targets = b["mlm_targets"][real]
    out = model(b["input_ids"], b["token_type_ids"], b["attention_mask"], masked_positions=positions,
                prediction_mask=real)
    loss = F.cross_entropy(out.mlm_logits, targets)  # (N, V)
    if objective == "mlm_nsp":
        loss = loss + F.cross_entropy(out.nsp_logits, b["next_sentence_label"])
    return loss


def their_step(model, b: dict[str, torch.Tensor], objective: str = "mlm_nsp") -> torch.Tensor:
    inputs = {"input_ids": b["input_ids"], "token_type_ids": b["token_type_ids"], "attention_mask": b["attention_mask"]}
    if objective == "ltr":
        return model(**inputs, labels=b["next_labels"], use_cache=False).loss
    if objective == "no_nsp":
        return model(**inputs, labels=b["labels"]).loss
    return model(**inputs, labels=b["labels"], next_sentence_label=b["next_sentence_label"]).loss


def timed(step: Callable[[], torch.Tensor], optimizer: torch.optim.Optimizer, device: str) -> float:
    """Seconds for one training step: forward + loss, backward, optimizer step, zero_grad."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    step().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - start


def training_flops_per_token(config: BertConfig, seq: int, masked_fraction: float) -> float:
    """Model FLOPs of one trained token (forward + backward = 3 x forward, 2 FLOPs per multiply-add):

        6 * N + 12 * L * T * H + 6 * H * V * P / T

    N = non-embedding parameters (every weight matrix a token passes through, counted once),
    12 * L * T * H = the attention scores QK^T and the weighted sum AV (2 * 2 * T * H per token and layer,
    times 3), 6 * H * V * P / T = the tied vocabulary projection, run only at the P of T masked positions.
    """
    with torch.device("meta"):
        n = count_parameters(BertForPreTraining(config), non_embedding=True)
    return 6 * n + 12 * config.num_layers * seq * config.hidden_size + 6 * config.hidden_size * config.vocab_size * masked_fraction


def gemm_flops(device: str, n: int = 2048, reps: int = 5) -> float:
    """Measured fp32 matmul FLOP/s: the ceiling a dense-GEMM-bound training step can approach."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a @ b  # warm-up
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2 * n**3 * reps / (time.perf_counter() - start)


def bench(name: str, batch: int, seq: int, masked: int, steps: int, warmup: int, device: str, fused: bool,
          objective: str = "mlm_nsp") -> dict:
    import transformers

    transformers.logging.set_verbosity_error()
    config = model_config(name, causal=objective == "ltr")
    torch.manual_seed(0)
    ours = BertForPreTraining(config, nsp=objective == "mlm_nsp").to(device).train()
    reference = REFERENCE[objective]
    hf_kwargs = {k: v for k, v in hf_config(config, reference).items() if not k.startswith("bert_repro")}
    if objective == "ltr":
        hf_kwargs["is_decoder"] = True  # BertLMHeadModel's causal mask
    theirs = getattr(transformers, reference)(transformers.BertConfig(**hf_kwargs, attn_implementation="sdpa"))
    theirs = theirs.to(device).train()
    # Same AdamW for both: fused, as our training runs it (tasks/base.py), or torch's default with --foreach.
    opt = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.01, "fused": True if fused else None}
    ours_opt, their_opt = torch.optim.AdamW(ours.parameters(), **opt), torch.optim.AdamW(theirs.parameters(), **opt)
    b = make_batch(config, batch, seq, masked, device, pairs=objective == "mlm_nsp")
    runs = {"ours": (lambda: our_step(ours, b, objective), ours_opt),
            "ref": (lambda: their_step(theirs, b, objective), their_opt)}
    for _ in range(warmup):
        for step, optimizer in runs.values():
            timed(step, optimizer, device)
    times = {"ours": [], "ref": []}
    for i in range(steps):
        for side in ("ours", "ref") if i % 2 == 0 else ("ref", "ours"):  # A B, B A: neither always goes first
            times[side].append(timed(*runs[side], device))
    ours_s, ref_s = statistics.median(times["ours"]), statistics.median(times["ref"])
    paired = statistics.median(r / o for o, r in zip(times["ours"], times["ref"]))  # robust to load drifting
    tokens = batch * seq
    predicted = (seq - 1) / seq if objective == "ltr" else masked / seq
    achieved = training_flops_per_token(config, seq, predicted) * tokens / ours_s
    peak = gemm_flops(device)
    return {
        "model": name, "objective": objective, "reference": reference, "seq": seq, "batch": batch,
        "masked_per_seq": seq - 1 if objective == "ltr" else masked, "device": device,
        "threads": torch.get_num_threads(), "fused_adamw": fused, "steps": steps,
        "ours_tokens_per_s": round(tokens / ours_s, 1), "ref_tokens_per_s": round(tokens / ref_s, 1),
        "ratio": round(ref_s / ours_s, 3), "paired_ratio": round(paired, 3), "ours_step_ms": round(1e3 * ours_s, 1), "ref_step_ms": round(1e3 * ref_s, 1),
        "ours_train_tflops": round(achieved / 1e12, 4), "gemm_fp32_tflops": round(peak / 1e12, 4),
        "share_of_gemm": round(achieved / peak, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", help="conf/model/<name>.yaml; repeatable (default: small, base)")
    parser.add_argument("--objective", action="append", choices=OBJECTIVES,
                        help="pre-training objective; repeatable (default: mlm_nsp). " + ", ".join(
                            f"{o}: vs transformers {r}" for o, r in REFERENCE.items()))
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--masked", type=int, default=20, help="predictions per sequence (§3.1: 15%% of 128 ~ 20)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--foreach", dest="fused", action="store_false",
                        help="torch's default (foreach) AdamW for both sides instead of the fused one training uses")
    parser.add_argument("--threads", type=int, help="torch threads for both sides (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for objective in args.objective or ["mlm_nsp"]:
        for name in args.model or ["small", "base"]:
            print(json.dumps(bench(name, args.batch, args.seq, args.masked, args.steps, args.warmup, args.device,
                                   args.fused, objective)), flush=True)


if __name__ == "__main__":
    main()
