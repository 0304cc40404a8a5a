"""A window of a tiled dimension, read or written where it falls: `dynamic_slice` and
`dynamic_update_slice` on a dimension the window covers only partly.

A scan over stacked layers reads layer i of each stacked parameter and writes layer i of its
gradient; a decode loop writes a token into its KV cache at the current position. Where the
stacked or cached dimension is tiled (ZeRO on the layer dimension, a sequence-sharded cache),
gathering the whole operand around each access is what these entries avoid:

- a write keeps the operand tiled and the update whole on every device; each device writes
  the part of the update that falls in its tile;
- a read gives each device the part of the window its tile holds, zeros elsewhere, so the
  tiles' results add up to the window (a pending sum, as the vocabulary-tiled embedding
  lookup's): one all_reduce of the window instead of a gather of the operand.

The lowering is the kernel's (`spmd/rules/masked_window.py`).
"""

from __future__ import annotations

from ...ir.graph import Op
from ...ir.opsets import Reduction
from ..tmr import Sum, TMREntry


def dynamic_update_slice_entries(op: Op) -> list[TMREntry]:
    """A dimension the update covers entirely is tiled in both (the start then clamps to 0);
    one it covers partly is tiled in the operand, the update whole on every device."""
    operand, update = op.operands[0].type.shape, op.operands[1].type.shape
    n_idx = len(op.operands) - 2
    return [TMREntry((d, d if update[d] == size else None) + (None,) * n_idx, (d,), size)
            for d, size in enumerate(operand) if size > 1 and update[d] > 0]


def provide(op: Op, found: list[TMREntry] | None) -> list[TMREntry] | None:
    """A dynamic_slice's entries (Shardy's, for the dimensions it takes whole) with, for each
    dimension it takes partly, the masked read: the operand tiled there, the result a sum of
    the tiles' parts. Not for booleans, which a sum does not combine."""
    if op.name != "stablehlo.dynamic_slice" or found is None:
        return found
    operand, window = op.operands[0].type.shape, op.results[0].type.shape
    if op.results[0].type.element == "i1":
        return found
    n_idx = len(op.operands) - 1
    return [*found, *(TMREntry((d,) + (None,) * n_idx, (Sum(Reduction.ADD),), size)
                      for d, size in enumerate(operand) if size > 1 and 0 < window[d] < size)]
