"""Why the lowering emitted a collective: the edge it converts.

Each collective the lowering inserts converts one value of the partitioned program from the
layout its producer gives it to the layout one consumer's loop nest needs (or the function's
declared output layout). The lowering puts that edge, a `Conversion`, on every collective op it
emits for it (`Op.origin`); diagnostics read it back to name the op the collective serves, its
source line and the reason. One small object per converted edge, shared by its collectives,
so lowering pays nothing per op.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..ir.dialect import KIND_ATTR
from ..ir.graph import Op, Value
from .layout import Layout


@dataclass(frozen=True, eq=False)
class Conversion:
    """`value` (of the program being partitioned) taken from layout `have` to `want` for
    `consumer` (None: the function's return, a program boundary)."""

    value: Value
    consumer: Op | None
    have: Layout
    want: Layout


@dataclass(frozen=True)
class Movement:
    """A data movement the program asks for (`partir.roll`, `partir.interleave`: a
    pipeline's shift between stages, its circular layout), lowered at `op`."""

    op: Op


def mark_origin(ops: Iterable[Op], conversion: Conversion | Movement) -> None:
    """Put `conversion` on the collectives among `ops` (what one edge's conversion emitted)."""
    for op in ops:
        if KIND_ATTR in op.attributes:
            op.origin = conversion
