"""The dimensions a program reads or writes one slice at a time, at a start it computes.

A scan over stacked layers reads layer `i` of every stacked parameter (`dynamic_slice` at
the loop counter) and its backward pass writes layer `i` of every stacked gradient
(`dynamic_update_slice`). Tiling such a dimension on a mesh axis makes each of those accesses
touch one device's tile at a start known only at run time, so the lowering gathers the whole
stack around it, in every iteration. ZeRO's `FIRST_DIVISIBLE_DIM` uses this to prefer another
dimension (the one MaxText's FSDP shards too): the shard of a layer is then gathered, and
its gradient reduce-scattered, once per iteration, at one layer's size.
"""

from __future__ import annotations

from ..ir.graph import Func, Op, walk

Shape = tuple[int, ...]


def scanned_dims(func: Func) -> frozenset[tuple[Shape, int]]:
    """`(shape, dim)` for every tensor shape a `dynamic_slice` reads from, or a
    `dynamic_update_slice` writes into, part of dimension `dim` at a start that is not a
    constant. Keyed by shape, not by value: the optimizer state of a stacked parameter is
    never sliced itself, but has the stack's shape and follows its gradient's layout."""
    found: set[tuple[Shape, int]] = set()
    for op in walk(func.ops):
        if op.name == "stablehlo.dynamic_slice":
            part, first = op.results[0].type.shape, 1
        elif op.name == "stablehlo.dynamic_update_slice":
            part, first = op.operands[1].type.shape, 2
        else:
            continue
        whole = op.operands[0].type.shape
        for d, start in enumerate(op.operands[first:first + len(whole)]):
            if part[d] < whole[d] and not _constant(start.producer):
                found.add((tuple(whole), d))
    return frozenset(found)


def _constant(op: Op | None) -> bool:
    return op is not None and op.name == "stablehlo.constant"
