"""Conflicts resolved by redistribution (issue 19; DESIGN.md §5 "Conflicts").

PartIR stops propagation at an op whose operands carry incompatible tilings on an axis: no
entry fits all of them, several fit part. The op then stays unpartitioned on the axis and its
operands are gathered, which is how expert parallelism used to gather expert weights. Here
the op is kept partitioned along one of the partly matching entries instead, and the operands
(or results) that do not fit it are redistributed to it: the lowering already converts any
layout to any other (`spmd/lowering.convert`: an all_to_all when a tiled dimension changes on
the axis, an all_gather when the entry reads the operand whole).

The choice is by cost and deterministic: the fewest bytes of function arguments (parameters,
optimizer state, inputs) moved, then the fewest bytes moved per device in all, then the
entries' order. Each resolution is recorded for the report. `PartitionState.resolve_conflicts
= False` keeps PartIR's strict semantics (stop and gather).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import Op, Value
from ..ir.types import format_bytes
from .state import PartitionState
from .tmr import Sum, TMREntry


@dataclass(frozen=True)
class Move:
    """One value redistributed so that an op fits its chosen entry: `what` is "operand i" or
    "result j"; dims are the tiled dimension on the axis before and after (None: whole)."""

    what: str
    type: str
    src: int | None
    dst: int | None
    collective: str
    bytes: int
    argument: bool  # a function argument (a parameter, optimizer state or input)

    def __str__(self) -> str:
        def dim(d):
            return "full" if d is None else f"tile<{d}>"
        change = ("partial sum" if self.collective == "reduce_scatter"
                  else f"{dim(self.src)} -> {dim(self.dst)}")
        return (f"{self.what} {self.type} {change} ({self.collective}, "
                f"{format_bytes(self.bytes)}/device)")


@dataclass(frozen=True)
class Resolution:
    """A conflict at `op_name` on `axis` resolved by looping the op with `entry` and
    redistributing `moves`."""

    op_name: str
    axis: str
    entry: TMREntry
    moves: tuple[Move, ...]
    location: str | None = None

    @property
    def bytes(self) -> int:
        return sum(m.bytes for m in self.moves)

    def __str__(self) -> str:
        where = f" at {self.location}" if self.location else ""
        moves = "; ".join(str(m) for m in self.moves)
        return f"{self.op_name}{where} on axis {self.axis!r} as {self.entry}: {moves}"


def _local_bytes(state: PartitionState, v: Value) -> int:
    """Bytes of `v`'s tile under its current tiling (every axis)."""
    n = v.type.nbytes
    for a, _ in state.tiles_of(v):
        n //= state.mesh.axis_size(a)
    return n


def _is_argument(state: PartitionState, v: Value) -> bool:
    return any(m.producer is None and m.owner is state.func.body
               for m in state.aliases.get(v, (v,)))


def _moves(state: PartitionState, op: Op, axis: str, e: TMREntry) -> list[Move] | None:
    """The redistributions that let `op` loop over `axis` with `e`, or None if it cannot
    (divisibility, atomic values, a result tiled otherwise or an alias of a loop value)."""
    size = state.mesh.axis_size(axis)
    moves = []
    for i, (v, d) in enumerate(zip(op.inputs, e.operands)):
        cur = state.dim_of(v, axis)
        if cur == d:
            continue
        if cur is None:  # inference slices it: no communication
            if state.can_tile(v, d, axis) is not None:
                return None
            continue
        local = _local_bytes(state, v)
        if d is None:
            moves.append(Move(f"operand {i}", str(v.type), cur, None, "all_gather",
                              local * (size - 1), _is_argument(state, v)))
            continue
        if state.local_extent(v, d) % size and not state.allow_padding:
            return None
        moves.append(Move(f"operand {i}", str(v.type), cur, d, "all_to_all",
                          local * (size - 1) // size, _is_argument(state, v)))
    for r, action in zip(op.results, e.results):
        cur = state.dim_of(r, axis)
        if state.blocked(r, axis) is not None or len(state.aliases.get(r, (r,))) > 1:
            return None
        if isinstance(action, Sum):
            if cur is not None:
                return None
            # Partial results are reduced later: at least a reduce_scatter of the result.
            moves.append(Move(f"result {r.index}", str(r.type), None, None, "reduce_scatter",
                              _local_bytes(state, r) * (size - 1) // size, False))
            continue
        if cur is not None and cur != action:
            return None
    if state.entry_pads(op, axis, e) and not state.padding_allowed(op, e, axis):
        return None
    if state.mixes_windows(op, e):
        return None
    return moves


def resolve(state: PartitionState, op: Op, axis: str, partial: list[TMREntry]
            ) -> TMREntry | None:
    """The entry to loop `op` with at a conflict between `partial` entries (each fitting part
    of the operands' tilings), recorded as a `Resolution`; None when none can be made to fit
    or the state keeps PartIR's strict semantics."""
    if not state.resolve_conflicts:
        return None
    best, best_key, best_moves = None, None, None
    for index, e in enumerate(partial):
        moves = _moves(state, op, axis, e)
        if moves is None:
            continue
        key = (sum(m.bytes for m in moves if m.argument), sum(m.bytes for m in moves), index)
        if best_key is None or key < best_key:
            best, best_key, best_moves = e, key, moves
    if best is None:
        return None
    state.resolutions.append(Resolution(op.name, axis, best, tuple(best_moves), op.location))
    state.resolved.add((op, axis))
    return best
