"""Pads folded into a windowed op's own padding (as XLA's algebraic simplifier folds them).

Code written as `conv(jnp.pad(x), VALID)` (a causal convolution, PyTorch's `F.pad`) pads the
image with zeros before a convolution that pads nothing; its gradient crops the input
gradient with a negative pad. A pad shifts every tile of a tiled dimension, so either would
gather a spatially tiled image, where the same convolution written with `padding=` exchanges
halos (core/rules/halo.py). Both fold exactly:
- `conv(pad(x, 0))`: the pad's edges on the image's spatial dimensions become the
  convolution's padding (zeros either way), for every convolution reading the pad (the
  forward pass and the weight gradient); the pad goes when nothing else reads it;
- `pad(conv(...), low, high)` with non-positive edges on the output's spatial dimensions (a
  crop): output row o' is row o' + |low| of the convolution, whose window starts |low|·stride
  rows later, so the convolution's padding shrinks by |low|·stride and |high|·stride; a crop
  of a sum of such convolutions (the gradient of an image two convolutions read) folds into
  each;
- `reduce_window(pad(x, c))` with c its init value (jax's transpose of a sum pool pads the
  output gradient with zeros inside and at the edges): interior padding is base dilation,
  whose holes a reduce_window fills with its init value as it does its padding, so the pad's
  edges join the padding and its interior becomes the base dilation.
"""

from __future__ import annotations

import re
from collections.abc import Set
from dataclasses import dataclass

from ..attributes import format_padding, i64_array, parse_i64_array, parse_padding
from ..graph import Func, Op, Value, blocks, use_counts
from ..opsets import WINDOWED_OPS
from .pipeline import FuncPass

CONV = "stablehlo.convolution"
PAD = "stablehlo.pad"
REDUCE_WINDOW = "stablehlo.reduce_window"


@dataclass(frozen=True)
class FoldWindowPadding(FuncPass):
    name = "fold-window-padding"

    def wanted(self, seen: Set[str]) -> bool:
        return PAD in seen and not WINDOWED_OPS.isdisjoint(seen)

    def apply(self, func: Func) -> None:
        fold_window_padding(func)


def fold_window_padding(func: Func) -> int:
    """Fold the pads around `func`'s convolutions and reduce_windows (regions included); the
    number folded."""
    uses = use_counts(func)
    folded = 0
    for block in blocks(func.body):
        gone: set[Op] = set()
        for op in block.ops:
            if op.name == CONV and _fold_input_pad(op, uses):
                folded += 1
            elif op.name == REDUCE_WINDOW and _fold_into_reduce_window(op, uses):
                folded += 1
            elif op.name == PAD and _fold_crop(op, uses):
                gone.add(op)
                folded += 1
        for op in block.ops:
            if op.name == PAD and uses.get(op.results[0], 0) == 0 and op not in gone:
                gone.add(op)  # a pad every convolution reading it folded
                for v in op.operands:
                    uses[v] -= 1
        if gone:
            block.ops = [op for op in block.ops if op not in gone]
    return folded


def _dims(conv: Op) -> tuple[list[str], list[str]] | None:
    """The lhs and output layouts of `conv` (`b`, `f`, or a spatial index per dimension)."""
    m = re.search(r"\[([^\]]*)\]x\[[^\]]*\]->\[([^\]]*)\]",
                  conv.attributes.get("dimension_numbers", ""))
    if not m:
        return None
    return [c.strip() for c in m.group(1).split(",")], [c.strip() for c in m.group(2).split(",")]


def _pad_widths(pad: Op) -> tuple[list[int], list[int], list[int]]:
    """A pad's low edges, high edges and interior padding, per dimension."""
    rank = pad.operands[0].type.rank
    low, high, interior = (parse_i64_array(pad.attributes.get(k, "")) or [0] * rank
                           for k in ("edge_padding_low", "edge_padding_high",
                                     "interior_padding"))
    return low, high, interior


def _edges(pad: Op) -> tuple[list[int], list[int]] | None:
    low, high, interior = _pad_widths(pad)
    return None if any(interior) else (low, high)


def _read_past(op: Op, pad: Op, uses: dict[Value, int]) -> None:
    """Make `op` read the pad's operand where it read the pad (operand 0)."""
    uses[op.operands[0]] -= 1
    op.operands[0] = pad.operands[0]
    uses[pad.operands[0]] = uses.get(pad.operands[0], 0) + 1


def _fold_input_pad(conv: Op, uses: dict[Value, int]) -> bool:
    pad = conv.operands[0].producer
    layouts = _dims(conv)
    if pad is None or pad.name != PAD or layouts is None or not _is_zero(pad.operands[1]):
        return False
    lhs, _ = layouts
    rank = sum(c.isdigit() for c in lhs)
    # Zeros before the image, only where the image has no holes (lhs dilation 1).
    dilation = parse_i64_array(conv.attributes.get("lhs_dilation", "")) or [1] * rank
    pads = _moved(conv, lhs, _edges(pad), [int(k == 1) for k in dilation], sign=1)
    if pads is None:
        return False
    conv.attributes["padding"] = format_padding(pads)
    _read_past(conv, pad, uses)
    return True


def _fold_into_reduce_window(op: Op, uses: dict[Value, int]) -> bool:
    pad = op.operands[0].producer
    if (len(op.operands) != 2 or pad is None or pad.name != PAD
            or not _same_constant(pad.operands[1], op.operands[1])):
        return False
    rank = op.operands[0].type.rank
    base = parse_i64_array(op.attributes.get("base_dilations", "")) or [1] * rank
    low, high, interior = _pad_widths(pad)
    if any(b != 1 for b in base) or min(low + high) < 0:
        return False  # holes of holes, or a crop: not the op's padding
    pads = parse_padding(op.attributes.get("padding", ""), rank)
    op.attributes["padding"] = format_padding([[p[0] + lo, p[1] + hi]
                                               for p, lo, hi in zip(pads, low, high)])
    if any(interior):
        op.attributes["base_dilations"] = i64_array([i + 1 for i in interior])
    _read_past(op, pad, uses)
    return True


def _fold_crop(pad: Op, uses: dict[Value, int]) -> bool:
    """Fold a crop into the convolutions computing its operand: one convolution, or a sum of
    them (an image read by two convolutions, as a gated causal convolution reads its padded
    input: its gradient adds two input gradients before the pad's crop), each read only
    there. The pad's result becomes the convolution's (or the sum's), and a summed
    convolution's result takes the cropped type."""
    producer = pad.operands[0].producer
    if producer is None or uses.get(pad.operands[0]) != 1:
        return False
    folds = _crop_folds(producer, _edges(pad), uses)
    if folds is None:
        return False
    result = pad.results[0]
    for conv, pads in folds:
        conv.attributes["padding"] = format_padding(pads)
        if conv is not producer:
            conv.results[0].type = result.type
    for op in _sums_under(producer):
        op.results[0].type = result.type
    if producer.name == "stablehlo.add":
        for op in [producer, *_sums_under(producer)]:
            op.rule = _resized_rule(op.rule, pad.operands[0].type.shape, result.type.shape)
    result.owner, result.index = producer, 0
    producer.results = [result]
    uses[pad.operands[1]] -= 1
    return True


def _crop_folds(op: Op, edges, uses: dict[Value, int]) -> list[tuple[Op, list]] | None:
    """Each convolution under `op` (a convolution, or adds of convolutions each read once)
    with its padding after the crop `edges`; None where one does not fold."""
    if op.name == "stablehlo.add":
        folds = []
        for v in op.operands:
            inner = v.producer
            if inner is None or uses.get(v) != 1:
                return None
            found = _crop_folds(inner, edges, uses)
            if found is None:
                return None
            folds += found
        return folds
    layouts = _dims(op) if op.name == CONV else None
    if layouts is None:
        return None
    _, out = layouts
    rank = sum(c.isdigit() for c in out)
    strides = parse_i64_array(op.attributes.get("window_strides", "")) or [1] * rank
    pads = _moved(op, out, edges, strides, sign=-1)
    return None if pads is None else [(op, pads)]


def _resized_rule(rule: str | None, old: tuple[int, ...], new: tuple[int, ...]) -> str | None:
    """An add's Shardy rule (one factor per dimension, imported with the shapes before the
    crop) with the factor sizes of the cropped dimensions changed: propagation reads the
    sizes from the rule."""
    m = re.search(r"->\(\[([^\]]*)\]", rule or "")
    if m is None:
        return rule
    factors = [f.strip() for f in m.group(1).split(",")]
    for factor, a, b in zip(factors, old, new):
        if a != b:
            rule = re.sub(rf"(?<=[{{ ]){factor}={a}\b", f"{factor}={b}", rule)
    return rule


def _sums_under(op: Op) -> list[Op]:
    """The adds of a folded sum below its top one (each takes the cropped type)."""
    if op.name != "stablehlo.add":
        return []
    inner = [v.producer for v in op.operands if v.producer.name == "stablehlo.add"]
    return inner + [s for i in inner for s in _sums_under(i)]


def _moved(conv: Op, layout: list[str], edges, scale: list[int], sign: int
           ) -> list[list[int]] | None:
    """The convolution's padding plus a pad's `edges` on the spatial dimensions of `layout`
    (its lhs or output), spatial dimension s scaled by `scale[s]`; None where an edge is on
    another dimension, has the other sign than `sign`, or has scale 0."""
    if edges is None:
        return None
    pads = parse_padding(conv.attributes.get("padding", ""), len(scale))
    for d, c in enumerate(layout):
        lo, hi = edges[0][d], edges[1][d]
        if (lo, hi) == (0, 0):
            continue
        if not c.isdigit() or lo * sign < 0 or hi * sign < 0 or scale[int(c)] == 0:
            return None
        s = int(c)
        pads[s] = [pads[s][0] + lo * scale[s], pads[s][1] + hi * scale[s]]
    return pads


def _same_constant(a: Value, b: Value) -> bool:
    """Are `a` and `b` one value, two zeros, or two constants of the same literal?"""
    if a is b or (_is_zero(a) and _is_zero(b) and a.type == b.type):
        return True
    pa, pb = a.producer, b.producer
    return (pa is not None and pb is not None and pa.name == pb.name == "stablehlo.constant"
            and a.type == b.type and pa.attributes.get("value") == pb.attributes.get("value"))


def _is_zero(v: Value) -> bool:
    """Is `v` a zero constant (possibly converted or broadcast from one)?"""
    op = v.producer
    while op is not None and op.name in ("stablehlo.convert", "stablehlo.broadcast_in_dim"):
        op = op.operands[0].producer
    if op is None or op.name != "stablehlo.constant":
        return False
    m = re.match(r"dense<([^>]*)>", op.attributes.get("value", ""))
    try:
        return m is not None and float(m.group(1)) == 0.0 and not m.group(1).startswith("-")
    except ValueError:
        return False

