"""Calls and composites inlined: each `func.call`, and each `stablehlo.composite` the importer
does not keep whole (`dialect.KEPT_COMPOSITES`), replaced by a copy of its callee's body (a
composite's decomposition: its meaning, partitioned like any other code; the composite's name,
which a backend could map to a fused kernel, is not kept).

The importer imports each callee once (`Func.callees`); a copy per call site is cheaper than
reading the callee's MLIR again. The copies keep everything the importer gave the callee's
ops (Shardy's rules, locations, tags, captures), so inlined code is what importing it at the
call site made; a region that held a call has its captures found again. Each copy's name
stack is prefixed with the call's, as XLA's call inliner names what it inlines
(`.../while/body/closed_call/blocks._scan_body/...`, jax.jit's op_name for the body of a
Flax `nn.scan`), so a profile of the partitioned step shows where the body was called. A
copied op with no source frames of its own (jax prints a callee's ops with names only) takes
the call's frames, as XLA's inliner gives an inlined instruction the call's stack frame: its
profile events point at the user's line that called `jnp.take` or `jnp.clip`.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass

from ..graph import Block, Func, Op, Region, Value, captures_of
from ..locations import location_name
from .pipeline import FuncPass

CALL_OPS = frozenset({"func.call", "stablehlo.composite"})
# The attribute a call op keeps its callee's symbol name in (the importer's).
CALLEE = "callee"


@dataclass(frozen=True)
class InlineCalls(FuncPass):
    name = "inline-calls"

    def wanted(self, seen: Set[str]) -> bool:
        return not CALL_OPS.isdisjoint(seen)

    def apply(self, func: Func) -> None:
        inlined: dict[str, Func] = {}  # callees whose own calls are inlined

        def callee(name: str) -> Func:
            body = inlined.get(name)
            if body is None:
                body = inlined[name] = func.callees[name]
                _inline_func(body, callee)
            return body

        _inline_func(func, callee)
        func.callees = {}


def _inline_func(func: Func, callee: Callable[[str], Func]) -> None:
    replaced: dict[Value, Value] = {}  # an inlined call's results -> what its copy returns
    _inline(func.body, replaced, callee, _Scopes())
    func.returns = [replaced.get(v, v) for v in func.returns]


class _Scopes:
    """Locations under a call's name stack, one object per (scope, location): the printer
    defines each distinct location once, by identity."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, object, object], object] = {}

    def under(self, scope: str | None, location, call):
        """`location` with its name stack prefixed by `scope` (`scope/name`), and the frames
        of `call` (the call op's location) where it has none."""
        if not scope or location is None:
            return location
        key = (scope, location.attr, call.attr)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = _prefixed(scope, location, _frames(call))
        return made


def _frames(location):
    """What follows a location's names: its frames (a call site or file:line), or None."""
    from jaxlib.mlir import ir

    while isinstance(location, ir.NameLoc):
        location = location.child_loc
    return None if isinstance(location, ir.UnknownLoc) else location


def _prefixed(scope: str, location, frames):
    """`location` with `scope/` before its name stack (the outermost name that is not an
    op type `"dot_general:"`), and `frames` after its names where it has none; a location
    without a name gets `scope` as its name."""
    from jaxlib.mlir import ir

    with location.context:
        if isinstance(location, ir.NameLoc):
            name = location.name_str
            child = location.child_loc
            if name.endswith(":"):
                return ir.Location.name(name, childLoc=_prefixed(scope, child, frames))
            if frames is not None and _frames(child) is None:
                child = _with_frames(child, frames)
            return ir.Location.name(f"{scope}/{name}", childLoc=child)
        if frames is not None and _frames(location) is None:
            return ir.Location.name(scope, childLoc=frames)
        return ir.Location.name(scope, childLoc=location)


def _with_frames(location, frames):
    """A frameless `location` (names over unknown) with `frames` in the unknown's place."""
    from jaxlib.mlir import ir

    if isinstance(location, ir.NameLoc):
        return ir.Location.name(location.name_str,
                                childLoc=_with_frames(location.child_loc, frames))
    return frames


def _inline(block: Block, replaced: dict[Value, Value], callee: Callable[[str], Func],
            scopes: _Scopes) -> bool:
    """Inline the calls of `block` in place; whether it (or a region in it) held one."""
    ops: list[Op] = []
    held = False
    for op in block.ops:
        if replaced:
            op.operands = [replaced.get(v, v) for v in op.operands]
        if op.regions:
            inner = [_inline(b, replaced, callee, scopes) for r in op.regions for b in r.blocks]
            if any(inner):
                op.captures = captures_of(op)
                held = True
            elif replaced and op.captures:
                op.captures = list(dict.fromkeys(replaced.get(v, v) for v in op.captures))
        if op.name in CALL_OPS:
            body = callee(op.attributes[CALLEE])
            env: dict[Value, Value] = dict(zip(body.args, op.operands))
            call = op.mlir_location
            scope = location_name(call) if call is not None else None
            ops += [_copy(o, env, scope, call, scopes) for o in body.ops]
            for r, v in zip(op.results, body.returns):
                replaced[r] = env.get(v, v)
            held = True
            continue
        ops.append(op)
    block.ops = ops
    return held


def _copy(op: Op, env: dict[Value, Value], scope: str | None, call, scopes: _Scopes) -> Op:
    """A copy of `op` reading through `env` (which gains its results and block arguments),
    with all the importer gave it, its location under the call's `scope`."""
    regions = []
    for region in op.regions:
        copy = Region()
        for block in region.blocks:
            b = Block()
            for a in block.args:
                env[a] = b.add_arg(a.type)
            b.ops = [_copy(o, env, scope, call, scopes) for o in block.ops]
            copy.blocks.append(b)
        regions.append(copy)
    new = Op(op.name, [env.get(v, v) for v in op.operands], [r.type for r in op.results],
             op.attributes, regions)
    new.rule = op.rule
    new.mlir_location = scopes.under(scope, op.mlir_location, call)
    if op.captures:
        new.captures = list(dict.fromkeys(env.get(v, v) for v in op.captures))
    for r, n in zip(op.results, new.results):
        n.tag = r.tag
        env[r] = n
    return new
