"""The logical device mesh: ordered named axes with sizes (paper 1 §2.1)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import PartitionError
from .subaxis import SubAxis, parse


@dataclass(frozen=True)
class Mesh:
    """Named axes, major to minor. Device `r` (replica id) has coordinates `coords(r)`,
    row-major over the axes, as `jax.sharding.Mesh.devices.flat` orders devices."""

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        # Propagation asks for axis sizes and names tens of thousands of times per schedule:
        # plain lookups, not a cached function of the (hashed) mesh. Not fields: equality
        # and hashing stay those of `axes`.
        object.__setattr__(self, "_names", tuple(n for n, _ in self.axes))
        object.__setattr__(self, "_sizes", dict(self.axes))

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
        return self._names

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
        """The size of a mesh axis or of a sub-axis (`model:(1)4`, `core/subaxis.py`)."""
        size = self._sizes.get(axis)
        return size if size is not None else self.sub_axis(axis).size

    def _parent_size(self, axis: str) -> int:
        for n, s in self.axes:
            if n == axis:
                return s
        raise PartitionError(f"axis {axis!r} is not in the mesh (axes: {self.shape})")

    def sub_axis(self, axis: str) -> SubAxis:
        """`axis` as a part of its mesh axis (a whole axis is the part `(1)size`)."""
        return _sub_axis(self, axis)

    def spelling(self, sub: SubAxis) -> str:
        """The axis name of `sub`: the plain name for a whole axis."""
        return sub.spelling(self._parent_size(sub.parent))

    def check_axis(self, axis: str) -> None:
        self.axis_size(axis)

    def stride(self, axis: str) -> int:
        """Replica-id stride of `axis` (product of the sizes of the more minor axes, and for a
        sub-axis of the more minor part of its parent)."""
        sub = self.sub_axis(axis)
        stride = 1
        for n, s in reversed(self.axes):
            if n == sub.parent:
                return stride * (s // sub.hi)
            stride *= s
        raise AssertionError(axis)  # sub_axis checked the parent

    def coord(self, replica: int, axis: str) -> int:
        """Coordinate of device `replica` along `axis` (a mesh axis or a sub-axis)."""
        return (replica // self.stride(axis)) % self.axis_size(axis)

    def coords(self, replica: int) -> dict[str, int]:
        """Coordinates of device `replica` along the mesh axes (`coord` for a sub-axis)."""
        return dict(_coords(self)[replica])

    def overlaps(self, a: str, b: str) -> bool:
        """Do axes `a` and `b` share devices' coordinate digits (the same axis, or an axis
        and one of its sub-axes)?"""
        if a == b:
            return True
        if ":" not in a and ":" not in b:  # two mesh axes (propagation asks this a lot)
            return False
        return self.sub_axis(a).overlaps(self.sub_axis(b))

    def split(self, axis: str, major_size: int) -> tuple[str, str]:
        """`axis` split row-major into a major sub-axis of `major_size` and the minor rest."""
        size = self.axis_size(axis)
        if major_size <= 1 or major_size >= size or size % major_size:
            raise PartitionError(f"cannot split axis {axis!r} of size {size} into a major "
                                 f"part of size {major_size}")
        return tuple(self.spelling(s) for s in self.sub_axis(axis).split(major_size))

    def fold(self, axes: tuple[str, ...]) -> tuple[str, ...]:
        """Axes tiling one dimension (major first) with adjacent parts of one mesh axis
        merged, `(model:(1)4, model:(4)2)` -> `(model,)`: the same tiles, one spelling."""
        out: list[str] = []
        for a in axes:
            if out:
                prev, sub = self.sub_axis(out[-1]), self.sub_axis(a)
                if prev.parent == sub.parent and prev.hi == sub.pre:
                    out[-1] = self.spelling(SubAxis(sub.parent, prev.pre,
                                                    prev.size * sub.size))
                    continue
            out.append(a)
        return tuple(out)

    def groups(self, axes: tuple[str, ...]) -> list[list[int]]:
        """Replica groups for a collective over `axes`: devices that differ only in those
        axes, ordered within a group by their coordinates along `axes` (first = major). A
        sub-axis's groups follow the row-major split of its parent."""
        return [list(g) for g in _groups(self, tuple(axes))]

    def _compute_groups(self, axes: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        for i, a in enumerate(axes):
            for b in axes[i + 1:]:
                if self.overlaps(a, b):
                    raise PartitionError(f"axes {a!r} and {b!r} overlap")
        strides = [(self.stride(a), self.axis_size(a)) for a in axes]
        groups: dict[int, list[tuple[tuple, int]]] = {}
        for r in range(self.size):
            c = tuple((r // st) % n for st, n in strides)
            key = r - sum(x * st for x, (st, _) in zip(c, strides))
            groups.setdefault(key, []).append((c, r))
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
def _sub_axis(mesh: Mesh, axis: str) -> SubAxis:
    sub = parse(axis)
    if sub is None:
        return SubAxis(axis, 1, mesh._parent_size(axis))
    size = mesh._parent_size(sub.parent)
    if sub.size < 1 or size % sub.hi:
        raise PartitionError(f"sub-axis {axis!r} does not fit axis {sub.parent!r} of size "
                             f"{size}")
    return sub


@functools.lru_cache(maxsize=4096)
def _groups(mesh: Mesh, axes: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    return mesh._compute_groups(axes)
