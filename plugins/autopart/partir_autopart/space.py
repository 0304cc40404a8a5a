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
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from partir_plugin.extend import (
    Leaf,
    LoweringCache,
    PartitionError,
    PartitionState,
    TacticContext,
    UnknownNameError,
    lower_to_spmd,
    propagate,
    resolve_hardware,
    resolve_simulator,
    simulate,
)

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


def progress_bar(total: int | None, enabled: bool | None, desc: str) -> tqdm:
    """A tqdm bar on stderr; shown when `enabled`, or (None) when stderr is a terminal."""
    show = sys.stderr.isatty() if enabled is None else enabled
    return tqdm(total=total, desc=desc, disable=not show, leave=False, unit="it",
                file=sys.stderr, dynamic_ncols=True)


class SearchSpace:
    """Actions available in a state, how they change it, and what a state costs."""

    def __init__(self, ctx: TacticContext, axes: list[str], hardware: Any = None,
                 min_leaf_bytes: int = 1024, memory_penalty: float = MEMORY_PENALTY):
        try:  # None: the hardware and simulator the plugins' default hooks name
            self.hardware = resolve_hardware(hardware or ctx.hardware)
            self.simulator = resolve_simulator(None)
        except UnknownNameError as e:
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
            result = simulate(program.func, program.mesh, self.hardware,
                              simulator=self.simulator, memo=self._work)
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
