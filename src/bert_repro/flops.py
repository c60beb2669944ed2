"""Model FLOPs of a training step and the machine's peak: what model FLOPs utilisation (MFU) divides.

Training FLOPs of one token (forward + backward = 3 x forward, 2 FLOPs per multiply-add):

    6 * N  +  12 * L * T * H  (+ 6 * (H * H + H * V) per predicted token)

N = the encoder's non-embedding parameters (every weight matrix a token passes through), 12 * L * T * H =
the attention scores QK^T and the weighted sum AV over T keys, and the masked-LM head (dense H x H, then the
tied vocabulary projection H x V) only at the positions that are predicted (Kaplan et al. 2020's counting,
as MosaicBERT and the MLPerf BERT reference report MFU).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from bert_repro.model import BertConfig

# Dense peak FLOP/s by accelerator and precision (vendor datasheets), for speed.peak_tflops.
PEAK_TFLOPS = {"h100-sxm/bf16": 989.0, "h200/bf16": 989.0, "a100/bf16": 312.0, "a100/tf32": 156.0}


def encoder_parameters(config: BertConfig) -> int:
    """Non-embedding encoder parameters: per layer QKV + output (4H^2 + 4H), the feed-forward
    (2 H I + I + H, I the inner size) and two LayerNorms (4H)."""
    H, inner = config.hidden_size, config.intermediate_size
    return config.num_layers * (4 * H * H + 4 * H + 2 * H * inner + inner + H + 4 * H)


def training_flops(config: BertConfig, tokens: int, seq_len: int, predictions: int = 0) -> float:
    """Model FLOPs of training on ``tokens`` real tokens in sequences padded to ``seq_len``, with
    ``predictions`` masked-LM (or next-token) predictions among them."""
    H, V = config.hidden_size, config.vocab_size
    per_token = 6 * encoder_parameters(config) + 12 * config.num_layers * seq_len * H
    return float(per_token * tokens + 6 * (H * H + H * V) * predictions)


def matmul_probe(device: str | torch.device = "cpu", n: int = 1024, reps: int = 4,
                 dtype: torch.dtype = torch.float32) -> Callable[[], float]:
    """A function that times ``reps`` square ``n`` x ``n`` matmuls on ``device`` and returns their FLOP/s: the
    ceiling a GEMM-bound training step can approach, where no datasheet peak applies (e.g. a CPU)."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up

    def probe() -> float:
        sync()
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync()
        return 2 * n**3 * reps / (time.perf_counter() - start)

    return probe


def measured_peak_flops(device: str | torch.device = "cpu", n: int = 1024, reps: int = 4,
                        dtype: torch.dtype = torch.float32, trials: int = 3) -> float:
    """The best of ``trials`` matmul probes: a peak, so a trial that a noisy machine slowed does not lower it."""
    probe = matmul_probe(device, n, reps, dtype)
    return max(probe() for _ in range(trials))
