"""Kernels that compute what model.py computes, faster: CPU dropout masks, CPU attention with dropout,
and attention over packed variable-length sequences (torch's varlen flash attention, nested-jagged SDPA, or a
padded reference).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from bert_repro.config import ATTENTION_BACKENDS


def eager_cpu(x: Tensor) -> bool:
    """An eager step on the CPU: where the CPU kernels here run, and where a tensor's values may be read on
    the host. A compiled step keeps the native ops, which Inductor fuses, and whose graph the kernels'
    in-place random draws or a read would break; on an accelerator a read is a host sync that stalls the
    launches."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


DROPOUT_LEVELS = 1 << 16  # the resolution of p in dropout_mask: a 16-bit uniform integer per element


def dropout_mask(like: Tensor, p: float) -> Tensor:
    """Dropout's multiplier for a tensor shaped like ``like``: 1 / (1 - p') with probability 1 - p', else 0,
    p' = round(p * 65536) / 65536 (|p' - p| <= 7.6e-6), so the expectation is exactly 1.

    Each element is one 16-bit lane of a uniform 64-bit word: on CPU, where ATen draws serially, cheaper
    per element than ``torch.rand`` or ``bernoulli_`` (docs/benchmarks.md). The mask carries the scale
    in ``like``'s dtype (float32 for half precision, which cannot hold 1/(1-p) exactly), so applying it
    and its backward are one multiplication each."""
    n, drop = like.numel(), min(round(p * DROPOUT_LEVELS), DROPOUT_LEVELS - 1)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=like.device).random_(-(1 << 63), None)
    lanes = words.view(torch.int16)[:n].view(like.shape)  # uniform on [-32768, 32767]
    dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
    scale = torch.tensor(DROPOUT_LEVELS / (DROPOUT_LEVELS - drop), dtype=dtype, device=like.device)
    return torch.where(lanes >= drop - (DROPOUT_LEVELS >> 1), scale, scale.new_zeros(()))


def dropout(x: Tensor, p: float) -> Tensor:
    """Training-mode dropout with ``dropout_mask``, in ``x``'s dtype (rounded once, as the native kernel)."""
    return (x * dropout_mask(x, p)).to(x.dtype)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    cpu_dropout: bool = True,
) -> Tensor:
    """``F.scaled_dot_product_attention``. With dropout on CPU, where SDPA's fused kernels take none and it
    falls back to its math path, the same math runs here with ``dropout``'s cheaper mask.
    ``mask``: boolean, True = may attend."""
    if dropout_p == 0.0 or not eager_cpu(q) or not cpu_dropout:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, heads, T|P, T)
    if is_causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))  # in place: the product's backward needs q and k, not it
    return dropout(scores.softmax(-1), dropout_p) @ v


@dataclass
class Packed:
    """Where the real tokens of a (B, T) batch sit when packed into (N, ...), and the sequences they form:
    ``cu_seqlens`` (S + 1,) their offsets in the packed order, ``max_len`` the longest. A padded batch is one
    sequence per row (``from_mask``); a packed batch holds several per row (``from_sequence_ids``)."""

    shape: tuple[int, int]  # (B, T)
    index: Tensor  # (N,) positions of the real tokens in the flattened batch
    cu_seqlens: Tensor  # (S + 1,) int32
    max_len: int
    slot: Tensor  # (N,) each token's place in an (S, max_len) grid: the padded reference's layout

    @classmethod
    def from_mask(cls, attention_mask: Tensor) -> Packed:
        return cls.from_sequence_ids(attention_mask.long())

    @classmethod
    def from_sequence_ids(cls, sequence_ids: Tensor) -> Packed:
        """``sequence_ids`` (B, T): 0 at padding, 1, 2, ... for the instances of a row (contiguous runs)."""
        flat = sequence_ids.flatten()
        index = flat.nonzero().squeeze(1)  # (N,)
        ids = flat[index]
        row = torch.div(index, sequence_ids.shape[1], rounding_mode="floor")
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[1:] = (ids[1:] != ids[:-1]) | (row[1:] != row[:-1])  # a new instance or a new row
        sequence = starts.cumsum(0) - 1  # (N,) which sequence each token is in
        lengths = torch.bincount(sequence)  # (S,)
        cu_seqlens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
        # off the eager CPU the row length bounds the longest, whose value would be a host sync (eager_cpu)
        max_len = (int(lengths.max()) if lengths.numel() else 0) if eager_cpu(flat) else sequence_ids.shape[1]
        offset = torch.arange(index.numel(), device=index.device) - cu_seqlens[sequence].long()
        return cls(tuple(sequence_ids.shape), index, cu_seqlens, max_len, sequence * max_len + offset)

    @classmethod
    def dense(cls, batch: int, length: int, device: torch.device) -> Packed:
        """A full (B, T) grid, one sequence per row: the sparse last layer's queries (B, P)."""
        index = torch.arange(batch * length, device=device)
        cu_seqlens = torch.arange(0, batch * length + 1, length, device=device, dtype=torch.int32)
        return cls((batch, length), index, cu_seqlens, length, index)

    @property
    def num_sequences(self) -> int:
        return self.cu_seqlens.numel() - 1

    def rows(self, positions: Tensor) -> Tensor:
        """(B, P) positions in the (B, T) batch -> their rows in the packed (N, ...) order. A position at
        padding (a prediction the prediction mask drops) reads row 0."""
        B, T = self.shape
        where = torch.zeros(B * T, dtype=torch.long, device=positions.device)
        where[self.index] = torch.arange(self.index.numel(), device=positions.device)
        return where[positions + T * torch.arange(B, device=positions.device)[:, None]]  # (B, P)

    def unpad(self, x: Tensor) -> Tensor:
        return x.flatten(0, 1).index_select(0, self.index)  # (B, T, ...) -> (N, ...)

    def pad(self, x: Tensor) -> Tensor:
        flat = x.new_zeros(self.shape[0] * self.shape[1], *x.shape[1:]).index_copy(0, self.index, x)
        return flat.view(*self.shape, *x.shape[1:])  # (N, ...) -> (B, T, ...), zeros at the padding

    def grid(self, x: Tensor) -> Tensor:
        """(N, ...) -> (S, max_len, ...), one sequence per row, zeros after its end."""
        flat = x.new_zeros(self.num_sequences * self.max_len, *x.shape[1:]).index_copy(0, self.slot, x)
        return flat.view(self.num_sequences, self.max_len, *x.shape[1:])


try:  # torch >= 2.10: flash attention on packed sequences, no flash_attn package needed
    from torch.nn.attention.varlen import varlen_attn
except ImportError:
    varlen_attn = None
FLASH_FORWARD = torch.ops.aten._flash_attention_forward  # what varlen_attn runs, with a dropout_p of 0
VARLEN_BACKENDS = ATTENTION_BACKENDS  # speed.attention (schema.SpeedOptions)


def flash_varlen(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
                 dropout_p: float, causal: bool) -> Tensor:
    """torch's flash attention within packed sequences, (N, heads, d) -> (N, heads, d): ``varlen_attn``, or
    with dropout the ATen op under it, which takes the paper's attention dropout (varlen_attn has none) and
    has its own backward. varlen_attn's causal switch is ``is_causal`` in torch 2.10, ``window_size=(-1, 0)``
    from 2.11."""
    if dropout_p > 0.0:
        return FLASH_FORWARD(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, causal, False)[0]
    if not causal:
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k)
    if "window_size" in inspect.signature(varlen_attn).parameters:
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, 0))
    return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True)


def varlen_backend(requested: str, q: Tensor, causal: bool) -> str:
    """``auto``: torch's varlen flash attention where it exists (torch >= 2.10, CUDA, half precision), else
    torch's nested-jagged SDPA on CUDA, else (CPU) the padded reference, whose dropout is the cheap CPU
    mask."""
    if requested not in VARLEN_BACKENDS:
        raise ValueError(f"attention backend {requested!r}: expected one of {', '.join(VARLEN_BACKENDS)}")
    flash = q.device.type == "cuda" and varlen_attn is not None and q.dtype in (torch.float16, torch.bfloat16)
    if requested == "flash" and not flash:
        raise ValueError(f"speed.attention=flash runs torch's varlen flash attention: it needs CUDA, torch "
                         f">= 2.10 and bf16 or fp16 (trainer=gpu), here {q.device.type}, torch "
                         f"{torch.__version__}, {q.dtype}; use speed.attention=auto")
    if requested != "auto":
        return requested
    if flash:
        return "flash"
    if q.device.type == "cuda":
        _warn_nested()
        return "nested"
    return "padded"


@functools.cache  # once a process: every layer of every step asks
def _warn_nested() -> None:
    warnings.warn("speed.unpad=true without torch's varlen flash attention (torch >= 2.10, fp16/bf16): "
                  "attention runs as torch's nested-jagged SDPA, slower than padded on an H200 "
                  "(docs/benchmarks.md#gpu); use torch >= 2.10 with bf16, or set speed.unpad=false",
                  stacklevel=3)


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    packed: Packed,
    dropout_p: float,
    causal: bool,
    backend: str = "auto",
    cpu_dropout: bool = True,
    queries: Packed | None = None,
) -> Tensor:
    """Attention within each packed sequence: q, k, v (N, heads, head_dim) -> (N, heads, head_dim).
    ``queries``: where q sits when it is packed apart from k and v (the sparse last layer's (B x P, ...)
    queries, sequence s over the keys of sequence s; not causal), else ``packed`` as for k and v."""
    if queries is not None and (causal or queries.num_sequences != packed.num_sequences):
        raise ValueError("queries packed apart from the keys: one sequence per key sequence, and not causal")
    backend = varlen_backend(backend, q, causal)
    queries = packed if queries is None else queries
    if backend == "flash":
        return flash_varlen(q, k, v, queries.cu_seqlens, packed.cu_seqlens, queries.max_len, packed.max_len,
                            dropout_p, causal)
    if backend == "nested":
        def jagged(x: Tensor, at: Packed) -> Tensor:  # (N, heads, hd) -> (S, heads, j, hd), contiguous
            offsets = at.cu_seqlens.long()
            return torch.nested.nested_tensor_from_jagged(x.contiguous(), offsets=offsets).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            jagged(q, queries), jagged(k, packed), jagged(v, packed), dropout_p=dropout_p, is_causal=causal
        )  # (S, heads, j, hd)
        return out.transpose(1, 2).values()  # (N, heads, hd)
    lengths = packed.cu_seqlens.diff()  # padded reference: each sequence in a row of (S, max_len)
    mask = (torch.arange(packed.max_len, device=q.device) < lengths[:, None])[
        :, None, None, :
    ]  # (S, 1, 1, j)
    if causal:
        keys = torch.arange(packed.max_len, device=q.device)
        mask = mask & (keys <= keys[:, None])
    q = queries.grid(q).transpose(1, 2)  # (S, heads, max query len, hd)
    k, v = (packed.grid(x).transpose(1, 2) for x in (k, v))  # (S, heads, max_len, hd)
    out = attention(q, k, v, mask, dropout_p, False, cpu_dropout)  # (S, heads, max query len, hd)
    return out.transpose(1, 2).flatten(0, 1).index_select(0, queries.slot)  # (N, heads, hd)
