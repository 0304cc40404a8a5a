"""`partir.estimate`: what a schedule would cost on a mesh of any size, before anything runs.

The step is traced on abstract arguments (`jax.ShapeDtypeStruct` pytrees, e.g. from
`jax.eval_shape`: a model of any size costs no memory), partitioned by the one driver
(`stages`) over a mesh given as axis sizes (no devices: thousands are fine), and the
device-local program simulated on a hardware spec. `Estimator` keeps the traces of one
function on one set of argument shapes, so a search over meshes and schedules (the planner)
traces again only where a schedule's trace hooks change the program (PP, RM).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._gc import gc_paused
from .core.mesh import Mesh
from .cost import HardwareSpec, SimulationResult
from .errors import EstimateWarning, PartitionError
from .frontend.trace import Traced, trace
from .options import PartitionOptions
from .plugin.resolve import resolve_hardware_option
from .report.rows import TacticReports
from .report.rows import estimate as simulate_program
from .report.tactic_report import TacticReport
from .stages import partition, resolve_options
from .tactics.base import as_tactic


@dataclass(frozen=True)
class Estimate:
    """The simulated cost of one step of a partitioned program, per device.

    `step_time_s` and `peak_memory_bytes` are the final program's (all tactics applied);
    `collectives` counts executions per kind (a loop body's by its trip count), `flops` is
    one device's work; `fits` says whether the peak fits the spec's memory. `tactics` are the
    per-tactic report rows (`TacticReport`), lowered and simulated when first read.
    """

    step_time_s: float
    peak_memory_bytes: int
    flops: float
    collectives: Mapping[str, int]
    compute_s: float
    communication_s: float
    mesh: Mapping[str, int]
    hardware: str
    memory_limit_bytes: int
    tactics: Sequence[TacticReport] = field(compare=False, repr=False)
    simulation: SimulationResult = field(compare=False, repr=False)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_limit_bytes

    def summary(self) -> str:
        """One line: time, memory against the spec's, the collectives."""
        from .report.text import fmt_bytes, fmt_time

        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.collectives.items()) if v)
        return (f"{fmt_time(self.step_time_s)} per step, {fmt_bytes(self.peak_memory_bytes)} "
                f"per device ({'fits' if self.fits else 'exceeds'} "
                f"{fmt_bytes(self.memory_limit_bytes)} on {self.hardware})"
                + (f"; {counts}" if counts else ""))


def schedule_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes a schedule entry names (`axis`, `axes`)."""
    axes = [getattr(entry, "axis", None), *(getattr(entry, "axes", None) or ())]
    return tuple(a for a in axes if isinstance(a, str))


def check_schedule_axes(mesh: Mesh, schedule: Sequence) -> None:
    """Every axis the schedule names is one of the mesh's (a clear error before tracing)."""
    for i, entry in enumerate(schedule):
        for axis in schedule_axes(entry):
            if axis not in mesh.names:
                name = getattr(entry, "name", type(entry).__name__)
                raise PartitionError(f"schedule entry {i} ({name}) names mesh axis {axis!r}, "
                                     f"which the mesh {dict(mesh.shape)} lacks")


def _trace_key(entry: Any, mesh: Mesh) -> tuple | None:
    """What a trace made with `entry`'s trace hook depends on (None: it has no hook): the
    entry's own fields (its repr) and the size of the axis it names."""
    if as_tactic(entry).trace_hook(mesh) is None:
        return None
    axes = tuple(mesh.axis_size(a) for a in schedule_axes(entry) if a in mesh.names)
    return (type(entry).__qualname__, repr(entry), axes)


class Estimator:
    """Estimates of `fn` on `args` for many meshes and schedules, sharing traces.
    `hardware` (when not None) overrides `options.hardware`.

    A trace depends on the schedule only through its trace hooks (PP's pipelined layer loop,
    RM's rematerialized body); schedules whose hooked entries are equal (same fields, same
    size of the axis they name) are partitioned from one trace.
    """

    def __init__(self, fn, args: tuple, hardware: HardwareSpec | str | None = None,
                 options: PartitionOptions | None = None) -> None:
        self.fn, self.args = fn, tuple(args)
        options = options or PartitionOptions()
        if hardware is not None:
            options = options.replace(hardware=hardware)
        spec = resolve_hardware_option(options.hardware)
        if spec is None:
            raise PartitionError("estimate: no hardware given and no hardware plugin offers "
                                 "a default spec")
        self.hardware: HardwareSpec = spec
        # The step as the spec's device runs it (`scatter_sums` by its platform: all-reduce
        # and slice on a CPU, reduce_scatter on an accelerator or a spec naming none),
        # whatever backend this process has.
        self.options = resolve_options(options.replace(hardware=spec),
                                       spec.platform or "accelerator")
        # trace key -> (the trace, the hooked schedule entries it was traced with)
        self._traces: dict[tuple, tuple[Traced, list]] = {}
        self.traces_made = 0
        self._warned = False  # of an uncosted part (`EstimateWarning`)

    def traced(self, mesh: Mesh, schedule: Sequence) -> tuple[Traced, list]:
        """A trace for `schedule` on `mesh`, and the schedule to partition it with (hooked
        entries replaced by those the trace was made with, which it knows)."""
        keys = [_trace_key(entry, mesh) for entry in schedule]
        key = tuple(k for k in keys if k is not None)
        found = self._traces.get(key)
        if found is None:
            hooked = [e for e, k in zip(schedule, keys) if k is not None]
            # lowered for the spec's platform: the program that device would run
            found = self._traces[key] = (trace(self.fn, self.args, hooked, mesh,
                                               self.hardware.platform), hooked)
            self.traces_made += 1
        traced, originals = found
        it = iter(originals)
        return traced, [next(it) if k is not None else e for e, k in zip(schedule, keys)]

    def estimate(self, mesh, schedule: Sequence = ()) -> Estimate:
        """Partition for `schedule` over `mesh` (a dict of axis sizes, a `Mesh` or a jax
        mesh) and simulate the final program; the per-tactic rows wait until read."""
        mesh = Mesh.of(mesh)
        schedule = list(schedule)
        check_schedule_axes(mesh, schedule)
        with gc_paused():
            traced, entries = self.traced(mesh, schedule)
            part = partition(traced, mesh, entries, self.options)
            result = simulate_program(part.program, self.hardware)
        if result is None:
            raise PartitionError("estimate: no simulator plugin is installed")
        self._warn_uncosted(result)
        rows: Sequence[TacticReport] = part.reports if schedule else TacticReports(
            [], self.hardware)
        return Estimate(result.runtime_s, result.peak_memory_bytes, result.flops,
                        result.collective_counts, result.compute_s, result.communication_s,
                        dict(mesh.shape), self.hardware.name, self.hardware.memory_bytes,
                        rows, result)

    def _warn_uncosted(self, result: SimulationResult) -> None:
        """Warn once per step (a planner estimates it many times) where the simulator left
        part of the program uncosted."""
        missing = []
        if result.unknown_ops:
            missing.append(f"ops it has no cost for ({', '.join(result.unknown_ops)}; charged "
                           "their memory traffic only)")
        if result.unknown_trip_counts:
            missing.append(f"{result.unknown_trip_counts} loop(s) whose trip count it cannot "
                           "read (counted once)")
        if missing and not self._warned:
            self._warned = True
            warnings.warn(f"estimate on {result.hardware!r}: the step has "
                          f"{' and '.join(missing)}; the estimate is a lower bound",
                          EstimateWarning, stacklevel=4)


def estimate(fn, *args, mesh, schedule: Sequence = (), hardware: HardwareSpec | str | None = None,
             **options: Any) -> Estimate:
    """Estimate one step of `fn(*args)` partitioned by `schedule` over `mesh` on `hardware`,
    without devices or data.

    `args` are arrays or `jax.ShapeDtypeStruct` pytrees; `mesh` is a dict of axis sizes, major
    to minor (`{"stage": 4, "data": 32, "model": 8}`), a `jax.sharding.Mesh` or a `Mesh`;
    `hardware` a spec or its name or alias (an unknown one fails, listing the known; None:
    the default spec). `options` are `partir.jit`'s (`conflicts`, `padding`,
    `uneven_outputs`, `scatter_sums`); `scatter_sums` defaults to what `hardware`'s platform
    runs (reduce-scatters on an accelerator, all-reduce and slice on a CPU), whatever
    backend this process has.
    """
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(PartitionOptions)})
    if unknown:
        raise TypeError(f"estimate: unexpected keyword arguments {unknown}")
    est = Estimator(fn, args, hardware, PartitionOptions(**options))
    return est.estimate(mesh, schedule)
