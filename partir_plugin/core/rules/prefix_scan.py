"""Scan entries: a `reduce_window` whose window spans its whole dimension (cumsum, cummax,
cumprod; jax writes `lax.cumsum` this way on CPU and GPU: window n, padding (n-1, 0), or
(0, n-1) reversed).

As a window such a dimension needs a halo wider than any tile, which gathered it. As a scan it
partitions like a reduction: device j scans its own tile, then adds (maxes, ...) the
combination of the tile totals before it (after it, reversed): a prefix over k tile totals,
all-gathered, as small as one row per device (`spmd/rules/prefix_scan.py`). Padded tiles are
allowed: the lowering masks the padding with the reducer's identity first.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.attributes import parse_i64_array, parse_padding
from ...ir.graph import Op
from ...ir.opsets import Reduction
from ..tmr import TMREntry
from .reductions import reduce_kind

# The reductions `spmd/rules/prefix_scan.py` finishes a tile's scan with.
_SCANNED = frozenset({Reduction.ADD, Reduction.MAX, Reduction.MIN, Reduction.MUL})


@dataclass(frozen=True)
class ScanEntry(TMREntry):
    """Tiles the scanned dimension of a prefix (or, `reverse`, suffix) `reduce_window` by
    `reduction` ("add", "max", "min", "mul"): the result tiled alike, each tile finished with
    the combination of the others' totals."""

    reduction: str = "add"
    reverse: bool = False

    def __str__(self) -> str:
        return f"{super().__str__()} scan<{self.reduction}{', reversed' if self.reverse else ''}>"


def scan_dims(op: Op) -> dict[int, bool]:
    """The dimensions a reduce_window scans, each with whether it scans in reverse."""
    if op.name != "stablehlo.reduce_window" or len(op.operands) != 2:
        return {}
    rank = op.operands[0].type.rank
    shape = op.operands[0].type.shape
    window, strides, base, dil = (parse_i64_array(op.attributes.get(k, "")) or [1] * rank
                                  for k in ("window_dimensions", "window_strides",
                                            "base_dilations", "window_dilations"))
    pads = parse_padding(op.attributes.get("padding", ""), rank)
    found = {}
    for d in range(rank):
        n = shape[d]
        if n > 1 and window[d] == n and (strides[d], base[d], dil[d]) == (1, 1, 1) \
                and pads[d] in ([n - 1, 0], [0, n - 1]):
            found[d] = pads[d] == [0, n - 1]
    return found


def scan_entries(op: Op, reduction: str | None) -> list[ScanEntry]:
    """Scan entries of a reduce_window by `reduction` (None: not a plain reducer with its
    identity as init, no entries)."""
    if reduction not in _SCANNED:
        return []
    return [ScanEntry((d, None), (d,), op.operands[0].type.shape[d], reduction, reverse)
            for d, reverse in scan_dims(op).items()]



def provide(op: Op, found: list[TMREntry] | None) -> list[TMREntry] | None:
    """The provider: a reduce_window's entries with the scan entries of the dimensions it
    scans."""
    if found is None or op.name != "stablehlo.reduce_window":
        return found
    return [*found, *scan_entries(op, reduce_kind(op))]
