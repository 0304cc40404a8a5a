"""TMR entries derived from OpenXLA Shardy's op sharding rules (DESIGN.md §2.2).

The importer runs `sdy-populate-op-sharding-rules`, which attaches to each op a factor-based
rule such as `#sdy.op_sharding_rule<([i, k], [k, j])->([i, j]) {i=32, j=16, k=8}
reduction={k}>`. Each pass-through factor gives an entry tiling that factor's dimension in every
tensor that has it; each reduction factor gives an entry with `Sum` results, when we know the
reduction; need-replication, permutation and blocked factors give none. A factor that is the
minor part of a compound dimension (`[ij]`: j) gives none either: tiling the dimension splits
its major factor.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..ir.attributes import parse_array
from ..ir.graph import Op
from .scan import scan_entries
from .tmr import OWN_REDUCER, Sum, TMREntry
from .windows import UNHALOED_OPS, halo_entries, windowed_dims

_FACTOR = re.compile(r"[a-z](?:_\d+)?")
_RULE = re.compile(r"#sdy\.op_sharding_rule<\((?P<ins>.*?)\)->\((?P<outs>.*?)\)(?P<rest>.*)>$")

# Ops whose Shardy rule we do not use: their partitioned form needs more than tiling (regions
# with loop-carried state, side effects, calls we cannot see into) or a lowering we lack.
DENIED = frozenset({
    "stablehlo.while", "stablehlo.case", "stablehlo.if", "stablehlo.custom_call",
    "stablehlo.rng_bit_generator", "stablehlo.rng", "stablehlo.all_reduce",
    "stablehlo.all_gather", "stablehlo.reduce_scatter", "stablehlo.all_to_all",
    "stablehlo.collective_permute", "stablehlo.fft",
    "stablehlo.triangular_solve", "stablehlo.cholesky",
    "stablehlo.dynamic_update_slice", "stablehlo.batch_norm_training",
    "stablehlo.batch_norm_inference", "stablehlo.batch_norm_grad", "stablehlo.infeed",
    "stablehlo.outfeed", "stablehlo.send", "stablehlo.recv", "stablehlo.after_all",
    "stablehlo.get_tuple_element", "stablehlo.tuple",
})

# The reduction a Sum entry performs, for ops whose reduction factors are plain sums.
_SUM_OPS = {"stablehlo.dot_general": "add", "stablehlo.dot": "add",
            "stablehlo.convolution": "add"}
_REDUCER = {"stablehlo.add": "add", "stablehlo.maximum": "max", "stablehlo.minimum": "min",
            "stablehlo.multiply": "mul", "stablehlo.and": "and", "stablehlo.or": "or"}
# Reductions where an init value that is not the identity would be counted once per tile.
_NEEDS_IDENTITY_INIT = {"add": 0.0, "mul": 1.0}


@dataclass(frozen=True)
class ShardyRule:
    operands: tuple[tuple[tuple[str, ...], ...], ...]  # per tensor, per dim, factors major->minor
    results: tuple[tuple[tuple[str, ...], ...], ...]
    sizes: dict[str, int]
    reduction: frozenset[str]
    blocked: frozenset[str]  # need_replication, permutation and blocked_propagation factors


def _tensors(text: str) -> tuple[tuple[tuple[str, ...], ...], ...]:
    tensors = []
    for t in re.findall(r"\[([^\]]*)\]", text):
        dims = [] if not t.strip() else [tuple(_FACTOR.findall(d)) for d in t.split(",")]
        tensors.append(tuple(dims))
    return tuple(tensors)


def _factor_set(rest: str, key: str) -> frozenset[str]:
    m = re.search(key + r"=\{([^}]*)\}", rest)
    return frozenset(_FACTOR.findall(m.group(1))) if m else frozenset()


def parse_rule(text: str) -> ShardyRule | None:
    m = _RULE.match(text.strip())
    if not m:
        return None
    rest = m.group("rest")
    sizes_m = re.search(r"\{([a-z_0-9=, ]*)\}", rest)
    sizes = {}
    if sizes_m and "=" in sizes_m.group(1):
        for item in sizes_m.group(1).split(","):
            k, v = item.split("=")
            sizes[k.strip()] = int(v)
    blocked = (_factor_set(rest, "need_replication") | _factor_set(rest, "permutation")
               | _factor_set(rest, "blocked_propagation"))
    return ShardyRule(_tensors(m.group("ins")), _tensors(m.group("outs")), sizes,
                      _factor_set(rest, "reduction"), blocked)


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


def reduce_kind(op: Op) -> str | None:
    """The reduction a single-result `stablehlo.reduce` (or `reduce_window`) applies, if it
    is a plain one whose partial results may be combined across tiles."""
    if len(op.results) != 1 or not op.regions:
        return None
    body = op.regions[0].blocks[0].ops
    if len(body) != 2:
        return None
    kind = _REDUCER.get(body[0].name)
    if kind is None:
        return None
    if kind in _NEEDS_IDENTITY_INIT:
        init = splat_value(_through_broadcast(op.operands[1]))
        if init is None or init != _NEEDS_IDENTITY_INIT[kind]:
            return None
    return kind


def _variadic(op: Op) -> bool:
    """Is `op` a reduce of several operands (argmax, argmin: a value and its index) with
    constant init values, whose partials its own reducer combines (`OWN_REDUCER`)? The
    lowering applies the inits again and masks padding with them, which is exact where they
    are the reducer's identity, as jax's are (StableHLO leaves other inits
    implementation-defined). A single-operand reduce with a plain reducer and another init
    (`lax.reduce(x, 1.0, add)`) is left whole."""
    return len(op.results) > 1 and all(splat_value(_through_broadcast(v)) is not None
               for v in op.operands[len(op.operands) // 2:])


def _through_broadcast(v) -> Op | None:
    """`v`'s producer, or the producer of what it broadcasts."""
    op = v.producer
    if op is not None and op.name == "stablehlo.broadcast_in_dim":
        op = op.operands[0].producer
    return op


def is_zero(v) -> bool:
    """Is `v` a splat zero (a constant, or a broadcast of one)?"""
    return splat_value(_through_broadcast(v)) == 0


def scatter_kind(op: Op) -> str | None:
    """`add` for a scatter-add into zeros (an embedding gradient): tiles of the updates can be
    scattered separately and their results summed. Other scatters have no Sum entry."""
    if len(op.results) != 1 or not op.regions:
        return None
    body = op.regions[0].blocks[0].ops
    if len(body) == 2 and body[0].name == "stablehlo.add" and is_zero(op.operands[0]):
        return "add"
    return None


def _indexed_operand_dims(op: Op) -> set[int]:
    """Operand dims a gather/scatter indexes into: tiling them would index a tile with global
    indices, so Shardy's pass-through factor there is not a plain tiling for us."""
    text = op.attributes.get("dimension_numbers") or op.attributes.get(
        "scatter_dimension_numbers", "")
    m = re.search(r"(?:start_index_map|scatter_dims_to_operand_dims) = \[([0-9, ]*)\]", text)
    return {int(d) for d in m.group(1).split(",") if d.strip()} if m else set()


def _grouped_convolution(op: Op) -> bool:
    """Grouped or batch-grouped convolutions tie feature tiles to groups: not plain tiling."""
    return any(not op.attributes.get(k, "1 : i64").startswith("1 ")
               for k in ("feature_group_count", "batch_group_count"))


def _window_reduction_halos(op: Op) -> frozenset[int]:
    """The lhs spatial dimensions of a convolution whose window-size factor Shardy marks as a
    reduction but which are not one: tiling them sums products of misaligned rows.

    Shardy gives a spatial dimension a reduction factor shared by the lhs and the kernel
    (`addSpatialFactor(windowSize, isContracting)` in its registry, whose comment there says
    such a factor "also needs permutation (halo-swap)"). It ignores padding, dilation and reversal,
    and that the output may hold several windows: a weight-gradient convolution (lhs = image,
    kernel = output gradient, output = kernel size) with SAME padding gets an entry that tiles
    the image and the output gradient alike and sums, although each output row reads image
    rows shifted by the padding. The sum is exact only for one window covering the whole
    unpadded, undilated, unreversed dimension: a plain contraction."""
    m = re.search(r"\[([^\]]*)\]x\[([^\]]*)\]->\[([^\]]*)\]",
                  op.attributes.get("dimension_numbers", ""))
    if not m:
        return frozenset()
    lhs, rhs, out = ([x.strip() for x in g.split(",")] for g in m.groups())
    spatial = [c for c in lhs if c.isdigit()]
    pads = [int(x) for x in re.findall(r"-?\d+", op.attributes.get("padding", "").split(":")[0])]
    if len(pads) == 1:
        pads = pads * (2 * len(spatial))

    lhs_dil, rhs_dil, reversal = (parse_array(op.attributes.get(k, "")) for k in
                                  ("lhs_dilation", "rhs_dilation", "window_reversal"))
    halos = set()
    for s, c in enumerate(spatial):
        ld, rd, od = lhs.index(c), rhs.index(c), out.index(c)
        exact = (op.operands[0].type.shape[ld] == op.operands[1].type.shape[rd]
                 and op.results[0].type.shape[od] == 1
                 and pads[2 * s: 2 * s + 2] in ([], [0, 0])
                 and (lhs_dil[s:s + 1] in ([], ["1"])) and (rhs_dil[s:s + 1] in ([], ["1"]))
                 and reversal[s:s + 1] in ([], ["false"]))
        if not exact:
            halos.add(ld)
    return frozenset(halos)


def entries_from_shardy(op: Op) -> list[TMREntry] | None:
    if op.name in DENIED or op.rule is None or op.captures:
        return None
    if op.name == "stablehlo.convolution" and _grouped_convolution(op):
        return []
    if op.name == "stablehlo.reduce":
        reduction = reduce_kind(op) or (OWN_REDUCER if _variadic(op) else None)
    elif op.name == "stablehlo.scatter":
        reduction = scatter_kind(op)
    else:
        reduction = _SUM_OPS.get(op.name)
    indexed = (frozenset(_indexed_operand_dims(op))
               if op.name in ("stablehlo.gather", "stablehlo.scatter") else frozenset())
    entries = _entries_for_signature(op.rule, reduction, indexed)
    if entries is None:
        return None
    if op.name in UNHALOED_OPS:
        entries = _without_moving_dims(op, entries)
    if op.name == "stablehlo.reshape":
        # A factor only the result has (a dimension no factorization of the operand's
        # matches: [5, 3] -> [3, 5]) would need the whole operand on every device, reshaped
        # and then sliced; run on a tile, the reshape would change its element count.
        entries = [e for e in entries if e.operands[0] is not None]
    if op.name == "stablehlo.convolution":
        halos = _window_reduction_halos(op)
        entries = [e for e in entries
                   if not (e.operands[0] in halos and any(isinstance(r, Sum) for r in e.results))]
    if op.name in ("stablehlo.convolution", "stablehlo.reduce_window"):
        entries = [*entries, *halo_entries(op, list(entries))]
    if op.name == "stablehlo.reduce_window":
        entries = [*entries, *scan_entries(op, reduce_kind(op))]
    return list(entries)


def _without_moving_dims(op: Op, entries) -> list[TMREntry]:
    """`entries` less those tiling a dimension along which the op moves rows. Shardy calls
    a `pad` dimension pointwise whenever its size is unchanged (a crop of one row on one side
    and a row of padding on the other: a shift), but each tile would be shifted on its own,
    without the rows its neighbour holds (issue 33)."""
    moving = windowed_dims(op)
    return [e for e in entries
            if not any(e.operands[i] in dims for i, dims in moving.items())]


@functools.lru_cache(maxsize=16384)
def _entries_for_signature(rule_text: str, reduction: str | None, indexed: frozenset[int]
                           ) -> tuple[TMREntry, ...] | None:
    """The entries of every op with this signature: its Shardy rule (which spells out the
    factor sizes, so the shapes), the reduction its Sum entries perform and, for gather and
    scatter, the indexed operand dimensions. The L layers of a model repeat a few dozen
    signatures, so the rule of each is parsed and derived once, not once per op."""
    rule = parse_rule(rule_text)
    if rule is None:
        return None
    entries = []
    for factor, size in rule.sizes.items():
        if factor in rule.blocked or size <= 1:
            continue

        def position(tensor, factor=factor):
            for d, factors in enumerate(tensor):
                if factor in factors:
                    return d if factors[0] == factor else -1  # -1: a minor part
            return None

        ins = tuple(position(t) for t in rule.operands)
        outs = tuple(position(t) for t in rule.results)
        if -1 in ins or -1 in outs:
            continue
        if factor in rule.reduction:
            if reduction is None or any(o is not None for o in outs):
                continue
            results = tuple(Sum(reduction) for _ in outs)
        else:
            if any(o is None for o in outs):
                continue
            results = outs
        if all(d is None for d in ins) and not results:
            continue
        entries.append(TMREntry(ins, results, size))
    if indexed:
        entries = [e for e in entries if e.operands[0] not in indexed]
    return tuple(entries)
