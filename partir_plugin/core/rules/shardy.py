"""TMR entries derived from OpenXLA Shardy's op sharding rules (DESIGN.md §2.2): the
provider of every op no kernel rule knows (`core/rules/__init__.py`).

The importer runs `sdy-populate-op-sharding-rules`, which attaches to each op a factor-based
rule such as `#sdy.op_sharding_rule<([i, k], [k, j])->([i, j]) {i=32, j=16, k=8}
reduction={k}>`. Each pass-through factor gives an entry tiling that factor's dimension in every
tensor that has it; each reduction factor gives an entry with `Sum` results, when we know the
reduction; need-replication, permutation and blocked factors give none. A factor that is the
minor part of a compound dimension (`[ij]`: j) gives none either: tiling the dimension splits
its major factor. Where Shardy's rule says more than a plain tiling can do (a pad that
shifts rows, a convolution's window taken for a reduction), the entry is dropped here; what
tiles such dimensions anyway (halos, prefix scans) comes from its own provider.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ...ir.attributes import dimension_list, parse_array, parse_i64_array
from ...ir.graph import Op
from ...ir.opsets import UNHALOED_OPS, Reduction
from ..tmr import OWN_REDUCER, Sum, TMREntry
from .halo import grouped_dim, windowed_dims
from .reductions import reduce_kind, scatter_kind, variadic

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
_SUM_OPS = {"stablehlo.dot_general": Reduction.ADD, "stablehlo.dot": Reduction.ADD,
            "stablehlo.convolution": Reduction.ADD}


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


def _indexed_operand_dims(op: Op) -> set[int]:
    """Operand dims a gather/scatter indexes into: tiling them would index a tile with global
    indices, so Shardy's pass-through factor there is not a plain tiling for us. Except where
    the slice (the update window) spans the whole dimension, as in jax's vmap of a
    dynamic_slice or dynamic_update_slice: a gather's start there clamps to 0 on the whole
    array and on a tile alike, and a scatter's window is in bounds on both exactly when its
    start is 0, so each tile reads (writes) its own rows."""
    text = op.attributes.get("dimension_numbers") or op.attributes.get(
        "scatter_dimension_numbers", "")
    indexed = (dimension_list(text, "start_index_map")
               or dimension_list(text, "scatter_dims_to_operand_dims") or [])
    return set(indexed) - _whole_window_dims(op, text)


def _whole_window_dims(op: Op, numbers: str) -> set[int]:
    """The operand dims whose gather slice or scatter update window is the whole dimension."""
    shape = op.operands[0].type.shape
    if op.name == "stablehlo.gather":
        sizes = parse_i64_array(op.attributes.get("slice_sizes", ""))
        return {d for d, n in enumerate(sizes) if d < len(shape) and n == shape[d]}
    if len(op.operands) != 3:  # one operand, indices, updates (not a variadic scatter)
        return set()
    removed = {*(dimension_list(numbers, "inserted_window_dims") or []),
               *(dimension_list(numbers, "input_batching_dims") or [])}
    window = [d for d in range(len(shape)) if d not in removed]
    updates = op.operands[2].type.shape
    return {d for d, u in zip(window, dimension_list(numbers, "update_window_dims") or [])
            if updates[u] == shape[d]}


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
    """The entries Shardy's rule on `op` gives (less those that would be wrong for us), or
    None where it has none we use."""
    if op.name in DENIED or op.rule is None or op.captures:
        return None
    if op.name == "stablehlo.reduce":
        reduction = reduce_kind(op) or (OWN_REDUCER if variadic(op) else None)
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
        grouped = grouped_dim(op)
        if grouped is not None:  # no entry tiles the groups or ties kernel features alone
            entries = [e for e in entries if e.operands[0] not in (grouped, None)]
    return list(entries)


def provide(op: Op, found: list[TMREntry] | None) -> list[TMREntry] | None:
    """The provider: Shardy's entries, where no earlier provider knows the op."""
    return entries_from_shardy(op) if found is None else found


def _without_moving_dims(op: Op, entries) -> list[TMREntry]:
    """`entries` less those tiling a dimension along which the op moves rows. Shardy calls
    a `pad` dimension pointwise whenever its size is unchanged (a crop of one row on one side
    and a row of padding on the other: a shift), but each tile would be shifted on its own,
    without the rows its neighbour holds (issue 33)."""
    moving = windowed_dims(op)
    return [e for e in entries
            if not any(e.operands[i] in dims for i, dims in moving.items())]


@functools.lru_cache(maxsize=16384)
def _entries_for_signature(rule_text: str, reduction: Reduction | str | None,
                           indexed: frozenset[int]
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
