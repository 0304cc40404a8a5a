"""Print the Python IR as StableHLO in MLIR's generic form, which every op accepts.

Every op is printed with its location (`loc(#locN)`, each distinct location defined once at
the module's end: `location_aliases.py`), so XLA's metadata names jax's op and the user's
line; `op_names` replaces the name stack of some ops' locations (the collectives the lowering
inserted, named after their tactic: `report/collective_names.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

from .graph import Block, Func, Op, Value
from .location_aliases import UNKNOWN, LocationAliases, borrowed_name, is_bare

# Attributes with a dialect prefix are discardable and go in `{...}`; the rest are properties.
_DROP = {"sdy.sharding_rule"}


class _Names:
    """SSA names (`%v0`, `%v1`, ...) in order of first appearance. A program's text is printed
    op by op (tens of thousands of them): names are given a whole operand or result list at a
    time."""

    def __init__(self):
        self.names: dict[Value, str] = {}

    def __call__(self, v: Value) -> str:
        n = self.names.get(v)
        if n is None:
            n = self.names[v] = f"%v{len(self.names)}"
        return n

    def join(self, values) -> str:
        """The names of `values`, comma-separated."""
        names = self.names
        out = []
        for v in values:
            n = names.get(v)
            if n is None:
                n = names[v] = f"%v{len(names)}"
            out.append(n)
        return ", ".join(out)


def _attr_dicts(op: Op) -> tuple[str, str]:
    """The op's properties (` <{...}>`, with its leading space) and discardable attributes
    (`{...}`), each empty where it has none."""
    if not op.attributes:
        return "", ""
    props, discardable = [], []
    for k, v in op.attributes.items():
        if k in _DROP:
            continue
        (discardable if "." in k else props).append(f"{k} = {v}")
    return (" <{" + ", ".join(props) + "}>" if props else "",
            "{" + ", ".join(discardable) + "}" if discardable else "")


class _Locations:
    """Each op's ` loc(...)`: its own location's alias, a named one for ops in `op_names`,
    `loc(unknown)` for an op without one (never a position in our text).

    jax lowers some ops with a bare primitive name and no frames (the index arithmetic of a
    `take`: `loc("lt")`), or with the library's frames alone (the body of a vmapped scan
    that PP's pipeline runs). Such an op is printed under its own name at the scope and
    frames of a located op near it (the op holding its region, else the op making one of
    its operands, else the op before it), so a profile shows it at the user's line."""

    def __init__(self, op_names: Mapping[Op, str] | None):
        self.aliases = LocationAliases()
        self.names = op_names or {}
        self._refs: dict[tuple[int, int], str] = {}  # ids of (location, borrowed) -> text
        self._weak: dict[int, bool] = {}  # id(location) -> not placed in the user's code
        self._placed: dict[Op, object] = {}  # an op -> the located op's location it borrows
        self.last = None  # the last location printed that needs no borrowing

    def place(self, op: Op, holder) -> object:
        """The location whose scope and frames `op` is printed at (`holder`: that of the op
        whose region holds it)."""
        loc = op.mlir_location
        if loc is None or self._is_weak(loc):
            found = holder
            if found is None:
                for v in op.operands:
                    found = self._placed.get(v.producer)
                    if found is not None:
                        break
                else:
                    found = self.last
            if found is None:
                return loc
            loc = found
        else:
            self.last = loc
        self._placed[op] = loc
        return loc

    def _is_weak(self, loc) -> bool:
        weak = self._weak.get(id(loc))
        if weak is None:
            weak = self._weak[id(loc)] = is_bare(loc) or not self.aliases.has_user_frame(loc)
        return weak

    def __call__(self, op: Op, placed) -> str:
        own = op.mlir_location
        if self.names:
            name = self.names.get(op)
            if name is not None:
                return f" loc({self.aliases.named(name, placed)})"
        if placed is None:
            return f" {UNKNOWN}"
        key = (id(own), id(placed))
        ref = self._refs.get(key)
        if ref is None:
            alias = (self.aliases.ref(placed) if own is placed or own is None else
                     self.aliases.named(borrowed_name(own, placed), placed))
            ref = self._refs[key] = f" loc({alias})"
        return ref


def _print_block(block: Block, names: _Names, indent: str, lines: list[str], header: bool,
                 locs: _Locations, holder=None):
    if header:
        args = ", ".join(f"{names(a)}: {a.type}" for a in block.args)
        lines.append(f"{indent[:-2]}^bb0({args}):")
    for op in block.ops:
        _print_op(op, names, indent, lines, locs, holder)


def _print_op(op: Op, names: _Names, indent: str, lines: list[str], locs: _Locations,
              holder=None):
    loc = locs.place(op, holder)
    lhs = f"{names.join(op.results)} = " if op.results else ""
    operands = names.join(op.operands)
    props, disc = _attr_dicts(op)
    in_types = ", ".join([str(v.type) for v in op.operands])
    out_types = ", ".join([str(r.type) for r in op.results])
    if len(op.results) != 1:
        out_types = f"({out_types})"
    tail = f"{' ' + disc if disc else ''} : ({in_types}) -> {out_types}{locs(op, loc)}"
    if not op.regions:
        lines.append(f'{indent}{lhs}"{op.name}"({operands}){props}{tail}')
        return
    lines.append(f'{indent}{lhs}"{op.name}"({operands}){props} ({{')
    for ri, region in enumerate(op.regions):
        for block in region.blocks:
            _print_block(block, names, indent + "    ", lines, header=True, locs=locs,
                         holder=loc)
        if ri + 1 < len(op.regions):
            lines.append(f"{indent}}}, {{")
    lines.append(f"{indent}}}){tail}")


def print_func(func: Func, name: str = "main", module_attrs: str = "",
               op_names: Mapping[Op, str] | None = None) -> str:
    """Print `func` as a module with one public function named `name`; `op_names`: ops
    whose location is printed under another name (at the same frames)."""
    locs = _Locations(op_names)
    names = _Names()
    args = ", ".join(f"{names(a)}: {a.type}" + (
        f" {{{func.arg_attrs[i]}}}" if i in func.arg_attrs else "")
        for i, a in enumerate(func.args))
    rets = ", ".join(str(v.type) for v in func.returns)
    lines = [f"module @partir{(' attributes {' + module_attrs + '}') if module_attrs else ''} {{",
             f"  func.func public @{name}({args}) -> ({rets}) {{"]
    for op in func.ops:
        _print_op(op, names, "    ", lines, locs)
    ret_vals = ", ".join(names(v) for v in func.returns)
    ret_types = ", ".join(str(v.type) for v in func.returns)
    lines.append(f'    "func.return"({ret_vals}) : ({ret_types}) -> ()')
    lines += ["  }", "}", *locs.aliases.lines]
    return "\n".join(lines) + "\n"


print_module = print_func
