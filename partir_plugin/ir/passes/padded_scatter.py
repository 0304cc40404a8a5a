"""The padded select_and_scatter: a max-pool's gradient as one op.

jax differentiates a padded `reduce_window` (a SAME max-pool) into three ops: the image padded
with the pool's init value (-inf), a `select_and_scatter` of the output gradient over it (no
padding of its own), and a slice back to the image's rows. Apart, a tiled spatial dimension
has nowhere to go: the pad shifts every tile and makes the extent uneven. Together they are a
windowed op like the pool itself, output-driven: the device holding image rows `[j·n,
(j+1)·n)` needs the windows that touch them, so its own rows plus halos of the image and of
the gradient (core/rules/halo.py `ScatterHalo`, spmd/rules/halo.py).

The importer fuses the trio into one `partir.padded_select_and_scatter` op (operands: image,
source, init, pad value; the pad's edges and the window's attributes; the select and scatter
regions), where the pad and the select_and_scatter have no other user and the slice keeps
exactly the image's rows. The lowering always expands it back into the three ops on local
shapes, so nothing downstream of the lowering ever sees it. Folding the pad into
select_and_scatter's own padding attribute instead would not be exact: padding is never
selected there, while jax's pad rows (-inf) win ties with real -inf values.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from ..attributes import parse_i64_array, parse_padding
from ..dialect import PADDED_SCATTER_OP
from ..graph import Func, Op, Value, blocks, use_counts
from .pipeline import FuncPass

# The attributes the fused op keeps: the window's, and the pad's edges.
WINDOW_ATTRS = ("window_dimensions", "window_strides")
EDGE_ATTRS = ("edge_padding_low", "edge_padding_high")


@dataclass(frozen=True)
class FusePaddedScatters(FuncPass):
    name = "fuse-padded-scatters"

    def wanted(self, seen: Set[str]) -> bool:
        return "stablehlo.select_and_scatter" in seen

    def apply(self, func: Func) -> None:
        fuse_padded_scatters(func)


def fuse_padded_scatters(func: Func) -> int:
    """Fuse every `slice(select_and_scatter(pad(x, v), g, init))` trio of `func` (regions
    included) into one padded select_and_scatter; the number fused."""
    uses = use_counts(func)
    fused = 0
    for block in blocks(func.body):
        gone: set[Op] = set()
        for i, op in enumerate(block.ops):
            trio = _trio(op, uses)
            if trio is not None:
                pad, scatter = trio
                block.ops[i] = _fused(pad, scatter, op)
                gone.update(trio)
                fused += 1
        if gone:
            block.ops = [op for op in block.ops if op not in gone]
    return fused


def _trio(op: Op, uses: dict[Value, int]) -> tuple[Op, Op] | None:
    """The pad and select_and_scatter that the slice `op` completes, if they fuse."""
    if op.name != "stablehlo.slice":
        return None
    scatter = op.operands[0].producer
    if (scatter is None or scatter.name != "stablehlo.select_and_scatter" or scatter.captures
            or uses.get(op.operands[0]) != 1 or _has_padding(scatter)):
        return None
    pad = scatter.operands[0].producer
    if pad is None or pad.name != "stablehlo.pad" or uses.get(scatter.operands[0]) != 1:
        return None
    rank = pad.operands[0].type.rank
    low, high, interior = (parse_i64_array(pad.attributes.get(k, "")) or [0] * rank
                           for k in (*EDGE_ATTRS, "interior_padding"))
    if any(interior) or any(e < 0 for e in (*low, *high)):
        return None
    start = parse_i64_array(op.attributes.get("start_indices", ""))
    limit = parse_i64_array(op.attributes.get("limit_indices", ""))
    strides = parse_i64_array(op.attributes.get("strides", "")) or [1] * rank
    shape = pad.operands[0].type.shape
    if (start != low or any(s != 1 for s in strides)
            or limit != [lo + n for lo, n in zip(low, shape)]):
        return None
    return pad, scatter


def _has_padding(scatter: Op) -> bool:
    """Does the select_and_scatter pad its operand itself (a `padding` attribute not all 0)?"""
    rows = parse_padding(scatter.attributes.get("padding", ""), scatter.operands[0].type.rank)
    return any(lo or hi for lo, hi in rows)


def _fused(pad: Op, scatter: Op, cut: Op) -> Op:
    attrs = {k: scatter.attributes[k] for k in WINDOW_ATTRS if k in scatter.attributes}
    attrs.update({k: pad.attributes[k] for k in EDGE_ATTRS})
    x, fill = pad.operands
    _, source, init = scatter.operands
    op = Op(PADDED_SCATTER_OP, [x, source, init, fill], [], attrs, scatter.regions)
    result = cut.results[0]
    result.owner, result.index = op, 0
    op.results = [result]
    op.mlir_location = scatter.mlir_location
    return op
