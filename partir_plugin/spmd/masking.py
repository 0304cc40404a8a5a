"""Masking padding (`core/padding.py`) before the ops that would read it into valid elements.

A padded tile's padding is unspecified (whatever a pad, a gather of padded tiles or an
elementwise op on garbage left there). Pass-through entries keep it in padding; a Sum entry
reads it into its partial result along the reduced factor: a reduction, the contraction of a
dot or convolution, a scatter-add's updates. Before such an op the lowering replaces the
padding of each operand the entry slices on a padded dimension with the identity of the
entry's reduction (0 for add, -inf for max, +inf for min, 1 for mul, ...), with a `select`
against the device's count of valid rows, never a multiply, so NaN or inf garbage cannot
leak. Softmax, argmax-by-gather and the like are made of these ops and need nothing more;
ops with no safe entry are refused uneven tiles in propagation (`entry_allows_padding`).
A windowed op tiled by a halo entry reads its neighbours' rows, padding included: its padding
gets the op's own pad value (`WINDOW_PAD`) before the halos are exchanged (`spmd/rules/halo.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.mesh import Mesh
from ..core.padding import PaddedDim, is_padded
from ..core.rules.embedding import lookup_dim
from ..core.rules.halo import HaloEntry
from ..core.rules.prefix_scan import ScanEntry
from ..core.tmr import Sum
from ..ir.graph import Op, Value
from ..ir.opsets import Reduction
from ..ir.types import TensorType

# The "reduction" of a mask that fills a windowed op's operand with the op's pad value (0 for
# a convolution, the init value for a reduce_window) before its halo exchange.
WINDOW_PAD = "window pad"


@dataclass(frozen=True)
class Mask:
    """Operand `operand`'s padding on `dim` replaced by the identity of `reduction`."""

    operand: int
    dim: int
    padded: PaddedDim
    reduction: str

    @property
    def fill(self) -> str:
        """What the padding becomes, for messages."""
        return "pad value" if self.reduction == WINDOW_PAD else f"{self.reduction} identity"

    def __str__(self) -> str:
        return f"operand {self.operand} dim {self.dim} ({self.fill})"


def masks(op: Op, nest, mesh: Mesh) -> list[Mask]:
    """The masks the lowering puts before `op` in loop nest `nest`: each operand a Sum entry
    slices on a dimension that its tiling (by every axis of the nest) pads, and each padded
    operand a halo entry extends (`WINDOW_PAD`, applied before the exchange)."""
    found: dict[tuple[int, int], Mask] = {}
    lookup = -1  # not asked yet: most nests sum nothing, and the lowering asks every op
    for _, entry in nest:
        if isinstance(entry, HaloEntry):
            d = entry.halo.dim
            for i in entry.halo.operands:
                padded = _padded(op.operands[i], d, nest, i, mesh)
                if padded is not None:
                    found[(i, d)] = Mask(i, d, padded, WINDOW_PAD)
        # A scan reads its padding into the rows after it (reversed: before it) as a
        # reduction reads it into its result.
        sums = ([Sum(entry.reduction)] if isinstance(entry, ScanEntry)
                else [r for r in entry.results if isinstance(r, Sum)])
        if not sums:
            continue
        if lookup == -1:
            lookup = lookup_dim(op)
        for i, v in enumerate(op.operands):
            d = entry.operands[i]
            if d is None or (i, d) in found or (i == 0 and d == lookup):
                continue  # a lookup's ids are clamped into the table: never its padding
            padded = _padded(v, d, nest, i, mesh)
            if padded is not None:
                found[(i, d)] = Mask(i, d, padded, sums[0].reduction)
    return list(found.values())


def _padded(v: Value, d: int, nest, i: int, mesh: Mesh) -> PaddedDim | None:
    """Dimension `d` of operand `i`, `v`, as the nest's axes tile it, if that pads it."""
    axes = tuple(a for a, e in nest if e.operands[i] == d)
    sizes = tuple(mesh.axis_size(a) for a in axes)
    return PaddedDim(v.type.shape[d], axes, sizes) if is_padded(v.type.shape[d], sizes) else None


def apply_mask(em, x: Value, mask: Mask, identity: Value | None = None) -> Value:
    """`x` (a local operand) with rows past this device's valid count on `mask.dim` set to
    the reduction's identity (`identity`, a scalar, where the op gives it: a reduce's init
    value for its own reducer)."""
    p = mask.padded
    valid = em.tile_valid(p.n, p.axes)
    index_t = TensorType(x.type.shape, "i32")
    rows = em.emit("stablehlo.iota", [], [index_t],
                   {"iota_dimension": f"{mask.dim} : i64"}).results[0]
    inside = em.compare(rows, em.broadcast(em.per_device(valid), index_t), "LT")
    if identity is None:
        identity = em.literal(Reduction(mask.reduction).identity_literal(x.type.element),
                              x.type.element)
    return em.where(inside, x, identity)


def padding_report(state) -> list[str]:
    """One line per padded dimension of a partitioned program (values grouped by size and
    axes), with the masks the lowering puts before the ops that read it: what the report
    says about padding."""
    values: dict[PaddedDim, int] = {}
    for v in state.tiling:
        if v.type.is_tensor:
            for p in state.padded_dims(v).values():
                values[p] = values.get(p, 0) + 1
    inserted: dict[PaddedDim, dict[str, int]] = {}
    for op, nest in state.nests.items():
        for m in masks(op, nest, state.mesh):
            what = f"{op.name} ({m.fill})"
            per = inserted.setdefault(m.padded, {})
            per[what] = per.get(what, 0) + 1
    lines = []
    for p in sorted(values, key=lambda p: (p.n, p.axes)):
        found = inserted.get(p, {})
        listed = ", ".join(f"{k} x{n}" for k, n in sorted(found.items())) or "none needed"
        count = f"{values[p]} value{'s' if values[p] > 1 else ''}"
        lines.append(f"pad {p}; {count}; masks: {sum(found.values())} ({listed})")
    return lines
