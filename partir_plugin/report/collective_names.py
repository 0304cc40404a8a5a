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
report's rows do that on another thread while XLA compiles): `records.TacticRule`, the one
rule the records' `tactic` uses too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..core.state import PartitionState
from ..ir.graph import Op, walk
from ..ir.locations import location_name
from ..spmd.lowering import SpmdProgram
from .records import ProgramIndex, TacticRule, collective_sites

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
    tactics = TacticRule(after)
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
