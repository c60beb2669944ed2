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
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and Lightning load only where a device is read: a plan (tables.plan) counts FLOPs
    import torch
    from torch import Tensor

    from bert_repro.model import BertConfig


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


def bilstm_flops(tokens: float, layers: list[tuple[int, int]]) -> float:
    """Training FLOPs of a bidirectional LSTM over ``tokens``, ``layers`` its (input, hidden) widths: a
    direction, a layer, a token: 4 gates of (input + hidden) x hidden multiply-adds, forward and backward."""
    return 6.0 * tokens * 2 * 4 * sum(h * (i + h) for i, h in layers)


def head_flops(config: BertConfig, module, tokens: float) -> float:
    """Training FLOPs over ``tokens`` of the BiLSTM a fine-tuning head adds (heads.bilstm_widths) as the run's
    ``module`` node chooses it (Table 5's ``bilstm``, Table 7's ``features``); 0 for the others."""
    from bert_repro.heads import bilstm_widths  # torch: only where a head is priced

    return bilstm_flops(tokens, bilstm_widths(config, bool(module.get("bilstm")), module.get("features")))


def batch_counts(batch: dict, ltr: bool = False) -> tuple[Tensor, Tensor]:
    """A training batch's real tokens and the masked-LM predictions it makes (``masked_lm_weights`` > 0, or
    every next real token for the left-to-right LM; fine-tuning batches predict none), as int64 tensors on the
    batch's device: reading them is a host sync, which a step on a GPU should not wait for."""
    mask = batch["attention_mask"]
    if ltr:
        predictions = mask[:, 1:].sum()
    else:
        weights = batch.get("masked_lm_weights")
        predictions = (weights > 0).sum() if weights is not None else mask.new_zeros(())
    return mask.sum().long(), predictions.long()


# Dense bf16/tf32 peaks from the vendors' datasheets, for plans that name an accelerator before any device is
# present (tables.plan); a run reads its device's peak from Lightning's table (accelerator_peak_flops).
PEAK_TFLOPS = {"h100-sxm/bf16": 989.0, "h200/bf16": 989.0, "a100/bf16": 312.0, "a100/tf32": 156.0}


def accelerator_peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """The accelerator's dense peak FLOP/s at ``dtype`` from Lightning's table of known devices
    (``get_available_flops``), and where it came from. Lightning's H200 rows quote the datasheet's
    with-sparsity tensor-core figures (SXM bf16: 2000 TFLOP/s for a dense 989) and it does not parse the
    plain name "NVIDIA H200": an H200 SXM is read as the H100 SXM row (the same GH100 tensor cores and
    clocks), an H200 NVL as half its sparse row."""
    import torch
    from lightning.fabric.utilities.throughput import _CUDA_FLOPS, get_available_flops

    name = torch.cuda.get_device_name(device)
    if "h200" not in name.lower():
        peak = get_available_flops(device, dtype)
        return (float(peak) if peak else None), f"lightning table: {name} ({dtype})"
    if dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest":
        dtype = "tfloat32"
    nvl = "nvl" in name.lower()
    peak = _CUDA_FLOPS["h200 nvl1" if nvl else "h100 sxm"].get(dtype)
    if peak and nvl and dtype not in (torch.float32, torch.float64):
        peak /= 2  # the sparse tensor-core figure
    row = "h200 nvl1 row, dense" if nvl else "h100 sxm row"
    return (float(peak) if peak else None), f"lightning table: {row} for {name} ({dtype})"


def matmul_probe(device: str | torch.device = "cpu", n: int = 1024, reps: int = 4,
                 dtype: torch.dtype | None = None) -> Callable[[], float]:
    """A function that times ``reps`` square ``n`` x ``n`` matmuls on ``device`` and returns their FLOP/s: the
    ceiling a GEMM-bound training step can approach, where no datasheet peak applies (e.g. a CPU). ``dtype``:
    float32 by default."""
    import torch

    device, dtype = torch.device(device), dtype or torch.float32
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
