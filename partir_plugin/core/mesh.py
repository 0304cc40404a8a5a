"""The logical device mesh: ordered named axes with sizes (paper 1 §2.1)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import PartitionError


@dataclass(frozen=True)
class Mesh:
    """Named axes, major to minor. Device `r` (replica id) has coordinates `coords(r)`,
    row-major over the axes, as `jax.sharding.Mesh.devices.flat` orders devices."""

    axes: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, mesh) -> Mesh:
        """Build from a `jax.sharding.Mesh`, a dict `{"batch": 4, "model": 2}` or a Mesh."""
        if isinstance(mesh, Mesh):
            return mesh
        if isinstance(mesh, Mapping):
            return cls(tuple((str(k), int(v)) for k, v in mesh.items()))
        if hasattr(mesh, "shape") and hasattr(mesh, "axis_names"):
            return cls(tuple((str(n), int(mesh.shape[n])) for n in mesh.axis_names))
        raise TypeError(f"cannot make a mesh from {type(mesh).__name__}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def shape(self) -> dict[str, int]:
        return dict(self.axes)

    @property
    def size(self) -> int:
        n = 1
        for _, s in self.axes:
            n *= s
        return n

    def axis_size(self, axis: str) -> int:
        for n, s in self.axes:
            if n == axis:
                return s
        raise PartitionError(f"axis {axis!r} is not in the mesh (axes: {self.shape})")

    def check_axis(self, axis: str) -> None:
        self.axis_size(axis)

    def stride(self, axis: str) -> int:
        """Replica-id stride of `axis` (product of the sizes of the more minor axes)."""
        stride = 1
        for n, s in reversed(self.axes):
            if n == axis:
                return stride
            stride *= s
        raise PartitionError(f"axis {axis!r} is not in the mesh (axes: {self.shape})")

    def coords(self, replica: int) -> dict[str, int]:
        return dict(_coords(self)[replica])

    def groups(self, axes: tuple[str, ...]) -> list[list[int]]:
        """Replica groups for a collective over `axes`: devices that differ only in those
        axes, ordered within a group by their coordinates along `axes` (first = major)."""
        return [list(g) for g in _groups(self, tuple(axes))]

    def _compute_groups(self, axes: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        others = [n for n in self.names if n not in axes]
        groups: dict[tuple, list[tuple[tuple, int]]] = {}
        for r in range(self.size):
            c = self.coords(r)
            key = tuple(c[n] for n in others)
            groups.setdefault(key, []).append((tuple(c[a] for a in axes), r))
        return tuple(tuple(r for _, r in sorted(members))
                     for _, members in sorted(groups.items()))

    def product(self, axes) -> int:
        n = 1
        for a in axes:
            n *= self.axis_size(a)
        return n


def parse_mesh(text: str) -> dict[str, int]:
    """`"batch=4,model=2"` -> `{"batch": 4, "model": 2}` (axes major to minor): the one parser
    of the command line's `--mesh`. Raises PartitionError naming the bad entry."""
    mesh: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, eq, size = part.partition("=")
        name = name.strip()
        if not eq or not name:
            raise PartitionError(f"--mesh: expected AXIS=SIZE pairs like batch=4,model=2; "
                                 f"got {part!r}")
        try:
            n = int(size)
        except ValueError:
            raise PartitionError(f"--mesh: size of axis {name!r} must be an integer, got "
                                 f"{size.strip()!r}") from None
        if n < 1:
            raise PartitionError(f"--mesh: size of axis {name!r} must be positive, got {n}")
        if name in mesh:
            raise PartitionError(f"--mesh: axis {name!r} appears twice")
        mesh[name] = n
    if not mesh:
        raise PartitionError("--mesh: no axes given (expected e.g. batch=4,model=2)")
    return mesh


# The lowering asks for the same few groups and coordinates at every collective it emits.
@functools.lru_cache(maxsize=256)
def _coords(mesh: Mesh) -> tuple[dict[str, int], ...]:
    return tuple({n: (r // mesh.stride(n)) % s for n, s in mesh.axes} for r in range(mesh.size))


@functools.lru_cache(maxsize=4096)
def _groups(mesh: Mesh, axes: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    return mesh._compute_groups(axes)
