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


def pack_rows(input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> PackedRows:
    """Pack the real tokens of each row (a left-aligned prefix, as the collators pad) into fewer rows."""
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
