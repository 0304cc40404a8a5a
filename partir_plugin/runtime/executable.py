"""A device-local program compiled for `num_replicas = mesh.size`, one replica per device.

XLA's SPMD partitioner never runs: the module has `num_partitions = 1`, so the executable's
collectives are exactly the ones our lowering wrote.
"""

from __future__ import annotations

import numpy as np

from ..core.mesh import Mesh
from ..errors import PartitionError
from ..spmd.layout import Layout


def jax_mesh_for(mesh) -> jax.sharding.Mesh:  # noqa: F821
    """A `jax.sharding.Mesh` for `mesh` (a jax Mesh is returned as is)."""
    import jax

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


def compile_options(devices, num_replicas: int, disabled_passes: tuple[str, ...] = ()):
    from jax._src.lib import xla_client as xc

    opts = xc.CompileOptions()
    build = opts.executable_build_options
    build.num_replicas = num_replicas
    build.num_partitions = 1
    build.device_assignment = xc.DeviceAssignment.create(
        np.array([[d.id] for d in devices], dtype=np.int64))
    if disabled_passes:
        build.debug_options.xla_disable_hlo_passes = ",".join(disabled_passes)
    return opts


class DeviceLocalExecutable:
    """Runs a device-local module on the devices of `jax_mesh` (replica r = devices.flat[r])."""

    def __init__(self, module_text: str, jax_mesh, in_layouts: list[Layout],
                 out_layouts: list[Layout], out_types, *, disabled_passes: tuple[str, ...] = ()):
        import jax
        import jax.extend
        from jax._src.lib import xla_client as xc

        self.jax_mesh = jax_mesh
        self.devices = list(jax_mesh.devices.flat)
        backend = jax.extend.backend.get_backend(self.devices[0].platform)
        opts = compile_options(self.devices, len(self.devices), disabled_passes)
        self.executable = backend.compile_and_load(module_text, xc.DeviceList(
            tuple(self.devices)), opts)
        sh = jax.sharding.NamedSharding
        self.in_shardings = [sh(jax_mesh, lay.spec()) for lay in in_layouts]
        self.out_shardings = [sh(jax_mesh, lay.spec()) for lay in out_layouts]
        self.out_types = out_types  # global (shape, dtype) per output

    def hlo_text(self) -> str:
        return self.executable.hlo_modules()[0].to_string()

    def memory_analysis(self):
        return self.executable.get_compiled_memory_stats()

    def place(self, leaves) -> list:
        """Inputs as jax.Arrays with the expected NamedShardings (moved only when needed)."""
        import jax

        placed = []
        for x, s in zip(leaves, self.in_shardings):
            if isinstance(x, jax.Array) and x.sharding == s:
                placed.append(x)
            elif isinstance(x, jax.Array) and x.sharding.is_equivalent_to(s, x.ndim):
                placed.append(x)
            else:
                placed.append(jax.device_put(x, s))
        # Typed PRNG keys travel as their raw uint32 data, as the StableHLO program sees them.
        return [jax.random.key_data(x) if _is_key(x.dtype) else x for x in placed]

    def __call__(self, leaves, out_shardings=None) -> list:
        """Run on `leaves`; results carry `out_shardings` when given (equivalent shardings
        spelled as the caller wants them, e.g. `P('a', None)` for our `P('a')`)."""
        import jax

        placed = self.place(leaves)
        results = self.executable.execute_sharded(placed)
        outs = []
        for arrays, s, (shape, dtype) in zip(results.disassemble_into_single_device_arrays(),
                                             out_shardings or self.out_shardings,
                                             self.out_types):
            if _is_key(dtype):
                data_shape = tuple(shape) + tuple(arrays[0].shape[len(arrays[0].shape)
                                                                  - _key_rank(dtype):])
                data = _assemble(data_shape, arrays[0].dtype, s, arrays)
                outs.append(jax.random.wrap_key_data(data, impl=dtype._impl.name))
            else:
                outs.append(_assemble(shape, dtype, s, arrays))
        return outs


def _assemble(shape, dtype, sharding, arrays):
    """A global jax.Array from per-device results. PJRT returns them in the device assignment's
    order, which is the mesh's, so jax's checks (and their cost, several ms per train step
    with hundreds of outputs) can be skipped; the public constructor is the fallback."""
    import jax

    try:
        from jax._src.array import ArrayImpl

        aval = jax.core.ShapedArray(tuple(shape), dtype)
        return ArrayImpl(aval, sharding, arrays, committed=True, _skip_checks=True)
    except (ImportError, TypeError, AttributeError):
        return jax.make_array_from_single_device_arrays(tuple(shape), sharding, arrays)


def _is_key(dtype) -> bool:
    import jax

    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _key_rank(dtype) -> int:
    """Trailing dimensions a key's raw data adds (1 for threefry's uint32[2])."""
    return len(dtype._impl.key_shape)
