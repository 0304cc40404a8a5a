"""The one path from a program to its partitioned, lowered and compiled forms, staged as jax
stages a function (`jax/_src/stages.py`):

    Traced  --partition-->  Partitioned  --lower-->  Lowered  --compile-->  Compiled

`Traced` is a jax function traced with the schedule's trace hooks (`frontend.trace`), or a
StableHLO module (`Traced.from_stablehlo`). `partition` runs the schedule with one
`PartitionOptions` and gives the device-local program with its report rows (made when first
read). `partir.jit` (`api`), `partir report` (`report_for_function`, `report_for_stablehlo`)
and the tests all take this path, so what they partition cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._gc import gc_paused
from .core.mesh import Mesh
from .core.state import PartitionState
from .errors import InputMismatchError
from .frontend.trace import Traced, aval_key, trace
from .options import PartitionOptions
from .report.collective_names import collective_names
from .report.metadata import Metadata
from .report.records import ProgramIndex
from .report.rows import TacticReports, tactic_report
from .report.tactic_report import BASELINE
from .runtime.executable import DeviceLocalFunction
from .schedule import apply_schedule
from .spmd.lowering import SpmdProgram, emit_diagnostics


@dataclass
class Partitioned:
    """A program partitioned by a schedule: the final state, its device-local program, and
    one report row per tactic (`TacticReports`, made when first read)."""

    state: PartitionState
    program: SpmdProgram
    reports: TacticReports


def resolve_options(options: PartitionOptions, platform: str | None = None
                    ) -> PartitionOptions:
    """`options` with the hardware resolved (an unknown name fails here, listing the known
    ones) and `scatter_sums` decided for `platform` (None: jax's default backend's)."""
    from .plugin.resolve import resolve_hardware_option

    if options.scatter_sums is None:
        if platform is None:
            import jax

            platform = jax.default_backend()
        options = options.for_platform(platform)
    return options.replace(hardware=resolve_hardware_option(options.hardware))


def partition(traced: Traced, mesh, schedule: Sequence = (),
              options: PartitionOptions | None = None) -> Partitioned:
    """Run `schedule` on `traced` over `mesh` (each entry as the tactic the trace gave it,
    `Traced.tactic_for`) and lower the result to the device-local program. The per-tactic
    report rows are made when first read; an unknown hardware name fails here, not then."""
    from .plugin.manager import default_registry

    options = resolve_options(options or PartitionOptions())
    mesh = Mesh.of(mesh)
    tactics = [traced.tactic_for(entry) for entry in schedule]
    with gc_paused():
        done = apply_schedule(traced.func, traced.leaves, mesh, tactics, options,
                              default_registry(), traced.arg_names, traced.out_names)
        # What the lowering found to say (a HaloWarning), once, about the program that runs
        # (the rows' lowerings of earlier tactics' programs say nothing).
        emit_diagnostics(done.program, stacklevel=2)
        # The report's rows share the index (parsed locations, op numbers) the names need.
        index = ProgramIndex(done.state)
        done.program.op_names = collective_names(done.program, done.state,
                                                 [(t.name, t.state) for t in done.after],
                                                 index)
    reports = TacticReports(done.after, options.hardware,
                            done.program if schedule else None, index)
    return Partitioned(done.state, done.program, reports)


def partition_function(fn, args: tuple, mesh, schedule: Sequence = (),
                       options: PartitionOptions | None = None) -> tuple[Traced, Partitioned]:
    """Trace `fn` on `args` (arrays, tracers or ShapeDtypeStructs) with the schedule's trace
    hooks and partition it: `partir.jit`'s path and `partir report --function`'s."""
    # jax's trace of the step allocates as many objects as our passes do, and each of the
    # collector's full passes along the way walks everything alive: one collection at the
    # end instead (`gc_paused`).
    with gc_paused():
        traced = trace(fn, tuple(args), schedule, Mesh.of(mesh))
        return traced, partition(traced, mesh, schedule, options)


# --- partir.jit's stages ---------------------------------------------------------------------

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


# --- partir report's stages ------------------------------------------------------------------

def report(load: Callable[[Sequence], Traced], mesh, schedule: Sequence,
           options: PartitionOptions | None = None, *, baseline: bool = True) -> Metadata:
    """Partition what `load(schedule)` traces (fresh on every call: traced for `schedule`,
    whose trace hooks may change the program, as PP's do) and return the filled Metadata,
    without compiling anything. With `baseline`, the first row is the unpartitioned program
    (`load([])`)."""
    import jax

    mesh = Mesh.of(mesh)
    options = resolve_options(options or PartitionOptions())
    rows = []
    with gc_paused():
        if baseline:
            base = partition(load([]), mesh, [], options)
            rows.append(tactic_report(BASELINE, base.program, base.state, options.hardware))
        traced = load(list(schedule))
        part = partition(traced, mesh, schedule, options)
    rows.extend(part.reports)
    in_specs = [lay.spec() for lay in part.program.in_layouts]
    out_specs = [lay.spec() for lay in part.program.out_layouts]
    if traced.in_tree is not None:
        in_shardings = jax.tree_util.tree_unflatten(traced.in_tree, in_specs)[0]
        out_shardings = jax.tree_util.tree_unflatten(traced.out_tree, out_specs)
    else:
        in_shardings = {lf.qualified: s for lf, s in zip(traced.leaves, in_specs)}
        out_shardings = out_specs
    return Metadata().fill(rows, mesh.shape, options.hardware, in_shardings, out_shardings,
                           part.program.text())


def report_for_function(fn, args: tuple, mesh, schedule: Sequence,
                        options: PartitionOptions | None = None, *,
                        baseline: bool = True) -> Metadata:
    """Trace `fn` on `args` (arrays or ShapeDtypeStructs) and partition it as `partir.jit`
    does (the schedule's trace hooks, the same options); nothing runs."""
    return report(lambda schedule: trace(fn, tuple(args), schedule, Mesh.of(mesh)), mesh,
                  schedule, options, baseline=baseline)


def report_for_stablehlo(source: str | bytes, mesh, schedule: Sequence,
                         options: PartitionOptions | None = None, *,
                         arg_names: Sequence[str] | None = None, entry: str = "main",
                         baseline: bool = True) -> Metadata:
    """Import a StableHLO module's `entry` and partition it; arguments are named `arg_names`
    (default arg0, arg1, ...)."""
    return report(lambda _schedule: Traced.from_stablehlo(source, entry, arg_names), mesh,
                  schedule, options, baseline=baseline)
