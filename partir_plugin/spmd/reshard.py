"""`reshard(x, sharding)`: run a memory-bounded redistribution plan on a `jax.Array`.

The plan (`spmd.redistribution.plan_redistribution`) from x's current `NamedSharding` to the
target one is emitted as a one-op device-local StableHLO module (one argument with the
source tile, the plan's collectives, one result with the target tile), compiled through PJRT
with one replica per mesh device (`runtime.executable.DeviceLocalExecutable`) and run on x's
shards. Executables are cached per (mesh, global shape, dtype, source spec, target spec).
"""

from __future__ import annotations

from ..errors import PartitionError
from ..ir.graph import Block, Func
from ..ir.printer import print_func
from ..ir.types import TensorType, element_type_of
from .layout import Layout
from .lowering import _Emitter, emit_plan
from .redistribution import RedistributionPlan, plan_redistribution
from .redistribution.types import normalize_spec

_CACHE: dict[tuple, tuple[RedistributionPlan, object]] = {}


def module_text(plan: RedistributionPlan, dtype=None) -> str:
    """The device-local module applying `plan`: `main(src tile) -> dst tile`."""
    from ..core.mesh import Mesh

    mesh = Mesh.of(plan.mesh)
    body = Block()
    em = _Emitter(mesh, body)
    element = element_type_of(plan.dtype if dtype is None else dtype)
    x = body.add_arg(TensorType(tuple(plan.src_local_shape), element))
    y = emit_plan(em, x, plan)
    func = Func("main", body, [y], ["x"])
    return print_func(func, module_attrs=f"mhlo.num_partitions = 1 : i32, "
                                         f"mhlo.num_replicas = {mesh.size} : i32")


def _check_devices(x, sharding) -> None:
    import jax

    if not isinstance(sharding, jax.sharding.NamedSharding):
        raise PartitionError(f"reshard needs a NamedSharding target, got {type(sharding).__name__}")
    if not isinstance(x, jax.Array):
        raise PartitionError(f"reshard needs a jax.Array, got {type(x).__name__}")
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


def compiled(jax_mesh, shape, dtype, src_spec, dst_spec):
    """The plan and the cached `DeviceLocalExecutable` for one problem (specs normalized)."""
    from ..runtime.executable import DeviceLocalExecutable

    key = (jax_mesh, tuple(shape), str(dtype), src_spec, dst_spec)
    if key not in _CACHE:
        plan = plan_redistribution(jax_mesh, shape, dtype, src_spec, dst_spec)
        exe = DeviceLocalExecutable(module_text(plan, dtype), jax_mesh, [Layout(src_spec)],
                                    [Layout(dst_spec)], [(tuple(shape), dtype)])
        _CACHE[key] = (plan, exe)
    return _CACHE[key]


def reshard(x, sharding):
    """`x` (a jax.Array with a NamedSharding) moved to the NamedSharding `sharding` with the
    planner's collectives; the result is a new jax.Array with exactly `sharding`."""
    _check_devices(x, sharding)
    src_spec = normalize_spec(x.sharding.spec, x.ndim)
    dst_spec = normalize_spec(sharding.spec, x.ndim)
    _, exe = compiled(sharding.mesh, x.shape, x.dtype, src_spec, dst_spec)
    (out,) = exe([x], out_shardings=[sharding])
    return out
