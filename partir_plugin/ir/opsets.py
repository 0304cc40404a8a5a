"""The sets and tables of StableHLO op names several passes share, spelled once.

Three sets name "shape-only" ops, and their members differ on purpose: each answers another
question (see each one's comment). They live side by side here so that a change to one is
made knowing the others.
"""

from __future__ import annotations

import enum

from .dialect import TAG_OP

# Block terminators: no loop nest, no tiling of their own.
TERMINATORS = frozenset({"stablehlo.return", "func.return"})
# Ops whose regions are partitioned like the top level (their values tied to the regions'
# through loop-carried aliases), not treated as one op.
PARTITIONED_REGIONS = frozenset({"stablehlo.while", "stablehlo.case"})

# Ops whose spatial dimensions a window slides along, with halo entries (`core/rules/halo.py`).
WINDOWED_OPS = frozenset({"stablehlo.convolution", "stablehlo.reduce_window"})
# Ops that read neighbouring rows along a dimension but have no halo entry: tiling such a
# dimension gathers it, which the lowering reports (a max-pool's gradient the importer did not
# fuse is a pad and a select_and_scatter).
UNHALOED_OPS = frozenset({"stablehlo.pad", "stablehlo.select_and_scatter"})

# Ops that only re-lay out their one operand: a value the lowering computes from a regathered
# one (ZeRO-3) through them is regathered too.
RELAYOUT_OPS = frozenset({"stablehlo.reshape", "stablehlo.convert", "stablehlo.transpose",
                          "stablehlo.broadcast_in_dim", "stablehlo.bitcast_convert"})
# Ops that only move or retype an argument's data: a value made by a chain of them from a
# function argument is that argument (a gathered parameter, for the collective records). The
# relayouts plus the identities: a copy, an optimization barrier and a tag.
ARGUMENT_PASS_THROUGH = RELAYOUT_OPS | {"stablehlo.copy", "stablehlo.optimization_barrier",
                                        TAG_OP}
# Shape ops linear in their first operand, through which a pending sum may pass on its way
# from a partial sum to a loop's accumulator (`spmd/accumulation.py`). Unlike the relayouts
# it takes slices (a slice of a sum is the sum of the slices) and leaves out
# bitcast_convert (reinterpreting a sum's bits is not linear).
PENDING_SUM_CHAIN = frozenset({"stablehlo.broadcast_in_dim", "stablehlo.transpose",
                               "stablehlo.reshape", "stablehlo.convert", "stablehlo.slice",
                               "stablehlo.dynamic_slice"})

# Bit patterns of the infinities, by float type (MLIR's dense literal takes hex).
_NEG_INF = {"f8E5M2": "0xFC", "f16": "0xFC00", "bf16": "0xFF80", "f32": "0xFF800000",
            "f64": "0xFFF0000000000000"}
_POS_INF = {"f8E5M2": "0x7C", "f16": "0x7C00", "bf16": "0x7F80", "f32": "0x7F800000",
            "f64": "0x7FF0000000000000"}


class Reduction(enum.StrEnum):
    """A reduction whose partial results may be combined across tiles: its scalar op, and its
    identity (what padding is masked with, and what an init value must be where it is counted
    once per tile). A `str` enum: `Sum("add")` and `Sum(Reduction.ADD)` are one entry."""

    ADD = "add"
    MAX = "max"
    MIN = "min"
    MUL = "mul"
    AND = "and"
    OR = "or"

    @property
    def op_name(self) -> str:
        """The StableHLO op combining two partials."""
        return _OP_NAMES[self]

    @classmethod
    def of_op(cls, name: str) -> Reduction | None:
        """The reduction a reducer region's one op performs, if a plain one."""
        return _BY_OP_NAME.get(name)

    @property
    def init_identity(self) -> float | None:
        """The identity an init value must equal for the reduction to be partitioned (an
        init counted once per tile changes a sum or a product, not a max or an and); None:
        any init will do."""
        return {Reduction.ADD: 0.0, Reduction.MUL: 1.0}.get(self)

    def identity_literal(self, element: str) -> str:
        """The identity's literal in `element` (a dense attribute's body)."""
        if element == "i1":
            return "true" if self in (Reduction.AND, Reduction.MIN, Reduction.MUL) else "false"
        if element.startswith("complex"):  # add and mul only: complex numbers are unordered
            return "(1.000000e+00,0.000000e+00)" if self == Reduction.MUL else \
                "(0.000000e+00,0.000000e+00)"
        if element.startswith(("f", "bf")):
            if self in (Reduction.MAX, Reduction.MIN):
                return _float_extreme(element, lowest=self == Reduction.MAX)
            return "1.000000e+00" if self == Reduction.MUL else "0.000000e+00"
        unsigned = element.startswith("ui")
        bits = int(element.lstrip("ui") or 32)
        low, high = ((0, 2 ** bits - 1) if unsigned
                     else (-2 ** (bits - 1), 2 ** (bits - 1) - 1))
        return str({Reduction.MAX: low, Reduction.MIN: high, Reduction.MUL: 1,
                    Reduction.AND: -1 if not unsigned else high}.get(self, 0))

    def all_reducible(self, element: str) -> bool:
        """Can an `all_reduce` combine partials of this reduction in `element`? XLA's
        collectives compute sums, products, maxima and minima, and and/or of booleans only
        (not bitwise and/or of integers)."""
        return self not in (Reduction.AND, Reduction.OR) or element == "i1"


def _float_extreme(element: str, lowest: bool) -> str:
    """-inf (`lowest`) or +inf in a float type as a hex bit pattern; the most negative or
    positive finite value in a type without infinities (f8E4M3FN)."""
    if element in _NEG_INF:
        return (_NEG_INF if lowest else _POS_INF)[element]
    import ml_dtypes

    info = ml_dtypes.finfo(getattr(ml_dtypes, _ML_DTYPES[element]))
    value = -float(info.max) if lowest else float(info.max)
    return f"{value:e}"


_ML_DTYPES = {"f8E4M3FN": "float8_e4m3fn", "f8E5M2": "float8_e5m2",
              "f8E4M3FNUZ": "float8_e4m3fnuz", "f8E5M2FNUZ": "float8_e5m2fnuz",
              "f8E4M3B11FNUZ": "float8_e4m3b11fnuz"}


_OP_NAMES = {Reduction.ADD: "stablehlo.add", Reduction.MAX: "stablehlo.maximum",
             Reduction.MIN: "stablehlo.minimum", Reduction.MUL: "stablehlo.multiply",
             Reduction.AND: "stablehlo.and", Reduction.OR: "stablehlo.or"}
_BY_OP_NAME = {name: r for r, name in _OP_NAMES.items()}
