"""`dynamic_slice` with its starts clamped in the program, not left to XLA.

StableHLO clamps a `dynamic_slice`'s start so that the slice stays inside its operand:
`dynamic_slice(x, (16,), (18,))` on 30 rows reads `x[12:30]`. When the lowering slices the
result again (an `all_slice` onto a device's tile), XLA:CPU folds the two slices into one,
`dynamic_slice(x, (16 + 0,), (9,))`, and clamps only the folded start: the first device reads
`x[16:25]` instead of `x[12:21]` (issue 33; plain jax shows it too). Clamping each traced
start explicitly, as the global op does, makes the device-local program mean the same
whatever XLA folds."""

from __future__ import annotations

from ...core.mesh import Mesh
from ...core.tmr import Sum
from ...ir.graph import Op, Value
from ...ir.types import TensorType
from ..emitter import Emitter
from ..op_plan import Nest, OpPlan
from .base import LoweringRule, RuleContext


class DynamicSliceClamp(LoweringRule):
    ops = frozenset({"stablehlo.dynamic_slice"})

    def matches(self, op: Op, nest: Nest, plan: OpPlan, mesh: Mesh) -> bool:
        # A masked read of a tiled dimension (`masked_window.MaskedSlice`) clamps its starts
        # on the global shapes itself.
        return not any(isinstance(e.results[0], Sum) for _, e in nest)

    def before(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str]
               ) -> list[Value]:
        return clamped_starts(ctx.em, ctx.op, operands, ctx.plan.result_types[0])


def clamped_starts(em: Emitter, op: Op, operands: list[Value], result_type: TensorType
                   ) -> list[Value]:
    """`operands` of a dynamic_slice (local operand, then one scalar start per dimension) with
    every start that is not a constant clamped to `[0, operand - slice]` on local shapes (a
    tiled dimension is sliced whole, so its start clamps to 0 as the global one does)."""
    x, starts = operands[0], operands[1:]
    out = [x]
    for d, (start, source) in enumerate(zip(starts, op.operands[1:])):
        if source.producer is not None and source.producer.name == "stablehlo.constant":
            out.append(start)
            continue
        t = start.type
        high = x.type.shape[d] - result_type.shape[d]
        out.append(em.emit("stablehlo.clamp", [em.scalar(0, t.element), start,
                                               em.scalar(high, t.element)], [t]).results[0])
    return out
