"""Prime-factor decomposition of a mesh (paper §3, Principle 1).

Memory-efficient redistribution needs axes of prime size: `{x: 4, y: 6}` is viewed as the
mesh of factor axes `{x/0: 2, x/1: 2, y/0: 2, y/1: 3}`. A mesh axis splits into its factors
MAJOR to MINOR, so the coordinate of `x` is the mixed-radix number of its factors'
coordinates and a PartitionSpec entry `"x"` equals the factor list `(x/0, x/1)`. A prime axis
keeps its own name. Factor axes only exist inside the planner; plans address devices by
replica id.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import prod

from ...core.mesh import Mesh
from ...core.subaxis import SubAxis
from ...errors import PartitionError


def prime_factors(n: int) -> list[int]:
    """Prime factors of `n` in ascending order, with multiplicity."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


@dataclass(frozen=True)
class FactorAxis:
    label: str  # "y/1", or the mesh axis name when that axis is already prime
    axis: str  # the mesh axis it is a factor of
    size: int  # a prime
    stride: int  # what one step of this factor adds to the mesh axis coordinate


@dataclass(frozen=True)
class FactorMesh:
    """A mesh and its prime factor axes. Factor axes are identified by their index."""

    mesh: Mesh
    factors: tuple[FactorAxis, ...]
    by_axis: tuple[tuple[str, tuple[int, ...]], ...]  # mesh axis -> its factors, major to minor
    replica_coords: tuple[tuple[int, ...], ...]  # replica id -> coordinate of every factor

    @classmethod
    def of(cls, mesh) -> FactorMesh:
        mesh = Mesh.of(mesh)
        factors: list[FactorAxis] = []
        by_axis = []
        for name, size in mesh.axes:
            primes = prime_factors(size)
            ids = []
            stride = size
            for k, p in enumerate(primes):
                stride //= p
                label = name if len(primes) == 1 else f"{name}/{k}"
                ids.append(len(factors))
                factors.append(FactorAxis(label, name, p, stride))
            by_axis.append((name, tuple(ids)))
        coords = []
        for r in range(mesh.size):
            mc = mesh.coords(r)
            coords.append(tuple((mc[f.axis] // f.stride) % f.size for f in factors))
        return cls(mesh, tuple(factors), tuple(by_axis), tuple(coords))

    @property
    def num_devices(self) -> int:
        return len(self.replica_coords)

    def sizes(self) -> tuple[int, ...]:
        return tuple(f.size for f in self.factors)

    def primes(self) -> Counter:
        """The multiset of factor sizes: all that the weak search needs to know of the mesh."""
        return Counter(f.size for f in self.factors)

    def expand(self, axis: str) -> tuple[int, ...]:
        """Factor ids of mesh axis `axis`, major to minor. A sub-axis (`model:(1)4`,
        `core/subaxis.py`) is the factors of its parent within its digits; one that cuts a
        prime factor raises PartitionError (the planner cannot name it)."""
        sub = self.mesh.sub_axis(axis)  # raises PartitionError naming the mesh
        for name, ids in self.by_axis:
            if name == sub.parent:
                parent = self.mesh.axis_size(name)
                low, high = parent // sub.hi, parent // sub.pre  # strides it spans
                inside = tuple(f for f in ids if self.factors[f].stride >= low
                               and self.factors[f].stride * self.factors[f].size <= high)
                if prod(self.factors[f].size for f in inside) != sub.size:
                    raise PartitionError(f"sub-axis {axis!r} cuts a prime factor of "
                                         f"{name!r}")
                return inside
        raise AssertionError(axis)

    def label(self, f: int) -> str:
        return self.factors[f].label

    def axes_of(self, factor_ids) -> tuple[str, ...]:
        """The mesh axes or sub-axes that `factor_ids` make up, in mesh order, spelt as Shardy
        spells them (`core/subaxis.py`): a collective over the factors `(model/0, model/1)`
        of `{model: 8}` runs over `model:(1)4`, not all of `model`, and its records say so.
        Factors of one axis that are not adjacent are separate sub-axes."""
        wanted = set(factor_ids)
        out: list[str] = []
        for name, ids in self.by_axis:
            pre, run = 1, 1  # the part of the axis above the current run, the run's size
            for f in ids:
                size = self.factors[f].size
                if f in wanted:
                    run *= size
                    continue
                if run > 1:
                    out.append(self.mesh.spelling(SubAxis(name, pre, run)))
                pre, run = pre * run * size, 1
            if run > 1:
                out.append(self.mesh.spelling(SubAxis(name, pre, run)))
        return tuple(out)
