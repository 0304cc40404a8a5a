"""Names for the collectives of a partitioned step, as a profiler shows them.

XLA names each HLO instruction after its MLIR location (`op_name`), and a profile event after
the instruction: a collective we insert is printed under a location that says what it is and
why, in the scope and at the frames of the op it serves (`ir.printer`'s `op_names`):

    jit(train_step)/jvp(Transformer)/Block_0/attn/query/Z3/all_gather[batch]
        params/Block_0/attn/query/kernel (gather for use) #c3f2a1b4c5d6

the tactic, the kind and mesh axes, the parameter it gathers or whose gradient it reduces
(where there is one), the reason, and the `CollectiveRecord` id (`record_ids` reads it back),
so an event in a trace maps to its record in `meta.tactics[i].records`. Names are made
while partitioning without parsing a location: the parameter is the one a collective
gathers (a gradient's parameter, which needs the locations parsed, is in its record).

The tactic is known before the step compiles, without lowering each tactic's program (the
report's rows do that on another thread while XLA compiles): it is the first tactic after which
every decision the collective depends on, restricted to its mesh axes, is final (the tiling
of the value it converts and the loop nests of the ops producing and consuming it, or of the
op whose lowering emitted it). Decisions only append, so that is the tactic whose decisions
made it, which is the tactic the records attribute it to (`attribute_tactics`: the first row
whose program has the collective).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .core.state import PartitionState
from .ir.graph import Op, Value, walk
from .ir.locations import location_name
from .records import ProgramIndex, collective_sites
from .spmd.collectives import Collective
from .spmd.lowering import _LAYOUT_OPS as LAYOUT_OPS
from .spmd.lowering import SpmdProgram
from .spmd.provenance import Conversion

_ID = re.compile(r"#(c[0-9a-f]{12})\b")


def record_ids(op_name: str) -> list[str]:
    """The `CollectiveRecord.id`s in a collective's op name (a profile event's or an HLO
    instruction's `op_name`): one, or several where XLA combined collectives into one
    instruction (its combiners join their names); none for an op that is not ours."""
    return _ID.findall(op_name)


def collective_names(program: SpmdProgram, state: PartitionState,
                     after: Sequence[tuple[str, PartitionState]],
                     index: ProgramIndex | None = None) -> dict[Op, str]:
    """Each counted collective of `program` (lowered from `state`) -> its name; `after`: each
    tactic's name and the state it left, in schedule order."""
    index = index if index is not None else ProgramIndex(state)
    tactics = _Tactics(after)
    names: dict[Op, str] = {}
    for site in collective_sites(walk(program.func.ops), state, None, index):
        facts, op = site.facts, site.local
        assert op is not None
        # The op it serves (not parsed: `record()`'s search for a located op and a
        # gradient's parameter parse locations, which partitioning never pays for).
        served = site.served if site.served is not None else op
        where = (location_name(served.mlir_location)
                 if served.mlir_location is not None else None)
        scope = (where or "").rpartition("/")[0]
        tactic = tactics.of(op.origin, facts.kind, facts.axes)
        what = f"{facts.kind}[{','.join(facts.axes)}]"
        label = "/".join(p for p in (scope, tactic, what) if p)
        param = index.argument_of(site.value) if site.value is not None else None
        names[op] = f"{label}{' ' + param if param else ''} ({site.reason}) #{facts.id}"
        if served.mlir_location is not None:  # printed at the served op's frames
            op.mlir_location = served.mlir_location
    return names


def _flatten(decisions: tuple):
    for d in decisions:
        if isinstance(d, tuple):
            yield from _flatten(d)
        else:
            yield d


def _regathered(state: PartitionState, v: Value) -> bool:
    """Is `v` gathered afresh per consumer (as the lowering decides it: a value Z3 asked
    for, or one made from it by layout ops alone)?"""
    while v not in state.regather:
        op = v.producer
        if op is None or op.name not in LAYOUT_OPS or len(op.operands) != 1:
            return False
        v = op.operands[0]
    return True


def _on(pairs: tuple, axes: frozenset[str]) -> tuple:
    """The (axis, ...) pairs of `pairs` on `axes` or on a part of one (`model:(1)2`)."""
    return tuple(p for p in pairs if p[0].split(":")[0] in axes)


class _Tactics:
    """Which tactic made a collective: the first whose state has the final decisions on the
    collective's axes about what it depends on."""

    def __init__(self, after: Sequence[tuple[str, PartitionState]]):
        self.after = list(after)
        self._axes: dict[int, frozenset[str]] = {}

    def _axes_of(self, i: int) -> frozenset[str]:
        """The mesh axes (whole) the state after tactic `i` has tiled anything on."""
        axes = self._axes.get(i)
        if axes is None:
            state = self.after[i][1]
            axes = self._axes[i] = frozenset(
                a.split(":")[0] for tiles in state.tiling.values() for a, _ in tiles)
        return axes

    def of(self, origin: object, kind: Collective, axes: tuple[str, ...]) -> str:
        if not self.after:
            return ""
        on = frozenset(a.split(":")[0] for a in axes)
        final = self._decisions(self.after[-1][1], origin, kind, on)
        if not any(_flatten(final)):
            # Nothing about its own ops on its axes: a sum forwarded to it from upstream
            # (`accumulation.py`). The first tactic deciding anything on those axes.
            return next((name for i, (name, _) in enumerate(self.after)
                         if on & self._axes_of(i)), self.after[-1][0])
        for name, state in self.after:
            if self._decisions(state, origin, kind, on) == final:
                return name
        return self.after[-1][0]

    @staticmethod
    def _decisions(state: PartitionState, origin: object, kind: Collective,
                   on: frozenset[str]) -> tuple:
        def made(v: Value) -> tuple:
            """What decides the layout `v` is made in: its producer's nest (an argument's
            own tiling)."""
            if v.producer is None:
                return _on(state.tiles_of(v), on)
            return _on(state.nest_of(v.producer), on)

        if isinstance(origin, Conversion):
            v = origin.value
            if kind is Collective.ALL_REDUCE:
                # A sum the producer left pending, whatever the consumer takes of it (on
                # XLA:CPU a sum wanted tiled is all-reduced, then sliced).
                return (made(v),)
            consumer = origin.consumer
            wanted = (_on(state.nest_of(consumer), on) if consumer is not None
                      else _on(state.tiles_of(v), on))
            return (made(v), wanted, _regathered(state, v))
        if isinstance(origin, Op):  # emitted by the op's own lowering (a roll, a halo)
            return (_on(state.nest_of(origin), on),
                    tuple(made(v) for v in origin.inputs))
        return ()
