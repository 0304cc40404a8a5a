"""`reshard(x, sharding)`: run a memory-bounded redistribution plan on a `jax.Array`.

The plan from x's `NamedSharding` to the target one (`spmd.redistribution`) is lowered to a
device-local module (`spmd.reshard`) and run as any partitioned program is: a
`DeviceLocalFunction` under `jax.jit`, so a warm call is one C++ dispatch. Programs are
cached per (mesh, global shape, dtype, source spec, target sharding).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax

from ..errors import PartitionError
from ..spmd.layout import Layout
from ..spmd.redistribution import RedistributionPlan, plan_redistribution
from ..spmd.redistribution.types import normalize_spec
from ..spmd.reshard import module_text
from .executable import DeviceLocalFunction


@dataclass
class ReshardProgram:
    """One redistribution problem: its plan and the jitted program applying it."""

    plan: RedistributionPlan
    function: DeviceLocalFunction
    jitted: jax.stages.Wrapped
    source: jax.ShapeDtypeStruct

    def __call__(self, x: jax.Array) -> jax.Array:
        (y,) = self.jitted(x)
        return y

    def function_text(self) -> str:
        """The device-local StableHLO module: the plan's collectives."""
        return self.function.module.text

    @functools.cached_property
    def compiled(self) -> jax.stages.Compiled:
        """The compiled program, for inspection (calls go through `jitted`)."""
        return self.jitted.lower(self.source).compile()

    def hlo_text(self) -> str:
        """XLA's compiled HLO: the plan's collectives and nothing else."""
        return self.compiled.as_text()

    def memory_analysis(self):
        return self.compiled.memory_analysis()


_CACHE: dict[tuple, ReshardProgram] = {}


def program_for(jax_mesh, shape, dtype, src_spec, dst_spec, target=None) -> ReshardProgram:
    """The cached program moving a `shape`/`dtype` array from `src_spec` to `dst_spec`
    (normalized specs); results carry `target` (an equivalent NamedSharding) when given."""
    target = target or jax.sharding.NamedSharding(jax_mesh, Layout(dst_spec).spec())
    key = (jax_mesh, tuple(shape), str(dtype), src_spec, dst_spec, target)
    if key not in _CACHE:
        plan = plan_redistribution(jax_mesh, shape, dtype, src_spec, dst_spec)
        src = jax.sharding.NamedSharding(jax_mesh, Layout(src_spec).spec())
        function = DeviceLocalFunction("reshard", module_text(plan, dtype), jax_mesh,
                                       [Layout(src_spec)], [Layout(dst_spec)],
                                       [jax.core.ShapedArray(tuple(shape), dtype)])
        jitted = jax.jit(function, in_shardings=src, out_shardings=(target,))
        _CACHE[key] = ReshardProgram(plan, function, jitted,
                                     jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=src))
    return _CACHE[key]


def _check_devices(x, sharding) -> None:
    if not isinstance(sharding, jax.sharding.NamedSharding):
        raise PartitionError(f"reshard needs a NamedSharding target, got {type(sharding).__name__}")
    if not isinstance(x, jax.Array):
        raise PartitionError(f"reshard needs a jax.Array, got {type(x).__name__}")
    if isinstance(x, jax.core.Tracer):
        raise PartitionError(
            "reshard moves concrete arrays, and was called on a traced value (inside jax.jit, "
            "jax.grad or a partir.jit step): there, use jax.lax.with_sharding_constraint, or "
            "in a partir.jit step name the value with partir.tag and let a tactic decide it")
    src = x.sharding
    mesh = sharding.mesh
    if not isinstance(src, jax.sharding.NamedSharding):
        raise PartitionError(
            f"reshard: x has a {type(src).__name__}, not a NamedSharding on the target mesh "
            f"{dict(mesh.shape)}; place it with jax.device_put(x, NamedSharding(mesh, spec)) first")
    same = (src.mesh.axis_names == mesh.axis_names
            and src.mesh.devices.shape == mesh.devices.shape
            and [d.id for d in src.mesh.devices.flat] == [d.id for d in mesh.devices.flat])
    if not same:
        raise PartitionError(
            f"reshard: x lives on mesh {dict(src.mesh.shape)} with devices "
            f"{[d.id for d in src.mesh.devices.flat]}, not on the target mesh "
            f"{dict(mesh.shape)} with devices {[d.id for d in mesh.devices.flat]}")


def reshard(x: jax.Array, sharding: jax.sharding.NamedSharding) -> jax.Array:
    """`x` (a jax.Array with a NamedSharding) moved to the NamedSharding `sharding` with the
    planner's collectives; the result is a new jax.Array with exactly `sharding`."""
    _check_devices(x, sharding)
    src_spec = normalize_spec(x.sharding.spec, x.ndim)
    dst_spec = normalize_spec(sharding.spec, x.ndim)
    return program_for(sharding.mesh, x.shape, x.dtype, src_spec, dst_spec, sharding)(x)
