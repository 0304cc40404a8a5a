"""Distributed array types `tile{axes}global` (paper §2.1, Fig. 6-8) and weak types (§5).

Order convention. The paper lists the axes of a dimension MINOR to MAJOR: in `[8{x, y}32]`
`x` varies fastest and the base offset is `8*i_x + 16*i_y` (Fig. 7a). A jax `PartitionSpec`
lists them MAJOR to MINOR: `P(("y", "x"))` splits the dimension into `|y|*|x|` blocks and the
device at `(i_y, i_x)` holds block `i_y*|x| + i_x`. So paper `{x, y}` is spec `("y", "x")`.
`DistType` stores each dimension's factor axes major to minor, as a spec does, and prints
in the paper's notation; `spec_str()` prints the spec form.

A `DistType` here is over the prime factor axes of `factors.FactorMesh`. The collective
rules are the multi-axis rules of §7.1 with device maps (Fig. 10): allgather and alltoall
may take their axes from anywhere in a dimension (the device map is re-labelled so that they
become minor-most), dynslice and alltoall append theirs as the new minor-most axes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from math import prod

from ...errors import PartitionError
from .factors import FactorMesh

SpecEntry = None | str | tuple[str, ...]


def normalize_spec(spec, rank: int) -> tuple[tuple[str, ...], ...]:
    """A PartitionSpec (or tuple in its convention) as per-dimension tuples of mesh axes."""
    entries = tuple(spec) if spec is not None else ()
    if len(entries) > rank:
        raise PartitionError(
            f"spec {spec!r} has {len(entries)} entries but the array has rank {rank}"
        )
    out = []
    for d, e in enumerate(entries + (None,) * (rank - len(entries))):
        if e is None:
            out.append(())
        elif isinstance(e, str):
            out.append((e,))
        elif isinstance(e, (tuple, list)) and all(isinstance(a, str) for a in e):
            out.append(tuple(e))
        else:
            raise PartitionError(f"dimension {d}: spec entry {e!r} is not None, an axis or axes")
    return tuple(out)


@dataclass(frozen=True)
class WeakType:
    """The weak type E[tau] of §5: a type up to a permutation of devices. With the global
    shape fixed it is determined by the local shape, which is all a search node stores."""

    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]


@dataclass(frozen=True)
class DistType:
    """`[c_0{axes_0}s_0, ...]` over factor axes; `dims[i]` = factor ids, MAJOR to MINOR."""

    global_shape: tuple[int, ...]
    dims: tuple[tuple[int, ...], ...]
    fmesh: FactorMesh = field(compare=False, repr=False)

    def __post_init__(self) -> None:
        self.check()

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_spec(cls, fmesh: FactorMesh, global_shape, spec) -> DistType:
        shape = tuple(int(s) for s in global_shape)
        for d, s in enumerate(shape):
            if s <= 0:
                raise PartitionError(f"dimension {d} has size {s}; sizes must be positive")
        entries = normalize_spec(spec, len(shape))
        seen: dict[str, int] = {}
        for d, axes in enumerate(entries):
            for a in axes:
                try:
                    fmesh.mesh.check_axis(a)  # a mesh axis or a sub-axis of one
                except PartitionError:
                    raise PartitionError(
                        f"dimension {d}: axis {a!r} is not in the mesh (axes: {fmesh.mesh.shape})"
                    ) from None
                used = next((b for b in seen if fmesh.mesh.overlaps(a, b)), None)
                if used is not None:
                    where = "twice in" if seen[used] == d else f"in dimension {seen[used]} and in"
                    raise PartitionError(f"axis {a!r} is used {where} dimension {d} of spec {spec}")
                seen[a] = d
            n = prod(fmesh.mesh.axis_size(a) for a in axes)
            if shape[d] % n:
                raise PartitionError(
                    f"dimension {d} of size {shape[d]} is not divisible by {n}, the size of "
                    f"axes {axes} ({', '.join(f'{a}={fmesh.mesh.axis_size(a)}' for a in axes)})"
                )
        dims = tuple(tuple(f for a in axes for f in fmesh.expand(a)) for axes in entries)
        return cls(shape, dims, fmesh)

    # ---- Fig. 6 meta-functions ------------------------------------------------------------
    def parts(self, d: int) -> int:
        return prod(self.fmesh.factors[f].size for f in self.dims[d])

    @property
    def local_shape(self) -> tuple[int, ...]:
        return tuple(s // self.parts(d) for d, s in enumerate(self.global_shape))

    @property
    def localsize(self) -> int:
        return prod(self.local_shape)

    @property
    def axes(self) -> frozenset[int]:
        return frozenset(f for dim in self.dims for f in dim)

    def weak(self) -> WeakType:
        return WeakType(self.global_shape, self.local_shape)

    def check(self) -> None:
        """WF-DIM and WF-TYPE of Fig. 7b: every axis at most once, tile * parts = global."""
        if len(self.dims) != len(self.global_shape):
            raise PartitionError(f"type has {len(self.dims)} dimensions, shape {self.global_shape}")
        used: list[int] = [f for dim in self.dims for f in dim]
        if len(used) != len(set(used)):
            twice = sorted({self.fmesh.label(f) for f in used if used.count(f) > 1})
            raise PartitionError(f"axes {twice} partition more than one position in {self}")
        for d, s in enumerate(self.global_shape):
            if s % self.parts(d):
                raise PartitionError(
                    f"dimension {d} of size {s} is not divisible by {self.parts(d)} "
                    f"(factor axes {[self.fmesh.label(f) for f in self.dims[d]]})"
                )

    # ---- collectives (Fig. 8 with the device maps of Fig. 10, multi-axis §7.1) ------------
    def _take(self, dim: int, axes: tuple[int, ...]) -> tuple[int, ...]:
        if not axes or any(f not in self.dims[dim] for f in axes):
            raise PartitionError(f"axes {axes} do not all partition dimension {dim} of {self}")
        return tuple(f for f in self.dims[dim] if f not in axes)

    def _with(self, changes: dict[int, tuple[int, ...]]) -> DistType:
        dims = list(self.dims)
        for d, v in changes.items():
            dims[d] = v
        return DistType(self.global_shape, tuple(dims), self.fmesh)

    def allgather(self, dim: int, axes: tuple[int, ...]) -> DistType:
        """T-ALLGATHER: `axes` stop partitioning `dim`; its tile grows by their size."""
        return self._with({dim: self._take(dim, axes)})

    def dynslice(self, dim: int, axes: tuple[int, ...]) -> DistType:
        """T-DYNSLICE: unused `axes` become the minor-most partitioning of `dim`."""
        if not axes or any(f in self.axes for f in axes):
            raise PartitionError(f"axes {axes} are already used in {self}")
        return self._with({dim: self.dims[dim] + tuple(axes)})

    def alltoall(self, src_dim: int, dst_dim: int, axes: tuple[int, ...]) -> DistType:
        """T-ALLTOALL: `axes` move from `src_dim` to the minor-most end of `dst_dim`."""
        if src_dim == dst_dim:
            raise PartitionError("alltoall needs two different dimensions")
        rest = self._take(src_dim, axes)
        return self._with({src_dim: rest, dst_dim: self.dims[dst_dim] + tuple(axes)})

    # ---- printing ---------------------------------------------------------------------------
    def _dim_str(self, d: int) -> str:
        s, ids = self.global_shape[d], self.dims[d]
        if not ids:
            return str(s)
        names = ", ".join(self.fmesh.label(f) for f in reversed(ids))  # paper: minor to major
        return f"{s // self.parts(d)}{{{names}}}{s}"

    def __str__(self) -> str:
        return "[" + ", ".join(self._dim_str(d) for d in range(len(self.dims))) + "]"

    def spec_str(self) -> str:
        """The type as a PartitionSpec over factor axes (major to minor)."""
        out = []
        for ids in self.dims:
            labels = [repr(self.fmesh.label(f)) for f in ids]
            joined = labels[0] if len(ids) == 1 else f"({', '.join(labels)})"
            out.append(joined if ids else "None")
        return "P(" + ", ".join(out) + ")"


_PAPER_DIM = re.compile(r"^\s*(\d+)\s*(?:\{([^}]*)\}\s*(\d+))?\s*$")


def parse_paper_type(text: str) -> tuple[tuple[int, ...], tuple[SpecEntry, ...]]:
    """`"[3{x}12, 2{y}12]"` (paper notation, axes minor to major, optional `x:4` sizes) to
    `(global_shape, spec)` with the spec in PartitionSpec order (major to minor)."""
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise PartitionError(f"not a distributed type: {text!r}")
    parts, depth, cur = [], 0, ""
    for ch in body[1:-1]:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    shape, spec = [], []
    for d, p in enumerate(parts):
        m = _PAPER_DIM.match(p)
        if not m:
            raise PartitionError(f"dimension {d}: cannot parse {p.strip()!r} in {text!r}")
        tile, axes, glob = m.groups()
        if axes is None:
            shape.append(int(tile))
            spec.append(None)
            continue
        names = [a.split(":")[0].strip().strip("\"'") for a in axes.split(",") if a.strip()]
        major_to_minor = tuple(reversed(names))
        shape.append(int(glob))
        spec.append(major_to_minor[0] if len(major_to_minor) == 1 else major_to_minor or None)
    return tuple(shape), tuple(spec)
