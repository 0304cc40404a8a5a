"""What lowering an op in its loop nest needs that no other op's lowering changes: the layouts
its inputs are converted to, its results' layouts and local types, its masks, and the lowering
rules that apply to it (`spmd/rules/`), decided once per distinct (op name, types, nest)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.mesh import Mesh
from ..core.tmr import Sum, TMREntry, pending_sums
from ..ir.graph import Op
from ..ir.types import TensorType
from .layout import Layout
from .masking import Mask, masks

Nest = tuple[tuple[str, TMREntry], ...]  # an op's loop nest: (mesh axis, TMR entry), outer first

# Ops whose masks and rules depend on attributes besides their types (a gather's dimension
# numbers: an embedding lookup or not): planned per op, not per name, types and nest.
PLANNED_PER_OP = frozenset({"stablehlo.gather"})


def wanted_layouts(op: Op, nest: Nest, mesh: Mesh) -> tuple[Layout, ...]:
    """The layouts the op's nest consumes its inputs in (tiled as its entries tile them)."""
    return tuple(Layout.from_tiles(v.type.rank, [(a, e.operands[i]) for a, e in nest
                                                 if e.operands[i] is not None], mesh=mesh)
                 for i, v in enumerate(op.inputs))


def produced_layouts(op: Op, nest: Nest, forwarded: tuple, mesh: Mesh) -> list[Layout]:
    """The layouts the op makes its results in: tiled as the nest tiles them, with the sums
    it leaves pending (after the ones it forwards)."""
    return [Layout.from_tiles(r.type.rank, [(a, e.results[j]) for a, e in nest
                                            if not isinstance(e.results[j], Sum)],
                              [*forwarded, *pending_sums(nest, j)], mesh)
            for j, r in enumerate(op.results)]


@dataclass(eq=False)
class OpPlan:
    """Shared by the ops of one name, types and nest (`_Lowering._plan`). Most ops match no
    rule: lowered as the op itself on local shapes, the lowering asks no rule op by op."""

    wanted: tuple[Layout, ...]
    produced: tuple[Layout, ...]  # with no sums forwarded (`accumulation.forwarded_sum`)
    result_types: tuple[TensorType, ...]
    masks: tuple[Mask, ...]
    own: tuple[str, ...]  # the axes of entries whose partials only the op's reducer combines
    # The `rules.base.LoweringRule`s that apply, set by `rules.registry.plan_rules` (typed
    # `Any` here: the rules import this module, and the package keeps no import cycle, not
    # even a typing-only one).
    rules: tuple[Any, ...] = field(default=())
    # Those of `rules` that check the incoming layouts or replace the op's lowering: asked
    # before the cache (`LoweringRule.check`, `LoweringRule.replace`).
    early: tuple[Any, ...] = field(default=())

    @classmethod
    def make(cls, op: Op, nest: Nest, mesh: Mesh) -> OpPlan:
        wanted = wanted_layouts(op, nest, mesh)
        produced = tuple(produced_layouts(op, nest, (), mesh))
        result_types = tuple(lay.local_type(r.type, mesh) for lay, r in zip(produced, op.results))
        own = tuple(a for a, e in nest
                    if any(isinstance(r, Sum) and not r.pending for r in e.results))
        return cls(wanted, produced, result_types, tuple(masks(op, nest, mesh)), own)

    def produced_with(self, op: Op, nest: Nest, forwarded: tuple, mesh: Mesh
                      ) -> tuple[Layout, ...] | list[Layout]:
        """The results' layouts when the op runs on the pending sum `forwarded`
        (`accumulation.PendingSums.lowered`; most ops forward none: `produced`)."""
        return produced_layouts(op, nest, forwarded, mesh) if forwarded else self.produced
