"""A lowering rule and what it sees of the lowering of one op.

A rule wraps the plain lowering of the ops it `matches` (decided once per op plan): `check`
reports diagnostics that depend on the layouts the inputs arrive in (run on every lowering,
a cached segment's too), `replace` lowers the op whole, its inputs' conversions included;
`before` rewrites the local operands and attributes, `emit` lowers the op in its place, `after`
rewrites its local results. Rules apply in registry order, `after` in reverse (the rule that
rewrote the operands first sees the results last)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from ...core.mesh import Mesh
from ...core.state import PartitionState
from ...ir.graph import Op, Region, Value
from ..emitter import Emitter
from ..layout import Layout
from ..op_plan import Nest, OpPlan


@dataclass
class RuleContext:
    """One op being lowered, as a rule sees it."""

    op: Op
    nest: Nest
    plan: OpPlan
    em: Emitter
    state: PartitionState
    have: list[Layout]  # the layouts the op's inputs arrive in (before any conversion)
    use: Callable[[Value, Layout], Value]  # an input converted to a layout (cached per edge)
    diagnostics: list[Warning]  # the program's (`SpmdProgram.diagnostics`)
    produced: list[Layout] = field(default_factory=list)  # its results' layouts

    @property
    def mesh(self) -> Mesh:
        return self.em.mesh


class LoweringRule:
    """One feature's lowering; the hooks a rule does not override change nothing."""

    # The ops it lowers, by name (None: any op its `matches` accepts), as jax registers a
    # lowering per primitive: the registry asks only these rules about an op.
    ops: ClassVar[frozenset[str] | None] = None
    # A rule that makes results in other layouts than the op's TMR entries (an exchanged
    # scatter): not applied where the results must be as produced (the TMR verifier).
    changes_layouts: ClassVar[bool] = False

    def matches(self, op: Op, nest: Nest, plan: OpPlan, mesh: Mesh) -> bool:
        """Does the rule apply to `op` (one of `ops`) in `nest`? Asked once per op plan."""
        return True

    def check(self, ctx: RuleContext) -> None:
        """Append diagnostics about the incoming layouts to `ctx.diagnostics`."""

    def replace(self, ctx: RuleContext) -> list[tuple[Value, Layout]] | None:
        """The op's local results and their layouts, or None to lower it otherwise."""
        return None

    def layouts(self, state: PartitionState, op: Op, nest: Nest) -> list[Layout] | None:
        """The layouts a rule that `changes_layouts` makes `op`'s results in, None where it
        keeps the TMR entries' (the pending-sum prediction asks: `accumulation.PendingSums`).
        Depends on the partitioned program alone, not on the incoming layouts."""
        return None

    def before(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str]
               ) -> list[Value]:
        return operands

    def emit(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str],
             regions: list[Region]) -> list[Value] | None:
        """The op's local results emitted in its place, or None (the op itself)."""
        return None

    def after(self, ctx: RuleContext, results: list[Value], operands: list[Value]
              ) -> list[Value]:
        return results

    def __repr__(self) -> str:
        return type(self).__name__
