"""Fusion: which values a fusing backend never materialises (DESIGN.md §2.5, app. A.5).

An elementwise or data-movement op whose every user can absorb it (another such op, or a
reduction) is fused into its users; every other op is a kernel root.
"""

from __future__ import annotations

from partir_plugin.extend import Op, Value

from . import opcost
from .comm import communication_kind
from .opcost import short_name


def fused_values(ops: list[Op], returned: set[Value], users: dict[Value, list[Op]]
                 ) -> set[Value]:
    """The results of `ops` (one block, program order) that are fused into their users."""
    fused: set[Value] = set()
    for op in reversed(ops):  # users before producers: a user's fate is known
        name = short_name(op)
        if len(op.results) != 1 or name not in opcost.FUSIBLE or op.regions:
            continue
        v = op.results[0]
        us = users.get(v, [])
        if v in returned or not us:
            continue
        if all(short_name(u) in opcost.FUSION_CONSUMERS and communication_kind(u) is None
               and u.results and (len(u.results) == 1 or short_name(u) == "reduce")
               for u in us):
            fused.add(v)
    return fused
