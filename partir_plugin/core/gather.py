"""The one gather form PartIR tiles on an indexed dimension: an embedding lookup, and its
transpose, the scatter-add of an embedding gradient.

`table[ids]` lowers to a gather with one indexed operand dimension `k` (start_index_map [k],
collapsed), indices with a trailing index vector of size 1 and no batching dimensions. A table
tiled on `k` (the vocabulary) is then looked up per tile with indices shifted to the tile and
rows outside it zeroed; the tiles' results add up to the full lookup (paper 1 §5, the
vocabulary-sharded embedding). The TMR rule and the lowering share this recognition. Its
gradient, `zeros.at[ids].add(updates)`, is the scatter of the same form (`scatter_dim`).
"""

from __future__ import annotations

import re

from ..ir.graph import Op


def _ints(text: str, key: str) -> list[int] | None:
    m = re.search(key + r" = \[([0-9, ]*)\]", text)
    if m is None:
        return None
    return [int(x) for x in m.group(1).split(",") if x.strip()]


def lookup_dim(op: Op) -> int | None:
    """The indexed operand dimension of an embedding-lookup gather, else None."""
    if op.name != "stablehlo.gather" or len(op.operands) != 2:
        return None
    numbers = op.attributes.get("dimension_numbers", "")
    start = _ints(numbers, "start_index_map")
    collapsed = _ints(numbers, "collapsed_slice_dims") or []
    if start is None or len(start) != 1 or start[0] not in collapsed:
        return None
    if _ints(numbers, "operand_batching_dims"):
        return None
    indices = op.operands[1].type.shape
    m = re.search(r"index_vector_dim = (\d+)", numbers)
    if not indices or m is None or int(m.group(1)) != len(indices) - 1 or indices[-1] != 1:
        return None
    return start[0]


def scatter_dim(op: Op) -> int | None:
    """The indexed operand dimension of a scatter of the lookup's form (one indexed, inserted
    dimension `k`, a trailing index vector of size 1, no batching dimensions), else None."""
    if op.name != "stablehlo.scatter" or len(op.operands) != 3:
        return None
    numbers = op.attributes.get("scatter_dimension_numbers", "")
    to_operand = _ints(numbers, "scatter_dims_to_operand_dims")
    inserted = _ints(numbers, "inserted_window_dims") or []
    if to_operand is None or len(to_operand) != 1 or to_operand[0] not in inserted:
        return None
    if _ints(numbers, "input_batching_dims"):
        return None
    indices = op.operands[1].type.shape
    m = re.search(r"index_vector_dim = (\d+)", numbers)
    if not indices or m is None or int(m.group(1)) != len(indices) - 1 or indices[-1] != 1:
        return None
    return to_operand[0]


def update_window_dims(op: Op) -> list[int]:
    return _ints(op.attributes.get("scatter_dimension_numbers", ""), "update_window_dims") or []


def offset_dims(op: Op) -> list[int]:
    return _ints(op.attributes.get("dimension_numbers", ""), "offset_dims") or []
