"""Halo entries: tiling a spatial dimension of a windowed op (convolution, reduce_window),
the TMR side of `spmd/rules/halo.py` (named alike: the rows a tile reads from its neighbours).

Shardy marks a window's spatial factor as a permutation (a halo swap), which gives no TMR
entry, so such a tiling used to stop propagation and gather. A `HaloEntry` tiles it anyway:
output-driven, device j of k computes output rows `[j·m, (j+1)·m)` and reads input rows
`[j·n - left, (j+1)·n + right)`, the tile it holds plus halos its neighbours send
(`spmd/rules/halo.py`). That is a plain tiling of the op (paper 1 §5.2.1) as long as the
window moves by a whole number of tiles per tile of output: `m·stride == n·lhs_dilation`.
The weight-gradient convolution (image x output gradient -> kernel) is the same with the
roles swapped: the output gradient is the window, tiled plainly, each device reads its image
rows plus halos, and the kernel is a partial `Sum`.

With padded tiles (`core/padding.py`) n and m are `ceil(size/k)` and `ceil(out/k)`: a VALID
window (32 -> 30 rows) or an uneven extent (37 rows) keeps the geometry for the k where the
padded tiles are in the stride's ratio (`Halo.fits`). Such an entry has factor size 1, so every
tiling of it counts as padding and propagation asks `fits` for the axes it would loop over;
the lowering fills the padding rows with the op's pad value before exchanging, so a window
reading past the valid rows sees what the global op's padding holds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ...ir.attributes import parse_i64_array, parse_padding
from ...ir.dialect import PADDED_SCATTER_OP
from ...ir.graph import Op
from ...ir.opsets import WINDOWED_OPS
from ..padding import ceil_div, contiguous
from ..tmr import Sum, TMREntry
from .prefix_scan import scan_dims


@dataclass(frozen=True)
class HaloRows:
    """What a device with a tile of `n` rows needs for one tiling into k tiles: `left` rows
    before its tile and `right` after it (negative: rows of its tile it does not read), and
    the op's local padding `(lo, hi)` on the extended operand."""

    n: int
    left: int
    right: int
    lo: int
    hi: int

    @property
    def one_hop(self) -> bool:
        """The halos come from the direct neighbours (a collective_permute each way)."""
        return -self.n <= self.left <= self.n and -self.n <= self.right <= self.n


@dataclass(frozen=True)
class Halo:
    """The window geometry of one spatial dimension, in the op's own terms.

    `operands` are the op inputs extended with halos along `dim`; `pad_row` is the row of the
    op's `padding` attribute for that dimension. `size` is their extent, `out` the result's,
    `tiled` the extent tiled plainly (the output's, or for a weight gradient the window
    operand's), `window` the dilated window extent. `weight_gradient`: the window operand is
    the tiled one and the output a partial sum.
    """

    operands: tuple[int, ...]
    dim: int
    pad_row: int
    size: int
    out: int
    stride: int
    lhs_dilation: int
    window: int
    window_dilation: int
    lo: int
    tiled: int
    weight_gradient: bool = False

    def fits(self, sizes: Sequence[int]) -> bool:
        """Do (padded) tiles over axes of `sizes` keep the window geometry: does each tile of
        the plainly tiled extent map onto one contiguous tile of the input, moved by a whole
        tile?"""
        if not (contiguous(self.size, sizes) and contiguous(self.tiled, sizes)):
            return False
        k = math.prod(sizes)
        n, m = ceil_div(self.size, k), ceil_div(self.tiled, k)
        ratio = (m * self.window_dilation == n if self.weight_gradient
                 else m * self.stride == n * self.lhs_dilation)
        return ratio and self.rows(k).one_hop

    def rows(self, k: int) -> HaloRows:
        n = ceil_div(self.size, k)
        if self.weight_gradient:
            # Tap t of this device's window (global tap j·m + t) reads image row
            # o·stride + (j·m + t)·window_dilation - lo for output o < out.
            right = (self.out - 1) * self.stride + 1 - self.window_dilation - self.lo
            return HaloRows(n, self.lo, right, 0, 0)
        m, s, dl = ceil_div(self.out, k), self.stride, self.lhs_dilation
        # Relative to j·n·dl in dilated input coordinates, this device's windows read
        # [-lo, end); the rows inside are the multiples of dl.
        end = m * s - s - self.lo + self.window
        left = self.lo // dl
        right = -(-end // dl) - n
        return HaloRows(n, left, right, self.lo - left * dl, end - (n + right - 1) * dl - 1)


@dataclass(frozen=True)
class ScatterHalo:
    """The window geometry of one spatial dimension of a padded select_and_scatter (a
    max-pool's gradient, ir/passes/padded_scatter.py): image `x` of `size` rows padded by
    `lo` before, source (the pool's output gradient) of `out` rows, one per window of `window`
    rows moved by `stride`. Output-driven like the pool: the result has the image's rows,
    tiled with it, and the source is tiled alike (`ceil(out/k)·stride == ceil(size/k)`,
    padded tiles included: `fits`). Device j computes the windows that touch its rows, so it
    reads the source rows of those windows and every image row they cover: halos of both,
    each one `HaloRows` (`lo`/`hi` unused: the extended image carries the pad value itself).
    """

    dim: int
    size: int
    out: int
    window: int
    stride: int
    lo: int

    operands = (0, 1)  # the image and the source get halos

    def fits(self, sizes: Sequence[int]) -> bool:
        """Do (padded) tiles of source and image over axes of `sizes` keep the window
        geometry (`Halo.fits`)?"""
        if not (contiguous(self.size, sizes) and contiguous(self.out, sizes)):
            return False
        k = math.prod(sizes)
        return (ceil_div(self.out, k) * self.stride == ceil_div(self.size, k)
                and self.rows(k).one_hop and self.source_rows(k).one_hop)

    def source_rows(self, k: int) -> HaloRows:
        m, s = ceil_div(self.out, k), self.stride
        # Window o covers padded rows [o·s, o·s + window), image rows shifted by lo; it
        # touches rows [j·n, (j+1)·n) for o in [j·m - left, (j+1)·m + right).
        left = (self.window - 1 - self.lo) // s
        right = (self.lo - 1) // s + 1
        return HaloRows(m, left, right, 0, 0)

    def rows(self, k: int) -> HaloRows:
        src = self.source_rows(k)
        n, s = ceil_div(self.size, k), self.stride
        return HaloRows(n, src.left * s + self.lo, (src.right - 1) * s + self.window - self.lo,
                        0, 0)


@dataclass(frozen=True)
class HaloEntry(TMREntry):
    """A TMR entry whose tiles read their neighbours' rows: `halo` says which and how."""

    halo: Halo | ScatterHalo | None = None

    def __str__(self) -> str:
        return f"{super().__str__()} halo<{self.halo.dim}>"


def _ints(op: Op, key: str, rank: int) -> list[int]:
    return parse_i64_array(op.attributes.get(key, "")) or [1] * rank


def _conv_halos(op: Op) -> list[tuple[tuple[int | None, ...], tuple[int | Sum, ...], Halo]]:
    m = re.search(r"\[([^\]]*)\]x\[([^\]]*)\]->\[([^\]]*)\]",
                  op.attributes.get("dimension_numbers", ""))
    if not m or op.attributes.get("window_reversal", "").count("true"):
        return []
    lhs, rhs, out = ([x.strip() for x in g.split(",")] for g in m.groups())
    spatial = [c for c in lhs if c.isdigit()]
    rank = len(spatial)
    strides, lhs_dil, rhs_dil = (_ints(op, k, rank) for k in
                                 ("window_strides", "lhs_dilation", "rhs_dilation"))
    pads = parse_padding(op.attributes.get("padding", ""), rank)
    lhs_shape, rhs_shape = op.operands[0].type.shape, op.operands[1].type.shape
    out_shape = op.results[0].type.shape
    found = []
    for s, c in enumerate(spatial):
        ld, rd, od = lhs.index(c), rhs.index(c), out.index(c)
        size, window, result = lhs_shape[ld], rhs_shape[rd], out_shape[od]
        effective = (window - 1) * rhs_dil[s] + 1
        if result > 1:
            found.append(((ld, None), (od,), Halo((0,), ld, s, size, result, strides[s],
                                                  lhs_dil[s], effective, rhs_dil[s],
                                                  pads[s][0], tiled=result)))
        if result * strides[s] == size * lhs_dil[s] and result > 1:
            continue  # a forward geometry with even tiles: no weight-gradient reading of it
        if lhs_dil[s] == 1 and window > 1:
            # Weight gradient: the output gradient is the window, dilated by the stride.
            found.append(((ld, rd), (Sum("add"),),
                          Halo((0,), ld, s, size, result, strides[s], 1, effective,
                               rhs_dil[s], pads[s][0], weight_gradient=True, tiled=window)))
    return found


def _reduce_window_halos(op: Op) -> list[tuple[tuple[int | None, ...], tuple[int | Sum, ...],
                                               Halo]]:
    inputs = len(op.operands) // 2
    rank = op.operands[0].type.rank
    window, strides, base, dil = (_ints(op, k, rank) for k in
                                  ("window_dimensions", "window_strides", "base_dilations",
                                   "window_dilations"))
    pads = parse_padding(op.attributes.get("padding", ""), rank)
    size_in, size_out = op.operands[0].type.shape, op.results[0].type.shape
    found = []
    scans = scan_dims(op)
    for d in range(rank):
        if window[d] == 1 and strides[d] == 1 and base[d] == 1 and pads[d] == [0, 0]:
            continue  # a plain elementwise dimension: Shardy's pass-through entry
        if d in scans:
            continue  # a scan (cumsum): `scan.ScanEntry`, not a halo
        if size_out[d] <= 1:
            continue
        operands = tuple(d if i < inputs else None for i in range(len(op.operands)))
        found.append((operands, tuple(d for _ in op.results),
                      Halo(tuple(range(inputs)), d, d, size_in[d], size_out[d], strides[d],
                           base[d], (window[d] - 1) * dil[d] + 1, dil[d], pads[d][0],
                           tiled=size_out[d])))
    return found


def padded_scatter_entries(op: Op) -> list[TMREntry]:
    """The entries of a padded select_and_scatter (operands image, source, init, pad value):
    a dimension the window does not slide along passes through; a spatial one whose source
    has a row per `stride` image rows is a halo entry, where the scatter adds (a window a
    device computes beyond the global edge scatters a zero)."""
    x, source = op.operands[0].type.shape, op.operands[1].type.shape
    rank = len(x)
    window, strides = (_ints(op, k, rank) for k in ("window_dimensions", "window_strides"))
    low, high = (parse_i64_array(op.attributes.get(k, "")) or [0] * rank
                 for k in ("edge_padding_low", "edge_padding_high"))
    adds = _scatter_adds(op)
    entries: list[TMREntry] = []
    for d in range(rank):
        if (window[d], strides[d], low[d], high[d]) == (1, 1, 0, 0):
            if x[d] > 1:
                entries.append(TMREntry((d, d, None, None), (d,), x[d]))
        elif adds and source[d] > 1:
            halo = ScatterHalo(d, x[d], source[d], window[d], strides[d], low[d])
            # Even tiles keep the geometry where the extents are in the stride's ratio;
            # elsewhere only padded ones can (factor 1: `fits` decides per k).
            factor = source[d] if source[d] * strides[d] == x[d] else 1
            entries.append(HaloEntry((d, d, None, None), (d,), factor, halo))
    return entries


def _scatter_adds(op: Op) -> bool:
    """Is the op's scatter region (its second) a plain add: scattering a zero changes nothing?"""
    body = [o.name for o in op.regions[1].blocks[0].ops] if len(op.regions) > 1 else []
    return body == ["stablehlo.add", "stablehlo.return"]


def windowed_dims(op: Op) -> dict[int, list[int]]:
    """Per windowed input (a convolution's image, a reduce_window's inputs), the dimensions a
    window slides along: tiling one of them needs a halo entry or a gather."""
    if op.name == "stablehlo.convolution":
        m = re.search(r"\[([^\]]*)\]x", op.attributes.get("dimension_numbers", ""))
        if not m:
            return {}
        lhs = [x.strip() for x in m.group(1).split(",")]
        return {0: [d for d, c in enumerate(lhs) if c.isdigit()]}
    if op.name in ("stablehlo.reduce_window", "stablehlo.select_and_scatter"):
        rank = op.operands[0].type.rank
        window, strides, base = (_ints(op, k, rank) for k in
                                 ("window_dimensions", "window_strides", "base_dilations"))
        pads = parse_padding(op.attributes.get("padding", ""), rank)
        dims = [d for d in range(rank)
                if (window[d], strides[d], base[d], pads[d]) != (1, 1, 1, [0, 0])]
        inputs = 2 if op.name == "stablehlo.select_and_scatter" else len(op.operands) // 2
        return dict.fromkeys(range(inputs), dims)
    if op.name == PADDED_SCATTER_OP:
        rank = op.operands[0].type.rank
        attrs = [_ints(op, k, rank) for k in ("window_dimensions", "window_strides")]
        attrs += [parse_i64_array(op.attributes.get(k, "")) or [0] * rank
                  for k in ("edge_padding_low", "edge_padding_high")]
        dims = [d for d in range(rank) if any(a[d] != (1 if i < 2 else 0)
                                              for i, a in enumerate(attrs))]
        return {0: dims, 1: dims}
    if op.name == "stablehlo.pad":
        rank = op.operands[0].type.rank
        edges = [parse_i64_array(op.attributes.get(k, "")) or [0] * rank
                 for k in ("edge_padding_low", "edge_padding_high", "interior_padding")]
        return {0: [d for d in range(rank) if any(e[d] for e in edges)]}
    return {}


def no_halo_reason(op: Op, dim: int) -> str:
    """Why input dimension `dim` of a windowed op has no usable halo entry, for messages."""
    if op.name == "stablehlo.convolution" and "true" in op.attributes.get("window_reversal", ""):
        return "its window is reversed"
    if op.name == "stablehlo.pad":
        return "padding shifts the rows of every tile (no halo rule for pad)"
    if op.name == "stablehlo.select_and_scatter":
        return "select_and_scatter (a max-pool's gradient) has no halo rule"
    if op.name == PADDED_SCATTER_OP:
        if not _scatter_adds(op):
            return "its scatter does not add"
        return ("its tiles of source and image (ceil(n/k) rows each) are not one source row "
                "per stride of image rows, or a halo is wider than a tile")
    if dim in scan_dims(op):
        return "it scans the whole dimension with a reducer that has no scan rule"
    found = _conv_halos(op) if op.name == "stablehlo.convolution" else _reduce_window_halos(op)
    halos = [h for _, _, h in found if h.dim == dim]
    if not halos:
        return "its output has a single row along it"
    extents = " or ".join(f"{h.size} and {h.tiled}" for h in halos)
    return (f"its input and output extents along it ({extents} rows) do not split into "
            f"tiles of ceil(n/k) rows in the ratio of its stride and lhs dilation, or its "
            f"halo is wider than a tile")


def halo_entries(op: Op, existing: list[TMREntry]) -> list[HaloEntry]:
    """Halo entries of a convolution or reduce_window, for the spatial tilings `existing`
    (Shardy's entries) lacks. The factor size makes k divide both the tiled extents."""
    if op.name == "stablehlo.convolution":
        found = _conv_halos(op)
    elif op.name == "stablehlo.reduce_window":
        found = _reduce_window_halos(op)
    else:
        return []
    have = {(e.operands, e.results) for e in existing}
    out = []
    for operands, results, halo in found:
        if (operands, results) in have:
            continue
        ratio = halo.window_dilation if halo.weight_gradient else halo.stride
        dilation = 1 if halo.weight_gradient else halo.lhs_dilation
        if halo.tiled * ratio == halo.size * dilation:
            factor = math.gcd(halo.size, halo.tiled)  # even tiles keep the geometry
        else:
            factor = 1  # only padded tiles can: every tiling pads, and asks `fits`
        out.append(HaloEntry(operands, results, factor, halo))
    return out


def grouped_dim(op: Op) -> int | None:
    """The lhs dimension a grouped convolution splits into groups (its feature dimension
    for `feature_group_count` > 1, its batch dimension for `batch_group_count` > 1, the
    weight gradient of a grouped convolution), else None. Tiling it changes the local group
    count, which the lowering keeps global: only the other dimensions tile (the batch,
    the spatial ones with halos, a weight gradient's contracted batch)."""
    if op.name != "stablehlo.convolution":
        return None
    m = re.search(r"\[([^\]]*)\]x", op.attributes.get("dimension_numbers", ""))
    if not m:
        return None
    lhs = [x.strip() for x in m.group(1).split(",")]
    for key, label in (("feature_group_count", "f"), ("batch_group_count", "b")):
        if not op.attributes.get(key, "1 : i64").startswith("1 ") and label in lhs:
            return lhs.index(label)
    return None


def provide(op: Op, found: list[TMREntry] | None) -> list[TMREntry] | None:
    """The provider: a windowed op's entries (Shardy's) with the halo entries they lack."""
    if found is None or op.name not in WINDOWED_OPS:
        return found
    return [*found, *halo_entries(op, found)]
