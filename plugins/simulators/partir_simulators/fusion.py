"""Fusion: which values a fusing backend never materialises (DESIGN.md §2.5, app. A.5).

An elementwise or data-movement op whose every user can absorb it (another such op, a
reduction, or an in-place update writing it as its update) is fused into its users; every
other op is a kernel root. Fusing a value read by several kernels duplicates its computation
into each of them, which a backend does not always do (`fused_values`): XLA:CPU's instruction
fusion never duplicates an expensive op (`EXPENSIVE`), and its library reductions
(`library_reduction`) absorb only producers no other kernel reads; such a value is computed
once, by a kernel of its own, and materialised.
"""

from __future__ import annotations

from collections.abc import Collection

from partir_plugin.extend import Op, Value

from . import opcost
from .opcost import SHORT_NAMES, short_name

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


# In-place updates that absorb the producers of their update (not of the buffer they write
# into): XLA's loop fusion emits a `dynamic-update-slice` fusion in place, computing the update
# in the kernel that writes it (e.g. a scan's per-step output: `dynamic-update-slice_convert_fusion`
# on XLA:CPU; the same on GPU).
IN_PLACE_ROOTS = frozenset({"dynamic_update_slice"})


# The reducers YNNPACK implements (XLA:CPU's `IsReduceOpSupportedByYnn`,
# xla/backends/cpu/ynn_support.cc: add, maximum, minimum over floats).
LIBRARY_REDUCERS = frozenset({"add", "maximum", "minimum"})


def library_reduction(op: Op) -> bool:
    """Whether XLA:CPU runs `op` as a YNNPACK fusion (`__ynn_fusion`): a float `reduce` by
    add/max/min. Such a fusion takes in a producer only when it is that producer's one user;
    XLA:CPU's loop fusion, run after it, does duplicate cheap producers but cannot enter it."""
    if short_name(op) != "reduce" or not op.regions or not op.regions[0].blocks:
        return False
    if not all(r.type.is_tensor and r.type.element.startswith(("f", "bf")) for r in op.results):
        return False
    body = [short_name(o) for o in op.regions[0].blocks[0].ops if short_name(o) != "return"]
    return len(body) == 1 and body[0] in LIBRARY_REDUCERS


# Ops HloCSE may merge (pure, one result, no regions).
_CSE_CANDIDATES = opcost.FUSIBLE | {"constant"}


def common_subexpressions(ops: list[Op], returned: set[Value]) -> dict[Value, Value]:
    """Results of pure ops that repeat an earlier op on the same operands -> that op's result.

    XLA's HloCSE merges them before fusion, so e.g. the broadcast of a norm's scale that JAX
    emits once for the forward pass and again for the backward pass is one value with users in
    both (which matters when it cannot be fused into all of them, `fused_values`).
    """
    first: dict[tuple, Value] = {}
    same: dict[Value, Value] = {}
    names = SHORT_NAMES
    for op in ops:
        results = op.results
        if len(results) != 1 or op.regions or names[op.name] not in _CSE_CANDIDATES:
            continue
        result = results[0]
        if result in returned:
            continue
        # Operands by identity (`Value` has no __eq__), attributes in key order (one or none,
        # for most ops: no sort), the type by its fields (hashing the frozen dataclass is a
        # Python call per key).
        attrs, t = op.attributes, result.type
        key = (op.name, tuple([same.get(v, v) for v in op.inputs]),
               tuple(sorted(attrs.items()) if len(attrs) > 1 else attrs.items()),
               t.shape, t.element, t.opaque)
        original = first.get(key)
        if original is None:
            first[key] = result
        else:
            same[result] = original
    return same


def fused_values(ops: list[Op], returned: set[Value], users: dict[Value, list[Op]],
                 collectives: Collection[Op] = (), duplicate_expensive: bool = True,
                 library_reductions: bool = False,
                 same: dict[Value, Value] | None = None) -> set[Value]:
    """The results of `ops` (one block, program order) that are fused into their users.

    Users are decided before producers, so each fused value knows the kernels (roots) it ends
    up in. A cheap op is duplicated into all of them. Without `duplicate_expensive` an
    expensive op (`_expensive`) is fused only when they are a single kernel, as XLA's
    instruction fusion does: e.g. the `tanh` of a GELU, read by a forward and a backward
    kernel, is kept from the forward pass to the backward one; the `exp` of a softmax, read
    by the sum and the division, is materialised between them. With `library_reductions`
    (XLA:CPU) a value read by a library reduction (`library_reduction`) and another kernel is
    materialised, cheap or not: e.g. the broadcast of a norm's scale or rsqrt that the
    backward pass multiplies into both the input gradient and the scale's gradient sum.
    `collectives` are the ops of `ops` that communicate (`communication_kind`): they absorb
    nothing. `same` (`common_subexpressions`) maps repeated values to the one `users` is
    keyed by; a repeat is fused when its original is.
    """
    same = same or {}
    names = SHORT_NAMES
    # The ops that can absorb a fused producer, decided once per op rather than per read.
    consumers = {op for op in ops
                 if (names[op.name] in opcost.FUSION_CONSUMERS or names[op.name] in IN_PLACE_ROOTS)
                 and op not in collectives
                 and op.results and (len(op.results) == 1 or names[op.name] == "reduce")}
    fused: set[Value] = set()
    homes: dict[Value, frozenset[Op]] = {}  # fused value -> the kernels it is fused into
    for op in reversed(ops):  # users before producers: a user's fate is known
        results = op.results
        if len(results) != 1 or op.regions:
            continue
        name = names[op.name]
        v = results[0]
        if name not in opcost.FUSIBLE or v in same or v in returned:
            continue
        us = users.get(v)
        if not us or not consumers.issuperset(us):
            continue
        if any(names[u.name] in IN_PLACE_ROOTS and u.operands[0] is v for u in us):
            continue  # the buffer an in-place update writes into is materialised
        if len(us) == 1:  # most values: no union to build
            u = us[0]
            kernels = (homes.get(u.results[0]) if len(u.results) == 1 else None
                       ) or frozenset((u,))
        else:
            kernels = frozenset().union(*(homes.get(u.results[0], frozenset((u,)))
                                          if len(u.results) == 1 else frozenset((u,))
                                          for u in us))
        if len(kernels) > 1 and (
                (not duplicate_expensive and _expensive(op, name))
                or (library_reductions and any(library_reduction(k) for k in kernels))):
            continue
        fused.add(v)
        homes[v] = kernels
    return fused | {d for d, v in same.items() if v in fused}


def splats(ops: list[Op], fused: set[Value], returned: set[Value]) -> set[Value]:
    """Broadcasts of a scalar (a splat: the zeros JAX initialises loop carries and scan
    outputs with) that are materialised (`fused_values` keeps them for a user that cannot
    absorb them: a loop, a dot) yet are cheap to recompute: XLA's instruction fusion
    duplicates such a producer into every consumer that can take it in and keeps the
    original for the others only, so those consumers do not read (nor keep alive) the
    materialised value."""
    out = set()
    names = SHORT_NAMES
    for op in ops:
        if (names[op.name] == "broadcast_in_dim" and len(op.results) == 1
                and op.results[0] not in fused and op.results[0] not in returned
                and op.operands and op.operands[0].type.is_tensor
                and not op.operands[0].type.shape):
            out.add(op.results[0])
    return out
