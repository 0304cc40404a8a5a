"""Pending sums carried through loops: a gradient accumulated over a loop's iterations is
reduced once after the loop, not once per iteration.

A loop-carried value accumulates when it starts as zeros and the body only ever adds to it,
or writes slots of it (`dynamic_update_slice`), with values that are partial sums over some
mesh axes (a dot_general contracting a tiled batch, say). Sums commute with both, so the
carried value may stay a partial sum over those axes through every iteration: its layout
carries the pending sum (`Layout.partial`) like any op result, and the conversion after the
loop reduces it once. This is what the backward pass of a scan over layers and of the
pipelined loop need: without it, data parallelism all-reduces each layer's weight gradient in
every iteration (L times, or M + S - 1 times per stage in a pipeline) instead of once.

`PendingSums` predicts, before the body is lowered, the pending sum each value will have as
lowered (the lowering needs the carried layout when it reaches the loop), with the rule the
lowering applies (`forwarded_sum`) on the layouts the lowering makes, a lowering rule's where
it makes other layouts than the op's TMR entries (an exchanged scatter: `made_by_rules`). A
wrong prediction is never a wrong result: converting a value to a layout with a pending sum
it does not have keeps it on one device of each group (`convert.convert`), at the cost of a
reduction or a select per iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..core.rules.reductions import is_zero
from ..core.state import PartitionState
from ..core.tmr import pending_sums
from ..ir.graph import Op, Value
from ..ir.opsets import PARTITIONED_REGIONS, PENDING_SUM_CHAIN
from .layout import Layout
from .op_plan import produced_layouts, wanted_layouts

Partial = tuple[tuple[str, str], ...]  # (axis, reduction), as `Layout.partial`

# Ops that run on partial sums of their inputs and give a partial sum of the result, by the
# operands that must carry it (the rest, e.g. indices, must not): Σa + Σb = Σ(a + b), and
# writing Σu into a slot of Σb is Σ(b with u written) when every device writes the same slot.
LINEAR_OPERANDS: dict[str, tuple[int, ...] | None] = {
    "stablehlo.add": None, "stablehlo.subtract": None, "stablehlo.negate": None,
    "stablehlo.dynamic_update_slice": (0, 1),
}
_ACCUMULATORS = ("stablehlo.add", "stablehlo.dynamic_update_slice")
# The ops a pending sum may pass through: linear ops, and shape ops on a chain to an
# accumulator (`linear_operands`).
FORWARDING_OPS = frozenset(LINEAR_OPERANDS) | PENDING_SUM_CHAIN


def _is_float(op: Op) -> bool:
    return all(v.type.element.startswith(("f", "bf")) for v in (op.operands[0], op.results[0]))


def linear_operands(op: Op, chain: frozenset[Op] | set[Op] = frozenset()) -> tuple[int, ...]:
    """The operands of `op` through which a pending sum may pass (empty: none); a shape op's
    first operand only where `op` is in `chain`."""
    if op.name in PENDING_SUM_CHAIN:
        return (0,) if op in chain and _is_float(op) else ()
    if op.name not in LINEAR_OPERANDS:
        return ()
    which = LINEAR_OPERANDS[op.name]
    return tuple(range(len(op.operands))) if which is None else which


def forwarded_sum(op: Op, wanted: Sequence[Layout], have: Callable[[int], Layout],
                  chain: frozenset[Op] | set[Op]) -> Partial:
    """The pending sum `op` runs on, given the layout its operand i has, `have(i)` (asked in
    operand order, linear operands first), and the layouts its nest consumes them in,
    `wanted`: when every linear operand (`linear_operands`) is the same
    partial sum (over the same axes, reduced by add) in the tiling the op consumes it in, and
    no other operand is a partial sum, `Σ a_i + Σ b_i = Σ (a_i + b_i)`: the op runs on the
    partials and one all_reduce follows instead of one per input (the backward pass of
    separate q/k/v projections; a gradient accumulated in a loop). The one rule of both the
    prediction (`PendingSums`) and the lowering."""
    which = linear_operands(op, chain)
    if not which:
        return ()
    partials = set()
    for i in which:
        layout = have(i)
        if layout.dims != wanted[i].dims or not layout.partial:
            return ()
        partials.add(layout.partial)
    if any(have(i).partial for i in range(len(op.operands)) if i not in which):
        return ()
    (partial,) = partials if len(partials) == 1 else ((),)
    return partial if all(kind == "add" for _, kind in partial) else ()


class PendingSums:
    """Predicted pending sums of a partitioned function's values, as the lowering makes them."""

    def __init__(self, state: PartitionState,
                 made_by_rules: Callable[[Op], Sequence[Layout] | None] = lambda op: None):
        self.state = state
        # The layouts a lowering rule makes `op`'s results in where they are not its TMR
        # entries' (`rules.registry.layouts_made`), None where they are.
        self.made_by_rules = made_by_rules
        self._values: dict[Value, Partial] = {}
        self._carried: dict[tuple[Op, int], Partial] = {}
        self.chain: set[Op] = set()  # shape ops on a path to an accumulator
        self._loops: dict[Value, tuple[Op, int]] | None = None  # `_body_args`
        self._tentative = False  # while deciding an accumulator: shape ops may forward
        self._tentative_values: dict[Value, Partial] = {}  # what was predicted meanwhile

    def of(self, v: Value) -> Partial:
        """The pending sum `v` will have as lowered."""
        memo = self._tentative_values if self._tentative else self._values
        if v not in memo:
            memo[v] = ()  # a cycle through a loop predicts no pending sum
            memo[v] = self._predict(v)
        return memo[v]

    def _body_args(self) -> dict[Value, tuple[Op, int]]:
        """Each while body's k-th argument -> (the while, k), found on first use."""
        if self._loops is None:
            self._loops = {a: (op, k) for op in self.state.position
                           if op.name == "stablehlo.while"
                           for k, a in enumerate(op.regions[1].blocks[0].args)}
        return self._loops

    def carried(self, loop: Op, k: int) -> Partial:
        """The pending sum the k-th value carried by the `while` keeps (empty: none)."""
        key = (loop, k)
        if key not in self._carried:
            self._carried[key] = ()
            self._carried[key] = self._accumulated(loop, k)
        return self._carried[key]

    def _predict(self, v: Value) -> Partial:
        op = v.producer
        if op is None:
            loop = self._body_args().get(v)
            return self.carried(*loop) if loop is not None else ()
        j = op.results.index(v)
        if op.name == "stablehlo.while":
            return self.carried(op, j)
        made = self.made_by_rules(op)
        if made is not None:
            return made[j].partial
        nest = self.state.nest_of(op)
        return (*self.forwarded(op), *pending_sums(nest, j))

    def lowered(self, op: Op, wanted: Sequence[Layout],
                local: dict[Value, tuple[Value, Layout]]) -> Partial:
        """The pending sum `op` runs on as the lowering makes it: `forwarded_sum` on the
        layouts its operands were lowered in (`local`: value -> its local value and layout);
        () for an op no sum passes through (most)."""
        if op.name not in FORWARDING_OPS:
            return ()
        operands = op.operands
        return forwarded_sum(op, wanted, lambda i: local[operands[i]][1], self.chain)

    def kept(self, op: Op, forwarded: Partial) -> tuple[int, ...]:
        """The operands `op` reads as they come when it runs on the pending sum `forwarded`
        (those carrying it); the others are converted to the layouts its nest consumes."""
        return linear_operands(op, self.chain) if forwarded else ()

    def loop_layouts(self, loop: Op, layouts: list[Layout]) -> list[Layout]:
        """The layouts of the values `loop` carries, from their declared `layouts`: a `while`
        keeps the pending sums `carried` predicts (a `case` keeps none)."""
        if loop.name != "stablehlo.while":
            return layouts
        return [Layout(lay.dims, self.carried(loop, k)) for k, lay in enumerate(layouts)]

    def forwarded(self, op: Op, assume: dict[Value, Partial] | None = None) -> Partial:
        """The pending sum `op` will run on (`forwarded_sum`, on the layouts its operands are
        predicted to have). `assume` overrides the prediction for some operands (a loop's
        accumulator being decided)."""
        chain = {op} if self._tentative else self.chain
        if not linear_operands(op, chain):
            return ()
        assume = assume or {}
        wanted = wanted_layouts(op, self.state.nest_of(op), self.state.mesh)

        def have(i: int) -> Layout:
            v = op.operands[i]
            dims = self._produced_dims(v)
            if dims != wanted[i].dims:  # forwards nothing whatever its sum: not predicted
                return Layout(dims)
            return Layout(dims, assume[v] if v in assume else self.of(v))

        return forwarded_sum(op, wanted, have, chain)

    def _produced_dims(self, v: Value) -> tuple[tuple[str, ...], ...]:
        """The tiling `v` has as its producer makes it (an op result's, from the op's loop
        nest; it may differ from the value's declared tiling, which a conversion reaches)."""
        op = v.producer
        mesh = self.state.mesh
        if op is None or op.name in PARTITIONED_REGIONS:
            return Layout.from_tiles(v.type.rank, self.state.tiles_of(v), mesh=mesh).dims
        made = self.made_by_rules(op)
        if made is None:
            made = produced_layouts(op, self.state.nest_of(op), (), mesh)
        return made[op.results.index(v)].dims

    def _accumulated(self, loop: Op, k: int) -> Partial:
        body = loop.regions[1].blocks[0]
        cond = loop.regions[0].blocks[0]
        arg, returned = body.args[k], body.ops[-1].operands[k]
        update = returned.producer
        if (not is_zero(loop.operands[k]) or update is None or update.name not in _ACCUMULATORS
                or self.state.users.get(cond.args[k])):
            return ()
        # (Another reader would only cost a reduction per iteration: it converts the sum.)
        readers = [o for o, _ in self.state.users.get(arg, [])]
        linear = [update.operands[i] for i in linear_operands(update)]
        if readers != [update] or linear.count(arg) != 1 or (
                update.name == "stablehlo.dynamic_update_slice" and linear[0] is not arg):
            return ()
        tiled = {a for a, _ in self.state.tiles_of(arg)}
        # The accumulator carries what is added to it: decide with that assumption, letting
        # shape ops on the way forward the sum; if it holds, they join the chain.
        added = [v for v in linear if v is not arg]
        tentative, self._tentative = self._tentative, True
        try:
            partial = self._predict(added[0]) if added else ()
            if not partial or any(self._predict(v) != partial for v in added):
                return ()
            partial = self.forwarded(update, assume={arg: partial})
            # A value cannot be both tiled over an axis and a sum over it (its tiles differ).
            if any(a in tiled for a, _ in partial):
                partial = ()
        finally:
            self._tentative = tentative
            if not tentative:
                self._tentative_values.clear()
        if partial:
            for v in added:
                self._join_chain(v)
        return partial

    def _join_chain(self, v: Value) -> None:
        """Register the shape ops between `v` and the partial sums it is made of."""
        op = v.producer
        while op is not None and op.name in PENDING_SUM_CHAIN and op not in self.chain:
            self.chain.add(op)
            op = op.operands[0].producer
        if op is not None and op.name in LINEAR_OPERANDS:
            for i in linear_operands(op):
                self._join_chain(op.operands[i])
