"""Embedding lookups and their gradients' scatters on a vocabulary-tiled table.

A lookup `table[ids]` with the table tiled on its vocabulary (`core/rules/embedding.py`): each
device shifts the ids into its tile, looks them up (clamped) and zeroes the rows whose id is not in
its tile, so the tiles' partial results add up.

The gradient's scatter-add may exchange its updates instead of reducing its pending sum. Under
data parallelism the gradient of a lookup `table[ids]`, `zeros.at[ids].add(updates)`,
is a partial sum over the batch axis: each device scatters its own tokens into a full-size
zero table, and the partial tables are reduced where ZeRO shards the table on its vocabulary
(reduce_scatter, or all_reduce then slice). A scatter-add is linear in its updates, so a
device's tile of the sum is also its scatter of *every* device's updates into its own rows:
all-gather the ids and updates over the axis, shift the ids into the tile and zero the
updates of rows outside it (`core.rules.embedding`'s lookup form, transposed). That holds a
`[tokens, d]` buffer at the end of the backward pass instead of a `[vocab, d]` pending sum
for the whole step (XLA allocates the zeros early, being a constant, and keeps them until the
gradients are reduced: a step-long buffer at the step's peak). The lowering makes the exchange
where it moves no more bytes than the reduction it replaces (an all_gather of tokens x d
against a reduce_scatter of vocab x d, or an all_reduce, twice that, where `scatter_sums` is
off); jax.jit's partitioner keeps this gradient sharded too.
"""

from __future__ import annotations

from ...core.mesh import Mesh
from ...core.padding import is_padded, local_extent
from ...core.rules.embedding import lookup_dim, offset_dims, scatter_dim, update_window_dims
from ...core.rules.reductions import scatter_kind
from ...core.state import PartitionState
from ...core.tmr import Sum
from ...ir.graph import Op, Value, clone_region
from ...ir.types import TensorType
from ..emitter import Emitter
from ..layout import Layout
from ..masking import apply_mask, masks
from ..op_plan import Nest, OpPlan
from .base import LoweringRule, RuleContext


class EmbeddingLookup(LoweringRule):
    """A gather indexing a table tiled on its vocabulary."""

    ops = frozenset({"stablehlo.gather"})

    def matches(self, op: Op, nest: Nest, plan: OpPlan, mesh: Mesh) -> bool:
        return bool(_vocab_axes(op, nest))

    def before(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str]
               ) -> list[Value]:
        op = ctx.op
        return [operands[0], local_ids(ctx.em, op.operands[0].type.shape[lookup_dim(op)],
                                       operands[1], _vocab_axes(op, ctx.nest))]

    def after(self, ctx: RuleContext, results: list[Value], operands: list[Value]
              ) -> list[Value]:
        op = ctx.op
        return [zero_foreign_rows(ctx.em, results[0], operands[1],
                                  op.operands[0].type.shape[lookup_dim(op)],
                                  _vocab_axes(op, ctx.nest), offset_dims(op))]


def _vocab_axes(op: Op, nest: Nest) -> tuple[str, ...]:
    k = lookup_dim(op)
    return tuple(a for a, e in nest if k is not None and e.operands[0] == k)


class ScatterExchange(LoweringRule):
    """An embedding gradient's scatter-add made per vocabulary tile from every device's
    updates, where `exchange_axes` finds that cheaper: ids and updates gathered over those
    axes, the ids shifted into this device's rows, the updates of other rows zeroed."""

    ops = frozenset({"stablehlo.scatter"})
    changes_layouts = True

    def matches(self, op: Op, nest: Nest, plan: OpPlan, mesh: Mesh) -> bool:
        return any(isinstance(e.results[0], Sum) for _, e in nest)

    def replace(self, ctx: RuleContext) -> list[tuple[Value, Layout]] | None:
        axes = exchange_axes(ctx.state, ctx.op, ctx.nest)
        return _exchanged_scatter(ctx, axes) if axes else None

    def layouts(self, state: PartitionState, op: Op, nest: Nest) -> list[Layout] | None:
        axes = exchange_axes(state, op, nest)
        return [_exchanged_layout(op, nest, axes, state.mesh)] if axes else None


def exchange_axes(state: PartitionState, op: Op, nest: Nest) -> tuple[str, ...]:
    """The axes over which `op`'s pending sum is better made by exchanging its updates: those
    whose sum the result's own tiling then scatters on the indexed dimension. Empty when the
    op is not an embedding-gradient scatter, or the exchange would move more bytes."""
    k = scatter_dim(op)
    if k is None or scatter_kind(op) != "add":
        return ()
    result = op.results[0]
    axes = tuple(a for a, e in nest
                 if isinstance(e.results[0], Sum) and state.dim_of(result, a) == k)
    if not axes:
        return ()
    updates = op.operands[2]
    mesh = state.mesh
    gathered = Layout.from_tiles(updates.type.rank, [(a, e.operands[2]) for a, e in nest
                                                     if e.operands[2] is not None
                                                     and a not in axes], mesh=mesh)
    pending = Layout.from_tiles(result.type.rank, [(a, e.results[0]) for a, e in nest
                                                   if not isinstance(e.results[0], Sum)],
                                mesh=mesh)
    # A ring all_gather moves the gathered bytes once (the ids add one element per token to
    # the updates' d: left out), a reduce_scatter the pending sum's bytes once, an all_reduce
    # twice (then a slice).
    reduced = pending.local_type(result.type, mesh).nbytes * (1 if state.scatter_sums else 2)
    return axes if gathered.local_type(updates.type, mesh).nbytes <= reduced else ()


def _exchanged_layout(op: Op, nest: Nest, axes: tuple[str, ...], mesh: Mesh) -> Layout:
    """The exchanged scatter's result: tiled as the nest tiles it and on the indexed
    dimension over the exchanged `axes`, still summed over the nest's other Sum axes."""
    return Layout.from_tiles(
        op.results[0].type.rank,
        [(a, e.results[0]) for a, e in nest if not isinstance(e.results[0], Sum)]
        + [(a, scatter_dim(op)) for a in axes],
        [(a, e.results[0].reduction) for a, e in nest
         if isinstance(e.results[0], Sum) and a not in axes], mesh=mesh)


def _exchanged_scatter(ctx: RuleContext, axes: tuple[str, ...]) -> list[tuple[Value, Layout]]:
    op, nest, em, mesh = ctx.op, ctx.nest, ctx.em, ctx.mesh
    k = scatter_dim(op)
    _, ids, updates = op.operands
    result = op.results[0]

    def kept(i: int) -> list[tuple[str, int]]:
        return [(a, e.operands[i]) for a, e in nest
                if e.operands[i] is not None and a not in axes]

    produced = _exchanged_layout(op, nest, axes, mesh)
    local = [ctx.use(ids, Layout.from_tiles(ids.type.rank, kept(1), mesh=mesh)),
             ctx.use(updates, Layout.from_tiles(updates.type.rank, kept(2), mesh=mesh))]
    # Tiles still summed over other axes may be padded: their padding is masked as any
    # Sum entry's (`masking.py`).
    for mask in masks(op, tuple((a, e) for a, e in nest if a not in axes), mesh):
        local[mask.operand - 1] = apply_mask(em, local[mask.operand - 1], mask)
    own_ids, own_updates = local
    zeros = em.splat(0, produced.local_type(result.type, mesh))
    rows = zeros.type.shape[k]
    shifted = local_ids(em, result.type.shape[k], own_ids, axes, clamp=False)
    own_updates = zero_foreign_rows(em, own_updates, shifted, result.type.shape[k], axes,
                                    update_window_dims(op))
    t = shifted.type
    clamped = em.emit("stablehlo.clamp", [em.splat(0, t), shifted, em.splat(rows - 1, t)],
                      [t]).results[0]
    attrs = dict(op.attributes)
    if "unique_indices" in attrs:  # foreign ids are clamped onto the same rows
        attrs["unique_indices"] = "false"
    regions = [clone_region(r, {}) for r in op.regions]
    x = em.emit(op.name, [zeros, clamped, own_updates], [zeros.type], attrs,
                regions).results[0]
    return [(x, produced)]


def local_ids(em: Emitter, vocab: int, ids: Value, axes: tuple[str, ...],
              clamp: bool = True) -> Value:
    """Ids shifted into this device's tile of the `vocab` rows tiled over `axes` (clamped
    first as the global gather clamps; a scatter drops an id out of range instead,
    `clamp=False`, so it stays out of every tile); ids outside the tile stay out of its range
    [0, tile)."""
    t = ids.type
    clamped = ids if not clamp else em.emit(
        "stablehlo.clamp", [em.splat(0, t), ids, em.splat(vocab - 1, t)], [t]).results[0]
    return em.from_tile_start(clamped, vocab, axes)


def zero_foreign_rows(em: Emitter, values: Value, ids: Value, vocab: int,
                      axes: tuple[str, ...], window_dims: list[int]) -> Value:
    """Rows of `values` (a lookup's result or a scatter's updates: the dimensions not in
    `window_dims` follow the ids) whose id is not among this tile's valid rows of the
    `vocab` tiled over `axes` are zero, so the tiles' partial results add up (a padded
    tile's padding rows are no vocabulary rows, whatever they hold)."""
    t = ids.type
    sizes = [em.mesh.axis_size(a) for a in axes]
    if is_padded(vocab, sizes):
        valid = em.emit("stablehlo.convert", [em.per_device(em.tile_valid(vocab, axes))],
                        [TensorType((), t.element)]).results[0]
        limit = em.broadcast(valid, t)
    else:
        limit = em.splat(local_extent(vocab, sizes), t)
    pred_t = TensorType(t.shape, "i1")
    ge = em.emit("stablehlo.compare", [ids, em.splat(0, t)], [pred_t],
                 {"comparison_direction": "#stablehlo<comparison_direction GE>"}).results[0]
    lt = em.emit("stablehlo.compare", [ids, limit], [pred_t],
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
