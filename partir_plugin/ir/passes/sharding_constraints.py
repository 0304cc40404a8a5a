"""jax's sharding annotations dropped: `sdy.sharding_constraint` and `sdy.reshard` are
identities whose shardings the schedule decides instead, so each use of one's result reads
its operand."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from ..graph import Func, Value, blocks
from .pipeline import FuncPass

SHARDING_OPS = frozenset({"sdy.sharding_constraint", "sdy.reshard"})


@dataclass(frozen=True)
class DropShardingConstraints(FuncPass):
    name = "drop-sharding-constraints"

    def wanted(self, seen: Set[str]) -> bool:
        return not SHARDING_OPS.isdisjoint(seen)

    def apply(self, func: Func) -> None:
        through: dict[Value, Value] = {}
        for block in blocks(func.body):
            for op in block.ops:
                if op.name in SHARDING_OPS:
                    v = op.operands[0]
                    through[op.results[0]] = through.get(v, v)
        for block in blocks(func.body):
            block.ops = [op for op in block.ops if op.name not in SHARDING_OPS]
            for op in block.ops:
                op.operands = [through.get(v, v) for v in op.operands]
                if op.captures:
                    # Read through, a captured annotation may be its operand, captured too.
                    op.captures = list(dict.fromkeys(through.get(v, v) for v in op.captures))
        func.returns = [through.get(v, v) for v in func.returns]
