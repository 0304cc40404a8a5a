"""Combining partial results with the op's own reducer (`core/tmr.OWN_REDUCER`).

Some ops reduce a tiled dimension with something no all_reduce computes: a reduce of several
operands (argmax and argmin: a value and its index) and `chlo.top_k` (the k largest and their
indices). Each device runs the op on its tile; the partials, as small as the result, are
all-gathered over the tiling axes and the op's reduction is run again over them:
- a variadic reduce: the same reduce over the gathered partials' new leading dimension, with
  the same reducer and init values (jax's inits are the reducer's identity);
- top_k: the local candidates' indices made global (the tile's start added; a padded
  position gets the largest index, so it loses every tie), the candidates of all tiles sorted
  by index, and top_k again over them: it breaks ties by position, so by global index, as
  top_k on the whole dimension does; the winners' indices are picked out of the candidates.
Every element of the global top k is among the top k of its own tile, so this is exact.
"""

from __future__ import annotations

from ...core.mesh import Mesh
from ...core.padding import tile_bounds
from ...ir.attributes import i64_array, parse_scalar
from ...ir.graph import Block, Op, Region, Value, clone_region
from ...ir.opsets import Reduction
from ...ir.types import TensorType
from ..emitter import Emitter
from ..op_plan import Nest, OpPlan
from .base import LoweringRule, RuleContext

TOP_K = "chlo.top_k"


class OwnReducer(LoweringRule):
    """An op whose nest has entries only its own reducer combines (`plan.own`): run per
    tile, its partials gathered and reduced again."""

    def matches(self, op: Op, nest: Nest, plan: OpPlan, mesh: Mesh) -> bool:
        return bool(plan.own)

    def before(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str]
               ) -> list[Value]:
        return local_operands(ctx.em, ctx.op, operands)

    def after(self, ctx: RuleContext, results: list[Value], operands: list[Value]
              ) -> list[Value]:
        return combine_partials(ctx.em, ctx.op, results, operands, ctx.plan.own)


def own_identity(em: Emitter, op: Op, operands: list[Value], i: int) -> Value:
    """What padding in operand i becomes: the reduce's init value, or for top_k the lowest
    value in its order. top_k orders floats totally: a NaN with the sign bit set (what
    `log` of a negative number gives) is below -inf, so the padding is the lowest such NaN
    (all bits set), which loses to every value, and its largest index breaks the tie with
    a NaN of the same bits."""
    if op.name == TOP_K:
        element = operands[i].type.element
        bits = TensorType((), element).itemsize * 8 if element.startswith(("f", "bf")) else 0
        lowest = (f"0x{'F' * (bits // 4)}" if bits
                  else Reduction.MAX.identity_literal(element))
        return em.literal(lowest, element)
    return operands[len(op.operands) // 2 + i]


def local_operands(em: Emitter, op: Op, operands: list[Value]) -> list[Value]:
    """The operands the op runs on per tile: top_k needs at least k elements, so a tile
    shorter than k is padded with -inf (positions past its valid rows)."""
    if op.name != TOP_K:
        return operands
    x, k = operands[0], parse_scalar(op.attributes["k"])
    last = x.type.rank - 1
    if x.type.shape[last] >= k:
        return operands
    hi = [0] * x.type.rank
    hi[last] = k - x.type.shape[last]
    return [em.pad(x, [0] * x.type.rank, hi, own_identity(em, op, operands, 0))]


def combine_partials(em: Emitter, op: Op, partials: list[Value], operands: list[Value],
                     axes: tuple[str, ...]) -> list[Value]:
    """The op's results from this device's partials, combined over `axes`."""
    if op.name == TOP_K:
        return _combine_top_k(em, op, partials, axes)
    stacked = [em.stacked_partials(x, axes) for x in partials]
    inits = operands[len(op.operands) // 2:]
    return em.emit("stablehlo.reduce", [*stacked, *inits], [x.type for x in partials],
                   {"dimensions": i64_array([0])}, [clone_region(op.regions[0], {})]
                   ).results


def _combine_top_k(em: Emitter, op: Op, partials: list[Value], axes: tuple[str, ...]
                   ) -> list[Value]:
    values, local = partials
    result_types = [values.type, local.type]  # local: other dimensions may be tiled too
    n = op.operands[0].type.shape[-1]
    last = values.type.rank - 1
    sizes = [em.mesh.axis_size(a) for a in axes]
    bounds = [tile_bounds(n, sizes, [em.mesh.coord(r, a) for a in axes])
              for r in range(em.mesh.size)]
    start = em.broadcast(em.per_device([s for s, _ in bounds]), local.type)
    valid = em.broadcast(em.per_device([v for _, v in bounds]), local.type)
    found = em.emit("stablehlo.add", [local, start], [local.type]).results[0]
    index = em.where(em.compare(local, valid, "LT"), found, em.scalar(2 ** 31 - 1, "i32"))
    values = em.all_gather(values, last, axes)
    index = em.all_gather(index, last, axes)
    index, values = em.emit("stablehlo.sort", [index, values], [index.type, values.type],
                            {"dimension": f"{last} : i64", "is_stable": "true"},
                            [_ascending(index.type.element, values.type.element)]).results
    best, where = em.emit(TOP_K, [values], result_types,
                          dict(op.attributes)).results
    # The winners' global indices: index[where], as a one-hot sum over the candidates.
    candidates = index.type.shape[-1]
    grid = TensorType((*where.type.shape, candidates), "i32")
    batch = list(range(last))
    position = em.emit("stablehlo.iota", [], [grid],
                       {"iota_dimension": f"{last + 1} : i64"}).results[0]
    chosen = em.compare(position, em.broadcast(where, grid, [*batch, last]), "EQ")
    picked = em.where(chosen, em.broadcast(index, grid, [*batch, last + 1]),
                      em.scalar(0, "i32"))
    zero = em.scalar(0, "i32")
    winners = em.emit("stablehlo.reduce", [picked, zero], [where.type],
                      {"dimensions": i64_array([last + 1])}, [em.reducer("add", "i32")]
                      ).results[0]
    return [best, winners]


def _ascending(key: str, other: str) -> Region:
    """A sort comparator on the first operand (signed less-than)."""
    b = Block()
    a, c = b.add_arg(TensorType((), key)), b.add_arg(TensorType((), key))
    b.add_arg(TensorType((), other))
    b.add_arg(TensorType((), other))
    less = Op("stablehlo.compare", [a, c], [TensorType((), "i1")],
              {"comparison_direction": "#stablehlo<comparison_direction LT>"})
    b.ops += [less, Op("stablehlo.return", [less.results[0]], [])]
    return Region([b])
