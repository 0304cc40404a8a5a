"""The public planner: `plan_redistribution` and the plan it returns."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from ...core.mesh import Mesh
from ...errors import PartitionError
from .factors import FactorMesh
from .lowering import lower
from .search import shortest_paths
from .steps import Step, describe
from .types import DistType, normalize_spec

_ITEMSIZE = {
    "bool": 1,
    "pred": 1,
    "i1": 1,
    "s8": 1,
    "i8": 1,
    "u8": 1,
    "int8": 1,
    "uint8": 1,
    "f8": 1,
    "float8": 1,
    "s16": 2,
    "i16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "float16": 2,
    "int16": 2,
    "uint16": 2,
    "s32": 4,
    "i32": 4,
    "u32": 4,
    "f32": 4,
    "float32": 4,
    "int32": 4,
    "uint32": 4,
    "s64": 8,
    "i64": 8,
    "u64": 8,
    "f64": 8,
    "float64": 8,
    "int64": 8,
    "uint64": 8,
    "c64": 8,
    "complex64": 8,
    "c128": 16,
    "complex128": 16,
}


def itemsize(dtype) -> int:
    """Bytes per element of `dtype`: a short name ("f32", "bf16"), a numpy or jax dtype."""
    if isinstance(dtype, str) and dtype.lower() in _ITEMSIZE:
        return _ITEMSIZE[dtype.lower()]
    if isinstance(dtype, str) and dtype.lower().startswith("float8"):
        return 1
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError as e:
        raise PartitionError(f"unknown dtype {dtype!r}") from e


def _spec_str(spec: tuple[tuple[str, ...], ...]) -> str:
    parts = [
        "None" if not a else repr(a[0]) if len(a) == 1 else "(" + ", ".join(map(repr, a)) + ")"
        for a in spec
    ]
    return "P(" + ", ".join(parts) + ")"


@dataclass(frozen=True)
class RedistributionPlan:
    """Collectives taking an array from `src_spec` to `dst_spec` on `mesh`.

    `cost_bytes` is Fig. 11's data transfer per device; `peak_bytes` the plan's height
    (§4.3), the largest per-device tile among its types, never above `bound_bytes`."""

    mesh: Mesh
    global_shape: tuple[int, ...]
    dtype: str
    itemsize: int
    src_spec: tuple[tuple[str, ...], ...]  # normalized: per dim, mesh axes major to minor
    dst_spec: tuple[tuple[str, ...], ...]
    src_type: DistType
    dst_type: DistType
    steps: tuple[Step, ...]

    @property
    def src_local_shape(self) -> tuple[int, ...]:
        return self.src_type.local_shape

    @property
    def dst_local_shape(self) -> tuple[int, ...]:
        return self.dst_type.local_shape

    @property
    def cost_bytes(self) -> int:
        return sum(s.bytes_per_device for s in self.steps)

    @property
    def peak_bytes(self) -> int:
        sizes = [prod(self.src_local_shape)] + [prod(s.out_local_shape) for s in self.steps]
        return max(sizes) * self.itemsize

    @property
    def bound_bytes(self) -> int:
        return max(prod(self.src_local_shape), prod(self.dst_local_shape)) * self.itemsize

    def pretty(self, groups: bool = False) -> str:
        """Readable text: problem, totals, then one line per step with its local shapes and
        paper types (axes minor to major); `groups` adds replica groups / indices / pairs."""
        shape = ",".join(map(str, self.global_shape))
        fm = self.src_type.fmesh
        factors = ", ".join(f"{f.label}:{f.size}" for f in fm.factors)
        lines = [
            f"redistribute {self.dtype}[{shape}] on mesh {dict(self.mesh.axes)} "
            f"(prime factor axes {factors})",
            f"  from {_spec_str(self.src_spec)} = {self.src_type}"
            f"  local {list(self.src_local_shape)}",
            f"  to   {_spec_str(self.dst_spec)} = {self.dst_type}"
            f"  local {list(self.dst_local_shape)}",
            f"  {len(self.steps)} steps, cost {self.cost_bytes} B/device, "
            f"peak {self.peak_bytes} B (bound {self.bound_bytes} B)",
        ]
        for k, s in enumerate(self.steps, 1):
            lines.append(
                f"  {k}. {describe(s)}  {list(s.in_local_shape)} -> {list(s.out_local_shape)}"
                f"  {s.bytes_per_device} B/device"
            )
            lines.append(f"       {s.in_type} -> {s.out_type}")
            if groups:
                for name in ("groups", "block_index", "pairs"):
                    if hasattr(s, name):
                        lines.append(f"       {name}: {getattr(s, name)}")
        if not self.steps:
            lines.append("  (nothing to do: every device already holds its target tile)")
        return "\n".join(lines)


def plan_redistribution(mesh, global_shape, dtype, src_spec, dst_spec) -> RedistributionPlan:
    """Plan the redistribution of a `dtype[global_shape]` array from `src_spec` to `dst_spec`
    (PartitionSpecs or tuples: per dim None, an axis, or axes major to minor) on `mesh`
    (a dict, a `jax.sharding.Mesh` or a `Mesh`). Raises `PartitionError` on bad specs."""
    fm = FactorMesh.of(mesh)
    shape = tuple(int(s) for s in global_shape)
    src = DistType.from_spec(fm, shape, src_spec)
    dst = DistType.from_spec(fm, shape, dst_spec)
    size = itemsize(dtype)
    # Cheapest weak paths cost the same; their concrete lowerings do not (one may need a
    # final permute where another lands every tile in place): keep the cheapest lowering.
    candidates = [lower(path, src, dst, size) for path in shortest_paths(
        shape, fm.primes(), src.local_shape, dst.local_shape)]
    steps = min(candidates, key=lambda st: (sum(s.bytes_per_device for s in st), len(st)))
    return RedistributionPlan(
        mesh=fm.mesh,
        global_shape=shape,
        dtype=str(getattr(dtype, "name", dtype)),
        itemsize=size,
        src_spec=normalize_spec(src_spec, len(shape)),
        dst_spec=normalize_spec(dst_spec, len(shape)),
        src_type=src,
        dst_type=dst,
        steps=tuple(steps),
    )
