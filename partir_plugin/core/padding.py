"""Uneven tiling: a dimension of any size n >= 1 tiled over axes that do not divide it.

A dimension tiled over an axis of size k has local extent ceil(n/k): device j holds rows
`[j·s, min((j+1)·s, n))` of it, padded on the right to s rows whose contents are unspecified.
A dimension tiled over several axes (outer first) is tiled level by level: each axis splits the
previous level's padded tile the same way, so gathering the innermost axis gives back the
previous level's tile (plus its padding past the valid part), which a trim restores. With
divisible sizes this is exactly even tiling.

This module answers the questions the rest asks about padding: a tile's extent, where a
device's tile starts and how much of it is valid, whether a TMR entry may run on padded
tiles (the policies a user picks, `PaddingPolicy` and `UnevenOutputs`, are in `options`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..ir.dialect import INTERLEAVE_OP, ROLL_OP
from ..ir.graph import Op
from .tmr import Sum, TMREntry


def ceil_div(n: int, k: int) -> int:
    return -(-n // k)


def local_extent(n: int, sizes: Sequence[int]) -> int:
    """The padded tile extent of a dimension of size `n` tiled over axes of `sizes`."""
    for k in sizes:
        n = ceil_div(n, k)
    return n


def contiguous(n: int, sizes: Sequence[int]) -> bool:
    """Does tiling `n` over `sizes` level by level give device j (row-major over the axes)
    rows `[j·s, (j+1)·s)`, s = `local_extent`, with padding only after the last valid row?
    Only where no level after the first pads: a padded inner level leaves padding at the end
    of every outer tile, between valid rows (what a window reading its neighbours must not
    meet)."""
    n = ceil_div(n, sizes[0]) if sizes else n
    for k in sizes[1:]:
        if n % k:
            return False
        n //= k
    return True


def is_padded(n: int, sizes: Sequence[int]) -> bool:
    """Does tiling `n` over `sizes` (level by level) leave padding anywhere?"""
    for k in sizes:
        if n % k:
            return True
        n //= k
    return False


def divisible_prefix(n: int, sizes: Sequence[int]) -> int:
    """How many of the leading axes tile `n` evenly: the largest divisible layout keeps them."""
    for i, k in enumerate(sizes):
        if n % k:
            return i
        n //= k
    return len(sizes)


def tile_bounds(n: int, sizes: Sequence[int], coords: Sequence[int]) -> tuple[int, int]:
    """(global start, valid rows) of the tile at `coords` (one per axis, outer first)."""
    start, extent, valid = 0, n, n
    for k, i in zip(sizes, coords):
        e = ceil_div(extent, k)
        start += i * e
        valid = min(max(valid - i * e, 0), e)
        extent = e
    return start, valid


def entry_tiles_exact_dims(op: Op, entry: TMREntry) -> bool:
    """Are all the dimensions `entry` tiles exactly its factor (no reshaped compound)? Then a
    padded row of one is a padded row of every other: a pass-through entry maps padding to
    padding, and a Sum entry reads padding only along the reduced factor, which the lowering
    masks with the reduction's identity (`spmd/masking.py`)."""
    for v, d in zip(op.inputs, entry.operands):
        if d is not None and v.type.shape[d] != entry.factor_size:
            return False
    for r, action in zip(op.results, entry.results):
        if not isinstance(action, Sum) and r.type.shape[action] != entry.factor_size:
            return False
    return True


# Ops whose tiled form reads neighbouring tiles (rolls, interleaves) or otherwise assumes
# equal tiles: an uneven entry is refused, so they gather their operands.
_NO_PADDING_OPS = frozenset({ROLL_OP, INTERLEAVE_OP})


def entry_allows_padding(op: Op, entry: TMREntry) -> bool:
    """May `op` loop over an axis with `entry` where that pads a tiled dimension?

    Padded tiles are safe where padding only ever lands in padding, or is masked first:
    pass-through and Sum entries over exact dimensions. The data-movement markers are
    refused: the op then reads its operands whole (the existing conflict and gather path),
    never a wrong number. (Halo entries depend on how many tiles: the state asks
    `Halo.fits` for those.)"""
    if op.name in _NO_PADDING_OPS:
        return False
    return entry_tiles_exact_dims(op, entry)


@dataclass(frozen=True)
class PaddedDim:
    """One padded dimension of a value: size `n` tiled over `axes` (outer first), `local`
    rows per device of which the last tile holds `n - start` valid."""

    n: int
    axes: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def local(self) -> int:
        return local_extent(self.n, self.sizes)

    @property
    def padding(self) -> int:
        """Padding rows in all, over every tile."""
        total = 1
        for k in self.sizes:
            total *= k
        return self.local * total - self.n

    def __str__(self) -> str:
        over = " x ".join(f"{a!r}({k})" for a, k in zip(self.axes, self.sizes))
        return (f"size {self.n} over {over}: {self.local} per device, "
                f"{self.padding} padding")
