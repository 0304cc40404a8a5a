"""The search space shared by the searchers: decisions on parameter groups and tagged values,
episodes played on copies of the partition state, and the simulator as cost (paper 1 §3,
§7.3.1, app. A.5).

An action is `tile<target, dim, axis>` or `atomic<target, axis>` (dim None), where a target is
a parameter group (`groups.py`: a role across layers, with its optimizer moments) or a tag
(`partir_plugin.tag`); `None` stands for "stop". Applying an action copies the state, issues
the action's `Decision` through a `TacticContext` on the copy and propagates, exactly as the
real context does when the best sequence is replayed (`SearchSpace.apply`), so the replay gives
the state the search costed.
"""

from __future__ import annotations

import gc
import math
import sys
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from partir_plugin.extend import (
    Decision,
    DecisionKind,
    LoweringCache,
    PartitionError,
    PartitionState,
    SearchResult,
    TacticContext,
    UnknownNameError,
    Value,
    lower_to_spmd,
    resolve_hardware,
    resolve_simulator,
    simulate,
)

from .groups import Group, find_groups

MEMORY_PENALTY = 10.0


@dataclass(frozen=True)
class Target:
    """What an action decides: a parameter group (`group`) or a tag (`tag`)."""

    name: str
    group: Group | None = None
    tag: str | None = None
    nbytes: int = 0


@dataclass(frozen=True)
class Action:
    """tile<targets[target], dim, axis>, or atomic<targets[target], axis> when dim is None."""

    target: int
    dim: int | None
    axis: str


def progress_bar(total: int | None, enabled: bool | None, desc: str) -> tqdm:
    """A tqdm bar on stderr; shown when `enabled`, or (None) when stderr is a terminal."""
    show = sys.stderr.isatty() if enabled is None else enabled
    return tqdm(total=total, desc=desc, disable=not show, leave=False, unit="it",
                file=sys.stderr, dynamic_ncols=True)


@dataclass(frozen=True)
class SpaceOptions:
    """The searchers' common options: what the space offers and how it costs a state."""

    hardware: Any = None
    min_leaf_bytes: int = 1024
    memory_penalty: float = MEMORY_PENALTY
    atomic: bool = True
    tags: bool = True

    def space(self, ctx: TacticContext, axes: list[str]) -> SearchSpace:
        return SearchSpace(ctx, axes, self.hardware, self.min_leaf_bytes, self.memory_penalty,
                           self.atomic, self.tags)


class SearchSpace:
    """Actions available in a state, how they change it, and what a state costs.

    `atomic`: offer atomic actions too (after the tile actions); `tags`: offer the tagged
    values as targets."""

    def __init__(self, ctx: TacticContext, axes: list[str], hardware: Any = None,
                 min_leaf_bytes: int = 1024, memory_penalty: float = MEMORY_PENALTY,
                 atomic: bool = True, tags: bool = True):
        try:  # None: the hardware and simulator the plugins' default hooks name
            self.hardware = resolve_hardware(hardware or ctx.hardware)
            self.simulator = resolve_simulator(None)
        except UnknownNameError as e:
            raise PartitionError(f"automatic partitioning needs a simulator and a hardware "
                                 f"spec: {e.args[0]}") from None
        self.ctx = ctx
        self.leaves = ctx.leaves
        self.arg_names = ctx.arg_names()
        self.axes = [a for a in axes if ctx.mesh.axis_size(a) > 1]
        candidates = [i for i, leaf in enumerate(self.leaves)
                      if leaf.value.type.is_tensor and leaf.value.type.rank > 0
                      and leaf.value.type.nbytes >= min_leaf_bytes]
        self.targets = [Target(g.name, group=g, nbytes=g.nbytes)
                        for g in find_groups(self.leaves, candidates)]
        if tags:
            for name, values in sorted(ctx.state.tags.items()):
                nbytes = sum(v.type.nbytes for v in values if v.type.is_tensor)
                if values and all(v.type.is_tensor and v.type.rank > 0 for v in values):
                    self.targets.append(Target(name, tag=name, nbytes=nbytes))
        self.atomic = atomic
        self.memory_penalty = memory_penalty
        self.evaluations = 0
        self._costs: dict[tuple, float] = {}
        # Sibling states share most of their device-local code, and so its simulated work.
        self._lowered, self._work = LoweringCache(), {}

    def values(self, target: Target, state: PartitionState) -> list[Value]:
        if target.tag is not None:
            return state.tagged(target.tag)
        return [self.leaves[i].value for i in target.group.leaves]

    def actions(self, state: PartitionState) -> list[Action]:
        """Every action `state` allows, in a fixed order: tile actions by axis, target, dim;
        then atomic ones. A group action must be legal on every leaf of the group and change
        at least one; a tag must still be undecided on the axis."""
        tiles, atomics = [], []
        for axis in self.axes:
            for t, target in enumerate(self.targets):
                values = self.values(target, state)
                current = [state.dim_of(v, axis) for v in values]
                if target.tag is not None and any(c is not None for c in current):
                    continue
                for d in range(values[0].type.rank):
                    # Even tiles only: the search's cost model and memory bounds assume them.
                    if all(c == d or (c is None
                                      and state.can_tile(v, d, axis, padding=False) is None)
                           for v, c in zip(values, current)) and None in current:
                        tiles.append(Action(t, d, axis))
                if self.atomic and all(c is None and (v, axis) not in state.atomic
                                       for v, c in zip(values, current)):
                    atomics.append(Action(t, None, axis))
        return tiles + atomics

    def decision(self, action: Action) -> Decision:
        """The action by name, as the result reports it and a frozen tactic replays it."""
        target = self.targets[action.target]
        kind = DecisionKind.ATOMIC if action.dim is None else DecisionKind.TILE
        if target.tag is not None:
            return Decision(kind, (target.tag,), action.axis, action.dim, tag=True)
        names = tuple(self.leaves[i].qualified for i in target.group.leaves)
        return Decision(kind, names, action.axis, action.dim,
                        label=target.name if len(names) > 1 else "")

    def step(self, state: PartitionState, action: Action) -> PartitionState:
        """A copy of `state` with `action` applied and propagated."""
        new = state.copy()
        ctx = TacticContext(new, self.leaves, self.arg_names)
        self.decision(action).apply(ctx)
        ctx.propagate()
        return new

    @staticmethod
    def key(state: PartitionState) -> tuple:
        """The distribution a state stands for: states reached by different sequences that
        share it share their statistics and cost (the searchers' transposition table). Tiles
        on different dimensions commute, so a value's tiles are ordered by dimension (stable:
        the order of axes on one dimension is kept, it is the devices' order); an op's loop
        nests by axis."""
        return (frozenset((id(v), tuple(sorted(t, key=lambda e: e[1])))
                          for v, t in state.tiling.items() if t),
                frozenset((id(op), tuple(sorted(n, key=lambda e: e[0])))
                          for op, n in state.nests.items() if n),
                frozenset((id(v), a) for v, a in state.atomic),
                frozenset((id(op), a) for op, a in state.boundaries))

    def cost(self, state: PartitionState, key: tuple | None = None) -> float:
        """Simulated runtime, times (1 + penalty * fraction of device memory overflowed).
        `key`: the state's `key()` when the caller has it (its tiles and loops decide the
        program, so they key the cost)."""
        key = (key if key is not None else self.key(state))[:2]
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

    def apply(self, actions: list[Action], searcher: str, cost: float, baseline: float,
              iterations: int, seconds: float) -> SearchResult:
        """Replay `actions` on the real context (recorded in its report), propagating after
        each as the search did, and say what was found: the result's `actions` are the
        context's action strings, its `decisions` the same by name."""
        decisions = [self.decision(a) for a in actions]
        before = len(self.ctx.actions)
        for d in decisions:
            d.apply(self.ctx)
            self.ctx.propagate()
        issued = [a for a in self.ctx.actions[before:] if a != "propagate"]
        return SearchResult(issued, cost, baseline, iterations, self.evaluations, seconds,
                            decisions, searcher)
