"""A window of a tiled dimension, read or written where it falls (`core/rules/masked_window.py`
says when): `dynamic_update_slice` and `dynamic_slice` on a dimension their operand has tiled
and the window covers only partly.

With the window's global start `s` clamped as StableHLO clamps it, a tile that starts at
global row `t0` and has `t` rows sees the window at local offset `off = s - t0`. Each device
touches `w = min(u, t)` rows of its tile at `ls = clamp(off, 0, t - w)` (the tile's part of
the window, wherever the window falls) and lines them up with the window's `u` rows through a
slice of the part padded by as many rows as it may be shifted: a write keeps the update's
rows that fall in its valid rows (not padding) and writes them back in place; a read keeps
the tile's rows that fall in the window and zeroes the others, so the tiles' reads add up to
the window. Both are exact: selects, never arithmetic on the values."""

from __future__ import annotations

from ...core.mesh import Mesh
from ...core.padding import is_padded
from ...core.tmr import Sum
from ...ir.graph import Op, Region, Value
from ...ir.types import TensorType
from ..emitter import Emitter
from ..op_plan import Nest, OpPlan
from .base import LoweringRule, RuleContext

_INDEX = TensorType((), "i64")


class MaskedUpdate(LoweringRule):
    """A dynamic_update_slice whose update is whole on every device, into a tiled dimension:
    each device writes the part of the update in its tile."""

    ops = frozenset({"stablehlo.dynamic_update_slice"})

    def matches(self, op: Op, nest: Nest, plan: OpPlan, mesh: Mesh) -> bool:
        return any(e.operands[0] is not None and e.operands[1] is None for _, e in nest)

    def emit(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str],
             regions: list[Region]) -> list[Value] | None:
        em = ctx.em
        x, update = operands[0], operands[1]
        full, part = ctx.op.operands[0].type.shape, ctx.op.operands[1].type.shape
        tiles = _Tiles(ctx, x, operands[2:], full, part, ctx.produced[0].dims,
                       local=update.type)
        shape = tuple(tiles.window)
        # Row j of the tile's part is update row j + ls - off (the update padded by w rows).
        padded = em.pad(update, tiles.pad, tiles.pad)
        piece = em.dynamic_slice(padded, [_add(em, _sub(em, tiles.ls[d], tiles.off[d]),
                                         em.scalar(tiles.pad[d], "i64"))
                                    if tiles.partly(d) else em.scalar(0, "i64")
                                    for d in range(len(full))], shape)
        old = em.dynamic_slice(x, tiles.at, shape)
        keep = tiles.mask(shape, tile_row=tiles.ls, update_row={
            d: _sub(em, tiles.ls[d], tiles.off[d]) for d in tiles.ls})
        new = em.emit("stablehlo.select", [keep, piece, old], [old.type]).results[0]
        return em.emit("stablehlo.dynamic_update_slice", [x, new, *tiles.at],
                       [x.type]).results


class MaskedSlice(LoweringRule):
    """A dynamic_slice of a tiled dimension that its result takes partly (a Sum entry): each
    device reads its tile's rows of the window, zeros for the others."""

    ops = frozenset({"stablehlo.dynamic_slice"})

    def matches(self, op: Op, nest: Nest, plan: OpPlan, mesh: Mesh) -> bool:
        return any(isinstance(e.results[0], Sum) for _, e in nest)

    def emit(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str],
             regions: list[Region]) -> list[Value] | None:
        em = ctx.em
        x = operands[0]
        full, size = ctx.op.operands[0].type.shape, ctx.op.results[0].type.shape
        summed = {e.operands[0] for _, e in ctx.nest if isinstance(e.results[0], Sum)}
        dims = tuple(axes if d in summed else () for d, axes
                     in enumerate(ctx.plan.wanted[0].dims))
        tiles = _Tiles(ctx, x, operands[1:], full, size, dims, local=ctx.plan.result_types[0])
        part = em.dynamic_slice(x, tiles.at, tiles.window)
        out_t = ctx.plan.result_types[0]
        # Window row j is the part's row j + off - ls (the part padded by u rows).
        rows = [size[d] if tiles.partly(d) else 0 for d in range(len(full))]
        padded = em.pad(part, rows, rows)
        lined = em.dynamic_slice(padded, [_add(em, _sub(em, tiles.off[d], tiles.ls[d]),
                                         em.scalar(size[d], "i64"))
                                    if tiles.partly(d) else em.scalar(0, "i64")
                                    for d in range(len(full))], out_t.shape)
        keep = tiles.mask(out_t.shape, tile_row=tiles.off)
        return [em.emit("stablehlo.select", [keep, lined, em.splat(0, out_t)],
                        [out_t]).results[0]]


class _Tiles:
    """Where a window of `part` rows (per dimension) starting at the traced `starts` falls in
    this device's tile of an operand of `full` rows, tiled over `dims` (axes per dimension)
    where the window covers it only partly; `local`: the window's local type (the update's,
    the result's), whose other dimensions the window keeps."""

    def __init__(self, ctx: RuleContext, x: Value, starts: list[Value], full, part, dims,
                 local: TensorType) -> None:
        em, self.em, self.ctx = ctx.em, ctx.em, ctx
        self.full, self.part, self.dims = full, part, dims
        self.window = list(local.shape)
        self.pad = [0] * len(full)
        self.at: list[Value] = []  # where the tile's part of the window starts, per dim
        # Per partly tiled dimension: the window's start relative to the tile's (`off`, may
        # fall outside it) and where the tile's part of it starts (`ls`, inside it).
        self.ls: dict[int, Value] = {}
        self.off: dict[int, Value] = {}
        for d, start in enumerate(starts):
            s = _clamp(em, _index(em, start), 0, full[d] - part[d])
            if not self.partly(d):  # untiled, or taken whole (s is then 0)
                self.at.append(s)
                continue
            t = x.type.shape[d]
            w = self.window[d] = self.pad[d] = min(part[d], t)
            self.off[d] = em.from_tile_start(s, full[d], dims[d])
            self.ls[d] = _clamp(em, self.off[d], 0, t - w)
            self.at.append(self.ls[d])
        self.rows_in_tile = {d: x.type.shape[d] for d in self.off}

    def partly(self, d: int) -> bool:
        return bool(self.dims[d]) and self.part[d] < self.full[d]

    def mask(self, shape, tile_row: dict[int, Value],
             update_row: dict[int, Value] | None = None) -> Value:
        """i1 of `shape`, true where, in every partly tiled dimension d, row j's tile row
        `j + tile_row[d]` is a valid row of this tile and (a write) its update row
        `j + update_row[d]` is a row of the update."""
        em = self.em
        rows_t = TensorType(tuple(shape), "i64")
        keep: Value | None = None
        for d in self.off:
            rows = em.emit("stablehlo.iota", [], [rows_t],
                           {"iota_dimension": f"{d} : i64"}).results[0]
            bounds = [(tile_row, self._valid(d, rows_t))]
            if update_row is not None:
                bounds.append((update_row, em.splat(self.part[d], rows_t)))
            for offset, limit in bounds:
                row = _add(em, rows, em.broadcast(offset[d], rows_t))
                for c in (em.compare(row, em.splat(0, rows_t), "GE"),
                          em.compare(row, limit, "LT")):
                    keep = c if keep is None else em.emit("stablehlo.and", [keep, c],
                                                          [c.type]).results[0]
        assert keep is not None, "matched without a partly covered tiled dimension"
        return keep

    def _valid(self, d: int, rows_t: TensorType) -> Value:
        """This tile's valid rows on `d` (its extent, or fewer where tiling pads)."""
        em, axes = self.em, self.dims[d]
        if not is_padded(self.full[d], [self.ctx.mesh.axis_size(a) for a in axes]):
            return em.splat(self.rows_in_tile[d], rows_t)
        return em.broadcast(_index(em, em.per_device(em.tile_valid(self.full[d], axes))),
                            rows_t)


def _index(em: Emitter, v: Value) -> Value:
    """A scalar start index as i64 (starts may be any integer type; an offset may be < 0)."""
    if v.type.element == "i64":
        return v
    return em.emit("stablehlo.convert", [v], [_INDEX]).results[0]


def _add(em: Emitter, a: Value, b: Value) -> Value:
    return em.emit("stablehlo.add", [a, b], [a.type]).results[0]


def _sub(em: Emitter, a: Value, b: Value) -> Value:
    return em.emit("stablehlo.subtract", [a, b], [a.type]).results[0]


def _clamp(em: Emitter, v: Value, low: int, high: int) -> Value:
    return em.emit("stablehlo.clamp", [em.scalar(low, "i64"), v, em.scalar(high, "i64")],
                   [_INDEX]).results[0]
