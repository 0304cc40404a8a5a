"""The public API: `jit`, `reshard`, `plan_redistribution` (DESIGN.md §3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .core.mesh import Mesh
from .errors import InputMismatchError
from .metadata import Metadata
from .pipeline import Partitioned, Traced, apply_schedule, trace
from .runtime.executable import DeviceLocalExecutable, jax_mesh_for
from .simulation import resolve_hardware_option


def _avals_key(leaves, treedef) -> tuple:
    """What a compiled program is specialised on: the pytree structure, shapes and dtypes."""
    import numpy as np

    return (treedef, tuple((x.shape, x.dtype) if hasattr(x, "dtype") and hasattr(x, "shape")
                           else (np.shape(x), np.result_type(x)) for x in leaves))


def donated_leaves(args: tuple, donate: tuple[int, ...]) -> list[int]:
    """Flat leaf indices of the arguments listed in `donate_argnums`."""
    import jax

    out, start = [], 0
    for i, a in enumerate(args):
        n = len(jax.tree_util.tree_leaves(a))
        if i in donate:
            out.extend(range(start, start + n))
        start += n
    return out


@dataclass
class Compiled:
    """A partitioned, compiled program for one set of input avals."""

    traced: Traced
    partitioned: Partitioned
    executable: DeviceLocalExecutable
    key: tuple
    donate: tuple[int, ...]

    def __call__(self, *args):
        import jax

        leaves, treedef = jax.tree_util.tree_flatten(args)
        key = _avals_key(leaves, treedef)
        if key != self.key:
            raise InputMismatchError(_describe_mismatch(self.key, key, self.traced))
        return self._run(args, leaves)

    def _run(self, args, leaves):
        import jax

        outs = self.executable(leaves)
        if self.donate:
            for i in donated_leaves(args, self.donate):
                if isinstance(leaves[i], jax.Array):
                    leaves[i].delete()
        return jax.tree_util.tree_unflatten(self.traced.out_tree, outs)

    def as_text(self) -> str:
        return self.partitioned.program.text()

    def compiled_hlo(self) -> str:
        return self.executable.hlo_text()


def _describe_mismatch(expected: tuple, got: tuple, traced: Traced) -> str:
    (etree, eleaves), (gtree, gleaves) = expected, got
    if etree != gtree:
        return (f"arguments have structure {gtree} but the program was partitioned for "
                f"{etree}")
    for leaf, e, g in zip(traced.leaves, eleaves, gleaves):
        if e != g:
            return (f"argument {leaf.qualified!r} has shape {g[0]} and dtype {g[1]} but the "
                    f"program was partitioned for shape {e[0]} and dtype {e[1]}")
    return "arguments differ from those the program was partitioned for"


class PartitionedFunction:
    """What `jit` returns: call it like the function; it partitions on first use per avals."""

    def __init__(self, fn, mesh, schedule: Sequence, donate_argnums=(), hardware=None,
                 metadata: Metadata | None = None):
        self.fn = fn
        self.jax_mesh = jax_mesh_for(mesh)
        self.mesh = Mesh.of(self.jax_mesh)
        self.schedule = list(schedule)
        self.donate = tuple([donate_argnums] if isinstance(donate_argnums, int)
                            else donate_argnums)
        self.hardware = hardware
        self.metadata = metadata if metadata is not None else Metadata()
        self._cache: dict[tuple, Compiled] = {}

    def _positional(self, args: tuple, kwargs: dict) -> tuple:
        """Keyword arguments bound to the function's parameters, in order (as jax.jit does);
        the partitioned program takes every array argument positionally."""
        if not kwargs:
            return args
        import inspect

        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{getattr(self.fn, '__name__', 'function')}: {e}") from None
        bound.apply_defaults()
        if bound.kwargs:
            raise TypeError(f"keyword-only arguments {sorted(bound.kwargs)} are not supported; "
                            f"pass them positionally")
        return bound.args

    def lower(self, *args, **kwargs) -> Compiled:
        """Partition and compile for these arguments (arrays or ShapeDtypeStructs)."""
        import jax

        args = self._positional(args, kwargs)
        leaves, treedef = jax.tree_util.tree_flatten(args)
        key = _avals_key(leaves, treedef)
        if key in self._cache:
            return self._cache[key]
        traced = trace(self.fn, args)
        part = apply_schedule(traced.func, traced.leaves, self.mesh, self.schedule,
                              hardware=self.hardware, arg_names=traced.arg_names)
        program = part.program
        for i in donated_leaves(args, self.donate):
            program.func.arg_attrs[i] = "jax.buffer_donor = true"
        out_types = [(a.shape, a.dtype) for a in traced.out_avals]
        exe = DeviceLocalExecutable(program.text(), self.jax_mesh, program.in_layouts,
                                    program.out_layouts, out_types)
        compiled = Compiled(traced, part, exe, key, self.donate)
        self._cache[key] = compiled
        self._fill_metadata(compiled)
        return compiled

    def _fill_metadata(self, c: Compiled) -> None:
        import jax

        m = self.metadata
        m.tactics = c.partitioned.reports
        m.mesh = self.mesh.shape
        m.hardware = getattr(self.hardware, "name", self.hardware)
        m.in_shardings = jax.tree_util.tree_unflatten(c.traced.in_tree, [
            *c.executable.in_shardings])[0]
        m.out_shardings = jax.tree_util.tree_unflatten(c.traced.out_tree,
                                                       c.executable.out_shardings)
        m.device_local_stablehlo = c.as_text()

    def __call__(self, *args, **kwargs):
        import jax

        args = self._positional(args, kwargs)
        leaves, treedef = jax.tree_util.tree_flatten(args)
        compiled = self._cache.get(_avals_key(leaves, treedef))
        if compiled is None:
            compiled = self.lower(*args)
        return compiled._run(args, leaves)


def jit(fn, mesh, schedule: Sequence = (), *, donate_argnums=(), hardware=None
        ) -> tuple[PartitionedFunction, Metadata]:
    """Partition `fn` over `mesh` with `schedule` (a list of tactics), like `jax.jit`.

    Returns the partitioned callable and its `Metadata`, filled when the callable first sees
    arguments (or on `.lower(*args)`), and refreshed when new input shapes cause a new
    partitioning. `hardware` (a spec, or a name or alias in any case) is resolved here, so an
    unknown name fails now, listing the known ones; None means the default spec the hardware
    plugins name (`partir_default_hardware`; host-cpu), which the report names.
    """
    hardware = resolve_hardware_option(hardware)
    f = PartitionedFunction(fn, mesh, schedule, donate_argnums, hardware)
    return f, f.metadata


def tag(x, name: str):
    """Name an intermediate value so tactics can address it (paper 1 §8).

    An identity in the program (a `reduce_precision` to the value's own precision inside the
    named scope `partir_tag[name]`), so `jax.jit(fn)` runs the same function unchanged.
    """
    import jax
    import jax.numpy as jnp

    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"partir_plugin.tag supports floating-point values, got {x.dtype}")
    info = jnp.finfo(x.dtype)
    with jax.named_scope(f"partir_tag[{name}]"):
        return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def plan_redistribution(mesh, global_shape, dtype, src_spec, dst_spec) -> Any:
    """The memory-bounded collective plan taking an array from `src_spec` to `dst_spec`."""
    from .spmd.redistribution import plan_redistribution as plan

    return plan(mesh, global_shape, dtype, src_spec, dst_spec)


def reshard(x, sharding):
    """Move `x` to `sharding` (a NamedSharding) with a memory-bounded plan run through PJRT."""
    from .spmd.reshard import reshard as run

    return run(x, sharding)
