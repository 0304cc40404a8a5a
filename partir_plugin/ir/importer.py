"""Import StableHLO (text, bytecode or a `jax.stages.Lowered`) into the Python IR.

We parse with jaxlib's MLIR bindings, run Shardy's `sdy-populate-op-sharding-rules` so every op
Shardy knows carries its factor-based sharding rule, then walk the module once, inlining
`func.call` and `stablehlo.composite` (its decomposition) but the composites partir keeps
whole (`dialect.KEPT_COMPOSITES`). The walk is linear in the number of ops. The rewrites of
the imported program are passes (`ir/passes`), run as one pipeline over the ops it saw.
"""

from __future__ import annotations

from jaxlib.mlir import ir, passmanager

from .._gc import gc_paused
from .dialect import KEPT_COMPOSITES, TAG_OP, tag_name
from .graph import Block, Func, Op, Region, Value, walk
from .locations import location_name
from .passes import IMPORT_PIPELINE, Pipeline
from .types import TensorType

_RULE_ATTR = "sdy.sharding_rule"


def make_context() -> ir.Context:
    from jax._src.interpreters import mlir as jax_mlir

    return jax_mlir.make_ir_context()


def _type(t: ir.Type) -> TensorType:
    if isinstance(t, ir.RankedTensorType):
        return TensorType(tuple(t.shape), str(t.element_type))
    try:
        rt = ir.RankedTensorType(t)
    except (ValueError, TypeError):
        return TensorType((), str(t), opaque=True)
    return TensorType(tuple(rt.shape), str(rt.element_type))


class _Importer:
    def __init__(self, module: ir.Operation, pipeline: Pipeline):
        self.funcs = {}
        for op in module.regions[0].blocks[0].operations:
            if op.operation.name == "func.func":
                name = ir.StringAttr(op.attributes["sym_name"]).value
                self.funcs[name] = op

        self.tags: dict[str, list[Value]] = {}  # a name may tag several values
        self.types: dict[ir.Type, TensorType] = {}  # a program has few distinct types
        self.texts: dict[ir.Attribute, str] = {}  # and few distinct attributes
        # One location object per distinct location (ops of one line share it), so the
        # printer defines each once by identity (`location_aliases.py`).
        self.locations: dict[ir.Attribute, ir.Location] = {}
        self.pipeline = pipeline
        # The op names imported: the pipeline runs the passes that rewrite some of them.
        self.seen: set[str] = set()

    def _type(self, t: ir.Type) -> TensorType:
        tt = self.types.get(t)
        if tt is None:
            tt = self.types[t] = _type(t)
        return tt

    def _location(self, op) -> ir.Location:
        loc = op.location
        return self.locations.setdefault(loc.attr, loc)

    def import_func(self, name: str) -> Func:
        fop = self.funcs[name]
        block = fop.regions[0].blocks[0]
        body = Block()
        env: dict[ir.Value, Value] = {}
        for a in block.arguments:
            env[a] = body.add_arg(self._type(a.type))
        returns = self._import_ops(block, env, body.ops)
        tags = {tag: list(values) for tag, values in self.tags.items()}
        func = Func(name=name, body=body, returns=returns, tags=tags)
        self.pipeline.run(func, self.seen)
        return func

    def _import_ops(self, block, env: dict, out: list[Op]) -> list[Value]:
        """Import `block`'s ops into `out`; return the values its terminator returns."""
        texts = self.texts
        for mop in block.operations:
            op = mop.operation
            name = op.name
            if name in ("func.return", "stablehlo.return"):
                return [env[v] for v in op.operands]
            kept = (ir.StringAttr(op.attributes["name"]).value
                    if name == "stablehlo.composite" else None)
            if kept in KEPT_COMPOSITES:
                attrs = ir.DictAttr(op.attributes["composite_attributes"])
                whole = Op(kept, [env[op.operands[0]]], [self._type(op.results[0].type)],
                           {k: str(attrs[k]) for k in KEPT_COMPOSITES[kept]})
                whole.mlir_location = self._location(op)
                env[op.results[0]] = whole.results[0]
                out.append(whole)
                continue
            if name in ("func.call", "stablehlo.composite"):
                # Calls are inlined; so are composites: the decomposition is their meaning,
                # and inlined it partitions like any other code (the composite's name, which
                # a backend could map to a fused kernel, is not kept).
                key = "callee" if name == "func.call" else "decomposition"
                callee = ir.FlatSymbolRefAttr(op.attributes[key]).value
                inner = self.funcs[callee].regions[0].blocks[0]
                sub_env = dict(env)
                for a, v in zip(inner.arguments, op.operands):
                    sub_env[a] = env[v]
                rets = self._import_ops(inner, sub_env, out)
                for r, v in zip(op.results, rets):
                    env[r] = v
                continue
            attrs = {}
            rule = None
            for key in op.attributes:
                # Attributes are uniqued in their context: equal ones print once.
                attr = op.attributes[key]
                text = texts.get(attr)
                if text is None:
                    text = texts[attr] = str(attr)
                if key == _RULE_ATTR:
                    rule = text
                else:
                    attrs[key] = text
            regions = []
            for mregion in op.regions:
                region = Region()
                for mblock in mregion.blocks:
                    b = Block()
                    for a in mblock.arguments:
                        env[a] = b.add_arg(self._type(a.type))
                    terminator = self._import_ops(mblock, env, b.ops)
                    # Region terminators are kept as explicit ops so the printer can emit them.
                    term_name = mblock.operations[len(mblock.operations) - 1].operation.name
                    b.ops.append(Op(term_name, terminator, []))
                    region.blocks.append(b)
                regions.append(region)
            results = op.results
            self.seen.add(name)
            new = Op(name, [env[v] for v in op.operands],
                     [self._type(r.type) for r in results], attrs, regions)
            new.rule = rule
            # Kept, not parsed: parsed when a message or a record names the op (the MLIR
            # context lives as long as the location object).
            new.mlir_location = self._location(op)
            if name == TAG_OP:
                t = tag_name(location_name(new.mlir_location))
                if t:
                    new.results[0].tag = t
                    self.tags.setdefault(t, []).append(new.results[0])
            if regions:
                new.captures = _captures(new)
            for r, v in zip(results, new.results):
                env[r] = v
            out.append(new)
        return []


def _captures(op: Op) -> list[Value]:
    """Values used inside `op`'s regions but defined outside them, in first-use order."""
    defined: set[Value] = set()
    used: list[Value] = []
    for region in op.regions:
        for block in region.blocks:
            defined.update(block.args)
    inner = list(walk([b_op for r in op.regions for b in r.blocks for b_op in b.ops]))
    for o in inner:
        defined.update(o.results)
        for r in o.regions:
            for b in r.blocks:
                defined.update(b.args)
    seen: set[Value] = set()
    for o in inner:
        for v in o.operands:
            if v not in defined and v not in seen:
                seen.add(v)
                used.append(v)
    return used


def _import_module(module: ir.Operation, entry: str, pipeline: Pipeline) -> Func:
    """Annotate `module` with Shardy's rules and import its `entry` function, inlined, its
    rewrites run by `pipeline`."""
    with gc_paused():
        pm = passmanager.PassManager.parse(
            "builtin.module(func.func(sdy-populate-op-sharding-rules))")
        pm.run(module)
        imp = _Importer(module, pipeline)
        if entry not in imp.funcs:
            raise ValueError(f"no function @{entry} in module (have: {sorted(imp.funcs)})")
        return imp.import_func(entry)


def import_stablehlo(source: str | bytes, entry: str = "main",
                     pipeline: Pipeline = IMPORT_PIPELINE) -> Func:
    """Import a StableHLO module (text or bytecode) and return its entry function, inlined."""
    with make_context():
        return _import_module(ir.Module.parse(source).operation, entry, pipeline)


def import_lowered(lowered, pipeline: Pipeline = IMPORT_PIPELINE) -> Func:
    """Import the StableHLO of a `jax.jit(fn).lower(*args)` result.

    A copy of the module jax built, in jax's context: printing it and parsing the text again
    would cost more than the walk itself (and the copy leaves jax's module, which jax may
    cache and compile, without our annotations)."""
    module = lowered.compiler_ir("stablehlo")
    with module.context:
        return _import_module(module.operation.clone(), "main", pipeline)
