"""Where a batch's tokens sit while the encoder runs, and the attention kernel that suits it: padded rows with
an SDPA mask, or (speed.unpad, as MosaicBERT and ModernBERT) only the real tokens, packed into (N, H) from the
embeddings to the head with varlen attention within each sequence; the sparse last layer (speed.fast_kernels)
whose queries are only the positions that leave it; packed rows (speed.pack). model.py calls these at one
place per feature; tests/test_speed_options.py proves each equal to the plain padded path."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bert_repro.speed import kernels
from bert_repro.speed.kernels import Packed, varlen_attention
from bert_repro.speed.packing import block_diagonal_mask, pack_rows, read_back

if TYPE_CHECKING:
    from bert_repro.config import SpeedOptions


@dataclass(frozen=True)
class AttentionContext:
    """How every layer's attention runs on this batch, decided once per forward (``context``). Padded, the
    layers see (B, T, H) and SDPA takes ``mask``; unpadded, they see the real tokens (N, H), and ``packed``
    says which sequence each is in (cu_seqlens). ``rows``, in the sparse last layer only: its query rows
    (B, P), the only ones that leave it; ``positions``, the (B, P) positions asked of the last layer."""

    speed: SpeedOptions
    causal: bool  # the left-to-right ablation (§5.1)
    attention_mask: Tensor | None  # (B, T) as given: 1 = real, 0 = padding
    mask: Tensor | None = None  # padded: boolean (B, 1, 1|T|P, T), True = may attend; None = nothing masked
    packed: Packed | None = None  # unpadded: the real tokens' places and sequences
    rows: tuple[Tensor, ...] | None = None  # an index of x's leading dimensions giving (B, P)
    positions: Tensor | None = None  # (B, P): the sparse last layer's queries

    @property
    def is_causal(self) -> bool:  # SDPA applies the causal mask itself when nothing else is masked
        return self.causal and self.mask is None and self.rows is None

    def select(self, x: Tensor) -> Tensor:
        """x's query rows: all of them, or the sparse last layer's (B, P, ...)."""
        return x if self.rows is None else x[self.rows]

    def unpad(self, x: Tensor) -> Tensor:
        """The embeddings (B, T, H) as the layers take them: the real tokens (N, H) when unpadded."""
        return x if self.packed is None else self.packed.unpad(x)

    def pad(self, x: Tensor) -> Tensor:
        """Unpadded (N, H) back to the batch's (B, T, H), zeros at the padding; other shapes as they are."""
        return self.packed.pad(x) if self.packed is not None and x.dim() == 2 else x

    def last_layer(self, x: Tensor) -> tuple[Tensor, AttentionContext]:
        """The last layer's input and context: as the others', or the sparse last layer's, whose queries
        are ``positions`` (B, P) and keys everywhere."""
        positions, packed = self.positions, self.packed
        if positions is None:
            return x, self
        if packed is not None and not self.causal and packed.num_sequences == len(positions):
            return x, replace(self, rows=(packed.rows(positions),))  # row b's queries over its real tokens
        x = self.pad(x)  # (B, T, H): varlen queries apart from their keys: never causal nor of empty rows
        mask = attention_mask_for_sdpa(self.attention_mask, self.causal, x.shape[1], positions)
        batch = torch.arange(len(positions), device=positions.device)[:, None]  # (B, 1)
        return x, replace(self, mask=mask, packed=None, rows=(batch, positions))


def context(speed: SpeedOptions, causal: bool, attention_mask: Tensor | None, seq_len: int,
            sequence_ids: Tensor | None = None, positions: Tensor | None = None) -> AttentionContext:
    """Padded rows and their SDPA mask (padding, the ablation's future, the other instances of packed rows),
    or with speed.unpad the real tokens and their sequences (a row, or a packed instance, each)."""
    if sequence_ids is not None and positions is not None:
        raise ValueError("packed rows (sequence_ids) have no sparse last layer")
    ctx = AttentionContext(speed, causal, attention_mask, positions=positions)
    if speed.unpad and sequence_ids is not None:
        return replace(ctx, packed=Packed.from_sequence_ids(sequence_ids))
    if speed.unpad and attention_mask is not None and (not kernels.eager_cpu(attention_mask)
                                                       or not bool(attention_mask.all())):
        return replace(ctx, packed=Packed.from_mask(attention_mask))
    if sequence_ids is not None:
        return replace(ctx, mask=block_diagonal_mask(sequence_ids, causal))
    return replace(ctx, mask=attention_mask_for_sdpa(attention_mask, causal, seq_len))


def attention_mask_for_sdpa(attention_mask: Tensor | None, causal: bool, seq_len: int,
                            positions: Tensor | None = None) -> Tensor | None:
    """Padding mask (B, T) of 1 = real, 0 = pad -> boolean SDPA mask (B, 1, 1|T, T), True = may attend;
    with query ``positions`` (B, P) (the sparse last layer), (B, 1, 1|P, T).

    None when nothing needs masking, so SDPA can take its fastest kernel (and apply the causal mask of
    the left-to-right ablation itself, through ``is_causal``, when every position is a query)."""
    # off the eager CPU the mask is built whatever it holds: a look at its values is a sync (eager_cpu)
    padded = attention_mask is not None and (not kernels.eager_cpu(attention_mask)
                                             or not bool(attention_mask.all()))
    if not padded and (not causal or positions is None):
        return None
    mask = attention_mask.bool()[:, None, None, :] if padded else None  # (B, 1, 1, T)
    if causal:
        keys = torch.arange(seq_len, device=(attention_mask if padded else positions).device)
        queries = keys[:, None] if positions is None else positions[:, None, :, None]  # (T, 1) | (B, 1, P, 1)
        seen = keys <= queries  # (T, T) | (B, 1, P, T): the left context and the query itself
        mask = seen if mask is None else mask & seen
    return mask


def sparse_qkv(qkv: nn.Linear, x: Tensor, ctx: AttentionContext,
               heads: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """The sparse last layer's projections: the query at its P rows only (B, P, heads, head_dim), keys and
    values at all of x's rows (..., heads, head_dim)."""
    H = x.shape[-1]
    (w_q, w_kv), (b_q, b_kv) = (t.split([H, 2 * H]) for t in (qkv.weight, qkv.bias))
    q = F.linear(ctx.select(x), w_q, b_q).unflatten(-1, heads)
    k, v = F.linear(x, w_kv, b_kv).unflatten(-1, (2, *heads)).unbind(-3)
    return q, k, v


def attend(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, dropout_p: float) -> Tensor:
    """softmax(q k^T / sqrt(d)) v per head (Vaswani et al.), token-major: q (..., heads, d) at ctx's query
    rows, k and v (..., heads, d) at every row; the context comes back shaped as q. The one switch between
    attention kernels: SDPA on the padded batch (with speed.fast_kernels, its math with the cheap CPU dropout
    mask), or, unpadded, attention within each sequence (kernels.py's varlen backends)."""
    if ctx.packed is not None:  # k, v (N, heads, d); q (N, heads, d), or the sparse last layer's (B, P, ...)
        queries = None if ctx.rows is None else Packed.dense(q.shape[0], q.shape[1], q.device)
        out = varlen_attention(q.reshape(-1, *q.shape[-2:]), k, v, ctx.packed, dropout_p, ctx.causal,
                               ctx.speed.attention, ctx.speed.fast_kernels, queries)  # (N | B x P, heads, d)
        return out.view(q.shape)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T|P, d)
    if ctx.speed.fast_kernels:
        out = kernels.attention(q, k, v, ctx.mask, dropout_p, ctx.is_causal)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.mask, dropout_p=dropout_p,
                                             is_causal=ctx.is_causal)
    return out.transpose(1, 2)  # (B, T|P, heads, d)


def prediction_states(bert: nn.Module, input_ids: Tensor, token_type_ids: Tensor | None,
                      attention_mask: Tensor | None, masked_positions: Tensor,
                      output_hidden_states: bool) -> tuple[Tensor, Tensor, list[Tensor] | None] | None:
    """Pre-training's final states of [CLS] (B, 1, H) and of ``masked_positions`` (B, P, H), and the hidden
    states, computed the fast way: several short instances per row (speed.pack), read back at each one's
    [CLS] and positions; or the sparse last layer (speed.fast_kernels), where only those leave it. None when
    neither applies: the caller runs the whole sequence."""
    speed = bert.speed
    if speed.pack and not output_hidden_states:
        p = pack_rows(input_ids, token_type_ids, attention_mask)
        out = bert(p.input_ids, p.token_type_ids, p.attention_mask, sequence_ids=p.sequence_ids,
                   position_ids=p.position_ids)
        return *read_back(p, out.last_hidden_state, masked_positions), None
    if speed.fast_kernels:
        positions = torch.cat([torch.zeros_like(masked_positions[:, :1]), masked_positions], dim=1)
        out = bert(input_ids, token_type_ids, attention_mask, output_hidden_states, positions)
        seq = out.last_hidden_state  # (B, 1 + P, H)
        return seq, seq[:, 1:], out.hidden_states
    return None
