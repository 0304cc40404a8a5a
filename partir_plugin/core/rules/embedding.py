"""The one gather form PartIR tiles on an indexed dimension: an embedding lookup, and its
transpose, the scatter-add of an embedding gradient.

`table[ids]` lowers to a gather with one indexed operand dimension `k` (start_index_map [k],
collapsed), indices with a trailing index vector of size 1 and no batching dimensions. A table
tiled on `k` (the vocabulary) is then looked up per tile with indices shifted to the tile and
rows outside it zeroed; the tiles' results add up to the full lookup (paper 1 §5, the
vocabulary-sharded embedding). The TMR rule and the lowering share this recognition. Its
gradient, `zeros.at[ids].add(updates)`, is the scatter of the same form (`scatter_dim`),
which the lowering exchanges (`spmd/rules/embedding.py`, `ScatterExchange`). The vocabulary
entry is the kernel's: only its lowering knows how to shift the ids and zero the foreign rows.
"""

from __future__ import annotations

import re

from ...ir.attributes import dimension_list
from ...ir.graph import Op
from ...ir.opsets import Reduction
from ..tmr import Sum, TMREntry

# What the lookup form reads from each op's dimension numbers: (the op, its operand count, the
# attribute, the indexed operand dims, the dims removed from the window, the batching dims).
_FORMS = {
    "gather": ("stablehlo.gather", 2, "dimension_numbers", "start_index_map",
               "collapsed_slice_dims", "operand_batching_dims"),
    "scatter": ("stablehlo.scatter", 3, "scatter_dimension_numbers",
                "scatter_dims_to_operand_dims", "inserted_window_dims", "input_batching_dims"),
}


def _indexed_dim(op: Op, form: str) -> int | None:
    """The one indexed operand dimension `k` of a gather or scatter of the lookup's form (`k`
    removed from the window, a trailing index vector of size 1, no batching dimensions)."""
    name, operands, attr, indexed, removed, batching = _FORMS[form]
    if op.name != name or len(op.operands) != operands:
        return None
    numbers = op.attributes.get(attr, "")
    dims = dimension_list(numbers, indexed)
    if dims is None or len(dims) != 1 or dims[0] not in (dimension_list(numbers, removed) or []):
        return None
    if dimension_list(numbers, batching):
        return None
    indices = op.operands[1].type.shape
    m = re.search(r"index_vector_dim = (\d+)", numbers)
    if not indices or m is None or int(m.group(1)) != len(indices) - 1 or indices[-1] != 1:
        return None
    return dims[0]


def lookup_dim(op: Op) -> int | None:
    """The indexed operand dimension of an embedding-lookup gather, else None."""
    return _indexed_dim(op, "gather")


def scatter_dim(op: Op) -> int | None:
    """The indexed operand dimension of a scatter of the lookup's form (its gradient), else
    None."""
    return _indexed_dim(op, "scatter")


def update_window_dims(op: Op) -> list[int]:
    numbers = op.attributes.get("scatter_dimension_numbers", "")
    return dimension_list(numbers, "update_window_dims") or []


def offset_dims(op: Op) -> list[int]:
    return dimension_list(op.attributes.get("dimension_numbers", ""), "offset_dims") or []


def provide(op: Op, found: list[TMREntry] | None) -> list[TMREntry] | None:
    """The provider: a lookup's entries (Shardy's pass-through ones) with the vocabulary
    entry: each tile of the table answers the ids that fall in it (zeros elsewhere), and the
    tiles add up."""
    k = lookup_dim(op)
    if found is None or k is None:
        return found
    return [*found, TMREntry((k, None), (Sum(Reduction.ADD),), op.operands[0].type.shape[k])]
