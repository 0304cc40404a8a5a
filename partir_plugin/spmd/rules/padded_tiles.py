"""Padded tiles (`core/padding.py`) before the ops that would read their padding: the masks
of `spmd/masking.py`, and a gather's or scatter's index hints, which padding breaks."""

from __future__ import annotations

from ...core.mesh import Mesh
from ...core.tmr import OWN_REDUCER
from ...ir.graph import Op, Value
from ..masking import WINDOW_PAD, apply_mask
from ..op_plan import Nest, OpPlan
from .base import LoweringRule, RuleContext
from .own_reducer import own_identity

_INDEX_HINTS = ("indices_are_sorted", "unique_indices")


class PaddingMasks(LoweringRule):
    """Operands whose padding a Sum entry reads: set to the reduction's identity (a halo
    entry's pad value is set before its exchange, `halo.py`)."""

    def matches(self, op: Op, nest: Nest, plan: OpPlan, mesh: Mesh) -> bool:
        return any(m.reduction != WINDOW_PAD for m in plan.masks)

    def before(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str]
               ) -> list[Value]:
        for mask in ctx.plan.masks:
            if mask.reduction == WINDOW_PAD:
                continue
            fill = (own_identity(ctx.em, ctx.op, operands, mask.operand)
                    if mask.reduction == OWN_REDUCER else None)
            operands[mask.operand] = apply_mask(ctx.em, operands[mask.operand], mask, fill)
        return operands


class IndexHints(LoweringRule):
    """A gather's or scatter's promise that its indices are sorted or unique does not hold
    for padded tiles of them (padding holds any index): dropped where an input is padded."""

    ops = frozenset({"stablehlo.gather", "stablehlo.scatter"})

    def matches(self, op: Op, nest: Nest, plan: OpPlan, mesh: Mesh) -> bool:
        return any(lay.padded(v.type.shape, mesh) for v, lay in zip(op.inputs, plan.wanted)
                   if v.type.is_tensor)

    def before(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str]
               ) -> list[Value]:
        for key in _INDEX_HINTS:
            if key in attrs:
                attrs[key] = "false"
        return operands
