"""A schedule's report rows: per tactic, the program as it stood after it, lowered, counted,
simulated and its collectives attributed (`TacticReport`), made when first read."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from .._gc import gc_paused
from ..core.state import PartitionState
from ..cost import HardwareSpec, SimulationResult
from ..errors import UnknownNameError
from ..ir.graph import walk
from ..schedule import AfterTactic
from ..spmd.collectives import sliced_all_reduces
from ..spmd.lowering import LoweringCache, SpmdProgram, lower_to_spmd
from ..spmd.masking import padding_report
from .records import ProgramIndex, attribute_tactics, collective_sites
from .tactic_report import TacticReport


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

    def __init__(self, after: list[AfterTactic], hardware,
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
                                          t.actions, memo, t.search, index,
                                          t.rematerialization))
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
    from ..plugin.manager import default_simulator_name
    from ..plugin.resolve import resolve_hardware, simulate

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
                  search=None, index: ProgramIndex | None = None,
                  rematerialization=None) -> TacticReport:
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
                        timeline=result.timeline if result is not None else [],
                        rematerialization=rematerialization)


def _sum_notes(program: SpmdProgram, state: PartitionState) -> list[str]:
    """Where the RS column reads 0 although the paper counts reduce_scatters (CPU meshes)."""
    n = 0 if state.scatter_sums else sliced_all_reduces(list(walk(program.func.ops)))
    if not n:
        return []
    return [f"{n} sums are all-reduced and sliced onto their shards where the paper "
            f"reduce-scatters (XLA:CPU runs all-reduces faster; on accelerators, or with "
            f"partir.jit(..., scatter_sums=True), they are reduce_scatters)"]
