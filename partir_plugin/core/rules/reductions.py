"""The reductions an op's region performs, as far as partials of them may be combined across
tiles (a reduce's Sum entries, a scatter-add's, a prefix scan's), and the splat constants
that decide it (an init value must be the reduction's identity).
"""

from __future__ import annotations

import re

from ...ir.graph import Op
from ...ir.opsets import Reduction


def splat_value(op: Op | None):
    """The scalar of a splat `stablehlo.constant`, or None."""
    if op is None or op.name != "stablehlo.constant":
        return None
    m = re.match(r"dense<([^>\[\]]*)>", op.attributes.get("value", ""))
    if not m:
        return None
    text = m.group(1).strip()
    if text in ("true", "false"):
        return text == "true"
    try:
        if text.startswith("0x"):
            import numpy as np

            bits = int(text, 16)
            width = {4: np.uint16, 8: np.uint32, 16: np.uint64}.get(len(text) - 2)
            float_t = {4: np.float16, 8: np.float32, 16: np.float64}.get(len(text) - 2)
            if width is None:
                return None
            return float(np.array(bits, dtype=width).view(float_t))
        return float(text)
    except ValueError:
        return None


def reduce_kind(op: Op) -> Reduction | None:
    """The reduction a single-result `stablehlo.reduce` (or `reduce_window`) applies, if it
    is a plain one whose partial results may be combined across tiles."""
    if len(op.results) != 1 or not op.regions:
        return None
    body = op.regions[0].blocks[0].ops
    if len(body) != 2:
        return None
    kind = Reduction.of_op(body[0].name)
    if kind is None:
        return None
    if kind.init_identity is not None:
        init = splat_value(through_broadcast(op.operands[1]))
        if init is None or init != kind.init_identity:
            return None
    return kind


def variadic(op: Op) -> bool:
    """Is `op` a reduce of several operands (argmax, argmin: a value and its index) with
    constant init values, whose partials its own reducer combines (`OWN_REDUCER`)? The
    lowering applies the inits again and masks padding with them, which is exact where they
    are the reducer's identity, as jax's are (StableHLO leaves other inits
    implementation-defined). A single-operand reduce with a plain reducer and another init
    (`lax.reduce(x, 1.0, add)`) is left whole."""
    return len(op.results) > 1 and all(splat_value(through_broadcast(v)) is not None
               for v in op.operands[len(op.operands) // 2:])


def through_broadcast(v) -> Op | None:
    """`v`'s producer, or the producer of what it broadcasts."""
    op = v.producer
    if op is not None and op.name == "stablehlo.broadcast_in_dim":
        op = op.operands[0].producer
    return op


def is_zero(v) -> bool:
    """Is `v` a splat zero (a constant, or a broadcast of one)?"""
    return splat_value(through_broadcast(v)) == 0


def scatter_kind(op: Op) -> Reduction | None:
    """`add` for a scatter-add into zeros (an embedding gradient): tiles of the updates can be
    scattered separately and their results summed. Other scatters have no Sum entry."""
    if len(op.results) != 1 or not op.regions:
        return None
    body = op.regions[0].blocks[0].ops
    if len(body) == 2 and body[0].name == "stablehlo.add" and is_zero(op.operands[0]):
        return Reduction.ADD
    return None
