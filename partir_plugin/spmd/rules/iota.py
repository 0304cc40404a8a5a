"""An iota on a tiled dimension counts from its tile's start, not from 0."""

from __future__ import annotations

from ...ir.attributes import parse_scalar
from ...ir.graph import Value
from ...ir.types import TensorType
from .base import LoweringRule, RuleContext


class IotaOffset(LoweringRule):
    ops = frozenset({"stablehlo.iota"})

    def after(self, ctx: RuleContext, results: list[Value], operands: list[Value]
              ) -> list[Value]:
        op, em, local = ctx.op, ctx.em, results[0]
        dim = parse_scalar(op.attributes["iota_dimension"])
        axes = ctx.produced[0].dims[dim]
        if not axes:
            return results
        start = em.per_device(em.tile_starts(op.results[0].type.shape[dim], axes))
        start = em.emit("stablehlo.convert", [start], [TensorType((), local.type.element)]
                        ).results[0]
        return [em.emit("stablehlo.add", [local, em.broadcast(start, local.type)],
                        [local.type]).results[0]]
