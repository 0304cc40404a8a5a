"""The device-local program builder: appends ops to a block and knows how to emit each
collective over mesh axes (as jax's shard_map writes them) and the local helpers the lowering
rules share (per-device tables, padded tiles' bounds, slices, selects)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ..core.mesh import Mesh
from ..core.padding import tile_bounds
from ..ir.attributes import i64_array
from ..ir.graph import Block, Op, Region, Value
from ..ir.opsets import Reduction
from ..ir.types import TensorType
from .collectives import mark

if TYPE_CHECKING:
    from .redistribution import RedistributionPlan

_I32 = TensorType((), "i32")

# Collectives are written as jax's shard_map writes them, so the program embeds in a jax
# SPMD computation: cross-partition groups of global device ids (our mesh positions, which
# are jax's partition ids), and a channel on every collective. The handle is a placeholder:
# `runtime.embed` numbers channels afresh where the module is merged into a jax program.
# Without the channel XLA reads the groups as replica ids and, with one replica, gives wrong
# numbers; the tests check every collective carries one.
_CHANNEL = {"channel_handle": "#stablehlo.channel_handle<handle = 1, type = 1>"}


def _groups_attr(groups: list[list[int]]) -> str:
    body = ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups)
    return f"dense<[{body}]> : tensor<{len(groups)}x{len(groups[0])}xi64>"


def _grouped(groups: list[list[int]]) -> dict[str, str]:
    """all_reduce / all_gather / reduce_scatter attributes: groups of global device ids."""
    return {"replica_groups": _groups_attr(groups), **_CHANNEL, "use_global_device_ids": "unit"}


@functools.lru_cache(maxsize=4096)
def _block_index(mesh: Mesh, axes: tuple[str, ...]) -> tuple[int, ...]:
    # Every all_slice asks this, and a program slices over few distinct axes: memoised.
    out = []
    for r in range(mesh.size):
        i = 0
        for a in axes:
            i = i * mesh.axis_size(a) + mesh.coord(r, a)
        out.append(i)
    return tuple(out)


# The integer type a float max/min all-reduce runs on (`Emitter._ordered`).
_ORDERED_INT = {"f64": "i64", "f32": "i32", "bf16": "i16", "f16": "i16"}


class Emitter:
    """Appends device-local ops to a block; knows how to emit each collective."""

    def __init__(self, mesh: Mesh, block: Block):
        self.mesh = mesh
        self.block = block
        self._device: Value | None = None
        self.plans: list[RedistributionPlan] = []  # emitted by `convert`, in order
        # The op of the partitioned program whose code is being emitted: every emitted op
        # keeps its location (profiles name the user's op and line) and has it as `origin`
        # until a conversion marks its collectives (`provenance.mark_origin`).
        self.serving: Op | None = None

    def emit(self, name: str, operands: list[Value], result_types, attrs: dict | None = None,
             regions: list[Region] | None = None) -> Op:
        op = Op(name, operands, result_types, attrs, regions)
        serving = self.serving
        if serving is not None:
            op.mlir_location, op.origin = serving.mlir_location, serving
        self.block.ops.append(op)
        return op

    def constant_i32(self, values: list[int]) -> Value:
        body = ", ".join(map(str, values))
        t = TensorType((len(values),), "i32")
        return self.emit("stablehlo.constant", [], [t],
                         {"value": f"dense<[{body}]> : {t}"}).results[0]

    def scalar(self, n: int | float, element: str) -> Value:
        if element == "i1":
            return self.literal("true" if n else "false", element)
        if element.startswith("complex"):
            return self.literal(f"({float(n):e},0.000000e+00)", element)
        return self.literal(f"{float(n):e}" if element.startswith(("f", "bf")) else str(int(n)),
                            element)

    def literal(self, text: str, element: str) -> Value:
        """A scalar constant spelled `text` (a dense attribute's body: a number, a hex bit
        pattern for an infinity, true/false)."""
        t = TensorType((), element)
        return self.emit("stablehlo.constant", [], [t],
                         {"value": f"dense<{text}> : {t}"}).results[0]

    def broadcast(self, scalar: Value, to: TensorType, dims: list[int] | None = None) -> Value:
        """`scalar` (or a lower-rank value along `dims`) broadcast to type `to`."""
        return self.emit("stablehlo.broadcast_in_dim", [scalar], [to],
                         {"broadcast_dimensions": i64_array(dims or [])}).results[0]

    def splat(self, n: int | float, to: TensorType) -> Value:
        """A tensor of type `to` filled with `n`."""
        return self.broadcast(self.scalar(n, to.element), to)

    def device(self) -> Value:
        """This device's mesh position as i32: its partition id (never `replica_id`, which
        is 0 on every device of an SPMD program)."""
        if self._device is None:
            pid = self.emit("stablehlo.partition_id", [], [TensorType((), "ui32")]).results[0]
            self._device = self.emit("stablehlo.convert", [pid], [_I32]).results[0]
        return self._device

    def per_device(self, values: list[int]) -> Value:
        """A scalar i32 holding `values[partition_id]` on each device."""
        table = self.constant_i32(values)
        one = self.emit("stablehlo.dynamic_slice", [table, self.device()],
                        [TensorType((1,), "i32")], {"slice_sizes": i64_array([1])}).results[0]
        return self.emit("stablehlo.reshape", [one], [_I32]).results[0]

    def tile_starts(self, n: int, axes: tuple[str, ...]) -> list[int]:
        """Per replica, where its tile of a dimension of size `n` tiled over `axes` starts
        (with padded tiles, `core/padding.py`, not simply block index x tile extent)."""
        return [start for start, _ in self._tile_bounds(n, axes)]

    def tile_valid(self, n: int, axes: tuple[str, ...]) -> list[int]:
        """Per replica, how many rows of its tile are valid (the rest is padding). Over two
        axes a tile may be all padding and start where its neighbour's valid rows start."""
        return [valid for _, valid in self._tile_bounds(n, axes)]

    def _tile_bounds(self, n: int, axes: tuple[str, ...]) -> list[tuple[int, int]]:
        sizes = [self.mesh.axis_size(a) for a in axes]
        return [tile_bounds(n, sizes, [self.mesh.coord(r, a) for a in axes])
                for r in range(self.mesh.size)]

    def pad_to(self, x: Value, dim: int, extent: int) -> Value:
        """`x` padded on the right of `dim` to `extent` rows (zeros: padding's contents are
        unspecified, `core/padding.py`)."""
        if x.type.shape[dim] == extent:
            return x
        high = [0] * x.type.rank
        high[dim] = extent - x.type.shape[dim]
        return self.pad(x, [0] * x.type.rank, high)

    def pad(self, x: Value, low: list[int], high: list[int], fill: Value | None = None
            ) -> Value:
        """`x` with `low[d]` rows before and `high[d]` after each dimension d, of the scalar
        `fill` (None: zeros)."""
        fill = self.scalar(0, x.type.element) if fill is None else fill
        shape = tuple(n + lo + hi for n, lo, hi in zip(x.type.shape, low, high))
        return self.emit("stablehlo.pad", [x, fill], [x.type.with_shape(shape)],
                         {"edge_padding_low": i64_array(low),
                          "edge_padding_high": i64_array(high),
                          "interior_padding": i64_array([0] * x.type.rank)}).results[0]

    def dynamic_slice(self, x: Value, starts: list[Value], shape) -> Value:
        """The `shape` block of the local `x` at the traced (scalar) `starts`."""
        return self.emit("stablehlo.dynamic_slice", [x, *starts],
                         [x.type.with_shape(tuple(shape))],
                         {"slice_sizes": i64_array(list(shape))}).results[0]

    def from_tile_start(self, x: Value, n: int, axes: tuple[str, ...]) -> Value:
        """Global positions `x` (integers) made relative to this device's tile of a dimension
        of size `n` tiled over `axes` (negative or past the tile where they fall outside)."""
        start = self.emit("stablehlo.convert", [self.per_device(self.tile_starts(n, axes))],
                          [TensorType((), x.type.element)]).results[0]
        if x.type.shape:
            start = self.broadcast(start, x.type)
        return self.emit("stablehlo.subtract", [x, start], [x.type]).results[0]

    def trim_to(self, x: Value, dim: int, extent: int) -> Value:
        """The first `extent` rows of `dim` (a gathered padded tile cut to its parent's)."""
        return x if x.type.shape[dim] == extent else self.slice(x, dim, 0, extent)

    def block_index(self, axes: tuple[str, ...]) -> list[int]:
        """Per replica, its block index along `axes` (first axis major)."""
        return list(_block_index(self.mesh, tuple(axes)))

    def reducer(self, kind: str, element: str) -> Region:
        scalar = TensorType((), element)
        b = Block()
        x, y = b.add_arg(scalar), b.add_arg(scalar)
        op = Op(Reduction(kind).op_name, [x, y], [scalar])
        b.ops += [op, Op("stablehlo.return", [op.results[0]], [])]
        return Region([b])

    def all_reduce(self, x: Value, axes, kind: str) -> Value:
        if kind in ("max", "min") and x.type.element in _ORDERED_INT:
            return self._ordered(x, kind, lambda key: self.all_reduce(key, axes, kind))
        if not Reduction(kind).all_reducible(x.type.element):
            return self._gathered_reduce(x, axes, kind)
        op = self.emit("stablehlo.all_reduce", [x], [x.type],
                       _grouped(self.mesh.groups(tuple(axes))),
                       [self.reducer(kind, x.type.element)])
        return mark(op, "all_reduce", axes).results[0]

    def _gathered_reduce(self, x: Value, axes, kind: str) -> Value:
        """A reduction no collective computes (bitwise and/or of integers: XLA's all-reduce
        refuses them), as an all_gather of the partials along a new leading dimension and a
        local reduce over it: the group's bytes on every device instead of one partial."""
        stacked = self.stacked_partials(x, axes)
        identity = self.literal(Reduction(kind).identity_literal(x.type.element),
                                x.type.element)
        return self.emit("stablehlo.reduce", [stacked, identity], [x.type],
                         {"dimensions": i64_array([0])}, [self.reducer(kind, x.type.element)]
                         ).results[0]

    def stacked_partials(self, x: Value, axes) -> Value:
        """Every device's `x` over `axes`, stacked along a new leading dimension (group
        order), for a reduction over it that no collective computes."""
        one = self.emit("stablehlo.reshape", [x], [x.type.with_shape((1, *x.type.shape))]
                        ).results[0]
        return self.all_gather(one, 0, axes)

    def _ordered(self, x: Value, kind: str, reduce) -> Value:
        """A max or min collective (`reduce`) of floats, run on integers that order like
        them. XLA's float max/min all-reduce drops NaN (on CPU `max(0, nan)` gives 0 across
        devices, where a `maximum` op and the unpartitioned program give NaN). The float's
        bits with the non-sign bits of negatives flipped order as the floats do, so an
        integer max/min is exact, and NaN becomes the extreme that wins (NaN propagates, as
        in `stablehlo.maximum`). Elementwise work on each side; the collective is the same."""
        bits_t = TensorType(x.type.shape, _ORDERED_INT[x.type.element])
        width = int(bits_t.element[1:])

        def ordered(bits: Value) -> Value:  # its own inverse
            flip = self.splat(2 ** (width - 1) - 1, bits.type)
            flipped = self.emit("stablehlo.xor", [bits, flip], [bits.type]).results[0]
            negative = self.compare(bits, self.splat(0, bits.type), "LT")
            return self.emit("stablehlo.select", [negative, flipped, bits],
                             [bits.type]).results[0]

        key = ordered(self.emit("stablehlo.bitcast_convert", [x], [bits_t]).results[0])
        extreme = 2 ** (width - 1) - 1 if kind == "max" else -2 ** (width - 1)
        key = self.emit("stablehlo.select", [self.compare(x, x, "NE"),
                                             self.splat(extreme, bits_t), key],
                        [bits_t]).results[0]
        reduced = reduce(key)
        back = TensorType(reduced.type.shape, x.type.element)
        return self.emit("stablehlo.bitcast_convert", [ordered(reduced)], [back]).results[0]

    def reduce_scatter(self, x: Value, dim: int, axes, kind: str) -> Value:
        if kind in ("max", "min") and x.type.element in _ORDERED_INT:
            return self._ordered(x, kind, lambda key: self.reduce_scatter(key, dim, axes, kind))
        shape = list(x.type.shape)
        shape[dim] //= self.mesh.product(axes)
        op = self.emit("stablehlo.reduce_scatter", [x], [x.type.with_shape(tuple(shape))],
                       {"scatter_dimension": f"{dim} : i64",
                        **_grouped(self.mesh.groups(tuple(axes)))},
                       [self.reducer(kind, x.type.element)])
        return mark(op, "reduce_scatter", axes).results[0]

    def all_gather(self, x: Value, dim: int, axes) -> Value:
        return self.all_gather_groups(x, dim, self.mesh.groups(tuple(axes)), axes)

    def all_gather_groups(self, x: Value, dim: int, groups: list[list[int]], axes) -> Value:
        """Concatenate the tiles of each group's members along `dim`, in group order.

        Unit dimensions before `dim` are dropped around the collective (reshapes XLA turns
        into bitcasts): XLA:CPU gives an all-gather on an inner dimension a layout with that
        dimension major and copies it back (the Flax transformer's norm scales, gathered as
        `[1, 1, d]` under Z3: 27 copies that jax.jit's program does not have)."""
        if dim and all(n == 1 for n in x.type.shape[:dim]):
            flat = self.emit("stablehlo.reshape", [x],
                             [x.type.with_shape(x.type.shape[dim:])]).results[0]
            full = self.all_gather_groups(flat, 0, groups, axes)
            return self.emit("stablehlo.reshape", [full],
                             [x.type.with_shape((1,) * dim + full.type.shape)]).results[0]
        shape = list(x.type.shape)
        shape[dim] *= len(groups[0])
        op = self.emit("stablehlo.all_gather", [x], [x.type.with_shape(tuple(shape))],
                       {"all_gather_dim": f"{dim} : i64", **_grouped(groups)})
        return mark(op, "all_gather", axes).results[0]

    def all_to_all(self, x: Value, split_dim: int, concat_dim: int, axes) -> Value:
        return self.all_to_all_groups(x, split_dim, concat_dim,
                                      self.mesh.groups(tuple(axes)), axes)

    def all_to_all_groups(self, x: Value, split_dim: int, concat_dim: int,
                          groups: list[list[int]], axes) -> Value:
        """Split `split_dim` into one chunk per group member, chunk k to member k, and
        concatenate the received chunks along `concat_dim` in member order."""
        k = len(groups[0])
        shape = list(x.type.shape)
        shape[split_dim] //= k
        shape[concat_dim] *= k
        op = self.emit("stablehlo.all_to_all", [x], [x.type.with_shape(tuple(shape))],
                       {"split_dimension": f"{split_dim} : i64",
                        "concat_dimension": f"{concat_dim} : i64",
                        "split_count": f"{k} : i64",
                        "replica_groups": _groups_attr(groups), **_CHANNEL})
        return mark(op, "all_to_all", axes).results[0]

    def all_slice(self, x: Value, new_axes: dict[int, tuple[str, ...]]) -> Value:
        """Keep this device's block: dimension d is split further by `new_axes[d]`."""
        blocks = {d: (self.mesh.product(axes), self.block_index(axes))
                  for d, axes in new_axes.items() if axes}
        return self.slice_blocks(x, blocks, [a for d in sorted(new_axes) for a in new_axes[d]])

    def all_slice_blocks(self, x: Value, dim: int, num_blocks: int, block_index: list[int],
                         axes) -> Value:
        """Split `dim` into `num_blocks`; replica r keeps block `block_index[r]`."""
        return self.slice_blocks(x, {dim: (num_blocks, list(block_index))}, axes)

    def slice_blocks(self, x: Value, blocks: dict[int, tuple[int, list[int]]], axes) -> Value:
        """The all_slice emitter: one local dynamic_slice where dimension d is cut into
        `blocks[d][0]` blocks and replica r keeps block `blocks[d][1][r]`."""
        shape = list(x.type.shape)
        starts = []
        for d in range(len(shape)):
            if d not in blocks:
                starts.append(self.scalar(0, "i32"))
                continue
            num_blocks, index = blocks[d]
            shape[d] //= num_blocks
            starts.append(self.per_device([i * shape[d] for i in index]))
        op = self.emit("stablehlo.dynamic_slice", [x, *starts], [x.type.with_shape(tuple(shape))],
                       {"slice_sizes": i64_array(shape)})
        return mark(op, "all_slice", axes).results[0]

    def slice(self, x: Value, dim: int, start: int, stop: int) -> Value:
        """Rows `[start, stop)` of dimension `dim` of the local `x`."""
        shape = list(x.type.shape)
        starts, limits = [0] * len(shape), list(shape)
        starts[dim], limits[dim] = start, stop
        shape[dim] = stop - start
        return self.emit("stablehlo.slice", [x], [x.type.with_shape(tuple(shape))],
                         {"start_indices": i64_array(starts), "limit_indices": i64_array(limits),
                          "strides": i64_array([1] * len(shape))}).results[0]

    def concatenate(self, parts: list[Value], dim: int) -> Value:
        if len(parts) == 1:
            return parts[0]
        shape = list(parts[0].type.shape)
        shape[dim] = sum(p.type.shape[dim] for p in parts)
        return self.emit("stablehlo.concatenate", parts,
                         [parts[0].type.with_shape(tuple(shape))],
                         {"dimension": f"{dim} : i64"}).results[0]

    def compare(self, x: Value, y: Value, direction: str) -> Value:
        """`x <direction> y` elementwise (EQ, LT, GE, ...), as i1."""
        return self.emit("stablehlo.compare", [x, y], [TensorType(x.type.shape, "i1")],
                         {"comparison_direction":
                          f"#stablehlo<comparison_direction {direction}>"}).results[0]

    def device_flag(self, flags: list[int]) -> Value:
        """A scalar i1: `flags[partition_id]` on each device."""
        return self.compare(self.per_device(flags), self.scalar(1, "i32"), "EQ")

    def where(self, keep: Value, x: Value, fill: Value) -> Value:
        """`x` where `keep` (a scalar, or i1 of x's shape) holds, else the scalar `fill`: how
        the lowering overwrites what must not be read (a halo past the global edge, padding,
        the copies of a value turned into a partial sum). A `select`, never a multiply, so
        NaN or inf in the overwritten part cannot leak."""
        if keep.type.shape != x.type.shape:
            keep = self.broadcast(keep, TensorType(x.type.shape, "i1"))
        return self.emit("stablehlo.select", [keep, x, self.broadcast(fill, x.type)],
                         [x.type]).results[0]

    def keep_on_first(self, x: Value, axes: tuple[str, ...]) -> Value:
        """`x` on the devices at block 0 along `axes`, zeros elsewhere: a full value turned
        into a partial sum over `axes`."""
        first = self.device_flag([int(i == 0) for i in self.block_index(axes)])
        return self.where(first, x, self.scalar(0, x.type.element))

    def collective_permute(self, x: Value, pairs, axes) -> Value:
        """Replica s sends its tile to t for every (s, t) in `pairs`."""
        body = ", ".join(f"[{s}, {t}]" for s, t in pairs)
        op = self.emit("stablehlo.collective_permute", [x], [x.type],
                       {"source_target_pairs": f"dense<[{body}]> : tensor<{len(pairs)}x2xi64>",
                        **_CHANNEL})
        return mark(op, "all_permute", axes).results[0]

