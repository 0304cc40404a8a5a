"""Lowering PartIR:Core to PartIR:HLO (paper 1 §6.1): device-local ops plus collectives.

Every op gets local shapes from its loop nest. At each edge where the producer's layout
differs from what the consumer's nest slices, `convert` inserts collectives over mesh axes:
sum→full all_reduce, sum→tile reduce_scatter, tile→full all_gather, tile d→tile d' all_to_all,
full→tile all_slice (a local dynamic_slice at the device's block). Because each conversion goes
straight from the produced layout to the consumed one, `all_slice(all_gather)` and
`all_slice(all_reduce)` never materialise: they are fused as the paper says.

This module is the generic walk (regions, tags, caching, conversions). What a feature
lowers differently is a rule of `spmd/rules/`, chosen once per op plan; what it changes of the
walk itself is a policy chosen once per program, which the walk calls without knowing the
feature: the program's boundary (`boundary.ProgramBoundary`: sub-axes dropped at the user's
shardings, or the TMR verifier's results as produced), which conversions are shared between
consumers (`convert.ConversionSharing`: ZeRO-3's regather, `rules/regather.py`), and the
pending sums an op or a loop carries (`accumulation.PendingSums`).
"""

from __future__ import annotations

import re
import warnings
import weakref
from dataclasses import dataclass, field

from ..core.mesh import Mesh
from ..core.state import PartitionState
from ..ir.attributes import i64_array, parse_i64_array
from ..ir.graph import Block, Func, Op, Region, Value, clone_region, walk
from ..ir.opsets import PARTITIONED_REGIONS
from ..ir.printer import print_func
from ..ir.types import TensorType
from .accumulation import PendingSums
from .boundary import AsProduced, BoundaryDrop, ProgramBoundary
from .collectives import count_collectives
from .convert import convert
from .emitter import Emitter
from .layout import Layout
from .op_plan import PLANNED_PER_OP, Nest, OpPlan
from .provenance import Conversion, mark_origin
from .rules.base import RuleContext
from .rules.regather import conversion_sharing
from .rules.registry import layouts_made, lower_with_rules, plan_rules


@dataclass
class SpmdProgram:
    """A device-local program: what runs on every device of the mesh."""

    func: Func
    mesh: Mesh
    in_layouts: list[Layout]
    out_layouts: list[Layout]
    counts: dict[str, int] = field(default_factory=dict)
    # Arguments and results whose sub-axes the boundary could not name (`boundary.py`).
    boundary_drops: list[BoundaryDrop] = field(default_factory=list)
    # What the lowering rules found to say about this program (e.g. a `HaloWarning`), in
    # program order; the driver emits them (`emit_diagnostics`), code generation never warns.
    diagnostics: list[Warning] = field(default_factory=list)
    # Collectives printed under a name saying what they are and why (`report/collective_names.py`;
    # set before the text is first printed).
    op_names: dict[Op, str] = field(default_factory=dict, repr=False, compare=False)
    _text: str | None = field(default=None, repr=False, compare=False)

    def text(self) -> str:
        """The module's text, printed on first use: tactics' reports need none, and the
        runtime and the metadata ask for the same text."""
        if self._text is None:
            self._text = print_func(self.func, module_attrs=spmd_module_attrs(self.mesh),
                                    op_names=self.op_names)
        return self._text


def spmd_module_attrs(mesh: Mesh) -> str:
    """A device-local module runs once per partition (device) of an SPMD program, as a
    `shard_map` body does: one replica, `mesh.size` partitions."""
    return f"mhlo.num_partitions = {mesh.size} : i32, mhlo.num_replicas = 1 : i32"


def emit_diagnostics(program: SpmdProgram, stacklevel: int = 2) -> None:
    """Warn each of the program's diagnostics (the driver calls this once, for the program
    that runs; lowerings of earlier tactics' programs for the report say nothing)."""
    for diagnostic in program.diagnostics:
        warnings.warn(diagnostic, stacklevel=stacklevel + 1)


class LoweringCache:
    """Device-local code of earlier lowerings of the same function, so that lowering after a
    tactic re-lowers only the ops whose distributed types the tactic changed (paper 1 §6.1,
    made incremental).

    An op's device-local code (its segment: the op with local shapes, plus the code around it
    that the lowering adds, e.g. an iota's offset) depends only on the op, its loop nest and
    the layouts of what it reads; a conversion's collectives only on the value and its two
    layouts. Both are cached under exactly that key. On a hit the segment is reused as it is,
    the same IR objects, re-pointed at this lowering's inputs where those were re-lowered (they
    have the same local types, since the layouts match). A segment is reused only if every
    other value it reads is defined in the program being built (the emitter shares helpers
    such as the device index between segments); otherwise it is lowered afresh.

    Reusing objects means a program lowered with a cache is only valid until the next lowering
    with the same cache: `apply_schedule` keeps the last program, a searcher simulates each
    program before it lowers the next.
    """

    MAX_ENTRIES = 1 << 20  # a long search drops what it cached and starts again

    def __init__(self):
        self.args: dict[tuple[Value, Layout], Value] = {}
        # per kind of program boundary (which rules it admits):
        # (op name, nest, input types, result types) -> what lowering such an op needs
        self.op_plans: dict[type[ProgramBoundary], dict[tuple, OpPlan]] = {}
        self.ops: dict[tuple, _Segment] = {}  # (op, its plan, forwarded sums) -> its code
        self.conversions: dict[tuple[Value, Layout, Layout], _Segment] = {}

    def trim(self) -> None:
        if len(self.ops) + len(self.conversions) > self.MAX_ENTRIES:
            self.args.clear()
            self.op_plans.clear()
            self.ops.clear()
            self.conversions.clear()


@dataclass
class _Segment:
    """Cached device-local code: `ops` read `inputs` and define `outputs`."""

    ops: list[Op]
    inputs: list[Value]
    outputs: list
    diagnostics: list[Warning] = field(default_factory=list)  # what its rules reported


# Ops whose attributes spell out shapes (`_rewrite_attributes`).
_SHAPED_ATTRIBUTES = frozenset({"stablehlo.constant", "stablehlo.slice",
                                "stablehlo.dynamic_slice", "stablehlo.gather"})


class _Lowering:
    def __init__(self, state: PartitionState, cache: LoweringCache | None = None,
                 boundary: ProgramBoundary | None = None):
        self.state = state
        self.mesh = state.mesh
        self.boundary = boundary or ProgramBoundary(self.mesh)
        self.body = Block()
        self.em = Emitter(self.mesh, self.body)
        self.local: dict[Value, tuple[Value, Layout]] = {}
        self.converted: dict[tuple[Value, Layout], Value] = {}
        self.cache = cache
        self.top = True  # lowering top-level ops (segments are cached only there)
        self.defined: set[Value] = set()  # local values the top-level block defines so far
        self._swept = 0
        self.consumer: Op | None = None  # the op being lowered (None: the function's return)
        # loop-carried accumulators keep their pending sums
        # (through a weak reference: a lowering is no reference cycle, so it is freed when
        # done, not left to the collector; a search lowers thousands)
        made = weakref.WeakMethod(self._layouts_made)
        self.pending = PendingSums(state, lambda op: made()(op))
        self.sharing = conversion_sharing(state)  # which conversions consumers share
        self.diagnostics: list[Warning] = []
        # Plans (and the rules they chose) are shared through the cache between lowerings
        # whose boundaries admit the same rules.
        self.op_plans: dict[tuple, OpPlan] = (
            cache.op_plans.setdefault(type(self.boundary), {}) if cache is not None else {})

    def declared(self, v: Value) -> Layout:
        return Layout.from_tiles(v.type.rank, self.state.tiles_of(v), mesh=self.mesh)

    def use(self, v: Value, want: Layout) -> Value:
        x, have = self.local[v]
        if have is want or have == want:  # most edges: nothing to convert
            return x
        if not self.sharing.shared(v):
            return self._convert(v, x, have, want)  # each consumer converts afresh
        key = (v, want)
        y = self.converted.get(key)
        if y is None:
            y = self.converted[key] = self._convert(v, x, have, want)
        return y

    def _inputs(self, values: list[Value], wanted, kept: tuple[int, ...] = ()
                ) -> list[Value]:
        """`use` of each of `values` in the layout `wanted` of it: the local value itself
        where it has that layout already (most edges), without a call per edge, or where it
        is one of the `kept` (read as it comes: a forwarded pending sum)."""
        local = self.local
        out = []
        for i, (v, want) in enumerate(zip(values, wanted)):
            x, have = local[v]
            out.append(x if have is want or i in kept else self.use(v, want))
        return out

    def _convert(self, v: Value, x: Value, have: Layout, want: Layout) -> Value:
        if have == want or not x.type.is_tensor:
            return x
        # A conversion made afresh for each consumer has one segment per consumer: not cached.
        caching = self.cache is not None and self.top and self.sharing.shared(v)
        if caching:
            hit = self.cache.conversions.get((v, have, want))
            if hit is not None and self._reuse(hit, [x]):
                return hit.outputs[0]
        start = len(self.em.block.ops)
        y = convert(self.em, x, have, want, self.state.scatter_sums, v.type.shape)
        mark_origin(self.em.block.ops[start:], Conversion(v, self.consumer, have, want))
        if caching:
            self.cache.conversions[(v, have, want)] = _Segment(self.em.block.ops[start:], [x],
                                                               [y])
        return y
    def _sweep(self) -> None:
        """Record the local values defined by top-level ops appended since the last sweep."""
        ops = self.body.ops
        for op in ops[self._swept:]:
            self.defined.update(op.results)
        self._swept = len(ops)

    def _reuse(self, segment: _Segment, inputs: list[Value]) -> bool:
        """Append a cached segment, re-pointed from the inputs it was lowered with to
        `inputs`, if every other value it reads is defined here."""
        self._sweep()
        moved = {old: new for old, new in zip(segment.inputs, inputs) if old is not new}
        inside: set[Value] = set()
        for op in segment.ops:
            for v in op.operands:
                if v not in moved and v not in self.defined and v not in inside:
                    return False
            inside.update(op.results)
        if moved:
            for op in segment.ops:
                op.operands = [moved.get(v, v) for v in op.operands]
            segment.inputs = list(inputs)
        self.body.ops.extend(segment.ops)
        self._sweep()
        return True

    def run(self) -> SpmdProgram:
        func = self.state.func
        boundary = self.boundary
        in_layouts = []
        for a, name in zip(func.args, _arg_labels(func)):
            layout = boundary.argument(self.declared(a), a.type.shape, f"argument {name!r}")
            in_layouts.append(layout)
            local = self.cache.args.get((a, layout)) if self.cache is not None else None
            if local is None:
                local = self.body.add_arg(layout.local_type(a.type, self.mesh))
                if self.cache is not None:
                    self.cache.args[(a, layout)] = local
            else:
                self.body.args.append(local)
            self.local[a] = (local, layout)
        self.defined.update(self.body.args)
        for a in func.args:
            if self.local[a][1] != self.declared(a):
                self.em.serving = next((u for u, _ in self.state.users.get(a, ()) if u), None)
                self.local[a] = (self.use(a, self.declared(a)), self.declared(a))
        for op in func.ops:
            self.lower_op(op)
        out_layouts, returns = [], []
        self.consumer = None
        for k, v in enumerate(func.returns):
            self.em.serving = v.producer
            layout = boundary.result(self.declared(v), self.local[v][1], v.type.shape,
                                     f"result {k}")
            out_layouts.append(layout)
            returns.append(self.use(v, layout))
        if self.cache is not None:
            self.cache.trim()
        local = Func(func.name, self.body, returns, list(func.arg_names))
        return SpmdProgram(local, self.mesh, in_layouts, out_layouts,
                           count_collectives(walk(self.body.ops)), boundary.drops,
                           self.diagnostics)

    def lower_op(self, op: Op) -> None:
        self.consumer = self.em.serving = op
        if op.name in PARTITIONED_REGIONS:
            self._lower_regions(op)
            return
        if op.results and op.results[0].tag is not None:
            # A tag is an identity. Where a tactic decided it, it is a redistribution point:
            # what it names goes straight to the tagged value's layout (e.g. one all_to_all).
            tagged = op.results[0]
            layout = self.declared(tagged)
            self.local[tagged] = (self.use(op.operands[0], layout), layout)
            return
        nest = self.state.nest_of(op)
        plan = self._plan(op, nest)
        ctx = None
        if plan.early:
            ctx = self._context(op, nest, plan)
            for rule in plan.early:
                replaced = rule.replace(ctx)
                if replaced is not None:
                    for r, local in zip(op.results, replaced):
                        self.local[r] = local
                    return
            for rule in plan.early:  # on every lowering: the incoming layouts are no key
                rule.check(ctx)
        wanted = plan.wanted
        forwarded = self.pending.lowered(op, wanted, self.local)
        inputs = self._inputs(op.inputs, wanted, self.pending.kept(op, forwarded))
        caching = self.cache is not None and self.top and not op.captures
        if caching:
            key = (op, plan, forwarded)  # the plan stands for the nest (`_plan`)
            hit = self.cache.ops.get(key)
            if hit is not None and self._reuse(hit, inputs):
                for r, local in zip(op.results, hit.outputs):
                    self.local[r] = local
                self.diagnostics += hit.diagnostics
                return
            start, reported = len(self.body.ops), len(self.diagnostics)
        produced = plan.produced_with(op, nest, forwarded, self.mesh)
        operands = inputs[: len(op.operands)]
        regions = []
        if op.regions:  # few ops have any: their captures map into the copies
            env = dict(zip(op.captures, inputs[len(op.operands):]))
            regions = [clone_region(r, env) for r in op.regions]
        if not plan.rules:
            attrs = op.attributes
            if op.name in _SHAPED_ATTRIBUTES:
                attrs = dict(attrs)
                _rewrite_attributes(op, attrs, operands, plan.result_types)
            results = self.em.emit(op.name, operands, plan.result_types, attrs,
                                   regions).results
        else:
            attrs = dict(op.attributes)
            _rewrite_attributes(op, attrs, operands, plan.result_types)
            ctx = ctx or self._context(op, nest, plan)
            ctx.produced = produced
            results = lower_with_rules(ctx, operands, attrs, regions)
        for r, x, lay in zip(op.results, results, produced):
            self.local[r] = (x, lay)
        if caching:
            self.cache.ops[key] = _Segment(self.body.ops[start:], inputs,
                                           [self.local[r] for r in op.results],
                                           self.diagnostics[reported:])

    def _context(self, op: Op, nest: Nest, plan: OpPlan) -> RuleContext:
        return RuleContext(op, nest, plan, self.em, self.state,
                           [self.local[v][1] for v in op.inputs], self.use, self.diagnostics)

    def _plan(self, op: Op, nest: Nest) -> OpPlan:
        """The op's `OpPlan` in `nest`, one object per distinct plan, with its rules. A plan
        depends on the op's name, types and nest alone (a gather's masks and rules also on
        its dimension numbers: `PLANNED_PER_OP`), and a program has few distinct ones (148
        for the 8.8k ops of a 16-layer decoder): shared by value."""
        if op.name in PLANNED_PER_OP:
            key = (op, nest)
        else:
            key = (op.name, nest, tuple([v.type for v in op.inputs]),
                   tuple([r.type for r in op.results]))
        plan = self.op_plans.get(key)
        if plan is None:
            plan = self.op_plans[key] = OpPlan.make(op, nest, self.mesh)
            plan_rules(op, nest, plan, self.mesh, self.boundary.admits)
        return plan

    def _layouts_made(self, op: Op) -> list[Layout] | None:
        """The layouts `op`'s rules make its results in, where not its TMR entries'."""
        nest = self.state.nest_of(op)
        return layouts_made(self._plan(op, nest), self.state, op, nest)

    def _lower_regions(self, op: Op) -> None:
        """`while` and `case`, whose regions are partitioned like the top level. A loop-carried
        value (or a case result) has one layout, shared through the state's aliases: while
        operands are converted to it, each region is lowered once with it, and the values a
        region returns are converted to it before its terminator. Outer values a region uses
        are converted inside it (implicit captures)."""
        layouts = self.pending.loop_layouts(op, [self.declared(r) for r in op.results])
        if op.name == "stablehlo.while":  # its operands are the carried values
            operands = [self.use(v, lay) for v, lay in zip(op.operands, layouts)]
        else:  # case: the branch index
            operands = [self.use(v, self.declared(v)) for v in op.operands]
        outer = (self.em, self.converted, self.top)
        self.top = False
        regions = []
        for index, region in enumerate(op.regions):
            block = region.blocks[0]
            local_block = Block()
            self.em, self.converted = Emitter(self.mesh, local_block), {}
            for a, lay in zip(block.args, layouts):
                self.local[a] = (local_block.add_arg(lay.local_type(a.type, self.mesh)), lay)
            for inner in block.ops[:-1]:
                self.lower_op(inner)
            term = block.ops[-1]
            # values a region returns are converted for the loop or case
            self.consumer = self.em.serving = op
            is_condition = op.name == "stablehlo.while" and index == 0
            wanted = [self.declared(v) for v in term.operands] if is_condition else layouts
            returns = [self.use(v, lay) for v, lay in zip(term.operands, wanted)]
            local_block.ops.append(Op(term.name, returns, []))
            regions.append(Region([local_block]))
        self.em, self.converted, self.top = outer
        new = self.em.emit(op.name, operands, [lay.local_type(r.type, self.mesh)
                                               for lay, r in zip(layouts, op.results)],
                           dict(op.attributes), regions)
        for r, x, lay in zip(op.results, new.results, layouts):
            self.local[r] = (x, lay)

def _arg_labels(func: Func) -> list[str]:
    names = list(func.arg_names or [])
    return [names[i] if i < len(names) and names[i] else f"#{i}"
            for i in range(len(func.args))]


def _rewrite_attributes(op: Op, attrs: dict[str, str], operands: list[Value],
                        result_types: list[TensorType]) -> None:
    """Attributes that spell out shapes, rewritten for the local shapes."""
    if op.name == "stablehlo.constant" and result_types[0] != op.results[0].type:
        attrs["value"] = re.sub(r":\s*tensor<[^>]*>$", f": {result_types[0]}", attrs["value"])
    elif op.name == "stablehlo.slice":
        limits = parse_i64_array(attrs["limit_indices"])
        for d, (g, loc) in enumerate(zip(op.operands[0].type.shape, operands[0].type.shape)):
            if g != loc:  # a tiled dimension is sliced whole
                limits[d] = loc
        attrs["limit_indices"] = i64_array(limits)
    elif op.name == "stablehlo.dynamic_slice":
        attrs["slice_sizes"] = i64_array(result_types[0].shape)
    elif op.name == "stablehlo.gather":
        sizes = parse_i64_array(attrs["slice_sizes"])
        for d, (g, loc) in enumerate(zip(op.operands[0].type.shape, operands[0].type.shape)):
            if g != loc and sizes[d] == g:  # a whole-slice (offset) dimension that is tiled
                sizes[d] = loc
        attrs["slice_sizes"] = i64_array(sizes)


def lower_to_spmd(state: PartitionState, cache: LoweringCache | None = None, *,
                  as_produced: bool = False) -> SpmdProgram:
    """Lower a partitioned function to its device-local program; with a `cache` of earlier
    lowerings of the same function, only what changed since is lowered again.

    `as_produced` returns each result in the layout its producer made it, pending sums left
    unreduced (the TMR verifier runs one op's tiles and combines them itself)."""
    return _Lowering(state, cache, AsProduced(state.mesh) if as_produced else None).run()
