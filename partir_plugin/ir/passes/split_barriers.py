"""One optimization barrier per value: a barrier of several values (jax's rematerialization
fences a layer's activations together) becomes one barrier per value. Each stays fenced, and
each can be tiled on its own: a joint barrier would need one TMR entry per combination of its
values' dimensions."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from ..graph import Func, Op, blocks
from .pipeline import FuncPass

BARRIER = "stablehlo.optimization_barrier"


@dataclass(frozen=True)
class SplitBarriers(FuncPass):
    name = "split-barriers"

    def wanted(self, seen: Set[str]) -> bool:
        return BARRIER in seen

    def apply(self, func: Func) -> None:
        for block in blocks(func.body):
            if any(_joint(op) for op in block.ops):
                block.ops = [single for op in block.ops
                             for single in (_split(op) if _joint(op) else (op,))]


def _joint(op: Op) -> bool:
    return op.name == BARRIER and len(op.operands) > 1


def _split(op: Op) -> list[Op]:
    """A barrier per operand, each keeping its result value (so its users stay as they are)."""
    singles = []
    for v, r in zip(op.operands, op.results):
        single = Op(op.name, [v], [])
        r.owner, r.index = single, 0
        single.results = [r]
        single.mlir_location = op.mlir_location
        singles.append(single)
    return singles
