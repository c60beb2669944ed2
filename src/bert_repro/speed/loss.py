"""The MLM head's decoder and its cross-entropy fused, a chunk of predictions at a time: the (N, V) logits
never exist whole, and the gradients (softmax minus one-hot) are made in the forward pass while each chunk is
in cache. Equal to ``F.cross_entropy(F.linear(h, W, b), targets)`` and its argmax
(tests/test_speed_options.py). It pays where N is large: the left-to-right LM predicts every token
(N = B x (T - 1)), whose log-softmax, its backward and the accuracy's argmax over (N, V) took a fifth of a CPU
step (docs/benchmarks.md). A chunk's logits are read once for their max and argmax together, shifted and
exponentiated in place, and scaled into the gradient: five passes over (c, V), where logsumexp, argmax and the
softmax took nine. Under autocast the matmuls take its dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from bert_repro.speed.kernels import eager_cpu

CHUNK_ELEMENTS = 1 << 19  # logits a chunk holds: 2 MB in fp32, a core's share of L3 beside a second run


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor, targets: Tensor,
                dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        rows = max(1, CHUNK_ELEMENTS // weight.shape[0])
        # The matmuls in ``dtype`` (autocast's: bf16 under bf16-mixed, as F.linear runs them), the softmax
        # and every accumulation in fp32, as the logits path's .float() before its loss.
        hidden_m, weight_m, bias_m = hidden.to(dtype), weight.to(dtype), bias.to(dtype)
        same = dtype == hidden.dtype
        grad_hidden = torch.empty_like(hidden)
        grad_weight, grad_bias = torch.zeros_like(weight), torch.zeros_like(bias)
        loss = hidden.new_zeros(())
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        for start in range(0, n, rows):
            h, t = hidden_m[start:start + rows], targets[start:start + rows]
            logits = torch.addmm(bias_m, h, weight_m.t()).float()  # (c, V); no copy in fp32
            top, best = logits.max(-1)  # one pass: the shift that keeps exp finite, and the prediction
            correct += (best == t).sum()
            target = logits.gather(1, t[:, None]).squeeze(1)
            grad = logits.sub_(top[:, None]).exp_()  # exp(logit - max), in place of the logits
            total = grad.sum(-1)
            loss += (total.log() + top - target).sum()  # logsumexp - target logit
            grad.mul_((total * n).reciprocal_()[:, None])  # the softmax, over the n predictions' mean
            grad[torch.arange(len(t), device=t.device), t] -= 1.0 / n  # d loss / d logits: softmax - one-hot
            grad_bias += grad.sum(0)
            if same:  # fp32: straight into the gradients
                torch.mm(grad, weight_m, out=grad_hidden[start:start + rows])
                grad_weight.addmm_(grad.t(), h)
            else:
                grad = grad.to(dtype)
                grad_hidden[start:start + rows] = torch.mm(grad, weight_m)
                grad_weight += torch.mm(grad.t(), h)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.mark_non_differentiable(correct)
        return loss / n, correct

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_correct: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        return grad_hidden * grad_loss, grad_weight * grad_loss, grad_bias * grad_loss, None, None


def linear_cross_entropy(hidden: Tensor, weight: Tensor, bias: Tensor,
                         targets: Tensor) -> tuple[Tensor, Tensor]:
    """(mean cross-entropy of ``hidden @ weight.T + bias`` (N, V) against ``targets`` (N,), how many of
    their argmaxes hit): ``hidden`` (N, H), ``weight`` (V, H) the tied word embeddings. Under autocast the
    matmuls take its dtype and the rest stays fp32."""
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    with torch.autocast(device, enabled=False):  # the dtypes are set above, not per op
        return _LinearCrossEntropy.apply(hidden.float(), weight, bias, targets, dtype)


def fusable(hidden: Tensor) -> bool:
    """An eager training step on the CPU, under autocast or not. Evaluation keeps the readable path, and so
    do GPUs (chunks sized for a CPU's cache would be a few rows of a 30,522-token vocabulary, a kernel launch
    each) and compiled steps (Inductor fuses the logits path)."""
    return torch.is_grad_enabled() and eager_cpu(hidden)


def decode(hidden: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``F.linear(hidden, weight, bias)`` (..., V), the tied decoder, as W h^T + b transposed back for up to
    H predicted positions: the tied weight's gradient is then a fresh (V, H) product that autograd accumulates
    the embedding's gradient into in place (F.linear's is a transposed view, costing an out-of-place (V, H)
    sum per step). The logits come out transposed, which costs the softmax a copy and the accuracy's argmax
    a strided pass over (N, V): with more positions than H (a left-to-right LM predicts every one) F.linear
    is the faster of the two."""
    flat = hidden.reshape(-1, hidden.shape[-1])  # (N, H)
    # compiled: Inductor picks the matmul's layout, and the count of predictions may be known only at run time
    if torch.compiler.is_compiling() or flat.shape[0] > flat.shape[1]:
        return F.linear(hidden, weight, bias)  # (..., V)
    logits = torch.addmm(bias[:, None], weight, flat.t()).t()  # (N, V)
    return logits.reshape(*hidden.shape[:-1], logits.shape[-1])  # (..., V)
