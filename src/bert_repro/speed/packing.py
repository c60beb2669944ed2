"""Sequence packing: several short instances of a padded (B, T) batch share a row of T tokens (first fit,
longest first), each with positions restarting at 0 and attention only within itself (block-diagonal),
so fewer rows are computed. Speed only: every instance's outputs are those it has alone in its own row."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PackedRows:
    """Where each instance b of the padded batch went: ``start`` (B,) its first token in the flattened
    (rows x T) packed batch; the packed tensors themselves (rows, T)."""

    start: Tensor  # (B,)
    input_ids: Tensor  # (rows, T)
    token_type_ids: Tensor  # (rows, T)
    attention_mask: Tensor  # (rows, T)
    sequence_ids: Tensor  # (rows, T): 1 + the instance's index in the batch, 0 at the padding
    position_ids: Tensor  # (rows, T): 0.. within each instance


def first_fit(lengths: list[int], capacity: int) -> tuple[list[int], list[int]]:
    """Row and offset of each length, placed longest first into the first row with room."""
    rows: list[int] = []  # used tokens per row
    row_of, offset_of = [0] * len(lengths), [0] * len(lengths)
    for b in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, used in enumerate(rows) if used + lengths[b] <= capacity), len(rows))
        if row == len(rows):
            rows.append(0)
        row_of[b], offset_of[b] = row, rows[row]
        rows[row] += lengths[b]
    return row_of, offset_of


def pack_rows(input_ids: Tensor, token_type_ids: Tensor | None, attention_mask: Tensor | None) -> PackedRows:
    """Pack the real tokens of each row (a left-aligned prefix, as the collators pad) into fewer rows."""
    token_type_ids = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    B, T = input_ids.shape
    real = attention_mask.bool()
    row_of, offset_of = first_fit(real.sum(1).tolist(), T)  # one host sync per batch
    rows = max(row_of) + 1 if B else 0
    row = torch.tensor(row_of, device=input_ids.device)
    start = row * T + torch.tensor(offset_of, device=input_ids.device)  # (B,)
    b, j = real.nonzero(as_tuple=True)  # (N,) each real token's instance and position
    dest = start[b] + j  # (N,) its place in the flattened packed batch

    def scatter(values: Tensor) -> Tensor:
        out = values.new_zeros(rows * T)
        out[dest] = values
        return out.view(rows, T)

    return PackedRows(
        start,
        scatter(input_ids[b, j]),
        scatter(token_type_ids[b, j]),
        scatter(torch.ones_like(j)),
        scatter(b + 1),
        scatter(j),
    )


def read_back(p: PackedRows, sequence: Tensor, masked_positions: Tensor) -> tuple[Tensor, Tensor]:
    """The packed rows' final states (rows, T, H) -> each instance's [CLS] (B, 1, H) and its states at its
    ``masked_positions`` (B, P, H). Positions past an instance's end (the LTR objective's unreal ones) read
    another token's state, which the prediction mask drops."""
    flat = sequence.flatten(0, 1)  # (rows x T, H)
    predicted = flat[(p.start[:, None] + masked_positions).clamp(max=flat.shape[0] - 1)]  # (B, P, H)
    return flat[p.start][:, None], predicted


def block_diagonal_mask(sequence_ids: Tensor, causal: bool) -> Tensor:
    """Packed rows (B, T) -> SDPA mask (B, 1, T, T): each token attends within its own instance (padding
    to itself, so no row is empty and nothing turns NaN)."""
    same = (sequence_ids[:, :, None] == sequence_ids[:, None, :]) & (sequence_ids[:, None, :] > 0)
    T = sequence_ids.shape[1]
    eye = torch.eye(T, dtype=torch.bool, device=sequence_ids.device)
    if causal:
        same = same & torch.ones_like(eye).tril()
    return (same | eye)[:, None]
