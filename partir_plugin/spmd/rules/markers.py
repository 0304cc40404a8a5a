"""partir's data-movement ops (`partir.roll`, `partir.interleave`, frontend markers): data
movement along one dimension, lowered in the op's place to collective_permutes between the
devices that tile it (`roll.py`, `interleave.py`), recorded as a movement of the user's line."""

from __future__ import annotations

from typing import ClassVar

from ...ir.attributes import parse_scalar
from ...ir.graph import Region, Value
from ..emitter import Emitter
from ..provenance import Movement, mark_origin
from .base import LoweringRule, RuleContext


class Marker(LoweringRule):
    """The lowering of the marker op named `op_name`."""

    op_name: ClassVar[str]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.ops = frozenset({cls.op_name})

    def emit(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str],
             regions: list[Region]) -> list[Value]:
        op, em = ctx.op, ctx.em
        a = {k: parse_scalar(v) for k, v in op.attributes.items()}
        dim = a.get("axis", 0)
        axes = tuple(ax for ax, e in ctx.nest if e.operands[0] == dim)
        start = len(em.block.ops)
        y = self.move(em, operands[0], a, dim, axes)
        mark_origin(em.block.ops[start:], Movement(op))  # records: its line and phase
        return [y]

    def move(self, em: Emitter, x: Value, attrs: dict, dim: int, axes: tuple[str, ...]
             ) -> Value:
        """`x`, this device's block of dimension `dim` tiled over `axes`, moved (each marker's
        rule says how: `roll.Roll`, `interleave.Interleave`)."""
        raise NotImplementedError(f"{type(self).__name__} must define move()")
