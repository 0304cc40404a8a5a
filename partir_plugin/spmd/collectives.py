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

import json

from ..ir.graph import Op

KIND_ATTR = "partir.collective"
AXES_ATTR = "partir.axes"

COUNTED_KINDS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "all_permute")


def mark(op: Op, kind: str, axes) -> Op:
    op.attributes[KIND_ATTR] = json.dumps(kind)
    op.attributes[AXES_ATTR] = "[" + ", ".join(json.dumps(a) for a in axes) + "]"
    return op


def collective_kind(op: Op) -> str | None:
    """The PartIR:HLO collective kind of `op`, or None for an ordinary op."""
    text = op.attributes.get(KIND_ATTR)
    return json.loads(text) if text else None


def collective_axes(op: Op) -> tuple[str, ...]:
    text = op.attributes.get(AXES_ATTR)
    return tuple(json.loads(text)) if text else ()


def count_collectives(ops) -> dict[str, int]:
    """Counts per kind over `ops` (a device-local function's ops), all_slice excluded."""
    counts = dict.fromkeys(COUNTED_KINDS, 0)
    for op in ops:
        kind = collective_kind(op)
        if kind in counts:
            counts[kind] += 1
    return counts
