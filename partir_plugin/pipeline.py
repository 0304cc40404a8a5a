"""The partitioning pipeline: trace -> import -> tactics + propagate -> lower -> report.

Kept apart from `api.py` so the steps can be run and inspected one by one (tests, the CLI,
searchers that need to try a schedule without compiling it).
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .collective_names import collective_names
from .core.actions import Leaf, TacticContext
from .core.mesh import Mesh
from .core.padding import PaddingPolicy, UnevenOutputs
from .core.propagation import propagate
from .core.resolution import ConflictPolicy
from .core.state import PartitionState
from .core.tmr import TileMappingRegistry
from .errors import PartitionError, UnevenOutputWarning, UnknownNameError
from .ir.graph import Func, gc_paused, walk
from .ir.importer import import_lowered
from .metadata import TacticReport
from .records import ProgramIndex, attribute_tactics, collective_sites
from .simulation import HardwareSpec, SimulationResult
from .spmd.collectives import sliced_all_reduces
from .spmd.lowering import LoweringCache, SpmdProgram, emit_diagnostics, lower_to_spmd
from .spmd.masking import padding_report


def key_path_str(path) -> str:
    """A jax key path as "a/b/0" (DESIGN.md §3)."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def argument_names(fn, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n):
        if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY,
                                                   params[i].POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        else:
            names.append(f"arg{i}")
    return names


@dataclass
class Traced:
    func: Func
    leaves: list[Leaf]
    arg_names: list[str]
    in_tree: Any
    out_tree: Any
    out_avals: list
    out_names: list[str] | None = None  # each output leaf as "output <path>"


def aval_key(x) -> tuple:
    """What a partitioned program is specialised on, per argument leaf (an array, a tracer,
    a Python scalar or a ShapeDtypeStruct): shape, dtype and weak type, as jax.jit traces it."""
    import jax

    aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    return (tuple(aval.shape), aval.dtype, aval.weak_type)


def trace_hooks(schedule: Sequence, mesh: Mesh) -> list:
    """The context managers the schedule's tactics want entered while the step is traced
    (a tactic with `trace_hook(mesh)`, e.g. PP substituting the layer loop)."""
    return [t.trace_hook(mesh) for t in schedule if hasattr(t, "trace_hook")]


def trace(fn, args: tuple, hooks: Sequence = ()) -> Traced:
    """Lower `fn` with jax (no sharding: partitioning starts from the logical program,
    whatever sharding an argument carries) and import it; name every argument leaf.

    `hooks` (context managers, `trace_hooks`) are entered around jax's trace; with any, a
    fresh wrapper is traced, so a trace jax cached without them is not reused."""
    import contextlib

    import jax

    def abstract(x):
        shape, dtype, weak = aval_key(x)
        return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak)

    names = argument_names(fn, len(args))
    abstract = jax.tree_util.tree_map(abstract, args)
    with contextlib.ExitStack() as stack:
        for hook in hooks:
            stack.enter_context(hook)
        traced_fn = (lambda *a: fn(*a)) if hooks else fn
        lowered = jax.jit(traced_fn, keep_unused=True).lower(*abstract)
    func = import_lowered(lowered)
    leaves: list[Leaf] = []
    flat_in = []
    for name, arg in zip(names, abstract):
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
            flat_in.append((name, key_path_str(path), leaf))
    if len(flat_in) != len(func.args):
        raise PartitionError(f"traced function has {len(func.args)} array arguments but the "
                             f"arguments have {len(flat_in)} leaves")
    for (name, path, _), v in zip(flat_in, func.args):
        leaves.append(Leaf(name, path, v))
    func.arg_names = [lf.qualified for lf in leaves]
    out_avals = jax.tree_util.tree_leaves(lowered.out_info)
    func.result_paths = [key_path_str(path) for path, _ in
                         jax.tree_util.tree_flatten_with_path(lowered.out_info)[0]]
    out_names = [f"output {path!r}" if path else "output" for path in func.result_paths]
    return Traced(func, leaves, names, lowered.in_tree, lowered.out_tree, out_avals,
                  out_names)


@dataclass
class Partitioned:
    state: PartitionState
    program: SpmdProgram
    reports: TacticReports


@dataclass(frozen=True)
class _AfterTactic:
    """What one tactic left: its name, its actions and search, and a copy of the state."""

    name: str
    state: PartitionState
    actions: list[str]
    search: Any


class TacticReports(Sequence[TacticReport]):
    """A schedule's report rows, one per tactic, made on first read.

    A row needs the program as it stood after its tactic, lowered and simulated: together
    more than half of a schedule's time, and a caller that only runs the step never reads
    them. So the schedule keeps a copy of the state after each tactic (cheap: decisions only
    append) and this sequence lowers and simulates them, in order and incrementally
    (`LoweringCache`, the simulator's memo), the first time a row is read. `len()` does not
    need the rows. `make_quietly` makes them on another thread while XLA compiles
    (`runtime.compile_overlap`); a read meanwhile waits for it.
    """

    def __init__(self, after: list[_AfterTactic], hardware,
                 final: SpmdProgram | None = None, index: ProgramIndex | None = None) -> None:
        self._after = after
        self._index = index
        self._count = len(after)
        self._hardware = hardware
        # The last tactic's state is the final one: its program is the one the schedule
        # lowered already (the runtime's), not lowered a second time for its row.
        self._final = final
        self._rows: list[TacticReport] | None = None
        self._lock = threading.Lock()

    def _made(self) -> list[TacticReport]:
        with self._lock:
            if self._rows is None:
                self._rows = self._make()
                self._after, self._final, self._index = [], None, None
        return self._rows

    def _make(self) -> list[TacticReport]:
        with gc_paused():
            cache, memo, rows = LoweringCache(), {}, []
            index = self._index or (ProgramIndex(self._after[0].state) if self._after
                                    else None)
            last = len(self._after) - 1
            for i, t in enumerate(self._after):
                program = (self._final if i == last and self._final is not None
                           else lower_to_spmd(t.state, cache))
                rows.append(tactic_report(t.name, program, t.state, self._hardware,
                                          t.actions, memo, t.search, index))
            attribute_tactics([(t.name, t.state, row.sites)
                               for t, row in zip(self._after, rows)])
        return rows

    def make_quietly(self) -> None:
        """Make the rows now, on whatever thread calls this; an error leaves them unmade,
        so the first read makes them again and raises it there."""
        try:
            self._made()
        except Exception:  # noqa: BLE001 -- reported by the read that remakes them
            pass

    @property
    def made(self) -> bool:
        """Have the rows been made (lowered and simulated) yet?"""
        return self._rows is not None

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        return self._made()[i]

    def __iter__(self):
        return iter(self._made())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(self._made()) if self.made else f"<{len(self)} tactic reports, not made yet>"


def estimate(program: SpmdProgram, hardware: HardwareSpec | str | None, memo: dict | None = None,
             *, timeline: bool = False) -> SimulationResult | None:
    """The default simulator plugin's estimate on `hardware` (None: the default spec the
    hardware plugins name), or None when no simulator, or no default spec, is installed.
    `memo` carries the simulator's per-op work from one tactic's program to the next;
    `timeline` asks for every kernel's start (a simulator without that option does without)."""
    from .kernel import default_simulator_name
    from .simulation import resolve_hardware, simulate

    if default_simulator_name() is None:
        return None
    try:
        spec = resolve_hardware(hardware)
    except UnknownNameError:
        if hardware is None:  # no hardware plugin offers a default: no estimates
            return None
        raise
    options: dict = {"memo": memo} if memo is not None else {}
    if timeline:
        options["timeline"] = True
    return simulate(program.func, program.mesh, spec, **options)


def tactic_report(name: str, program: SpmdProgram, state: PartitionState, hardware,
                  actions: list[str] | None = None, memo: dict | None = None,
                  search=None, index: ProgramIndex | None = None) -> TacticReport:
    """The report row for the program as it stands (the one place rows are assembled), with
    a site per collective (`TacticReport.records`; `index` is shared by a schedule's rows)."""
    result = estimate(program, hardware, memo, timeline=True)
    if index is None:
        index = ProgramIndex(state)
    sites = collective_sites(walk(program.func.ops), state, result, index)
    for s in sites:
        s.tactic = name
    return TacticReport(name, dict(program.counts),
                        result.runtime_s if result is not None else None,
                        result.peak_memory_bytes if result is not None else None,
                        result.flops if result is not None else None,
                        [str(c) for c in state.conflicts], dict(state.unsupported),
                        list(actions or []), search, sites=sites,
                        resolutions=[str(r) for r in state.resolutions],
                        notes=[*state.notes, *map(str, program.boundary_drops),
                               *_sum_notes(program, state)],
                        # Nothing to say where no tiling pads (walking every op's masks
                        # costs about a tenth of a row on the decoder).
                        padding=padding_report(state) if state.pads_any else [],
                        timeline=result.timeline if result is not None else [])


def _sum_notes(program: SpmdProgram, state: PartitionState) -> list[str]:
    """Where the RS column reads 0 although the paper counts reduce_scatters (CPU meshes)."""
    n = 0 if state.scatter_sums else sliced_all_reduces(list(walk(program.func.ops)))
    if not n:
        return []
    return [f"{n} sums are all-reduced and sliced onto their shards where the paper "
            f"reduce-scatters (XLA:CPU runs all-reduces faster; on accelerators, or with "
            f"partir.jit(..., scatter_sums=True), they are reduce_scatters)"]


def apply_schedule(func: Func, leaves: list[Leaf], mesh: Mesh, schedule, *, hardware=None,
                   registry: TileMappingRegistry | None = None,
                   arg_names: list[str] | None = None,
                   conflicts: str | ConflictPolicy = ConflictPolicy.REDISTRIBUTE,
                   scatter_sums: bool = True,
                   padding: str | PaddingPolicy = PaddingPolicy.ALLOW,
                   uneven_outputs: str | UnevenOutputs = UnevenOutputs.ERROR,
                   out_names: list[str] | None = None) -> Partitioned:
    """Apply each tactic then `propagate`, and lower the final state to the device-local
    program. The per-tactic report rows are made when first read (`TacticReports`); an unknown
    `hardware` name fails here, not then. `scatter_sums`: `PartitionState.scatter_sums`.
    `padding`, `uneven_outputs`: `partir.jit`'s options of those names; `out_names` name the
    outputs in their messages."""
    from .simulation import resolve_hardware_option

    hardware = resolve_hardware_option(hardware)
    policy = ConflictPolicy.of(conflicts)
    boundary = _Boundary(PaddingPolicy.of(padding), UnevenOutputs.of(uneven_outputs),
                         out_names)
    with gc_paused():
        return _apply_schedule(func, leaves, mesh, schedule, hardware, registry, arg_names,
                               policy, scatter_sums, boundary)


@dataclass(frozen=True)
class _Boundary:
    """How a schedule treats padding and the outputs it tiles unevenly."""

    padding: PaddingPolicy
    uneven_outputs: UnevenOutputs
    out_names: list[str] | None

    def check_outputs(self, state: PartitionState, after: list[_AfterTactic]) -> None:
        """Outputs tiled unevenly: a PartitionError naming each (path, dimension, sizes and
        the tactic that first tiled it so), or with `UnevenOutputs.REPLICATE` a warning (the
        lowering gathers them to their largest divisible layout and trims)."""
        found = []
        for i, v in enumerate(state.func.returns):
            if not v.type.is_tensor:
                continue
            for d, p in state.padded_dims(v).items():
                name = self.out_names[i] if self.out_names else f"output {i}"
                tactic = next((t.name for t in after if d in t.state.padded_dims(v)), "?")
                sizes = " x ".join(str(k) for k in p.sizes)
                found.append(f"{name} of shape {v.type.shape}: dimension {d} of size {p.n} "
                             f"is tiled {sizes} ways over {', '.join(map(repr, p.axes))} by "
                             f"tactic {tactic!r}, which does not divide it")
        if not found:
            return
        if self.uneven_outputs is UnevenOutputs.ERROR:
            raise PartitionError(
                "program outputs must be tiled evenly (jax shards only divisible "
                "dimensions): " + "; ".join(found) + ". Pass uneven_outputs='replicate' to "
                "gather and trim them, or tile the output on an axis that divides it")
        warnings.warn("outputs tiled unevenly are gathered and trimmed: " + "; ".join(found),
                      UnevenOutputWarning, stacklevel=5)


def _apply_schedule(func, leaves, mesh, schedule, hardware, registry, arg_names, policy,
                    scatter_sums, boundary: _Boundary) -> Partitioned:
    from .kernel import default_registry

    state = PartitionState(func, mesh, registry or default_registry(),
                           resolve_conflicts=policy is ConflictPolicy.REDISTRIBUTE,
                           scatter_sums=scatter_sums,
                           allow_padding=boundary.padding is PaddingPolicy.ALLOW)
    after = []
    for tactic in schedule:
        if hasattr(tactic, "reserve"):
            tactic.reserve(state)
    for i, tactic in enumerate(schedule):
        ctx = TacticContext(state, leaves, arg_names, hardware)
        if callable(tactic) and not hasattr(tactic, "apply"):
            tactic(ctx)
            name = getattr(tactic, "__name__", "tactic")
        else:
            tactic.apply(ctx)
            name = tactic.name
        ctx.propagate()
        # The last tactic's state is the final one, which nothing changes any more.
        kept = state if i == len(schedule) - 1 else state.copy()
        after.append(_AfterTactic(name, kept, ctx.actions, ctx.search))
    if not schedule:  # an empty schedule: the replicated program
        propagate(state)
    for tactic in schedule:  # checks that need the whole schedule's decisions (PP)
        if hasattr(tactic, "finish"):
            tactic.finish(state)
    boundary.check_outputs(state, after)
    # `after[-1].state` is `state` itself (and `finish` changed it in place), so the final
    # program is also the last row's.
    program = lower_to_spmd(state)
    # What the lowering found to say (a HaloWarning), once, about the program that runs (the
    # rows' lowerings of earlier tactics' programs say nothing).
    emit_diagnostics(program, stacklevel=4)
    # The report's rows share the index (parsed locations, op numbers) the names need.
    index = ProgramIndex(state)
    program.op_names = collective_names(program, state, [(t.name, t.state) for t in after],
                                        index)
    return Partitioned(state, program, TacticReports(after, hardware, program if schedule
                                                     else None, index))
