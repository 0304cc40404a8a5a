"""Beam search over group, tag and atomic actions: a second searcher beside MCTS.

Model programs are shallow in decisions once layers are grouped (a role across layers is one
action), so keeping the `width` cheapest distributions at each depth and expanding every action
from each explores the few decisions that matter exhaustively and deterministically, with no
random rollouts. Distributions reached twice (a transposition: the same tiles in another order)
are kept once. An action that made a state slower is not tried again from that state's
children (`slack`; it rarely helps one decision later, and skipping it makes a depth cost
the few actions that still help rather than all of them). It stops when a depth improves on
nothing, at `max_depth`, or when the budget (simulations and/or seconds) is spent; an int
budget counts simulations.
"""

from __future__ import annotations

import logging
from typing import Any

from partir_plugin.extend import Budget, PartitionState, SearchResult, TacticContext

from .space import Action, SpaceOptions, progress_bar

log = logging.getLogger(__name__)


class BeamSearcher:
    """Beam search. Options: `width` (4 distributions kept per depth), `patience` (1: depths
    without improvement before stopping), `slack` (0.02: an action whose state cost more than
    (1 + slack) times its parent's is not tried from the parent's children; None: try every
    action at every depth), `max_depth` (16 decisions), `hardware`, `progress`,
    `min_leaf_bytes`, `memory_penalty`, `atomic` (False here: atomic actions rarely lower the
    cost on their own, and a beam ranks by cost), `tags`, `seed` (accepted; the search is
    deterministic)."""

    name = "beam"
    # Simulated candidates; a count, not seconds, so every host of a multi-host run stops at
    # the same point and applies the same decisions. The search stops earlier when a depth
    # brings no improvement (`patience`).
    default_iterations = 200

    def __init__(self, budget: Budget | int | None = None, *, hardware: Any = None, seed: int = 0,
                 progress: bool | None = None, width: int = 4, patience: int = 1,
                 slack: float | None = 0.02,
                 max_depth: int = 16, min_leaf_bytes: int = 1024, memory_penalty: float = 10.0,
                 atomic: bool = False, tags: bool = True):
        self.budget = Budget.parse(budget, self.default_iterations)
        self.options = SpaceOptions(hardware, min_leaf_bytes, memory_penalty, atomic, tags)
        self.progress = progress
        self.width = width
        self.patience = patience
        self.slack = slack
        self.max_depth = max_depth
        self.result: SearchResult | None = None

    def search(self, ctx: TacticContext, axes: list[str]) -> SearchResult:
        """Search on `axes`, then apply the best sequence found to `ctx`."""
        space = self.options.space(ctx, axes)
        start = ctx.state.copy()
        start_key = space.key(start)
        baseline = best_cost = space.cost(start, start_key)
        best_seq: list[Action] = []
        # (cost, actions taken, state, the actions worth trying from it; None: all)
        beam: list[tuple[float, list[Action], PartitionState, set | None]] = [
            (baseline, [], start, None)]
        seen = {start_key}
        self.budget.start()
        it, stale = 0, 0
        with progress_bar(self.budget.iterations, self.progress, "AutomaticPartition") as bar:
            for _ in range(self.max_depth):
                level = []
                for parent_cost, seq, state, worth in beam:
                    tried = []
                    for action in space.actions(state):
                        if self.budget.spent(it):
                            break
                        if worth is not None and action not in worth:
                            continue
                        after = space.step(state, action)
                        key = space.key(after)
                        if key in seen:
                            continue
                        seen.add(key)
                        cost = space.cost(after, key)
                        it += 1
                        bar.update(1)
                        tried.append((cost, action))
                        level.append((cost, len(level), [*seq, action], after, tried))
                    limit = parent_cost * (1 + self.slack) if self.slack is not None else None
                    tried[:] = [(c, a) for c, a in tried if limit is None or c <= limit]
                if not level:
                    break
                level.sort(key=lambda e: (e[0], e[1]))
                beam = [(c, s, st, None if self.slack is None else {a for _, a in tried})
                        for c, _, s, st, tried in level[:self.width]]
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
