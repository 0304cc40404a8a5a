"""Halo exchange: the lowering of a `HaloEntry` (core/rules/halo.py).

Device j of k along the tiling axes holds rows `[j·n, (j+1)·n)` of a windowed op's input and
computes its own output rows (n = ceil(size/k): a padded tile's padding is first set to the
pad value, so a window reading past the valid rows sees what the global op pads with). Before
the op it builds the extended operand `[j·n - left, (j+1)·n + right)`: its tile, the last
`left` rows of device j-1 and the first `right` rows of device j+1, each received by one
collective_permute. Rows beyond the global
ends are the op's padding value (0 for a convolution, the init value for reduce_window, so a
max-pool over negative inputs never sees a zero); the op then runs with local padding that makes
it compute exactly this device's rows. A halo wider than a tile (a big window over small tiles)
is not a neighbour's: that dimension is gathered, padded and sliced instead, with a
`HaloWarning` among the program's diagnostics (the driver emits them).
"""

from __future__ import annotations

from ...core.rules.halo import Halo, HaloEntry, HaloRows, no_halo_reason, windowed_dims
from ...ir.attributes import format_padding, i64_array, parse_i64_array, parse_padding
from ...ir.dialect import PADDED_SCATTER_OP
from ...ir.graph import Op, Region, Value
from ...ir.opsets import UNHALOED_OPS, WINDOWED_OPS
from ...ir.passes.padded_scatter import WINDOW_ATTRS
from ...ir.types import TensorType
from ..emitter import Emitter
from ..layout import Layout
from ..masking import WINDOW_PAD, apply_mask, masks
from ..op_plan import Nest
from .base import LoweringRule, RuleContext


class HaloWarning(UserWarning):
    """A spatial tiling whose halo exchange falls back to gathering the dimension."""


def halo_axes(nest) -> list[tuple[Halo, tuple[str, ...]]]:
    """The halos of an op's loop nest, each with the mesh axes tiling it (major first)."""
    found: dict[Halo, list[str]] = {}
    for axis, entry in nest:
        if isinstance(entry, HaloEntry):
            found.setdefault(entry.halo, []).append(axis)
    return [(h, tuple(axes)) for h, axes in found.items()]


class GatheredWindow(LoweringRule):
    """A pad or select_and_scatter, which has no halo rule: a window dimension that arrives
    tiled is gathered (by the conversion to what its nest slices), and reported."""

    ops = UNHALOED_OPS

    def check(self, ctx: RuleContext) -> None:
        ctx.diagnostics += gathered_windows(ctx.op, ctx.have, ctx.plan.wanted)


class HaloExchange(GatheredWindow):
    """A convolution or reduce_window: its operands extended by their halos."""

    ops = WINDOWED_OPS

    def before(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str]
               ) -> list[Value]:
        return extend_operands(ctx.em, ctx.op, ctx.nest, operands, attrs, ctx.diagnostics)


class PaddedScatter(GatheredWindow):
    """A padded select_and_scatter (a max-pool's gradient), with halos."""

    ops = frozenset({PADDED_SCATTER_OP})

    def emit(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str],
             regions: list[Region]) -> list[Value]:
        return [lower_padded_scatter(ctx.em, ctx.op, ctx.nest, operands,
                                     ctx.plan.result_types[0], regions, ctx.diagnostics)]


def extend_operands(em: Emitter, op: Op, nest: Nest, operands: list[Value],
                    attrs: dict[str, str], diagnostics: list[Warning]) -> list[Value]:
    """The op's local operands with their halos, and `attrs["padding"]` made local; a halo
    wider than a neighbour's tile is gathered instead, which is reported in `diagnostics`."""
    if not any(isinstance(e, HaloEntry) for _, e in nest):
        return operands
    operands = list(operands)
    pad_rows = (op.operands[0].type.rank if op.name == "stablehlo.reduce_window"
                else op.operands[0].type.rank - 2)
    pads = parse_padding(attrs.get("padding", ""), pad_rows)
    fills = {(m.operand, m.dim): m for m in masks(op, nest, em.mesh)
             if m.reduction == WINDOW_PAD}
    for halo, axes in halo_axes(nest):
        k = em.mesh.product(axes)
        rows = halo.rows(k)
        for i in halo.operands:
            fill = _pad_value(em, op, i, operands)
            if (i, halo.dim) in fills:  # padded tiles: the padding reads as the pad value
                operands[i] = apply_mask(em, operands[i], fills[(i, halo.dim)], fill)
            if rows.one_hop:
                operands[i] = _exchange(em, operands[i], halo.dim, rows, axes, fill)
            else:
                diagnostics.append(_wide(op, halo.dim, rows, axes, k))
                operands[i] = _gathered_window(em, operands[i], halo.dim, rows, axes, fill)
        pads[halo.pad_row] = [rows.lo, rows.hi]
    if pads:
        attrs["padding"] = format_padding(pads)
    return operands


def lower_padded_scatter(em: Emitter, op: Op, nest: Nest, operands: list[Value],
                         result: TensorType, regions: list[Region], diagnostics: list[Warning]
                         ) -> Value:
    """A padded select_and_scatter (ir/passes/padded_scatter.py) as local pad, select_and_scatter
    and slice. Along a dimension tiled by a halo entry the image arrives with its halos (the
    pad value past the global edges) and the source with its own (zeros past the edges: a
    window there scatters nothing), the pad is already in the extended image, and the slice
    keeps this device's rows."""
    x, source, init, fill = operands
    rank = x.type.rank
    fills = {(m.operand, m.dim): m for m in masks(op, nest, em.mesh)
             if m.reduction == WINDOW_PAD}
    low, high = (parse_i64_array(op.attributes.get(k, "")) or [0] * rank
                 for k in ("edge_padding_low", "edge_padding_high"))
    keep = list(low)
    # Rows of the tile no window reads (a stride longer than the window: the halo is
    # negative) are not in the extended image; the result holds the init value there.
    unread_lo, unread_hi = [0] * rank, [0] * rank
    for halo, axes in halo_axes(nest):
        k = em.mesh.product(axes)
        rows, src = halo.rows(k), halo.source_rows(k)
        zero = em.scalar(0, source.type.element)
        # Padded tiles: the image's padding reads as the pad value, the source's scatters 0.
        if (0, halo.dim) in fills:
            x = apply_mask(em, x, fills[(0, halo.dim)], fill)
        if (1, halo.dim) in fills:
            source = apply_mask(em, source, fills[(1, halo.dim)], zero)
        if rows.one_hop and src.one_hop:
            x = _exchange(em, x, halo.dim, rows, axes, fill)
            source = _exchange(em, source, halo.dim, src, axes, zero)
        else:
            diagnostics.append(_wide(op, halo.dim, rows, axes, k))
            x = _gathered_window(em, x, halo.dim, rows, axes, fill)
            source = _gathered_window(em, source, halo.dim, src, axes, zero)
        low[halo.dim] = high[halo.dim] = 0
        keep[halo.dim] = max(0, rows.left)
        unread_lo[halo.dim], unread_hi[halo.dim] = max(0, -rows.left), max(0, -rows.right)
    padded = em.pad(x, low, high, fill)
    attrs = {key: op.attributes[key] for key in WINDOW_ATTRS if key in op.attributes}
    scattered = em.emit("stablehlo.select_and_scatter", [padded, source, init],
                        [padded.type], attrs, regions).results[0]
    if any(unread_lo) or any(unread_hi):
        scattered = em.pad(scattered, unread_lo, unread_hi, init)
    return em.emit("stablehlo.slice", [scattered], [result],
                   {"start_indices": i64_array(keep),
                    "limit_indices": i64_array([s + n for s, n in zip(keep, result.shape)]),
                    "strides": i64_array([1] * rank)}).results[0]


def _wide(op: Op, dim: int, rows: HaloRows, axes, k: int) -> HaloWarning:
    return HaloWarning(
        f"{op.name} at {op.where}: its window needs {rows.left} rows before and "
        f"{rows.right} after a tile of {rows.n} along dimension {dim} (tiled {k} ways over "
        f"{', '.join(axes)}), more than a neighbour holds; gathering that dimension instead "
        f"of a halo exchange")


def gathered_windows(op: Op, have: list[Layout], wanted: tuple[Layout, ...]
                     ) -> list[HaloWarning]:
    """A HaloWarning for each window dimension of `op` that arrives tiled and is gathered
    (`have`, `wanted`: its inputs' layouts as produced and as its nest slices them), with the
    reason no halo entry applied."""
    found = []
    for i, dims in windowed_dims(op).items():
        for d in dims:
            gathered = [a for a in have[i].dims[d] if a not in wanted[i].dims[d]]
            if gathered:
                found.append(HaloWarning(
                    f"{op.name} at {op.where}: dimension {d} of operand {i} arrives tiled "
                    f"over {', '.join(gathered)} but has no halo exchange: "
                    f"{no_halo_reason(op, d)}; gathering it"))
    return found


def _pad_value(em: Emitter, op: Op, i: int, operands: list[Value]) -> Value:
    """The scalar a windowed op pads operand i with: reduce_window's init value, else 0."""
    if op.name == "stablehlo.reduce_window":
        return operands[len(op.operands) // 2 + i]
    return em.scalar(0, operands[i].type.element)


def _boundary(em: Emitter, x: Value, fill: Value, axes, edge: int) -> Value:
    """`x`, or `fill` where this device is the `edge`-th block along `axes` (0 or k-1): the
    halo a device at the global boundary reads is the op's padding."""
    inside = em.device_flag([int(b != edge) for b in em.block_index(axes)])
    return em.where(inside, x, fill)


def _exchange(em: Emitter, x: Value, dim: int, rows: HaloRows, axes, fill: Value) -> Value:
    n = rows.n
    groups = em.mesh.groups(tuple(axes))
    k = len(groups[0])
    pieces = []
    if rows.left > 0:
        send = em.slice(x, dim, n - rows.left, n)
        pairs = [(g[i], g[i + 1]) for g in groups for i in range(k - 1)]
        pieces.append(_boundary(em, em.collective_permute(send, pairs, axes), fill, axes, 0))
    pieces.append(em.slice(x, dim, max(0, -rows.left), n - max(0, -rows.right))
                  if rows.left < 0 or rows.right < 0 else x)
    if rows.right > 0:
        send = em.slice(x, dim, 0, rows.right)
        pairs = [(g[i + 1], g[i]) for g in groups for i in range(k - 1)]
        pieces.append(_boundary(em, em.collective_permute(send, pairs, axes), fill, axes,
                                k - 1))
    return em.concatenate(pieces, dim)


def _gathered_window(em: Emitter, x: Value, dim: int, rows: HaloRows, axes, fill: Value
                     ) -> Value:
    """The extended operand cut from the whole dimension: gathered, padded with `fill` at
    both global ends, and sliced at this device's rows."""
    full = em.all_gather(x, dim, axes)
    rank = len(x.type.shape)
    lo, hi = [0] * rank, [0] * rank
    lo[dim], hi[dim] = rows.left, rows.right
    padded = em.pad(full, lo, hi, fill)
    size = list(x.type.shape)
    size[dim] = rows.n + rows.left + rows.right
    starts = [em.scalar(0, "i32") for _ in range(rank)]
    starts[dim] = em.per_device([b * rows.n for b in em.block_index(axes)])
    return em.dynamic_slice(padded, starts, size)
