"""model.py's encoder, run faster on the same parameters: the same modules under subclasses whose forward
unpads (the layers see only the real tokens, attention runs per packed sequence), recomputes activations
(activation checkpointing), draws CPU dropout cheaply, and lets only the predicted positions leave the last
layer. tests/test_speed_options.py proves each equal (loss and gradients) to model.py's path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

from bert_repro.model import (
    BertForPreTraining,
    BertModel,
    EncoderOutput,
    Layer,
    MLMHead,
    PreTrainingOutput,
    attention_mask_for_sdpa,
)
from bert_repro.speed.kernels import VARLEN_BACKENDS, Packed, attention, varlen_attention
from bert_repro.speed.loss import fusable, linear_cross_entropy
from bert_repro.speed.packing import pack_rows


@dataclass(frozen=True)
class SpeedOptions:
    """What trainer/ switches on; none changes what is computed. All off = model.py's readable path."""

    kernels: bool = (
        False  # CPU dropout masks and attention, the sparse last layer, the MLM-head gradient trick
    )
    unpad: bool = False  # layers and attention on the real tokens only (varlen attention)
    activation_checkpointing: bool = False  # recompute each layer in the backward pass: memory for compute
    attention: str = "auto"  # the varlen kernel: auto | flash | nested | padded (speed/kernels.py)
    pack: bool = False  # pre-training: several short instances per row (speed/packing.py)

    def __post_init__(self) -> None:
        if self.attention not in VARLEN_BACKENDS:
            raise ValueError(
                f"speed attention={self.attention!r}: expected one of {', '.join(VARLEN_BACKENDS)}"
            )

    @property
    def any(self) -> bool:
        return self.kernels or self.unpad or self.activation_checkpointing or self.pack


class FastLayer(Layer):
    """model.Layer's computation on (..., H) rows, attention by ``attend``: (module, fused qkv (..., 3H)) ->
    context (..., H). With ``positions`` (B, P) only those rows leave: queries there, keys and values at
    every position (``attend`` then maps (module, q (B, heads, P, hd), k, v) to the context): of x (B, T, H)
    in (B, heads, T, hd), or of the real tokens x (N, H) in (N, heads, hd), ``positions`` then their rows.
    The layer stays a module call, so FSDP's per-layer units and activation checkpointing wrap it."""

    def forward(self, x: Tensor, attend: Callable, positions: Tensor | None = None) -> Tensor:
        a = self.attention
        if positions is None:
            residual, context = x, attend(a, a.qkv(x))  # (..., H)
        else:
            (B, P), H = positions.shape, x.shape[-1]
            if x.dim() == 2:  # unpadded
                residual = x[positions]  # (B, P, H)
            else:
                residual = x.gather(1, positions.unsqueeze(-1).expand(-1, -1, H))  # (B, P, H)
            (w_q, w_kv), (b_q, b_kv) = a.qkv.weight.split([H, 2 * H]), a.qkv.bias.split([H, 2 * H])
            q = (
                F.linear(residual, w_q, b_q).view(B, P, a.num_heads, a.head_dim).transpose(1, 2)
            )  # (B, heads, P, hd)
            kv = F.linear(x, w_kv, b_kv).view(*x.shape[:-1], 2, a.num_heads, a.head_dim)  # (.., 2, heads, hd)
            if x.dim() == 2:
                k, v = kv.unbind(1)  # 2 x (N, heads, hd)
            else:
                k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # 2 x (B, heads, T, hd)
            context = attend(a, q, k, v).transpose(1, 2).reshape(B, P, H)  # (B, P, H)
        x = a.LayerNorm(residual + a.dropout(a.dense(context)))
        return self.LayerNorm(x + self.dropout(self.output(F.gelu(self.intermediate(x)))))


def sparse_last_mask(
    attention_mask: Tensor | None, causal: bool, seq_len: int, positions: Tensor
) -> Tensor | None:
    """The SDPA mask (B, 1, P|1, T) for queries at ``positions`` (B, P) only, keys everywhere."""
    padded = attention_mask is not None and not bool(attention_mask.all())
    mask = attention_mask.bool()[:, None, None, :] if padded else None  # (B, 1, 1, T)
    if causal:
        left = torch.arange(seq_len, device=positions.device) <= positions[:, None, :, None]  # (B, 1, P, T)
        mask = left if mask is None else mask & left
    return mask


def block_diagonal_mask(sequence_ids: Tensor, causal: bool) -> Tensor:
    """Packed rows (B, T) -> SDPA mask (B, 1, T, T): each token attends within its own instance (padding
    to itself, so no row is empty and nothing turns NaN)."""
    same = (sequence_ids[:, :, None] == sequence_ids[:, None, :]) & (sequence_ids[:, None, :] > 0)
    T = sequence_ids.shape[1]
    eye = torch.eye(T, dtype=torch.bool, device=sequence_ids.device)
    if causal:
        same = same & torch.ones_like(eye).tril()
    return (same | eye)[:, None]


class FastBertModel(BertModel):
    """BertModel with the options of ``self.speed`` (a SpeedOptions); ``output_positions`` (B, P) lets
    only those positions leave the last layer, (B, P, H): its queries, feed-forward and LayerNorms run at
    P instead of T positions. ``sequence_ids``/``position_ids`` (B, T): packed rows (several instances per
    row: packing.py), positions restarting at each instance; attention per instance (varlen with
    ``unpad``, else a block-diagonal mask)."""

    speed: SpeedOptions = SpeedOptions()

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        output_hidden_states: bool = False,
        output_positions: Tensor | None = None,
        sequence_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> EncoderOutput:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}")
        if sequence_ids is not None and output_positions is not None:
            raise ValueError("packed rows (sequence_ids) have no sparse last layer")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        B, T = input_ids.shape
        packed = None
        if sequence_ids is not None and self.speed.unpad:
            packed = Packed.from_sequence_ids(sequence_ids)
        elif self.speed.unpad and attention_mask is not None and not bool(attention_mask.all()):
            packed = Packed.from_mask(attention_mask)
        # embeddings as model.py computes them (the same dropout draws), then only the real tokens go on
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        if packed is not None:
            x = packed.unpad(x)  # (N, H): nothing padded from here to the head
        if sequence_ids is not None and packed is None:
            mask = block_diagonal_mask(sequence_ids, self.config.causal)
        else:
            mask = attention_mask_for_sdpa(attention_mask, self.config.causal, T)
        hidden_states = [x if packed is None else packed.pad(x)] if output_hidden_states else None
        for i, layer in enumerate(self.encoder.layer):
            last = output_positions is not None and i == len(self.encoder.layer) - 1
            if last and packed is not None and not self.config.causal and packed.num_sequences == B:
                # the sparse last layer unpadded: keys and values of the N real tokens, queries at positions
                rows = packed.rows(output_positions)  # (B, P)
                x = self._checkpointed(layer, x, partial(self._varlen_queries, packed=packed), rows)
                packed = None  # (B, P, H) from here
            elif last:
                if packed is not None:  # causal, or an empty row: the keys and values padded again
                    x, packed = packed.pad(x), None
                last_mask = sparse_last_mask(attention_mask, self.config.causal, T, output_positions)
                x = self._checkpointed(
                    layer, x, partial(self._heads, mask=last_mask, is_causal=False), output_positions
                )
            elif packed is not None:
                x = self._checkpointed(layer, x, partial(self._varlen, packed=packed))
            else:
                x = self._checkpointed(layer, x, partial(self._padded, mask=mask))
            if hidden_states is not None:
                hidden_states.append(x if packed is None else packed.pad(x))
        if packed is not None:
            x = packed.pad(x)  # (B, T, H)
        return EncoderOutput(last_hidden_state=x, hidden_states=hidden_states)

    def _checkpointed(self, layer: FastLayer, *args) -> Tensor:
        if self.speed.activation_checkpointing and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def _heads(self, a, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        """(B, heads, T|P, hd) queries over (B, heads, T, hd) keys and values."""
        return attention(
            q, k, v, mask, a.attention_dropout if self.training else 0.0, is_causal, self.speed.kernels
        )

    def _padded(self, a, qkv: Tensor, mask: Tensor | None) -> Tensor:
        B, T, _ = qkv.shape
        q, k, v = (
            qkv.view(B, T, 3, a.num_heads, a.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        )  # (B, heads, T, hd)
        context = self._heads(a, q, k, v, mask, a.causal and mask is None)  # (B, heads, T, hd)
        return context.transpose(1, 2).reshape(B, T, -1)  # (B, T, H)

    def _varlen(self, a, qkv: Tensor, packed: Packed) -> Tensor:
        q, k, v = qkv.view(-1, 3, a.num_heads, a.head_dim).unbind(1)  # 3 x (N, heads, hd)
        context = varlen_attention(
            q,
            k,
            v,
            packed,
            a.attention_dropout if self.training else 0.0,
            a.causal,
            self.speed.attention,
            self.speed.kernels,
        )  # (N, heads, hd)
        return context.flatten(1)  # (N, H)

    def _varlen_queries(self, a, q: Tensor, k: Tensor, v: Tensor, packed: Packed) -> Tensor:
        """Queries (B, heads, P, hd) of row b over the keys and values (N, heads, hd) of row b's tokens."""
        B, _, P, _ = q.shape
        context = varlen_attention(
            q.transpose(1, 2).flatten(0, 1),  # (B x P, heads, hd)
            k,
            v,
            packed,
            a.attention_dropout if self.training else 0.0,
            False,
            self.speed.attention,
            self.speed.kernels,
            queries=Packed.dense(B, P, q.device),
        )  # (B x P, heads, hd)
        return context.view(B, P, a.num_heads, a.head_dim).transpose(1, 2)  # (B, heads, P, hd)


class FastMLMHead(MLMHead):
    """W h^T + b, transposed back, rather than h W^T + b, for up to H predicted positions: the tied weight's
    gradient is then a fresh (V, H) product that autograd accumulates the embedding's gradient into in place
    (F.linear's is a transposed view, costing an out-of-place (V, H) sum per step). The logits come out
    transposed, which costs the softmax a copy and the accuracy's argmax a strided pass over (N, V): with more
    positions than H (a left-to-right LM predicts every one) F.linear is the faster of the two."""

    def forward(self, hidden: Tensor, decoder_weight: Tensor) -> Tensor:
        h = self.transform(hidden)  # (..., H)
        flat = h.reshape(-1, h.shape[-1])  # (N, H)
        if flat.shape[0] > flat.shape[1]:
            return F.linear(h, decoder_weight, self.bias)  # (..., V)
        logits = torch.addmm(self.bias[:, None], decoder_weight, flat.t()).t()  # (N, V)
        return logits.reshape(*h.shape[:-1], logits.shape[-1])  # (..., V)

    def loss(self, hidden: Tensor, decoder_weight: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """(mean cross-entropy, hits) of the (N, H) ``hidden`` against ``targets``, the decoder fused with the
        loss (speed/loss.py): no (N, V) logits."""
        return linear_cross_entropy(self.transform(hidden), decoder_weight, self.bias, targets)


class FastBertForPreTraining(BertForPreTraining):
    """With ``kernels``, only [CLS] (for NSP) and the masked positions leave the last layer (FastBertModel's
    ``output_positions``); with ``pack``, short instances share rows (packing.py)."""

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, masked_positions: Tensor | None = None,
                prediction_mask: Tensor | None = None,
                output_hidden_states: bool = False, mlm_targets: Tensor | None = None) -> PreTrainingOutput:
        """``mlm_targets`` (N,), the tokens the N predictions should give: with ``kernels``, in CPU training
        (under autocast or not), the output carries the MLM loss and hits (``mlm_loss``, ``mlm_correct``) in
        place of the logits."""
        if masked_positions is not None and self.bert.speed.pack and not output_hidden_states:
            return self._packed(input_ids, token_type_ids, attention_mask, masked_positions, prediction_mask,
                                mlm_targets)
        if masked_positions is None or not self.bert.speed.kernels:
            return super().forward(input_ids, token_type_ids, attention_mask, masked_positions,
                                   prediction_mask, output_hidden_states)
        positions = masked_positions
        if self.nsp is not None:
            # (B, 1+P): [CLS] first
            positions = torch.cat([torch.zeros_like(positions[:, :1]), positions], dim=1)
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, positions)
        seq = out.last_hidden_state  # (B, [1+]P, H)
        predicted = seq[:, 1:] if self.nsp is not None else seq  # (B, P, H)
        return self.heads(predicted, seq, prediction_mask, out.hidden_states, mlm_targets)

    def heads(self, predicted: Tensor, seq: Tensor, prediction_mask: Tensor | None = None,
              hidden_states: list[Tensor] | None = None,
              mlm_targets: Tensor | None = None) -> PreTrainingOutput:
        if mlm_targets is None or not isinstance(self.mlm, FastMLMHead) or not fusable(predicted):
            return super().heads(predicted, seq, prediction_mask, hidden_states)
        if prediction_mask is not None:
            predicted = predicted[prediction_mask]  # (N, H)
        loss, correct = self.mlm.loss(predicted.reshape(-1, predicted.shape[-1]),
                                      self.bert.embeddings.word_embeddings.weight, mlm_targets)
        nsp_logits = self.nsp(self.bert.pooler(seq)) if self.nsp is not None else None  # (B, 2)
        return PreTrainingOutput(None, nsp_logits, seq, hidden_states, mlm_loss=loss, mlm_correct=correct)

    def _packed(self, input_ids: Tensor, token_type_ids: Tensor | None, attention_mask: Tensor | None,
                masked_positions: Tensor, prediction_mask: Tensor | None,
                mlm_targets: Tensor | None = None) -> PreTrainingOutput:
        """The batch's instances packed into fewer rows; the predictions and [CLS] read back per instance."""
        token_type_ids = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        p = pack_rows(input_ids, token_type_ids, attention_mask)
        out = self.bert(
            p.input_ids,
            p.token_type_ids,
            p.attention_mask,
            sequence_ids=p.sequence_ids,
            position_ids=p.position_ids,
        )
        seq = out.last_hidden_state.flatten(0, 1)  # (rows x T, H)
        # positions past an instance's end (the LTR objective's unreal ones) are dropped by prediction_mask
        predicted = seq[(p.start[:, None] + masked_positions).clamp(max=seq.shape[0] - 1)]  # (B, P, H)
        cls = seq[p.start][:, None]  # (B, 1, H): each instance's [CLS]
        return self.heads(predicted, cls, prediction_mask, mlm_targets=mlm_targets)
