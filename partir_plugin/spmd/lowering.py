"""Lowering PartIR:Core to PartIR:HLO (paper 1 §6.1): device-local ops plus collectives.

Every op gets local shapes from its loop nest. At each edge where the producer's layout
differs from what the consumer's nest slices, `convert` inserts collectives over mesh axes:
sum→full all_reduce, sum→tile reduce_scatter, tile→full all_gather, tile d→tile d' all_to_all,
full→tile all_slice (a local dynamic_slice at the device's block). Because each conversion goes
straight from the produced layout to the consumed one, `all_slice(all_gather)` and
`all_slice(all_reduce)` never materialise: they are fused as the paper says.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from ..core.mesh import Mesh
from ..core.padding import ceil_div, is_padded, local_extent, tile_bounds
from ..core.rules.embedding import lookup_dim, offset_dims, scatter_dim, update_window_dims
from ..core.state import PartitionState
from ..core.tmr import OWN_REDUCER, Sum, pending_sums
from ..ir.attributes import i64_array, parse_i64_array, parse_scalar
from ..ir.dialect import INTERLEAVE_OP, PADDED_SCATTER_OP, ROLL_OP
from ..ir.graph import Block, Func, Op, Region, Value, clone_region, walk
from ..ir.opsets import (
    PARTITIONED_REGIONS,
    PENDING_SUM_CHAIN,
    RELAYOUT_OPS,
    UNHALOED_OPS,
    WINDOWED_OPS,
    Reduction,
)
from ..ir.printer import print_func
from ..ir.types import TensorType
from .accumulation import LINEAR_OPERANDS, PendingSums, linear_operands
from .boundary import BoundaryDrop, at_boundary
from .collectives import Collective, count_collectives, mark
from .dynamic_slice import clamped_starts
from .halo import extend_operands, lower_padded_scatter, warn_gathered
from .interleave import lower_interleave
from .layout import Layout
from .masking import WINDOW_PAD, Mask, apply_mask, drop_index_hints, masks
from .own_reducer import combine_partials, local_operands, own_identity
from .provenance import Conversion, Movement, mark_origin
from .rotation import lower_roll
from .scan import lower_scan, scan_axes
from .scatter_exchange import exchange_axes

_I32 = TensorType((), "i32")


@dataclass
class SpmdProgram:
    """A device-local program: what runs on every device of the mesh."""

    func: Func
    mesh: Mesh
    in_layouts: list[Layout]
    out_layouts: list[Layout]
    counts: dict[str, int] = field(default_factory=dict)
    # Arguments and results whose sub-axes the boundary could not name (`boundary.py`).
    boundary_drops: list[BoundaryDrop] = field(default_factory=list)
    # Collectives printed under a name saying what they are and why (`collective_names.py`;
    # set before the text is first printed).
    op_names: dict[Op, str] = field(default_factory=dict, repr=False, compare=False)
    _text: str | None = field(default=None, repr=False, compare=False)

    def text(self) -> str:
        """The module's text, printed on first use: tactics' reports need none, and the
        runtime and the metadata ask for the same text."""
        if self._text is None:
            self._text = print_func(self.func, module_attrs=spmd_module_attrs(self.mesh),
                                    op_names=self.op_names)
        return self._text


def spmd_module_attrs(mesh: Mesh) -> str:
    """A device-local module runs once per partition (device) of an SPMD program, as a
    `shard_map` body does: one replica, `mesh.size` partitions."""
    return f"mhlo.num_partitions = {mesh.size} : i32, mhlo.num_replicas = 1 : i32"


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


# The integer type a float max/min all-reduce runs on (`_Emitter._all_reduce_ordered`).
_ORDERED_INT = {"f64": "i64", "f32": "i32", "bf16": "i16", "f16": "i16"}


class _Emitter:
    """Appends device-local ops to a block; knows how to emit each collective."""

    def __init__(self, mesh: Mesh, block: Block):
        self.mesh = mesh
        self.block = block
        self._device: Value | None = None
        self.plans: list = []  # redistribution plans emitted by `convert`, in order
        # The op of the partitioned program whose code is being emitted: every emitted op
        # keeps its location (profiles name the user's op and line) and has it as `origin`
        # until a conversion marks its collectives (`provenance.mark_origin`).
        self.serving: Op | None = None

    def emit(self, name, operands, result_types, attrs=None, regions=None) -> Op:
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
        rank = x.type.rank
        high = [0] * rank
        high[dim] = extent - x.type.shape[dim]
        shape = list(x.type.shape)
        shape[dim] = extent
        return self.emit("stablehlo.pad", [x, self.scalar(0, x.type.element)],
                         [x.type.with_shape(tuple(shape))],
                         {"edge_padding_low": i64_array([0] * rank),
                          "edge_padding_high": i64_array(high),
                          "interior_padding": i64_array([0] * rank)}).results[0]

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
        op = self.emit("stablehlo.all_reduce", [x], [x.type],
                       _grouped(self.mesh.groups(tuple(axes))),
                       [self.reducer(kind, x.type.element)])
        return mark(op, "all_reduce", axes).results[0]

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


def emit_plan(em: _Emitter, x: Value, plan) -> Value:
    """Apply the steps of a `RedistributionPlan` to the local value `x` (its source tile)."""
    from .redistribution import AllGather, AllPermute, AllSlice, AllToAll

    for step in plan.steps:
        if isinstance(step, AllGather):
            x = em.all_gather_groups(x, step.dim, step.groups, step.axes)
        elif isinstance(step, AllToAll):
            x = em.all_to_all_groups(x, step.split_dim, step.concat_dim, step.groups, step.axes)
        elif isinstance(step, AllSlice):
            x = em.all_slice_blocks(x, step.dim, step.num_blocks, step.block_index, step.axes)
        else:
            assert isinstance(step, AllPermute), step
            x = em.collective_permute(x, step.pairs, step.axes)
        assert x.type.shape == tuple(step.out_local_shape), (step, x.type)
    return x


def convert(em: _Emitter, x: Value, src: Layout, dst: Layout, scatter_sums: bool = True,
            shape: tuple[int, ...] | None = None) -> Value:
    """Collectives taking local `x` from layout `src` to `dst`.

    A `dst` with pending sums (a loop's accumulator, `accumulation.py`) is reached from the
    full value kept on one device of each group and zeros elsewhere (the sum is the value).
    `scatter_sums=False` all-reduces a pending sum the target tiles further and slices it locally
    (`PartitionState.scatter_sums`). `shape` is the value's global shape: where either layout
    pads a dimension, the conversion goes one axis at a time (`_convert_padded`)."""
    if src == dst or not x.type.is_tensor:
        return x
    if dst.partial:
        assert not dst.axes() & {a for a, _ in dst.partial}, dst  # tiled and summed: no value
        x = convert(em, x, src, Layout(dst.dims), scatter_sums, shape)
        return em.keep_on_first(x, tuple(a for a, _ in dst.partial))
    rank = len(src.dims)
    dims = list(src.dims)
    padded = shape is not None and bool(src.padded(shape, em.mesh) or dst.padded(shape, em.mesh))
    # 1. Pending sums: reduce_scatter where the target tiles a dimension further with
    # some of the summed axes, all_reduce for the rest.
    kinds: dict[str, list[str]] = {}
    for axis, kind in src.partial:
        kinds.setdefault(kind, []).append(axis)
    for kind, axes in kinds.items():
        scatter = None
        for d in range(rank if scatter_sums and not padded else 0):
            have, want = dims[d], dst.dims[d]
            if len(want) > len(have) and want[: len(have)] == have:
                extra = want[len(have):]
                if all(a in axes for a in extra):
                    scatter = (d, extra)
                    break
        rest = [a for a in axes if scatter is None or a not in scatter[1]]
        if rest:
            x = em.all_reduce(x, rest, kind)
        if scatter is not None:
            x = em.reduce_scatter(x, scatter[0], scatter[1], kind)
            dims[scatter[0]] = dims[scatter[0]] + scatter[1]
    # 2.-4. One collective per dimension with a prefix relation (all_to_all, all_gather,
    # all_slice); anything else (axes reordered within a dimension, several axes moving,
    # an axis entering a non-minor position, or a sequence exceeding the memory bound) is a
    # redistribution problem for the planner (DESIGN.md §2.3-2.4).
    if padded:
        return _convert_padded(em, x, dims, dst.dims, shape)
    simple = _simple_steps(dims, dst.dims)
    if not _is_simple(em.mesh, dims, dst.dims, simple):
        plan = _plan_edge(em.mesh, x.type, dims, dst.dims)
        if plan is not None:
            em.plans.append(plan)
            return emit_plan(em, x, plan)
    for step in simple:
        if step[0] == Collective.ALL_TO_ALL:
            x = em.all_to_all(x, split_dim=step[1], concat_dim=step[2], axes=step[3])
        elif step[0] == Collective.ALL_GATHER:
            x = em.all_gather(x, step[1], step[2])
        else:
            x = em.all_slice(x, step[1])
    return x


def _convert_padded(em: _Emitter, x: Value, dims: list[tuple[str, ...]], want, shape
                    ) -> Value:
    """The direct conversion where a dimension is padded, one axis at a time: a gathered
    axis concatenates its padded tiles into the parent tile's extent plus padding, trimmed
    back; a sliced axis first pads its dimension to a multiple of the axis. (The planner's
    plans assume even tiles: not used here.)"""
    dims = list(dims)

    def extent(d: int) -> int:
        return local_extent(shape[d], [em.mesh.axis_size(a) for a in dims[d]])

    def split(x: Value, d: int, axis: str) -> Value:
        k = em.mesh.axis_size(axis)
        return em.pad_to(x, d, ceil_div(x.type.shape[d], k) * k)

    for step in _simple_steps(dims, want):
        if step[0] == Collective.ALL_TO_ALL:
            split_dim, concat_dim, (axis,) = step[1], step[2], step[3]
            x = em.all_to_all(split(x, split_dim, axis), split_dim, concat_dim, (axis,))
            dims[concat_dim], dims[split_dim] = dims[concat_dim][:-1], dims[split_dim] + (axis,)
            x = em.trim_to(x, concat_dim, extent(concat_dim))
        elif step[0] == Collective.ALL_GATHER:
            d, axes = step[1], step[2]
            if not is_padded(shape[d], [em.mesh.axis_size(a) for a in dims[d]]):
                x = em.all_gather(x, d, axes)
                dims[d] = dims[d][: len(dims[d]) - len(axes)]
                continue
            for axis in reversed(axes):  # minor first: each gather yields the parent tile
                x = em.all_gather(x, d, (axis,))
                dims[d] = dims[d][:-1]
                x = em.trim_to(x, d, extent(d))
        else:
            for d, axes in sorted(step[1].items()):
                for axis in axes:
                    x = em.all_slice(split(x, d, axis), {d: (axis,)})
                    dims[d] = dims[d] + (axis,)
    return x


def _simple_steps(dims, want) -> list[tuple]:
    """The direct conversion of tilings `dims` to `want` (no partial sums), as steps
    ("all_to_all", split_dim, concat_dim, axes) / ("all_gather", dim, axes) /
    ("all_slice", {dim: axes})."""
    rank = len(dims)
    dims = list(dims)
    steps: list[tuple] = []
    # An axis leaving the minor end of one dimension for the minor end of another: all_to_all.
    moved = True
    while moved:
        moved = False
        for d1 in range(rank):
            if not dims[d1] or want[d1][: len(dims[d1])] == dims[d1]:
                continue
            axis = dims[d1][-1]
            for d2 in range(rank):
                if d2 != d1 and want[d2][: len(dims[d2]) + 1] == dims[d2] + (axis,):
                    steps.append((Collective.ALL_TO_ALL, d2, d1, (axis,)))
                    dims[d1], dims[d2] = dims[d1][:-1], dims[d2] + (axis,)
                    moved = True
                    break
            if moved:
                break
    # Gather what the target does not keep, minor axes first.
    for d in range(rank):
        keep = 0
        while keep < len(dims[d]) and keep < len(want[d]) and dims[d][keep] == want[d][keep]:
            keep += 1
        if keep < len(dims[d]):
            steps.append((Collective.ALL_GATHER, d, dims[d][keep:]))
            dims[d] = dims[d][:keep]
    # Slice what the target adds.
    new_axes = {d: want[d][len(dims[d]):] for d in range(rank) if len(want[d]) > len(dims[d])}
    if new_axes:
        steps.append((Collective.ALL_SLICE, new_axes))
    return steps


def _is_simple(mesh: Mesh, dims, want, steps) -> bool:
    """At most one all_to_all, no dimension both gathered and sliced, and never more per
    device than max(source tile, target tile)."""
    if sum(s[0] == Collective.ALL_TO_ALL for s in steps) > 1:
        return False
    gathered = {s[1] for s in steps if s[0] == Collective.ALL_GATHER}
    sliced = {d for s in steps if s[0] == Collective.ALL_SLICE for d in s[1]}
    if gathered & sliced:
        return False

    def parts(layout) -> int:
        return mesh.product([a for d in layout for a in d])

    lowest, current = parts(dims), parts(dims)
    for s in steps:
        if s[0] == Collective.ALL_GATHER:
            current //= mesh.product(s[2])
        elif s[0] == Collective.ALL_SLICE:
            current *= mesh.product([a for axes in s[1].values() for a in axes])
        lowest = min(lowest, current)
    return lowest >= min(parts(dims), parts(want))


def _plan_edge(mesh: Mesh, local: TensorType, dims, want):
    """The planner's memory-bounded plan for one edge, or None where it cannot plan it
    (an element type it has no size for): the direct conversion is used then."""
    from ..errors import PartitionError
    from .redistribution import plan_redistribution

    shape = tuple(s * mesh.product(d) for s, d in zip(local.shape, dims))
    try:
        return plan_redistribution(mesh, shape, local.element.replace("ui", "u"),
                                   Layout(tuple(dims)).spec(), Layout(tuple(want)).spec())
    except PartitionError:
        return None


class LoweringCache:
    """Device-local code of earlier lowerings of the same function, so that lowering after a
    tactic re-lowers only the ops whose distributed types the tactic changed (paper 1 §6.1,
    made incremental).

    An op's device-local code (its segment: the op with local shapes, plus the code around it
    that the lowering adds, e.g. an iota's offset) depends only on the op, its loop nest and
    the layouts of what it reads; a conversion's collectives only on the value and its two
    layouts. Both are cached under exactly that key. On a hit the segment is reused as it is,
    the same IR objects, re-pointed at this lowering's inputs where those were re-lowered (they
    have the same local types, since the layouts match). A segment is reused only if every
    other value it reads is defined in the program being built (the emitter shares helpers
    such as the device index between segments); otherwise it is lowered afresh.

    Reusing objects means a program lowered with a cache is only valid until the next lowering
    with the same cache: `apply_schedule` keeps the last program, a searcher simulates each
    program before it lowers the next.
    """

    MAX_ENTRIES = 1 << 20  # a long search drops what it cached and starts again

    def __init__(self):
        self.args: dict[tuple[Value, Layout], Value] = {}
        # (op name, nest, input types, result types) -> what lowering such an op needs
        self.op_plans: dict[tuple, _OpPlan] = {}
        self.ops: dict[tuple, _Segment] = {}  # (op, its plan, forwarded sums) -> its code
        self.conversions: dict[tuple[Value, Layout, Layout], _Segment] = {}

    def trim(self) -> None:
        if len(self.ops) + len(self.conversions) > self.MAX_ENTRIES:
            self.args.clear()
            self.op_plans.clear()
            self.ops.clear()
            self.conversions.clear()


@dataclass
class _Segment:
    """Cached device-local code: `ops` read `inputs` and define `outputs`."""

    ops: list[Op]
    inputs: list[Value]
    outputs: list


# Ops whose lowering puts code around them or lowers them otherwise (`_Lowering._lower_around`):
# halos, a gathered window's warning, a scan, a marker, a padded scatter, an iota's offset, a
# lookup's or scatter's index hints, an embedding lookup's vocabulary tile.
_NOT_PLAIN = WINDOWED_OPS | UNHALOED_OPS | {
    ROLL_OP, INTERLEAVE_OP, PADDED_SCATTER_OP, "stablehlo.iota", "stablehlo.reduce_window",
    "stablehlo.gather", "stablehlo.scatter", "stablehlo.dynamic_slice"}
# Ops whose attributes spell out shapes (`_rewrite_attributes`).
_SHAPED_ATTRIBUTES = frozenset({"stablehlo.constant", "stablehlo.slice",
                                "stablehlo.dynamic_slice", "stablehlo.gather"})


def _produced(op: Op, nest: tuple, forwarded: tuple, mesh: Mesh) -> list[Layout]:
    """The layouts the op makes its results in: tiled as the nest tiles them, with the sums
    it leaves pending (after the ones it forwards)."""
    return [Layout.from_tiles(r.type.rank, [(a, e.results[j]) for a, e in nest
                                            if not isinstance(e.results[j], Sum)],
                              [*forwarded, *pending_sums(nest, j)], mesh)
            for j, r in enumerate(op.results)]


@dataclass(eq=False)
class _OpPlan:
    """What lowering an op in its loop nest needs that no other op's lowering changes: the
    layouts its inputs are converted to, its results' layouts and local types, its masks.
    Shared by the ops of one name, types and nest (`_Lowering._plan`). Most ops are `plain`:
    lowered as the op itself on local shapes, none of the code `_lower_around` adds applies
    to them, so the lowering does not ask for it op by op."""

    wanted: tuple[Layout, ...]
    produced: tuple[Layout, ...]  # with no sums forwarded (`_Lowering._forwarded_sum`)
    result_types: tuple[TensorType, ...]
    masks: tuple[Mask, ...]
    own: tuple[str, ...]  # the axes of entries whose partials only the op's reducer combines
    may_forward: bool  # a linear or shape op, which may forward a pending sum
    plain: bool

    @classmethod
    def make(cls, op: Op, nest: tuple, mesh: Mesh) -> _OpPlan:
        wanted = tuple(Layout.from_tiles(v.type.rank, [(a, e.operands[i]) for a, e in nest
                                                       if e.operands[i] is not None], mesh=mesh)
                       for i, v in enumerate(op.inputs))
        produced = tuple(_produced(op, nest, (), mesh))
        result_types = tuple(lay.local_type(r.type, mesh) for lay, r in zip(produced, op.results))
        found = tuple(masks(op, nest, mesh))
        own = tuple(a for a, e in nest
                    if any(isinstance(r, Sum) and not r.pending for r in e.results))
        return cls(wanted, produced, result_types, found, own,
                   op.name in PENDING_SUM_CHAIN or op.name in LINEAR_OPERANDS,
                   op.name not in _NOT_PLAIN and not found and not own)


class _Lowering:
    def __init__(self, state: PartitionState, cache: LoweringCache | None = None,
                 as_produced: bool = False):
        self.state = state
        self.as_produced = as_produced
        self.mesh = state.mesh
        self.body = Block()
        self.em = _Emitter(self.mesh, self.body)
        self.local: dict[Value, tuple[Value, Layout]] = {}
        self.converted: dict[tuple[Value, Layout], Value] = {}
        self.cache = cache
        self.top = True  # lowering top-level ops (segments are cached only there)
        self.defined: set[Value] = set()  # local values the top-level block defines so far
        self._swept = 0
        self.consumer: Op | None = None  # the op being lowered (None: the function's return)
        self.pending = PendingSums(state)  # loop-carried accumulators keep their pending sums
        self._regather_memo: dict[Value, bool] = {}
        self.op_plans: dict[tuple, _OpPlan] = cache.op_plans if cache is not None else {}

    def declared(self, v: Value) -> Layout:
        return Layout.from_tiles(v.type.rank, self.state.tiles_of(v), mesh=self.mesh)

    def use(self, v: Value, want: Layout) -> Value:
        x, have = self.local[v]
        if have is want or have == want:  # most edges: nothing to convert
            return x
        if self._regathered(v):
            return self._convert(v, x, have, want)  # each consumer gathers afresh
        key = (v, want)
        y = self.converted.get(key)
        if y is None:
            y = self.converted[key] = self._convert(v, x, have, want)
        return y

    def _inputs(self, values: list[Value], wanted) -> list[Value]:
        """`use` of each of `values` in the layout `wanted` of it: the local value itself
        where it has that layout already (most edges), without a call per edge."""
        local = self.local
        out = []
        for v, want in zip(values, wanted):
            x, have = local[v]
            out.append(x if have is want else self.use(v, want))
        return out

    def _regathered(self, v: Value) -> bool:
        """Is `v` gathered afresh for each consumer: a value the tactic asked for
        (`state.regather`), or one computed from such a value by layout ops alone (a norm
        scale reshaped to `[1, 1, d]`, a weight converted to bf16), which is what is gathered
        once the tiling has flowed through them."""
        known = self._regather_memo.get(v)
        if known is None:
            op = v.producer
            known = v in self.state.regather or (
                op is not None and op.name in RELAYOUT_OPS and len(op.operands) == 1
                and self._regathered(op.operands[0]))
            self._regather_memo[v] = known
        return known

    def _convert(self, v: Value, x: Value, have: Layout, want: Layout) -> Value:
        if have == want or not x.type.is_tensor:
            return x
        # A value gathered afresh for each consumer has one segment per consumer: not cached.
        caching = self.cache is not None and self.top and not self._regathered(v)
        if caching:
            hit = self.cache.conversions.get((v, have, want))
            if hit is not None and self._reuse(hit, [x]):
                return hit.outputs[0]
        start = len(self.em.block.ops)
        y = convert(self.em, x, have, want, self.state.scatter_sums, v.type.shape)
        mark_origin(self.em.block.ops[start:], Conversion(v, self.consumer, have, want))
        if caching:
            self.cache.conversions[(v, have, want)] = _Segment(self.em.block.ops[start:], [x],
                                                               [y])
        return y

    def _sweep(self) -> None:
        """Record the local values defined by top-level ops appended since the last sweep."""
        ops = self.body.ops
        for op in ops[self._swept:]:
            self.defined.update(op.results)
        self._swept = len(ops)

    def _reuse(self, segment: _Segment, inputs: list[Value]) -> bool:
        """Append a cached segment, re-pointed from the inputs it was lowered with to
        `inputs`, if every other value it reads is defined here."""
        self._sweep()
        moved = {old: new for old, new in zip(segment.inputs, inputs) if old is not new}
        inside: set[Value] = set()
        for op in segment.ops:
            for v in op.operands:
                if v not in moved and v not in self.defined and v not in inside:
                    return False
            inside.update(op.results)
        if moved:
            for op in segment.ops:
                op.operands = [moved.get(v, v) for v in op.operands]
            segment.inputs = list(inputs)
        self.body.ops.extend(segment.ops)
        self._sweep()
        return True

    def run(self) -> SpmdProgram:
        func = self.state.func
        in_layouts, drops = [], []
        for a, name in zip(func.args, _arg_labels(func)):
            inside = self.declared(a)
            layout, dropped = at_boundary(inside, self.mesh)
            if dropped:
                drops.append(BoundaryDrop(f"argument {name!r}", dropped, inside, layout))
            # An argument tiled unevenly comes in on its largest divisible layout (jax needs
            # divisible shardings) and is sliced into its padded tiles here.
            layout = layout.divisible(a.type.shape, self.mesh)
            in_layouts.append(layout)
            local = self.cache.args.get((a, layout)) if self.cache is not None else None
            if local is None:
                local = self.body.add_arg(layout.local_type(a.type, self.mesh))
                if self.cache is not None:
                    self.cache.args[(a, layout)] = local
            else:
                self.body.args.append(local)
            self.local[a] = (local, layout)
        self.defined.update(self.body.args)
        for a in func.args:
            if self.local[a][1] != self.declared(a):
                self.em.serving = next((u for u, _ in self.state.users.get(a, ()) if u), None)
                self.local[a] = (self.use(a, self.declared(a)), self.declared(a))
        for op in func.ops:
            self.lower_op(op)
        out_layouts, returns = [], []
        self.consumer = None
        for k, v in enumerate(func.returns):
            self.em.serving = v.producer
            if self.as_produced:
                layout = self.local[v][1]
            else:
                inside = self.declared(v)
                layout, dropped = at_boundary(inside, self.mesh)
                if dropped:
                    drops.append(BoundaryDrop(f"result {k}", dropped, inside, layout))
                # An output tiled unevenly leaves on its largest divisible layout, trimmed
                # (whether that is allowed is the caller's policy: `pipeline.uneven_outputs`).
                layout = layout.divisible(v.type.shape, self.mesh)
            out_layouts.append(layout)
            returns.append(self.use(v, layout))
        if self.cache is not None:
            self.cache.trim()
        local = Func(func.name, self.body, returns, list(func.arg_names))
        return SpmdProgram(local, self.mesh, in_layouts, out_layouts,
                           count_collectives(walk(self.body.ops)), drops)

    def lower_op(self, op: Op) -> None:
        self.consumer = self.em.serving = op
        if op.name in PARTITIONED_REGIONS:
            self._lower_regions(op)
            return
        if op.results and op.results[0].tag is not None:
            # A tag is an identity. Where a tactic decided it, it is a redistribution point:
            # what it names goes straight to the tagged value's layout (e.g. one all_to_all).
            tagged = op.results[0]
            layout = self.declared(tagged)
            self.local[tagged] = (self.use(op.operands[0], layout), layout)
            return
        nest = self.state.nest_of(op)
        plan = self._plan(op, nest)
        wanted = plan.wanted
        forwarded = self._forwarded_sum(op, wanted) if plan.may_forward else ()
        if not forwarded and not self.as_produced and op.name == "stablehlo.scatter":
            axes = exchange_axes(self.state, op, nest)
            if axes:
                self._lower_exchanged_scatter(op, nest, axes)
                return
        if forwarded:
            linear = linear_operands(op, self.pending.chain)
            inputs = [self.local[v][0] if i in linear else self.use(v, lay)
                      for i, (v, lay) in enumerate(zip(op.inputs, wanted))]
        else:
            inputs = self._inputs(op.inputs, wanted)
        caching = self.cache is not None and self.top and not op.captures
        if caching:
            key = (op, plan, forwarded)  # the plan stands for the nest (`_plan`)
            hit = self.cache.ops.get(key)
            if hit is not None and self._reuse(hit, inputs):
                for r, local in zip(op.results, hit.outputs):
                    self.local[r] = local
                return
            start = len(self.body.ops)
        produced = (_produced(op, nest, forwarded, self.mesh) if forwarded
                    else plan.produced)
        operands = inputs[: len(op.operands)]
        regions = []
        if op.regions:  # few ops have any: their captures map into the copies
            env = dict(zip(op.captures, inputs[len(op.operands):]))
            regions = [clone_region(r, env) for r in op.regions]
        if plan.plain:
            attrs = op.attributes
            if op.name in _SHAPED_ATTRIBUTES:
                attrs = dict(attrs)
                _rewrite_attributes(op, attrs, operands, plan.result_types)
            results = self.em.emit(op.name, operands, plan.result_types, attrs,
                                   regions).results
        else:
            results = self._lower_around(op, nest, plan, operands, produced, regions)
        for r, x, lay in zip(op.results, results, produced):
            self.local[r] = (x, lay)
        if caching:
            self.cache.ops[key] = _Segment(self.body.ops[start:], inputs,
                                           [self.local[r] for r in op.results])

    def _plan(self, op: Op, nest: tuple) -> _OpPlan:
        """The op's `_OpPlan` in `nest`, one object per distinct plan. A plan depends on the
        op's name, types and nest alone (a gather's masks also on its dimension numbers:
        planned per op), and a program has few distinct ones (148 for the 8.8k ops of a
        16-layer decoder): shared by value."""
        if op.name == "stablehlo.gather":
            key = (op, nest)
        else:
            key = (op.name, nest, tuple([v.type for v in op.inputs]),
                   tuple([r.type for r in op.results]))
        plan = self.op_plans.get(key)
        if plan is None:
            plan = self.op_plans[key] = _OpPlan.make(op, nest, self.mesh)
        return plan

    def _lower_around(self, op: Op, nest: tuple, plan: _OpPlan, operands: list[Value],
                      produced: list[Layout], regions: list[Region]) -> list[Value]:
        """An op that is not plain: with the code the lowering puts around it (halos, masks,
        a vocabulary tile's ids, its own reducer's combination, an iota's offset) or in its
        place (a scan, a roll or interleave marker, a padded scatter)."""
        wanted = plan.wanted
        result_types = plan.result_types
        attrs = dict(op.attributes)
        _rewrite_attributes(op, attrs, operands, result_types)
        if op.name in WINDOWED_OPS:
            operands = extend_operands(self.em, op, nest, operands, attrs,
                                       [self.local[v][1] for v in op.inputs], wanted)
        elif op.name in UNHALOED_OPS:
            warn_gathered(op, [self.local[v][1] for v in op.inputs], wanted)
        for mask in plan.masks:
            if mask.reduction == WINDOW_PAD:
                continue  # applied before the halo exchange (extend_operands)
            fill = (own_identity(self.em, op, operands, mask.operand)
                    if mask.reduction == OWN_REDUCER else None)
            operands[mask.operand] = apply_mask(self.em, operands[mask.operand], mask, fill)
        own = plan.own
        if own:
            operands = local_operands(self.em, op, operands)
        drop_index_hints(op, attrs, wanted, self.mesh)
        if op.name == "stablehlo.dynamic_slice":
            operands = clamped_starts(self.em, op, operands, result_types[0])
        k = lookup_dim(op)
        vocab_axes = tuple(a for a, e in nest if k is not None and e.operands[0] == k)
        if vocab_axes:
            operands = [operands[0], self._local_ids(op, operands[0], operands[1], k,
                                                     vocab_axes)]
        scans = scan_axes(nest) if op.name == "stablehlo.reduce_window" else {}
        if op.name in (ROLL_OP, INTERLEAVE_OP):
            results = [self._lower_marker(op, operands[0], nest)]
        elif scans:
            results = [lower_scan(self.em, op, scans, operands, attrs, result_types[0],
                                  regions)]
        elif op.name == PADDED_SCATTER_OP:
            results = [lower_padded_scatter(self.em, op, nest, operands, result_types[0],
                                            regions, [self.local[v][1] for v in op.inputs],
                                            wanted)]
        else:
            results = self.em.emit(op.name, operands, result_types, attrs, regions).results
        if vocab_axes:
            results = [self._zero_foreign_rows(results[0], operands[1],
                                               op.operands[0].type.shape[k], vocab_axes,
                                               offset_dims(op))]
        if op.name == "stablehlo.iota":
            results = [self._offset_iota(op, results[0], produced[0])]
        if own:
            results = combine_partials(self.em, op, results, operands, own)
        return results

    def _lower_marker(self, op: Op, x: Value, nest: tuple) -> Value:
        """`partir.roll` / `partir.interleave` (markers.py): data movement along one dimension,
        lowered to collective_permutes between the devices that tile it."""
        a = {k: parse_scalar(v) for k, v in op.attributes.items()}
        dim = a.get("axis", 0)
        axes = tuple(ax for ax, e in nest if e.operands[0] == dim)
        start = len(self.em.block.ops)
        if op.name == ROLL_OP:
            y = lower_roll(self.em, x, a["shift"], dim, axes)
        else:
            y = lower_interleave(self.em, x, a["repeats"], a["stages"], a["inverse"], axes)
        mark_origin(self.em.block.ops[start:], Movement(op))  # records: its line and phase
        return y

    def _forwarded_sum(self, op: Op, wanted: list[Layout]) -> tuple:
        """Pending sums a linear op can pass through (`accumulation.LINEAR_OPERANDS`): when
        every linear operand is the same partial sum (over the same axes, reduced by add) of
        what the op consumes, `Σ a_i + Σ b_i = Σ (a_i + b_i)`, so the op runs on the partials
        and one all_reduce follows instead of one per input (the backward pass of separate
        q/k/v projections; a gradient accumulated in a loop)."""
        which = linear_operands(op, self.pending.chain)
        if not which:
            return ()
        partials = set()
        for i in which:
            have = self.local[op.operands[i]][1]
            if have.dims != wanted[i].dims or not have.partial:
                return ()
            partials.add(have.partial)
        if any(self.local[v][1].partial for i, v in enumerate(op.operands) if i not in which):
            return ()
        (partial,) = partials if len(partials) == 1 else ((),)
        return partial if all(kind == "add" for _, kind in partial) else ()

    def _lower_regions(self, op: Op) -> None:
        """`while` and `case`, whose regions are partitioned like the top level. A loop-carried
        value (or a case result) has one layout, shared through the state's aliases: while
        operands are converted to it, each region is lowered once with it, and the values a
        region returns are converted to it before its terminator. Outer values a region uses
        are converted inside it (implicit captures)."""
        layouts = [self.declared(r) for r in op.results]
        if op.name == "stablehlo.while":
            layouts = [Layout(lay.dims, self.pending.carried(op, k))
                       for k, lay in enumerate(layouts)]
            operands = [self.use(v, lay) for v, lay in zip(op.operands, layouts)]
        else:  # case: the branch index
            operands = [self.use(v, self.declared(v)) for v in op.operands]
        outer = (self.em, self.converted, self.top)
        self.top = False
        regions = []
        for index, region in enumerate(op.regions):
            block = region.blocks[0]
            local_block = Block()
            self.em, self.converted = _Emitter(self.mesh, local_block), {}
            for a, lay in zip(block.args, layouts):
                self.local[a] = (local_block.add_arg(lay.local_type(a.type, self.mesh)), lay)
            for inner in block.ops[:-1]:
                self.lower_op(inner)
            term = block.ops[-1]
            # values a region returns are converted for the loop or case
            self.consumer = self.em.serving = op
            is_condition = op.name == "stablehlo.while" and index == 0
            wanted = [self.declared(v) for v in term.operands] if is_condition else layouts
            returns = [self.use(v, lay) for v, lay in zip(term.operands, wanted)]
            local_block.ops.append(Op(term.name, returns, []))
            regions.append(Region([local_block]))
        self.em, self.converted, self.top = outer
        new = self.em.emit(op.name, operands, [lay.local_type(r.type, self.mesh)
                                               for lay, r in zip(layouts, op.results)],
                           dict(op.attributes), regions)
        for r, x, lay in zip(op.results, new.results, layouts):
            self.local[r] = (x, lay)

    def _local_ids(self, op: Op, table: Value, ids: Value, k: int, axes,
                   clamp: bool = True) -> Value:
        """Ids shifted into this device's tile of the vocabulary (clamped first as the global
        gather clamps; a scatter drops an id out of range instead, `clamp=False`, so it stays
        out of every tile); ids outside the tile stay out of its range [0, tile)."""
        em = self.em
        vocab = op.operands[0].type.shape[k]
        t = ids.type
        clamped = ids if not clamp else em.emit(
            "stablehlo.clamp", [em.splat(0, t), ids, em.splat(vocab - 1, t)], [t]).results[0]
        start = em.per_device(em.tile_starts(vocab, axes))
        start = em.emit("stablehlo.convert", [start], [TensorType((), t.element)]).results[0]
        return em.emit("stablehlo.subtract", [clamped, em.broadcast(start, t)], [t]).results[0]

    def _lower_exchanged_scatter(self, op: Op, nest: tuple, axes: tuple[str, ...]) -> None:
        """An embedding gradient's scatter-add made per vocabulary tile from every device's
        updates (`scatter_exchange.py`): ids and updates gathered over `axes`, the ids shifted
        into this device's rows, the updates of other rows zeroed."""
        k = scatter_dim(op)
        _, ids, updates = op.operands
        result = op.results[0]

        def kept(i: int) -> list[tuple[str, int]]:
            return [(a, e.operands[i]) for a, e in nest
                    if e.operands[i] is not None and a not in axes]

        produced = Layout.from_tiles(
            result.type.rank,
            [(a, e.results[0]) for a, e in nest if not isinstance(e.results[0], Sum)]
            + [(a, k) for a in axes],
            [(a, e.results[0].reduction) for a, e in nest
             if isinstance(e.results[0], Sum) and a not in axes], mesh=self.mesh)
        local = [self.use(ids, Layout.from_tiles(ids.type.rank, kept(1), mesh=self.mesh)),
                 self.use(updates, Layout.from_tiles(updates.type.rank, kept(2),
                                                     mesh=self.mesh))]
        # Tiles still summed over other axes may be padded: their padding is masked as any
        # Sum entry's (`masking.py`).
        for mask in masks(op, tuple((a, e) for a, e in nest if a not in axes), self.mesh):
            local[mask.operand - 1] = apply_mask(self.em, local[mask.operand - 1], mask)
        local_ids, local_updates = local
        zeros = self.em.splat(0, produced.local_type(result.type, self.mesh))
        rows = zeros.type.shape[k]
        shifted = self._local_ids(op, zeros, local_ids, k, axes, clamp=False)
        local_updates = self._zero_foreign_rows(local_updates, shifted, result.type.shape[k],
                                                axes, update_window_dims(op))
        t = shifted.type
        clamped = self.em.emit("stablehlo.clamp", [self.em.splat(0, t), shifted,
                                                   self.em.splat(rows - 1, t)], [t]).results[0]
        attrs = dict(op.attributes)
        if "unique_indices" in attrs:  # foreign ids are clamped onto the same rows
            attrs["unique_indices"] = "false"
        regions = [clone_region(r, {}) for r in op.regions]
        x = self.em.emit(op.name, [zeros, clamped, local_updates], [zeros.type], attrs,
                         regions).results[0]
        self.local[result] = (x, produced)

    def _zero_foreign_rows(self, values: Value, local_ids: Value, vocab: int,
                           axes: tuple[str, ...], window_dims: list[int]) -> Value:
        """Rows of `values` (a lookup's result or a scatter's updates: the dimensions not in
        `window_dims` follow the ids) whose id is not among this tile's valid rows of the
        `vocab` tiled over `axes` are zero, so the tiles' partial results add up (a padded
        tile's padding rows are no vocabulary rows, whatever they hold)."""
        em, t = self.em, local_ids.type
        sizes = [self.mesh.axis_size(a) for a in axes]
        if is_padded(vocab, sizes):
            valid = em.emit("stablehlo.convert", [em.per_device(em.tile_valid(vocab, axes))],
                            [TensorType((), t.element)]).results[0]
            limit = em.broadcast(valid, t)
        else:
            limit = em.splat(local_extent(vocab, sizes), t)
        pred_t = TensorType(t.shape, "i1")
        ge = em.emit("stablehlo.compare", [local_ids, em.splat(0, t)], [pred_t],
                     {"comparison_direction": "#stablehlo<comparison_direction GE>"}).results[0]
        lt = em.emit("stablehlo.compare", [local_ids, limit], [pred_t],
                     {"comparison_direction": "#stablehlo<comparison_direction LT>"}).results[0]
        inside = em.emit("stablehlo.and", [ge, lt], [pred_t]).results[0]
        # indices [..., 1] -> the result's batch dimensions (those not in offset_dims).
        inside = em.emit("stablehlo.reshape", [inside], [TensorType(t.shape[:-1], "i1")]
                         ).results[0]
        out_t = values.type
        batch_dims = [d for d in range(out_t.rank) if d not in window_dims]
        mask = em.broadcast(inside, TensorType(out_t.shape, "i1"), batch_dims)
        return em.emit("stablehlo.select", [mask, values, em.splat(0, out_t)], [out_t]
                       ).results[0]

    def _offset_iota(self, op: Op, local: Value, layout: Layout) -> Value:
        dim = parse_scalar(op.attributes["iota_dimension"])
        axes = layout.dims[dim]
        if not axes:
            return local
        start = self.em.per_device(self.em.tile_starts(op.results[0].type.shape[dim], axes))
        start = self.em.emit("stablehlo.convert", [start],
                             [TensorType((), local.type.element)]).results[0]
        return self.em.emit("stablehlo.add", [local, self.em.broadcast(start, local.type)],
                            [local.type]).results[0]


def _arg_labels(func: Func) -> list[str]:
    names = list(func.arg_names or [])
    return [names[i] if i < len(names) and names[i] else f"#{i}"
            for i in range(len(func.args))]


def _rewrite_attributes(op: Op, attrs: dict[str, str], operands: list[Value],
                        result_types: list[TensorType]) -> None:
    """Attributes that spell out shapes, rewritten for the local shapes."""
    if op.name == "stablehlo.constant" and result_types[0] != op.results[0].type:
        attrs["value"] = re.sub(r":\s*tensor<[^>]*>$", f": {result_types[0]}", attrs["value"])
    elif op.name == "stablehlo.slice":
        limits = parse_i64_array(attrs["limit_indices"])
        for d, (g, loc) in enumerate(zip(op.operands[0].type.shape, operands[0].type.shape)):
            if g != loc:  # a tiled dimension is sliced whole
                limits[d] = loc
        attrs["limit_indices"] = i64_array(limits)
    elif op.name == "stablehlo.dynamic_slice":
        attrs["slice_sizes"] = i64_array(result_types[0].shape)
    elif op.name == "stablehlo.gather":
        sizes = parse_i64_array(attrs["slice_sizes"])
        for d, (g, loc) in enumerate(zip(op.operands[0].type.shape, operands[0].type.shape)):
            if g != loc and sizes[d] == g:  # a whole-slice (offset) dimension that is tiled
                sizes[d] = loc
        attrs["slice_sizes"] = i64_array(sizes)


def lower_to_spmd(state: PartitionState, cache: LoweringCache | None = None, *,
                  as_produced: bool = False) -> SpmdProgram:
    """Lower a partitioned function to its device-local program; with a `cache` of earlier
    lowerings of the same function, only what changed since is lowered again.

    `as_produced` returns each result in the layout its producer made it, pending sums left
    unreduced (the TMR verifier runs one op's tiles and combines them itself)."""
    return _Lowering(state, cache, as_produced).run()
