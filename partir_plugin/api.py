"""The public API: `jit`, `reshard`, `plan_redistribution` (DESIGN.md §3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .core.mesh import Mesh
from .core.padding import PaddingPolicy, UnevenOutputs
from .core.resolution import ConflictPolicy
from .errors import InputMismatchError
from .ir.graph import gc_paused
from .pipeline import Partitioned, Traced, apply_schedule, aval_key, trace, trace_hooks
from .plugin.resolve import resolve_hardware_option
from .report.metadata import Metadata
from .runtime.compile_overlap import while_xla_compiles
from .runtime.executable import DeviceLocalFunction, jax_mesh_for


def _shapes_and_dtypes(key: tuple) -> tuple:
    """A partition key without weak types: what a compiled program checks its inputs against
    (jax converts a Python scalar to the compiled dtype)."""
    treedef, leaves = key
    return treedef, tuple(k[:2] for k in leaves)


@dataclass
class Partition:
    """The partitioned program for one set of input avals, as a traceable jax function."""

    traced: Traced
    partitioned: Partitioned
    function: DeviceLocalFunction
    key: tuple

    def __call__(self, args: tuple):
        import jax

        outs = self.function(*jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(self.traced.out_tree, outs)

    def as_text(self) -> str:
        return self.partitioned.program.text()


def _describe_mismatch(expected: tuple, got: tuple, traced: Traced) -> str:
    (etree, eleaves), (gtree, gleaves) = expected, got
    if etree != gtree:
        return (f"arguments have structure {gtree} but the program was partitioned for "
                f"{etree}")
    for leaf, e, g in zip(traced.leaves, eleaves, gleaves):
        if e[:2] != g[:2]:
            return (f"argument {leaf.qualified!r} has shape {g[0]} and dtype {g[1]} but the "
                    f"program was partitioned for shape {e[0]} and dtype {e[1]}")
    return "arguments differ from those the program was partitioned for"


class Lowered:
    """`step.lower(*args)`: the partitioned program, staged as jax stages it.

    `as_text()` is the device-local StableHLO (what every device runs, collectives
    explicit); `jax_lowered` the enclosing jax program that embeds it; `compile()` compiles.
    """

    def __init__(self, partition: Partition, jax_lowered, bind) -> None:
        self.partition = partition
        self.jax_lowered = jax_lowered
        self._bind = bind  # (args, kwargs) -> positional args, as the step binds them

    @property
    def partitioned(self) -> Partitioned:
        return self.partition.partitioned

    @property
    def traced(self) -> Traced:
        return self.partition.traced

    def as_text(self) -> str:
        return self.partition.as_text()

    def compile(self) -> Compiled:
        return Compiled(self.partition, self.jax_lowered.compile(), self._bind)


class Compiled:
    """A compiled partitioned program: call it with arguments of the avals it was lowered for.

    `as_text()` is XLA's compiled HLO (its collectives are ours); `memory_analysis()` and
    `cost_analysis()` are XLA's.
    """

    def __init__(self, partition: Partition, jax_compiled, bind) -> None:
        self.partition = partition
        self.jax_compiled = jax_compiled
        self._bind = bind

    def __call__(self, *args, **kwargs):
        import jax

        leaves, treedef = jax.tree_util.tree_flatten(self._bind(args, kwargs))
        key = (treedef, tuple(aval_key(x) for x in leaves))
        expected = self.partition.key
        if _shapes_and_dtypes(key) != _shapes_and_dtypes(expected):
            raise InputMismatchError(_describe_mismatch(expected, key, self.partition.traced))
        return self.jax_compiled(*args, **kwargs)

    def as_text(self) -> str:
        return self.jax_compiled.as_text()

    def memory_analysis(self):
        return self.jax_compiled.memory_analysis()

    def cost_analysis(self):
        return self.jax_compiled.cost_analysis()


class PartitionedFunction:
    """What `jit` returns: call it like the function (a jax function: it works inside a
    user's `jax.jit`, `lax.scan` and `jax.export`); it partitions on first use per avals."""

    def __init__(self, fn, mesh, schedule: Sequence, donate_argnums=(), hardware=None,
                 metadata: Metadata | None = None, conflicts: str = "redistribute",
                 scatter_sums: bool | None = None, padding: str = "allow",
                 uneven_outputs: str = "error"):
        import functools

        import jax

        self.fn = fn
        self.jax_mesh = jax_mesh_for(mesh)
        self.mesh = Mesh.of(self.jax_mesh)
        self.schedule = list(schedule)
        self.donate = tuple([donate_argnums] if isinstance(donate_argnums, int)
                            else donate_argnums)
        self.hardware = hardware
        self.conflicts = ConflictPolicy.of(conflicts)
        self.padding = PaddingPolicy.of(padding)
        self.uneven_outputs = UnevenOutputs.of(uneven_outputs)
        # XLA:CPU runs a pending sum faster all-reduced (and combined) then sliced than
        # reduce-scattered; elsewhere reduce_scatter (`PartitionState.scatter_sums`).
        self.scatter_sums = (self.jax_mesh.devices.flat[0].platform != "cpu"
                             if scatter_sums is None else bool(scatter_sums))
        self.metadata = metadata if metadata is not None else Metadata()
        self._cache: dict[tuple, Partition] = {}
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
            raise TypeError(f"keyword-only arguments {sorted(bound.kwargs)} are not supported; "
                            f"pass them positionally")
        return bound.args

    def partition(self, args: tuple) -> Partition:
        """The partitioned program for `args` (arrays, tracers or ShapeDtypeStructs): traced,
        scheduled and lowered on first sight of their avals, then cached."""
        import jax

        leaves, treedef = jax.tree_util.tree_flatten(args)
        key = (treedef, tuple(aval_key(x) for x in leaves))
        found = self._cache.get(key)
        if found is not None:
            return found
        # jax's trace of the step allocates as many objects as our passes do, and each of
        # the collector's full passes along the way walks everything alive: one collection
        # at the end instead (`gc_paused`).
        with gc_paused():
            traced = trace(self.fn, args, trace_hooks(self.schedule, self.mesh))
            part = apply_schedule(traced.func, traced.leaves, self.mesh, self.schedule,
                                  hardware=self.hardware, arg_names=traced.arg_names,
                                  conflicts=self.conflicts, scatter_sums=self.scatter_sums,
                                  padding=self.padding, uneven_outputs=self.uneven_outputs,
                                  out_names=traced.out_names)
            program = part.program
            function = DeviceLocalFunction(getattr(self.fn, "__name__", "fn"),
                                           program.text(), self.jax_mesh, program.in_layouts,
                                           program.out_layouts, traced.out_avals)
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

        self.metadata.fill(
            p.partitioned.reports, self.mesh.shape, self.hardware,
            jax.tree_util.tree_unflatten(p.traced.in_tree, p.function.in_shardings)[0],
            jax.tree_util.tree_unflatten(p.traced.out_tree, p.function.out_shardings),
            p.as_text())

    def lower(self, *args, **kwargs) -> Lowered:
        """Partition for these arguments (arrays or ShapeDtypeStructs) and lower the step."""
        lowered = self._jitted.lower(*args, **kwargs)
        return Lowered(self.partition(self._positional(args, kwargs)), lowered,
                       self._positional)

    def __call__(self, *args, **kwargs):
        return self._jitted(*args, **kwargs)


def jit(fn, mesh, schedule: Sequence = (), *, donate_argnums=(), hardware=None,
        conflicts: str = "redistribute", scatter_sums: bool | None = None,
        padding: str = "allow", uneven_outputs: str = "error"
        ) -> tuple[PartitionedFunction, Metadata]:
    """Partition `fn` over `mesh` with `schedule` (a list of tactics), like `jax.jit`.

    Returns the partitioned callable and its `Metadata`, filled when the callable first sees
    arguments (or on `.lower(*args)`), and refreshed when new input shapes cause a new
    partitioning. `hardware` (a spec, or a name or alias in any case) is resolved here, so an
    unknown name fails now, listing the known ones; None means the default spec the hardware
    plugins name (`partir_default_hardware`; host-cpu), which the report names.

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
    hardware = resolve_hardware_option(hardware)
    f = PartitionedFunction(fn, mesh, schedule, donate_argnums, hardware,
                            conflicts=conflicts, scatter_sums=scatter_sums, padding=padding,
                            uneven_outputs=uneven_outputs)
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
