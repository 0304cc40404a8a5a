"""Greedy search: apply the single action that lowers the simulated cost most, until none
does or the budget is spent. A baseline for MCTS and beam search, and quick on small
programs."""

from __future__ import annotations

import logging
from typing import Any

from partir_plugin.extend import Budget, SearchResult, TacticContext

from .space import Action, SpaceOptions, progress_bar

log = logging.getLogger(__name__)


class GreedySearcher:
    """Steepest descent over group, tag and atomic actions. Options: `hardware`, `progress`,
    `min_leaf_bytes`, `memory_penalty`, `atomic`, `tags`, `max_depth` (12 decisions), `seed`
    (accepted for symmetry; unused). `budget` (a `Budget`, or an int: simulated candidates)
    limits candidates and/or seconds; default none: the search ends when no action helps."""

    name = "greedy"
    default_iterations = None

    def __init__(self, budget: Budget | int | None = None, *, hardware: Any = None, seed: int = 0,
                 progress: bool | None = None, max_depth: int = 12, min_leaf_bytes: int = 1024,
                 memory_penalty: float = 10.0, atomic: bool = True, tags: bool = True):
        self.budget = Budget.parse(budget, self.default_iterations)
        self.options = SpaceOptions(hardware, min_leaf_bytes, memory_penalty, atomic, tags)
        self.progress = progress
        self.max_depth = max_depth
        self.result: SearchResult | None = None

    def search(self, ctx: TacticContext, axes: list[str]) -> SearchResult:
        """Descend from `ctx.state`, then apply the actions taken to `ctx`."""
        space = self.options.space(ctx, axes)
        state = ctx.state.copy()
        baseline = cost = space.cost(state)
        taken: list[Action] = []
        self.budget.start()
        it = 0
        with progress_bar(self.budget.iterations, self.progress, "AutomaticPartition") as bar:
            while len(taken) < self.max_depth and not self.budget.spent(it):
                best = None
                for action in space.actions(state):
                    if self.budget.spent(it):
                        break
                    after = space.step(state, action)
                    c = space.cost(after)
                    it += 1
                    bar.update(1)
                    if c < cost * (1 - 1e-9) and (best is None or c < best[0]):
                        best = (c, action, after)
                if best is None:
                    break
                cost, action, state = best
                taken.append(action)
                bar.set_postfix(best=f"{cost:.3g}s", speedup=f"{baseline / cost:.2f}x")
        self.result = space.apply(taken, self.name, cost, baseline, it, self.budget.elapsed())
        log.info("greedy: %d candidates, %.2fs: %s (%.3g s -> %.3g s)", it,
                 self.result.seconds, self.result.actions, baseline, cost)
        return self.result
