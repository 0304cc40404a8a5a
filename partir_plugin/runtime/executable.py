"""A device-local program as a jax function: `shard_map` over every mesh axis of `partir_call`.

One runtime path for everything we run (a partitioned step, a `reshard` plan): the function
takes global arrays with the program's input shardings and returns global arrays with its
output shardings. jax traces it like any function, so under `jax.jit` it dispatches through
jax's C++ path and inside a user's `jax.jit` or `lax.scan` it is embedded in their program.
The shard_map is fully manual, so XLA's SPMD partitioner leaves its body alone: the compiled
collectives are exactly the ones our lowering wrote.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from ..core.mesh import Mesh
from ..errors import PartitionError
from ..spmd.layout import Layout
from .embed import DeviceLocalModule, fresh_name, partir_call_p


def jax_mesh_for(mesh) -> jax.sharding.Mesh:
    """A `jax.sharding.Mesh` for `mesh` (a jax Mesh is returned as is)."""
    if isinstance(mesh, jax.sharding.Mesh):
        return mesh
    m = Mesh.of(mesh)
    devices = jax.devices()
    if m.size > len(devices):
        raise PartitionError(
            f"mesh {m.shape} needs {m.size} devices but only {len(devices)} "
            f"{devices[0].platform} devices are available (on CPU, set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={m.size} before importing jax)")
    return jax.sharding.Mesh(np.array(devices[: m.size]).reshape([s for _, s in m.axes]),
                             m.names)


def local_aval(global_aval, layout: Layout, mesh: Mesh) -> jax.core.ShapedArray:
    """The per-device aval of a value with `layout` (a key array stays a key array)."""
    return jax.core.ShapedArray(layout.local_shape(global_aval.shape, mesh), global_aval.dtype)


class DeviceLocalFunction:
    """Global arrays in, global arrays out: `module_text` run on every device of `jax_mesh`.

    `in_layouts`/`out_layouts` are the device-local program's argument and result layouts;
    `out_avals` the global avals of its results; `host_callbacks` the callables the module's
    host callbacks index (`Traced.host_callbacks`).
    """

    def __init__(self, name: str, module_text: str, jax_mesh: jax.sharding.Mesh,
                 in_layouts: Sequence[Layout], out_layouts: Sequence[Layout],
                 out_avals: Sequence, host_callbacks: Sequence = ()) -> None:
        mesh = Mesh.of(jax_mesh)
        self.jax_mesh = jax_mesh
        self.in_specs = tuple(lay.spec() for lay in in_layouts)
        self.out_specs = tuple(lay.spec() for lay in out_layouts)
        self.module = DeviceLocalModule(
            fresh_name(name), module_text,
            tuple(local_aval(a, lay, mesh) for a, lay in zip(out_avals, out_layouts)),
            tuple(host_callbacks))
        # On a mesh with Explicit axes an argument's sharding is part of its type and
        # shard_map takes it as it is: such arguments are resharded to the program's
        # layouts first (on Auto axes jax places them itself).
        self._explicit = any(t == jax.sharding.AxisType.Explicit
                             for t in getattr(jax_mesh, "axis_types", ()))
        self._mapped = jax.shard_map(self._per_device, mesh=jax_mesh, in_specs=self.in_specs,
                                     out_specs=self.out_specs, check_vma=False)

    @property
    def in_shardings(self) -> list[jax.sharding.NamedSharding]:
        return [jax.sharding.NamedSharding(self.jax_mesh, s) for s in self.in_specs]

    @property
    def out_shardings(self) -> list[jax.sharding.NamedSharding]:
        return [jax.sharding.NamedSharding(self.jax_mesh, s) for s in self.out_specs]

    def _per_device(self, *tiles):
        return tuple(partir_call_p.bind(*tiles, module=self.module))

    def __call__(self, *leaves) -> tuple:
        """Traceable: the program's results for the flat input `leaves`."""
        if self._explicit:
            leaves = [jax.reshard(x, s) for x, s in zip(leaves, self.in_shardings)]
        return self._mapped(*leaves)
