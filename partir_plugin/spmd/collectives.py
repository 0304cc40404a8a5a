"""Collectives of the device-local IR and how they are marked.

Every collective the lowering emits is a real StableHLO op (`stablehlo.all_gather`,
`stablehlo.all_reduce`, `stablehlo.reduce_scatter`, `stablehlo.all_to_all`,
`stablehlo.collective_permute`, or for `all_slice` a local `stablehlo.dynamic_slice` indexed by
the device coordinate) carrying two discardable attributes, so counting, simulation and tests
read them back without re-deriving mesh axes from replica groups:

    partir.collective = "all_gather" | "all_reduce" | "reduce_scatter" | "all_to_all"
                        | "all_permute" | "all_slice"
    partir.axes = ["B", "M"]            (mesh axes the collective spans, major to minor)
"""

from __future__ import annotations

import enum
import functools
import json

from ..ir.dialect import AXES_ATTR, KIND_ATTR
from ..ir.graph import Op


class Collective(enum.StrEnum):
    """The collective kinds of PartIR:HLO, defined once. A `str` enum: each member equals its
    value, so `Metadata.tactics[i].collectives["all_gather"]` and JSON keep plain strings."""

    ALL_GATHER = "all_gather"
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    ALL_PERMUTE = "all_permute"
    ALL_SLICE = "all_slice"  # a local dynamic_slice: no communication, never counted

    @property
    def short(self) -> str:
        """The report's column header ("AG", "AR", ...)."""
        return _SHORT[self]

    @property
    def counted(self) -> bool:
        return self is not Collective.ALL_SLICE


_SHORT = {Collective.ALL_GATHER: "AG", Collective.ALL_REDUCE: "AR",
          Collective.REDUCE_SCATTER: "RS", Collective.ALL_TO_ALL: "A2A",
          Collective.ALL_PERMUTE: "AP", Collective.ALL_SLICE: "AS"}

# The kinds a report counts, in its column order (paper 1 Table 2).
COUNTED_KINDS: tuple[Collective, ...] = tuple(k for k in Collective if k.counted)


def mark(op: Op, kind: Collective | str, axes) -> Op:
    op.attributes[KIND_ATTR], op.attributes[AXES_ATTR] = _mark_texts(kind, tuple(axes))
    return op


@functools.lru_cache(maxsize=1024)
def _mark_texts(kind: Collective | str, axes: tuple[str, ...]) -> tuple[str, str]:
    # The lowering marks every collective it emits, with few distinct kinds and axes.
    return json.dumps(str(Collective(kind))), "[" + ", ".join(json.dumps(a) for a in axes) + "]"


# Attribute text -> what it says. The marks take a handful of distinct texts, and counting,
# the simulator and the records ask every op of every program several times.
_KINDS: dict[str, Collective] = {}
_AXES: dict[str, tuple[str, ...]] = {}


def collective_kind(op: Op) -> Collective | None:
    """The PartIR:HLO collective kind of `op`, or None for an ordinary op."""
    text = op.attributes.get(KIND_ATTR)
    if not text:
        return None
    kind = _KINDS.get(text)
    if kind is None:
        kind = _KINDS[text] = Collective(json.loads(text))
    return kind


def collective_axes(op: Op) -> tuple[str, ...]:
    text = op.attributes.get(AXES_ATTR)
    if not text:
        return ()
    axes = _AXES.get(text)
    if axes is None:
        axes = _AXES[text] = tuple(json.loads(text))
    return axes


def count_collectives(ops) -> dict[str, int]:
    """Counts per kind over `ops` (a device-local function's ops), all_slice excluded."""
    counts = {str(k): 0 for k in COUNTED_KINDS}  # plain str keys (API contract)
    for op in ops:
        kind = collective_kind(op)
        if kind in counts:
            counts[kind] += 1
    return counts


def sliced_all_reduces(ops) -> int:
    """All_reduces whose result is only sliced onto a shard (`all_slice`): a reduce_scatter
    the lowering wrote as all_reduce + slice (`PartitionState.scatter_sums` off)."""
    # One pass over the ops (a report asks this of every tactic's program), the kinds bound
    # once (an enum member read from its class is slow).
    all_reduce, all_slice = Collective.ALL_REDUCE, Collective.ALL_SLICE
    reduced, sliced = set(), set()
    for op in ops:
        kind = collective_kind(op)
        if kind is all_reduce:
            reduced.add(op.results[0])
        elif kind is all_slice:
            sliced.add(op.operands[0])
    return len(sliced & reduced)
