"""The search space shared by the searchers: tile actions on argument leaves, episodes played on
copies of the partition state, and the simulator as cost (paper 1 §3, §7.3.1, app. A.5).

An action is `tile<leaf, dim, axis>`; `None` stands for "stop". Applying an action copies the
state, tiles the leaf and propagates from it, exactly as `TacticContext.tile` followed by
`TacticContext.propagate` does on the real state, so the best sequence found can be replayed
there with the same result.
"""

from __future__ import annotations

import gc
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from ...core.actions import Leaf, TacticContext
from ...core.propagation import propagate
from ...core.state import PartitionState
from ...errors import PartitionError
from ...simulation import resolve_hardware, resolve_simulator, simulate
from ...spmd.lowering import LoweringCache, lower_to_spmd

DEFAULT_HARDWARE = "host-cpu"
MEMORY_PENALTY = 10.0


@dataclass(frozen=True)
class Action:
    """tile<leaves[leaf], dim, axis>."""

    leaf: int
    dim: int
    axis: str

    def describe(self, leaves: list[Leaf]) -> str:
        """As `TacticContext.actions` records it."""
        return f"tile<argument {leaves[self.leaf].qualified!r}, {self.dim}, {self.axis!r}>"


@dataclass
class Budget:
    """At most `iterations` iterations and/or `seconds` of wall time (None: no limit)."""

    iterations: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, budget: Any, default_iterations: int | None) -> Budget:
        """`None` (the default), an int (iterations), a float (seconds) or a dict with keys
        `iterations` and/or `seconds`."""
        if budget is None:
            out = cls(default_iterations, None)
        elif isinstance(budget, bool):
            raise PartitionError(f"budget must be an int, a float or a dict, not {budget!r}")
        elif isinstance(budget, int):
            out = cls(budget, None)
        elif isinstance(budget, float):
            out = cls(None, budget)
        elif isinstance(budget, dict):
            unknown = sorted(set(budget) - {"iterations", "seconds"})
            if unknown:
                raise PartitionError(f"unknown budget keys {unknown} (use 'iterations' and/or "
                                     f"'seconds')")
            out = cls(budget.get("iterations"), budget.get("seconds"))
        else:
            raise PartitionError(f"budget must be an int (iterations), a float (seconds) or a "
                                 f"dict {{'iterations': n, 'seconds': s}}; got {budget!r}")
        for what, value in (("iterations", out.iterations), ("seconds", out.seconds)):
            if value is not None and not value > 0:
                raise PartitionError(f"budget {what} must be positive, got {value!r}")
        return out

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def spent(self, iterations: int) -> bool:
        if self.iterations is not None and iterations >= self.iterations:
            return True
        return self.seconds is not None and self.elapsed() >= self.seconds


@dataclass
class SearchResult:
    """What a search found: the best action sequence and its cost against the starting one."""

    actions: list[str]
    cost: float
    baseline_cost: float
    iterations: int
    evaluations: int
    seconds: float


def progress_bar(total: int | None, enabled: bool | None, desc: str) -> tqdm:
    """A tqdm bar on stderr; shown when `enabled`, or (None) when stderr is a terminal."""
    show = sys.stderr.isatty() if enabled is None else enabled
    return tqdm(total=total, desc=desc, disable=not show, leave=False, unit="it",
                file=sys.stderr, dynamic_ncols=True)


class SearchSpace:
    """Actions available in a state, how they change it, and what a state costs."""

    def __init__(self, ctx: TacticContext, axes: list[str], hardware: Any = None,
                 min_leaf_bytes: int = 1024, memory_penalty: float = MEMORY_PENALTY):
        hardware = hardware or ctx.hardware or DEFAULT_HARDWARE
        try:
            self.hardware = resolve_hardware(hardware)
            resolve_simulator("analytical")
        except KeyError as e:
            raise PartitionError(f"automatic partitioning needs a simulator and a hardware "
                                 f"spec: {e.args[0]}") from None
        self.ctx = ctx
        self.leaves = ctx.leaves
        self.axes = [a for a in axes if ctx.mesh.axis_size(a) > 1]
        self.candidates = [i for i, leaf in enumerate(self.leaves)
                           if leaf.value.type.is_tensor and leaf.value.type.rank > 0
                           and leaf.value.type.nbytes >= min_leaf_bytes]
        self.memory_penalty = memory_penalty
        self.evaluations = 0
        self._costs: dict[tuple, float] = {}
        # Sibling states share most of their device-local code, and so its simulated work.
        self._lowered, self._work = LoweringCache(), {}

    def actions(self, state: PartitionState) -> list[Action]:
        """Every tile action `state` allows, in a fixed order (axis, leaf, dim)."""
        out = []
        for axis in self.axes:
            for i in self.candidates:
                v = self.leaves[i].value
                out += [Action(i, d, axis) for d in range(v.type.rank)
                        if state.can_tile(v, d, axis) is None]
        return out

    def step(self, state: PartitionState, action: Action) -> PartitionState:
        """A copy of `state` with `action` applied and propagated."""
        new = state.copy()
        changed = new.tile_value(self.leaves[action.leaf].value, action.dim, action.axis)
        propagate(new, seeds=changed or None)
        return new

    def cost(self, state: PartitionState) -> float:
        """Simulated runtime, times (1 + penalty * fraction of device memory overflowed)."""
        key = (frozenset((id(v), tuple(t)) for v, t in state.tiling.items() if t),
               frozenset((id(op), tuple(n)) for op, n in state.nests.items() if n))
        if key not in self._costs:
            self.evaluations += 1
            program = lower_to_spmd(state, self._lowered)
            result = simulate(program.func, program.mesh, self.hardware, memo=self._work)
            limit = self.hardware.memory_bytes
            overflow = max(0, result.peak_memory_bytes - limit) / limit if limit > 0 else 0.0
            cost = result.runtime_s * (1.0 + self.memory_penalty * overflow)
            self._costs[key] = cost if math.isfinite(cost) else math.inf
            if self.evaluations % 64 == 0:
                gc.collect()  # the schedule pauses the collector; each program is garbage now
        return self._costs[key]

    def apply(self, actions: list[Action]) -> None:
        """Replay `actions` on the real context (recorded in its report), propagating after
        each as the search did."""
        for a in actions:
            self.ctx.tile(self.leaves[a.leaf], a.dim, a.axis)
            self.ctx.propagate()
