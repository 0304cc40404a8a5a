"""Print op locations once each, as MLIR location aliases, so XLA keeps jax's op names.

XLA builds every HLO instruction's metadata (`op_name`, the stack frame table) from the op's
MLIR location; an op printed without one gets a position in our text (`"-":line:col`), and
after XLA inlines the device-local function every op would read `shard_map/partir_call`.
jax's locations are a DAG: `NameLoc(name stack)` around a chain of
`CallSiteLoc(NameLoc(function, FileLineColLoc), caller)` frames that thousands of ops share.
Printing each op's location inline would repeat that chain per op (3 MB of text and 0.3 s of
`str(loc)` for the 16-layer transformer); printed as MLIR prints it (`#locN = loc(...)` once
per distinct node, referenced as `loc(#locN)`), each node is walked and printed once.

Nodes are told apart by their location attribute (`loc.attr`, uniqued by the MLIR context),
top-level locations by identity (the importer shares one object per distinct location).

Name stacks are printed without their leading `jit(step)/`: the program runs inside the
step's own `jit(step)/shard_map`, whose name XLA prefixes to every op it inlines, so the
traced scope would read twice (`jit(step)/shard_map/jit(step)/jvp(Model)/...`).
"""

from __future__ import annotations

import re

from .locations import is_library_file, location_name

# What MLIR's printer leaves unescaped in a string: printable ASCII except `"` and `\`.
_PLAIN = re.compile(r'[ !#-\[\]-~]*')
UNKNOWN = "loc(unknown)"
# The traced function's own scope at the start of a name stack (or of each of a fused
# location's names, `;`-separated); a Python function's name holds no parentheses.
_JIT_SCOPE = re.compile(r"(^|;)jit\([^()]*\)/")


_IR = None


def _mlir():
    """jaxlib's MLIR bindings, imported on first use (`import partir_plugin` stays light)."""
    global _IR
    if _IR is None:
        from jaxlib.mlir import ir

        _IR = ir
    return _IR


def scope_name(name: str) -> str:
    """`name` (a name stack) as printed: without the traced step's `jit(step)/`."""
    return _JIT_SCOPE.sub(r"\1", name) if "jit(" in name else name


def escape(text: str) -> str:
    """`text` as an MLIR string literal's body (MLIR's `printEscapedString`)."""
    if _PLAIN.fullmatch(text):
        return text
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif _PLAIN.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"\\{b:02X}" for b in ch.encode())
    return "".join(out)


class LocationAliases:
    """The location aliases of one printed module: `ref` gives an op's `#locN`, `named` a
    new name around an existing location's frames; `definitions` are the lines that close
    the module text."""

    def __init__(self) -> None:
        self._top: dict[int, tuple[object, str]] = {}  # id(location) -> (it, alias)
        self._nodes: dict[object, str] = {}  # location attribute -> alias
        self._named: dict[tuple[str, int], str] = {}
        self._user: dict[object, bool] = {}  # location attribute -> holds a user frame
        self.lines: list[str] = []

    def ref(self, location) -> str:
        """The alias of `location` (an MLIR location object), defining it on first use."""
        seen = self._top.get(id(location))
        if seen is not None:
            return seen[1]
        alias = self._node(location)
        self._top[id(location)] = (location, alias)  # kept alive: ids stay unique
        return alias

    def named(self, name: str, location) -> str:
        """The alias of `NameLoc(name, frames of location)`: `location` with its name stack
        replaced by `name` (a collective named after the op it serves, at its lines); the
        name alone where there is no location (a collective on an argument before any op)."""
        key = (name, id(location))
        alias = self._named.get(key)
        if alias is None:
            frames = frames_of(location) if location is not None else None
            inner = f"({self._node(frames)})" if frames is not None else ""
            alias = self._named[key] = self._define(f'"{escape(scope_name(name))}"{inner}')
            if location is not None:  # kept alive: ids stay unique
                self._top.setdefault(id(location), (location, self.ref(location)))
        return alias

    def has_user_frame(self, loc) -> bool:
        """Does `loc` hold a frame outside the libraries (`locations.is_library_file`)?
        Memoised per node: the frames of a program's ops share their callers."""
        ir = _mlir()

        key = loc.attr
        found = self._user.get(key)
        if found is not None:
            return found
        if isinstance(loc, ir.NameLoc):
            found = self.has_user_frame(loc.child_loc)
        elif isinstance(loc, ir.CallSiteLoc):
            found = self.has_user_frame(loc.callee) or self.has_user_frame(loc.caller)
        elif isinstance(loc, ir.FileLineColLoc):
            found = not is_library_file(loc.filename) and loc.filename != "-"
        elif isinstance(loc, ir.FusedLoc):
            found = any(self.has_user_frame(inner) for inner in loc.locations)
        else:
            found = False
        self._user[key] = found
        return found

    def _define(self, body: str) -> str:
        alias = f"#loc{len(self.lines)}"
        self.lines.append(f"{alias} = loc({body})")
        return alias

    def _node(self, loc) -> str:
        ir = _mlir()

        key = loc.attr
        alias = self._nodes.get(key)
        if alias is not None:
            return alias
        if isinstance(loc, ir.NameLoc):
            child = loc.child_loc
            inner = "" if isinstance(child, ir.UnknownLoc) else f"({self._node(child)})"
            body = f'"{escape(scope_name(loc.name_str))}"{inner}'
        elif isinstance(loc, ir.CallSiteLoc):
            body = f"callsite({self._node(loc.callee)} at {self._node(loc.caller)})"
        elif isinstance(loc, ir.FusedLoc):
            parts = ", ".join(self._node(inner) for inner in loc.locations)
            meta = loc.metadata
            body = f"fused{'<' + str(meta) + '>' if meta is not None else ''}[{parts}]"
        else:  # file:line:col, unknown, opaque: short, printed by MLIR itself
            body = str(loc)[4:-1]
        alias = self._nodes[key] = self._define(body)
        return alias


def frames_of(location):
    """The frames of a jax location: what its op-type (`"dot_general:"`) and name-stack
    names hold (the outermost name is the name stack, as `locations.parse_location` reads
    it); None where it has none."""
    ir = _mlir()

    loc = location
    while isinstance(loc, ir.NameLoc) and loc.name_str.endswith(":"):
        loc = loc.child_loc
    if isinstance(loc, ir.NameLoc):
        loc = loc.child_loc
    return None if isinstance(loc, ir.UnknownLoc) else loc


def is_bare(location) -> bool:
    """Is `location` a bare primitive name with no scope (`loc("lt")`, `"dynamic_slice"`
    around a few library frames)? jax lowers some ops so, where its name stack was reset; a
    name under `jit(...)` has a `/`."""
    name = location_name(location)
    return name is None or "/" not in name


def borrowed_name(own, placed) -> str:
    """The name of an op printed at another op's location: its own name in that op's
    scope (`jit(step)/jvp(Model)/embed/lt` for a bare `lt` placed at the embedding)."""
    mine = location_name(own) or ""
    scope = (location_name(placed) or "").rpartition("/")[0]
    if not mine:
        return location_name(placed) or ""
    return f"{scope}/{mine}" if scope and not mine.startswith(scope) else mine
