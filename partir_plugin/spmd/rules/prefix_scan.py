"""Lowering a tiled prefix scan (`core/rules/prefix_scan.py`): cumsum, cummax, cumprod over a
tiled dimension.

Each device scans its own tile (the reduce_window with its window and padding cut to the
tile), then combines every row with the carry: the reduction of the tile totals before its
own (after it, reversed). The totals (each tile's last row, or first) are all-gathered over the
tiling axes, one row per device, and the device keeps those of the blocks before its own,
putting the init value (the reducer's identity) elsewhere. Padding (the last tile of an
uneven dimension) was set to the identity by the lowering's masks, so it adds nothing.
"""

from __future__ import annotations

from ...core.mesh import Mesh
from ...core.rules.prefix_scan import ScanEntry
from ...ir.attributes import format_padding, i64_array, parse_i64_array, parse_padding
from ...ir.graph import Op, Region, Value, clone_region
from ...ir.types import TensorType
from ..emitter import Emitter
from ..op_plan import Nest, OpPlan
from .base import LoweringRule, RuleContext

_COMBINE = {"add": "stablehlo.add", "max": "stablehlo.maximum", "min": "stablehlo.minimum",
            "mul": "stablehlo.multiply"}


class PrefixScan(LoweringRule):
    """A reduce_window that is a prefix scan of a tiled dimension (`ScanEntry`)."""

    ops = frozenset({"stablehlo.reduce_window"})

    def matches(self, op: Op, nest: Nest, plan: OpPlan, mesh: Mesh) -> bool:
        return bool(scan_axes(nest))

    def emit(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str],
             regions: list[Region]) -> list[Value]:
        return [lower_scan(ctx.em, ctx.op, scan_axes(ctx.nest), operands, attrs,
                           ctx.plan.result_types[0], regions)]


def scan_axes(nest: Nest) -> dict[int, tuple[ScanEntry, tuple[str, ...]]]:
    """The scanned dimensions of an op's loop nest, each with its entry and axes (major
    first)."""
    found: dict[int, tuple[ScanEntry, list[str]]] = {}
    for axis, entry in nest:
        if isinstance(entry, ScanEntry):
            found.setdefault(entry.operands[0], (entry, []))[1].append(axis)
    return {d: (e, tuple(axes)) for d, (e, axes) in found.items()}


def lower_scan(em: Emitter, op: Op, scans: dict, operands: list[Value], attrs: dict[str, str],
               result: TensorType, regions: list[Region]) -> Value:
    """The reduce_window `op` on this device's tiles of its scanned dimensions `scans`
    (`scan_axes`), finished with the carry of the other tiles."""
    x, init = operands
    rank = x.type.rank
    window = parse_i64_array(attrs["window_dimensions"])
    pads = parse_padding(attrs.get("padding", ""), rank)
    for d, (entry, _) in scans.items():
        n = x.type.shape[d]
        window[d] = n
        pads[d] = [0, n - 1] if entry.reverse else [n - 1, 0]
    attrs = {**attrs, "window_dimensions": i64_array(window), "padding": format_padding(pads)}
    y = em.emit(op.name, [x, init], [result], attrs, regions).results[0]
    for d, (entry, axes) in scans.items():
        y = _with_carry(em, op, y, init, d, entry, axes)
    return y


def _with_carry(em: Emitter, op: Op, y: Value, init: Value, d: int, entry: ScanEntry,
                axes: tuple[str, ...]) -> Value:
    n = y.type.shape[d]
    edge = em.slice(y, d, 0, 1) if entry.reverse else em.slice(y, d, n - 1, n)
    totals = em.all_gather(edge, d, axes)
    rows = em.emit("stablehlo.iota", [], [TensorType(totals.type.shape, "i32")],
                   {"iota_dimension": f"{d} : i64"}).results[0]
    mine = em.broadcast(em.per_device(em.block_index(axes)), rows.type)
    others = em.compare(rows, mine, "GT" if entry.reverse else "LT")
    kept = em.where(others, totals, init)
    kept_dims = [i for i in range(y.type.rank) if i != d]
    carry_t = TensorType(tuple(y.type.shape[i] for i in kept_dims), y.type.element)
    carry = em.emit("stablehlo.reduce", [kept, init], [carry_t],
                    {"dimensions": i64_array([d])}, [clone_region(op.regions[0], {})]
                    ).results[0]
    carry = em.broadcast(carry, y.type, kept_dims)
    return em.emit(_COMBINE[entry.reduction], [carry, y], [y.type]).results[0]
