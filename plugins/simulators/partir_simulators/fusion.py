"""Fusion: which values a fusing backend never materialises (DESIGN.md §2.5, app. A.5).

An elementwise or data-movement op whose every user can absorb it (another such op, or a
reduction) is fused into its users; every other op is a kernel root. Fusing a value read by
several kernels duplicates its computation into each of them, which XLA allows only for cheap
ops: an expensive one (`EXPENSIVE`) read by more than one kernel is computed once, by a kernel
of its own, and its result is materialised (`fused_values`).
"""

from __future__ import annotations

from partir_plugin.extend import Op, Value

from . import opcost
from .comm import communication_kind
from .opcost import short_name

# The elementwise ops XLA's `InstructionFusion::IsExpensive` (xla/service/instruction_fusion.cc)
# lists as expensive: fusion does not duplicate them into a second consumer
# (`FusionWouldDuplicate(...) && is_expensive_(producer)` forbids it). Real `sine`, `cosine`,
# `tan`, `abs`, `sign` are cheap there; `divide`/`remainder` are expensive unless integral with
# a constant divisor (`_expensive`).
EXPENSIVE = frozenset({
    "exponential", "exponential_minus_one", "log", "log_plus_one", "logistic", "tanh", "sqrt",
    "rsqrt", "cbrt", "power", "erf", "atan2", "divide", "remainder",
})


def _expensive(op: Op, name: str) -> bool:
    """Whether XLA would refuse to duplicate `op` into several fusions."""
    if name not in EXPENSIVE:
        return False
    if name in ("divide", "remainder"):  # an integer division by a constant is shifts
        divisor = op.operands[1].producer if len(op.operands) > 1 else None
        while divisor is not None and short_name(divisor) in ("broadcast_in_dim", "broadcast"):
            divisor = divisor.operands[0].producer
        element = op.results[0].type.element if op.results[0].type.is_tensor else ""
        return not (element.startswith(("i", "ui")) and divisor is not None
                    and short_name(divisor) == "constant")
    return True


def fused_values(ops: list[Op], returned: set[Value], users: dict[Value, list[Op]],
                 duplicate_expensive: bool = True) -> set[Value]:
    """The results of `ops` (one block, program order) that are fused into their users.

    Users are decided before producers, so each fused value knows the kernels (roots) it ends
    up in: a cheap op is duplicated into all of them, an expensive one (`_expensive`) only
    fused when they are a single kernel, as XLA's instruction fusion does. E.g. the `tanh` of
    a GELU, read by the forward kernel and by the backward pass's kernels, is kept from the
    forward pass to the backward one; the `exp` of a softmax, read by the sum and the
    division, is materialised between them.
    """
    fused: set[Value] = set()
    homes: dict[Value, frozenset[Op]] = {}  # fused value -> the kernels it is fused into
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
            kernels = frozenset().union(*(homes.get(u.results[0], frozenset((u,)))
                                          if len(u.results) == 1 else frozenset((u,))
                                          for u in us))
            if len(kernels) > 1 and not duplicate_expensive and _expensive(op, name):
                continue
            fused.add(v)
            homes[v] = kernels
    return fused
