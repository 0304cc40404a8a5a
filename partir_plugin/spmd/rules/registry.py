"""The lowering rules, in the order they wrap an op (`base.py`), and the choice of an op's
rules, made once per op plan."""

from __future__ import annotations

from collections.abc import Callable

from ...core.mesh import Mesh
from ...core.state import PartitionState
from ...ir.graph import Op, Region, Value
from ..layout import Layout
from ..op_plan import Nest, OpPlan
from .base import LoweringRule, RuleContext
from .dynamic_slice import DynamicSliceClamp
from .embedding import EmbeddingLookup, ScatterExchange
from .halo import GatheredWindow, HaloExchange, PaddedScatter
from .interleave import Interleave
from .iota import IotaOffset
from .manual_body import ManualBody
from .masked_window import MaskedSlice, MaskedUpdate
from .one_device import OnOneDevice
from .own_reducer import OwnReducer
from .padded_tiles import IndexHints, PaddingMasks
from .prefix_scan import PrefixScan
from .roll import Roll

RULES: tuple[LoweringRule, ...] = (
    HaloExchange(), GatheredWindow(), PaddedScatter(), PaddingMasks(), OwnReducer(),
    IotaOffset(), IndexHints(), DynamicSliceClamp(), MaskedUpdate(), MaskedSlice(),
    EmbeddingLookup(), ScatterExchange(), PrefixScan(), Roll(), Interleave(), OnOneDevice(),
    ManualBody(),
)

# The rules to ask about an op, by its name, in registry order.
_ANY_OP = tuple(r for r in RULES if r.ops is None)
_BY_NAME: dict[str, tuple[LoweringRule, ...]] = {
    name: tuple(r for r in RULES if r.ops is None or name in r.ops)
    for rule in RULES for name in rule.ops or ()}


def plan_rules(op: Op, nest: Nest, plan: OpPlan, mesh: Mesh,
               admits: Callable[[LoweringRule], bool] | None = None) -> None:
    """Set `plan.rules`, the rules that apply to `op` in `nest` (none: the op is lowered as
    itself on local shapes), and `plan.early`; only rules the program's boundary `admits`
    (`boundary.ProgramBoundary.admits`; the verifier's admits none that change layouts)."""
    plan.rules = tuple(r for r in _BY_NAME.get(op.name, _ANY_OP)
                       if (admits is None or admits(r)) and r.matches(op, nest, plan, mesh))
    plan.early = tuple(r for r in plan.rules if type(r).check is not LoweringRule.check
                       or type(r).replace is not LoweringRule.replace)


def layouts_made(plan: OpPlan, state: PartitionState, op: Op, nest: Nest
                 ) -> list[Layout] | None:
    """The layouts the rules of `plan` make `op`'s results in where some rule makes other
    layouts than its TMR entries' (`LoweringRule.layouts`), else None."""
    for rule in plan.rules:
        if rule.changes_layouts:
            made = rule.layouts(state, op, nest)
            if made is not None:
                return made
    return None


def lower_with_rules(ctx: RuleContext, operands: list[Value], attrs: dict[str, str],
                     regions: list[Region]) -> list[Value]:
    """The op's local results, its rules wrapped around it."""
    rules = ctx.plan.rules
    for rule in rules:
        operands = rule.before(ctx, operands, attrs)
    results = None
    for rule in rules:
        results = rule.emit(ctx, operands, attrs, regions)
        if results is not None:
            break
    if results is None:
        results = ctx.em.emit(ctx.op.name, operands, ctx.plan.result_types, attrs,
                              regions).results
    for rule in reversed(rules):
        results = rule.after(ctx, results, operands)
    return results
