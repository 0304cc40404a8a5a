"""Device-local layouts: per dimension the mesh axes tiling it (major to minor), plus pending
partial sums. This is a value's distributed type at the PartIR:HLO level."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..core.mesh import Mesh
from ..core.padding import divisible_prefix, is_padded, local_extent
from ..ir.types import TensorType


@dataclass(frozen=True)
class Layout:
    dims: tuple[tuple[str, ...], ...]
    partial: tuple[tuple[str, str], ...] = ()  # (axis, reduction), outer loop first

    # The lowering compares and hashes layouts for every edge of every op (its memo and
    # cache keys), and `from_tiles` hands out one object per distinct layout: equality
    # tries identity first, and the hash (the one a dataclass computes) is computed once.
    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.dims, self.partial)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.dims == other.dims and self.partial == other.partial

    def __reduce__(self):  # rebuilt from the fields: string hashes differ between processes
        return Layout, (self.dims, self.partial)

    @classmethod
    def replicated(cls, rank: int) -> Layout:
        return cls(((),) * rank)

    @classmethod
    def from_tiles(cls, rank: int, tiles, partial=(), mesh: Mesh | None = None) -> Layout:
        """The layout of `tiles` ((axis, dim) pairs, outer loop first): shared per distinct
        argument (lowering asks for one per operand and result of every op). With the
        `mesh`, adjacent sub-axes of one axis are folded (`Mesh.fold`), so a value tiled on
        `model` and an op's loops over `model:(1)4` then `model:(4)2` on the same dimension
        give one layout."""
        return _from_tiles(rank, tuple(tiles), tuple(partial), mesh)

    def axes(self) -> set[str]:
        return {a for d in self.dims for a in d}

    def local_type(self, global_type: TensorType, mesh: Mesh) -> TensorType:
        return _local_type(self.dims, global_type, mesh)

    def local_shape(self, shape: tuple[int, ...], mesh: Mesh) -> tuple[int, ...]:
        """Each device's tile of a `shape` array with this layout (padded where the axes do
        not divide a dimension: `core/padding.py`)."""
        return tuple(local_extent(s, [mesh.axis_size(a) for a in d])
                     for s, d in zip(shape, self.dims))

    def padded(self, shape: tuple[int, ...], mesh: Mesh) -> list[int]:
        """The dimensions this layout pads for a `shape` array."""
        return [i for i, (s, d) in enumerate(zip(shape, self.dims))
                if d and is_padded(s, [mesh.axis_size(a) for a in d])]

    def divisible(self, shape: tuple[int, ...], mesh: Mesh) -> Layout:
        """The largest layout like this one that pads nothing: each dimension keeps the
        leading axes that divide it (what a program's boundary can carry, jax needing
        divisible shardings)."""
        dims = tuple(d[:divisible_prefix(s, [mesh.axis_size(a) for a in d])]
                     for s, d in zip(shape, self.dims))
        return Layout(dims, self.partial)

    def spec(self):
        """The equivalent `jax.sharding.PartitionSpec`."""
        from jax.sharding import PartitionSpec

        entries = [None if not d else (d[0] if len(d) == 1 else d) for d in self.dims]
        while entries and entries[-1] is None:
            entries.pop()
        return PartitionSpec(*entries)

    def __str__(self) -> str:
        dims = ", ".join("{" + ",".join(d) + "}" for d in self.dims)
        part = (" sum" + str([a for a, _ in self.partial])) if self.partial else ""
        return f"[{dims}]{part}"


@functools.lru_cache(maxsize=65536)
def _from_tiles(rank: int, tiles: tuple, partial: tuple, mesh: Mesh | None) -> Layout:
    dims: list[tuple[str, ...]] = [() for _ in range(rank)]
    for axis, dim in tiles:
        dims[dim] = dims[dim] + (axis,)
    if mesh is not None:
        dims = [mesh.fold(d) if len(d) > 1 else d for d in dims]
    return Layout(tuple(dims), partial)


@functools.lru_cache(maxsize=65536)
def _local_type(dims, global_type: TensorType, mesh: Mesh) -> TensorType:
    # Lowering and simulation ask this for every value after every tactic: memoised.
    if not global_type.is_tensor:
        return global_type
    return global_type.with_shape(Layout(dims).local_shape(global_type.shape, mesh))
