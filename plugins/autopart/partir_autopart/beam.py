"""Beam search over group, tag and atomic actions: a second searcher beside MCTS.

Model programs are shallow in decisions once layers are grouped (a role across layers is one
action), so keeping the `width` cheapest distributions at each depth and expanding every action
from each explores the few decisions that matter exhaustively and deterministically, with no
random rollouts. Distributions reached twice (a transposition: the same tiles in another order)
are kept once. It stops when a depth improves on nothing, at `max_depth`, or when the budget
(simulations and/or seconds) is spent; an int budget counts simulations.
"""

from __future__ import annotations

import logging
from typing import Any

from partir_plugin.extend import Budget, PartitionState, SearchResult, TacticContext

from .space import Action, SearchSpace, progress_bar

log = logging.getLogger(__name__)


class BeamSearcher:
    """Beam search. Options: `width` (4 distributions kept per depth), `patience` (1: depths
    without improvement before stopping), `max_depth` (16 decisions), `hardware`, `progress`,
    `min_leaf_bytes`, `memory_penalty`, `atomic` (False here: atomic actions rarely lower the
    cost on their own, and a beam ranks by cost), `tags`, `seed` (accepted; the search is
    deterministic)."""

    name = "beam"
    default_iterations = None

    def __init__(self, budget: Budget | int | None = None, *, hardware: Any = None, seed: int = 0,
                 progress: bool | None = None, width: int = 4, patience: int = 1,
                 max_depth: int = 16, min_leaf_bytes: int = 1024, memory_penalty: float = 10.0,
                 atomic: bool = False, tags: bool = True):
        self.budget = Budget.parse(budget, self.default_iterations)
        self.hardware = hardware
        self.progress = progress
        self.width = width
        self.patience = patience
        self.max_depth = max_depth
        self.min_leaf_bytes = min_leaf_bytes
        self.memory_penalty = memory_penalty
        self.atomic = atomic
        self.tags = tags
        self.result: SearchResult | None = None

    def search(self, ctx: TacticContext, axes: list[str]) -> SearchResult:
        """Search on `axes`, then apply the best sequence found to `ctx`."""
        space = SearchSpace(ctx, axes, self.hardware, self.min_leaf_bytes, self.memory_penalty,
                            self.atomic, self.tags)
        start = ctx.state.copy()
        baseline = best_cost = space.cost(start)
        best_seq: list[Action] = []
        beam: list[tuple[float, list[Action], PartitionState]] = [(baseline, [], start)]
        seen = {space.key(start)}
        self.budget.start()
        it, stale = 0, 0
        with progress_bar(self.budget.iterations, self.progress, "AutomaticPartition") as bar:
            for _ in range(self.max_depth):
                level: list[tuple[float, int, list[Action], PartitionState]] = []
                for _, seq, state in beam:
                    for action in space.actions(state):
                        if self.budget.spent(it):
                            break
                        after = space.step(state, action)
                        key = space.key(after)
                        if key in seen:
                            continue
                        seen.add(key)
                        cost = space.cost(after)
                        it += 1
                        bar.update(1)
                        level.append((cost, len(level), [*seq, action], after))
                if not level:
                    break
                level.sort(key=lambda e: (e[0], e[1]))
                beam = [(c, s, st) for c, _, s, st in level[:self.width]]
                if beam[0][0] < best_cost * (1 - 1e-9):
                    best_cost, best_seq, stale = beam[0][0], beam[0][1], 0
                    bar.set_postfix(best=f"{best_cost:.3g}s",
                                    speedup=f"{baseline / best_cost:.2f}x")
                else:
                    stale += 1
                if stale >= self.patience or self.budget.spent(it):
                    break
        self.result = space.apply(best_seq, self.name, best_cost, baseline, it,
                                  self.budget.elapsed())
        log.info("beam: %d simulations, %.2fs: %s (%.3g s -> %.3g s)", it,
                 self.result.seconds, self.result.actions, baseline, best_cost)
        return self.result
