"""The public API: `jit`, `reshard`, `plan_redistribution` (DESIGN.md §3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._gc import gc_paused
from .core.mesh import Mesh
from .frontend.trace import aval_key
from .options import PartitionOptions
from .report.metadata import Metadata
from .runtime.compile_overlap import while_xla_compiles
from .runtime.executable import DeviceLocalFunction, jax_mesh_for
from .stages import Lowered, Partition, partition_function, resolve_options


class PartitionedFunction:
    """What `jit` returns: call it like the function (a jax function: it works inside a
    user's `jax.jit`, `lax.scan` and `jax.export`); it partitions on first use per avals."""

    def __init__(self, fn, mesh, schedule: Sequence, donate_argnums=(),
                 options: PartitionOptions | None = None, metadata: Metadata | None = None):
        import functools

        import jax

        self.fn = fn
        self.jax_mesh = jax_mesh_for(mesh)
        self.mesh = Mesh.of(self.jax_mesh)
        self.schedule = list(schedule)
        self.donate = tuple([donate_argnums] if isinstance(donate_argnums, int)
                            else donate_argnums)
        # XLA:CPU runs a pending sum faster all-reduced (and combined) then sliced than
        # reduce-scattered; elsewhere reduce_scatter (`PartitionOptions.for_platform`).
        self.options = resolve_options(options or PartitionOptions(),
                                       self.jax_mesh.devices.flat[0].platform)
        self.metadata = metadata if metadata is not None else Metadata()
        self._cache: dict[tuple, Partition] = {}
        self._described: Partition | None = None  # the partition `metadata` describes
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            if hasattr(fn, attr):
                setattr(self, attr, getattr(fn, attr))
        self.__wrapped__ = fn  # jax.jit(step) and inspect see the function's signature
        # One jax.jit over the traceable step: jax caches the trace per avals and dispatches
        # warm calls in C++; the trace partitions (once per avals, see `partition`).
        @functools.wraps(fn)
        def traced_call(*args, **kwargs):
            return self._traced_call(*args, **kwargs)

        self._jitted = jax.jit(traced_call, donate_argnums=self.donate)

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
            raise TypeError(f"keyword-only arguments {sorted(bound.kwargs)} are not supported: "
                            f"the step's parameters must be positional (wrap it, e.g. "
                            f"`lambda x, w: fn(x, w=w)`, and partition the wrapper)")
        return bound.args

    def partition(self, args: tuple) -> Partition:
        """The partitioned program for `args` (arrays, tracers or ShapeDtypeStructs): traced,
        scheduled and lowered on first sight of their avals, then cached."""
        import jax

        leaves, treedef = jax.tree_util.tree_flatten(args)
        key = (treedef, tuple(aval_key(x) for x in leaves))
        found = self._cache.get(key)
        if found is not None:
            if self._described is not found:  # `.lower(*args)` describes these args' program
                self._fill_metadata(found)
            return found
        with gc_paused():
            traced, part = partition_function(self.fn, args, self.mesh, self.schedule,
                                              self.options)
            program = part.program
            function = DeviceLocalFunction(getattr(self.fn, "__name__", "fn"),
                                           program.text(), self.jax_mesh, program.in_layouts,
                                           program.out_layouts, traced.out_avals,
                                           traced.host_callbacks)
        found = self._cache[key] = Partition(traced, part, function, key)
        self._fill_metadata(found)
        # The report's rows are made while XLA compiles the step (on another core), so a
        # caller who reads the report after compiling does not wait for them.
        while_xla_compiles(part.reports.make_quietly)
        return found

    def _traced_call(self, *args, **kwargs):
        """The step as jax traces it: the partitioned program on these (abstract) args."""
        args = self._positional(args, kwargs)
        return self.partition(args)(args)

    def _fill_metadata(self, p: Partition) -> None:
        import jax

        self._described = p
        self.metadata.fill(
            p.partitioned.reports, self.mesh.shape, self.options.hardware,
            jax.tree_util.tree_unflatten(p.traced.in_tree, p.function.in_shardings)[0],
            jax.tree_util.tree_unflatten(p.traced.out_tree, p.function.out_shardings),
            p.as_text())

    def lower(self, *args, **kwargs) -> Lowered:
        """Partition for these arguments (arrays or ShapeDtypeStructs) and lower the step."""
        lowered = self._jitted.lower(*args, **kwargs)
        return Lowered(self.partition(self._positional(args, kwargs)), lowered,
                       self._positional)

    def __call__(self, *args, **kwargs):
        try:
            return self._jitted(*args, **kwargs)
        except TypeError as e:
            if "static_argnums" not in str(e):
                raise
            raise TypeError(
                f"{str(e).splitlines()[0]} partir.jit takes arrays (and pytrees of them) only, "
                f"and has no static_argnums: close over the other arguments "
                f"(functools.partial(fn, config=...)) and partition that") from None
        except ValueError as e:
            if "incompatible devices" not in str(e):
                raise
            # Off the fast path: jax refuses arrays committed to the mesh's devices in
            # another order (a Mesh over a permutation); jax.jit with in_shardings moves
            # them, and so does this.
            return self._jitted(*self._placed(self._positional(args, kwargs)))

    def _placed(self, args: tuple) -> tuple:
        """`args` with every array committed to the mesh's devices in another layout moved
        to the program's input sharding; one committed to other devices is an error naming
        it (jax.jit refuses those too: data is not moved between device sets implicitly)."""
        import jax

        p = self.partition(args)
        leaves, treedef = jax.tree_util.tree_flatten(args)
        mesh_devices = set(self.jax_mesh.devices.flat)
        placed = []
        for leaf, name, sharding in zip(leaves, p.traced.leaves, p.function.in_shardings):
            if isinstance(leaf, jax.Array) and leaf.committed:
                if set(leaf.sharding.device_set) != mesh_devices:
                    ids = sorted(d.id for d in leaf.sharding.device_set)
                    raise ValueError(
                        f"argument {name.qualified!r} is committed to devices {ids}, not to "
                        f"the step's mesh (devices "
                        f"{sorted(d.id for d in mesh_devices)}); place it with "
                        f"jax.device_put(x, meta.in_shardings...) or pass it uncommitted")
                leaf = jax.device_put(leaf, sharding)
            placed.append(leaf)
        return jax.tree_util.tree_unflatten(treedef, placed)


def jit(fn, mesh, schedule: Sequence = (), *, donate_argnums=(), hardware=None,
        conflicts: str = "redistribute", scatter_sums: bool | None = None,
        padding: str = "allow", uneven_outputs: str = "error"
        ) -> tuple[PartitionedFunction, Metadata]:
    """Partition `fn` over `mesh` with `schedule` (a list of tactics), like `jax.jit`.

    Returns the partitioned callable and its `Metadata`, filled when the callable first sees
    arguments, refreshed when new input shapes cause a new partitioning, and set to the
    program of `args` by `.lower(*args)` (a call with shapes seen before runs their program
    without touching the metadata). `hardware` (a spec, or a name or alias in any case) is
    resolved here, so an unknown name fails now, listing the known ones; None means the
    default spec the hardware plugins name (`partir_default_hardware`; host-cpu), which the
    report names.

    `conflicts`: where an op's operands carry incompatible tilings on an axis,
    "redistribute" (the default) keeps the op partitioned along the cheapest entry and moves
    the operands that do not fit (each resolution is a line of the report); "stop" is PartIR's
    strict semantics: the op stays unpartitioned on the axis and its operands are gathered.

    `scatter_sums`: a pending sum that its consumer tiles further (a ZeRO gradient onto its
    sharded optimizer state) is reduce-scattered (True) or all-reduced and sliced (False).
    None picks by the mesh's platform: False on CPU, where XLA combines all-reduces and runs
    them faster than reduce-scatters (docs/BENCHMARKS.md), True elsewhere (XLA:GPU also turns
    all-reduce + slice into reduce-scatter itself).

    `padding`: "allow" (the default) lets a tiling pad a dimension its axes do not divide (a
    batch of 12 over 8 devices: tiles of 2, the last ones partly padding; the lowering masks
    the padding where an op would read it, docs/redistribution.md); "error" makes any padding
    a PartitionError (propagation then never pads). Program inputs tiled unevenly come in on
    their largest divisible layout and are sliced on the devices.

    `uneven_outputs`: an output tiled unevenly is a PartitionError naming it, its dimension,
    the sizes and the tactic ("error", the default), or is gathered to its largest divisible
    layout and trimmed, with an `UnevenOutputWarning` ("replicate").
    """
    options = PartitionOptions(conflicts, padding, uneven_outputs, scatter_sums, hardware)
    f = PartitionedFunction(fn, mesh, schedule, donate_argnums, options)
    return f, f.metadata


def plan_redistribution(mesh, global_shape, dtype, src_spec, dst_spec) -> Any:
    """The memory-bounded collective plan taking an array from `src_spec` to `dst_spec`."""
    from .spmd.redistribution import plan_redistribution as plan

    return plan(mesh, global_shape, dtype, src_spec, dst_spec)


def reshard(x, sharding):
    """Move `x` to `sharding` (a NamedSharding) with a memory-bounded plan, run as a jax
    function like every partitioned program."""
    from .runtime.reshard import reshard as run

    return run(x, sharding)
