"""Import StableHLO (text, bytecode or a `jax.stages.Lowered`) into the Python IR.

We parse with jaxlib's MLIR bindings, run Shardy's `sdy-populate-op-sharding-rules` so every op
Shardy knows carries its factor-based sharding rule, then walk the entry function once, and
each function its `func.call`s and `stablehlo.composite`s name once (`Func.callees`), but for
the composites partir keeps whole (`dialect.KEPT_COMPOSITES`, imported as one op). The walk is
linear in the number of ops. The rewrites of the imported program, inlining the calls first,
are passes (`ir/passes`), run as one pipeline over the ops it saw.

Shardy's per-op shardings are dropped (partir chooses the layouts) but for two cases: a
maximal one puts the op on one device (a host callback, `ON_DEVICE_ATTR`), and a manual
computation (a `jax.shard_map`) keeps the text of the mesh its shardings name (`MESH_ATTR`).
"""

from __future__ import annotations

import re

from jaxlib.mlir import ir, passmanager

from .._gc import gc_paused
from .dialect import (
    KEPT_COMPOSITES,
    MANUAL_COMPUTATION,
    MESH_ATTR,
    ON_DEVICE_ATTR,
    TAG_OP,
    tag_name,
)
from .graph import Block, Func, Op, Region, Value, captures_of, tagged_values
from .locations import location_name
from .passes import IMPORT_PIPELINE, Pipeline
from .passes.inline_calls import CALL_OPS, CALLEE
from .types import TensorType

_RULE_ATTR = "sdy.sharding_rule"
# An op's Shardy sharding: dropped (partir chooses the layouts), but for a maximal one, on one
# device (`ON_DEVICE_ATTR`): `<@mesh, [...]>` naming a module-level `sdy.mesh` of no axes.
_SHARDING_ATTR = "sdy.sharding"
_TERMINATORS = frozenset({"func.return", "stablehlo.return", "sdy.return"})
_MESH_NAME = re.compile(r"<@([\w.$-]+),")
_MAXIMAL_MESH = re.compile(r"<\[\], device_ids=\[(\d+)\]>")


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
        self.maximal_meshes: dict[str, int] = {}  # sdy.mesh name -> its one device
        self.meshes: dict[str, str] = {}  # sdy.mesh name -> its text (`<["a"=2, ...]>`)
        for op in module.regions[0].blocks[0].operations:
            if op.operation.name == "func.func":
                name = ir.StringAttr(op.attributes["sym_name"]).value
                self.funcs[name] = op
            elif op.operation.name == "sdy.mesh":
                name = ir.StringAttr(op.attributes["sym_name"]).value
                self.meshes[name] = str(op.attributes["mesh"])
                found = _MAXIMAL_MESH.search(self.meshes[name])
                if found:
                    self.maximal_meshes[name] = int(found.group(1))

        self.callees: dict[str, Func] = {}  # the functions called, each imported once
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

    def import_entry(self, name: str) -> Func:
        """The function `name` with its rewrites run (its calls inlined first)."""
        func = self._import_func(name)
        func.callees = self.callees
        self.pipeline.run(func, self.seen)
        func.tags = tagged_values(func.ops)
        return func

    def _import_func(self, name: str) -> Func:
        fop = self.funcs[name]
        block = fop.regions[0].blocks[0]
        body = Block()
        env: dict[ir.Value, Value] = {}
        for a in block.arguments:
            env[a] = body.add_arg(self._type(a.type))
        returns = self._import_ops(block, env, body.ops)
        return Func(name=name, body=body, returns=returns)

    def _import_callee(self, name: str) -> None:
        if name not in self.callees:
            self.callees[name] = self._import_func(name)

    def _import_ops(self, block, env: dict, out: list[Op]) -> list[Value]:
        """Import `block`'s ops into `out`; return the values its terminator returns."""
        texts = self.texts
        for mop in block.operations:
            op = mop.operation
            name = op.name
            if name in _TERMINATORS:
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
            if name in CALL_OPS:  # inlined by `passes.inline_calls`
                key = "callee" if name == "func.call" else "decomposition"
                callee = ir.FlatSymbolRefAttr(op.attributes[key]).value
                self._import_callee(callee)
                self.seen.add(name)
                call = Op(name, [env[v] for v in op.operands],
                          [self._type(r.type) for r in op.results], {CALLEE: callee})
                call.mlir_location = self._location(op)  # the scope of the inlined body
                for r, v in zip(op.results, call.results):
                    env[r] = v
                out.append(call)
                continue
            attrs = {}
            rule = None
            for key in op.attributes:
                # Attributes are uniqued in their context: equal ones print once.
                try:
                    attr = op.attributes[key]
                except TypeError:  # the bindings cannot type it (a complex dense constant)
                    text = attribute_text(op, key)
                else:
                    text = texts.get(attr)
                    if text is None:
                        text = texts[attr] = str(attr)
                if key == _RULE_ATTR:
                    rule = text
                elif key == _SHARDING_ATTR:
                    mesh = _MESH_NAME.search(text)
                    device = self.maximal_meshes.get(mesh.group(1)) if mesh else None
                    if device is not None:
                        attrs[ON_DEVICE_ATTR] = str(device)
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
            if name == MANUAL_COMPUTATION:  # the mesh its shardings name, for the lowering
                mesh = _MESH_NAME.search(attrs.get("in_shardings", "")
                                         + attrs.get("out_shardings", ""))
                if mesh and mesh.group(1) in self.meshes:
                    attrs[MESH_ATTR] = self.meshes[mesh.group(1)]
            results = op.results
            self.seen.add(name)
            new = Op(name, [env[v] for v in op.operands],
                     [self._type(r.type) for r in results], attrs, regions)
            new.rule = rule
            # Kept, not parsed: parsed when a message or a record names the op (the MLIR
            # context lives as long as the location object).
            new.mlir_location = self._location(op)
            if name == TAG_OP:
                new.results[0].tag = tag_name(location_name(new.mlir_location))
            if regions:
                new.captures = captures_of(new)
            for r, v in zip(results, new.results):
                env[r] = v
            out.append(new)
        return []


_OPEN, _CLOSE = "<([{", ">)]}"


def attribute_text(op, key: str) -> str:
    """Attribute `key` of `op` as the op's generic form prints it: for the attributes MLIR's
    Python bindings cannot type (a `dense<(re,im)>` of complex elements raises TypeError)."""
    asm = op.get_asm(print_generic_op_form=True, large_elements_limit=None)
    start = asm.index(f"{key} = ") + len(key) + 3
    depth, i = 0, start
    while i < len(asm):
        c = asm[i]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        elif c == '"':  # a string: its brackets do not count
            i = asm.index('"', i + 1)
        i += 1
    return asm[start:i].strip()


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
        return imp.import_entry(entry)


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
