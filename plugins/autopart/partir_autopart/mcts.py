"""Monte-Carlo tree search (UCT) over tile actions, as in paper 1 app. A.5.3 (refs [2, 51]).

The tree's nodes are action sequences from the state the tactic starts from; an iteration
selects a node by UCT, expands one untried action (or "stop"), plays a random rollout of bounded
depth from it, and backs up the reward `baseline cost / cost` of the better of the two states it
simulated. The best sequence ever simulated is replayed on the real context at the end.
"""

from __future__ import annotations

import logging
import math
import random
from collections import OrderedDict
from typing import Any

from partir_plugin.extend import Budget, PartitionState, SearchResult, TacticContext

from .space import Action, SearchSpace, progress_bar

log = logging.getLogger(__name__)


class _Node:
    __slots__ = ("path", "parent", "children", "untried", "visits", "total", "terminal",
                 "exhausted")

    def __init__(self, path: tuple[Action, ...], parent: _Node | None, terminal: bool):
        self.path = path
        self.parent = parent
        self.children: dict[Action | None, _Node] = {}
        self.untried: list[Action | None] | None = None  # None: not listed yet
        self.visits = 0
        self.total = 0.0
        self.terminal = terminal
        self.exhausted = terminal


class MCTSSearcher:
    """UCT search. Options (`AutomaticPartition(options=...)`): `hardware` (name or spec;
    default the context's, else the `partir_default_hardware` hook's),
    `seed` (0), `progress` (None: when stderr is a
    TTY), `exploration` (UCT constant, 1.0), `rollout_depth` (4), `max_depth` (8 actions),
    `min_leaf_bytes` (1024), `memory_penalty` (10.0), `cache_states` (256 states kept).
    `budget`: a `Budget(iterations=..., seconds=...)` or an int (iterations; default 200)."""

    default_iterations = 200

    def __init__(self, budget: Budget | int | None = None, *, hardware: Any = None, seed: int = 0,
                 progress: bool | None = None, exploration: float = 1.0,
                 rollout_depth: int = 4, max_depth: int = 8, min_leaf_bytes: int = 1024,
                 memory_penalty: float = 10.0, cache_states: int = 256):
        self.budget = Budget.parse(budget, self.default_iterations)
        self.hardware = hardware
        self.rng = random.Random(seed)
        self.progress = progress
        self.exploration = exploration
        self.rollout_depth = rollout_depth
        self.max_depth = max_depth
        self.min_leaf_bytes = min_leaf_bytes
        self.memory_penalty = memory_penalty
        self.cache_states = cache_states
        self.result: SearchResult | None = None

    # -- states -------------------------------------------------------------------------
    def _state(self, node: _Node) -> PartitionState:
        """The node's state: from the cache, else replayed from its nearest cached ancestor."""
        missing = []
        n = node
        while n.path not in self._cache:
            missing.append(n)
            n = n.parent
        state = self._cache[n.path]
        self._cache.move_to_end(n.path)
        for m in reversed(missing):
            if len(m.path) > len(m.parent.path):  # not a "stop" node
                state = self.space.step(state, m.path[-1])
            self._remember(m.path, state)
        return state

    def _remember(self, path: tuple[Action, ...], state: PartitionState) -> None:
        self._cache[path] = state
        self._cache.move_to_end(path)
        while len(self._cache) > self.cache_states:
            oldest = next(iter(self._cache))
            if oldest == ():
                self._cache.move_to_end(oldest)
                continue
            del self._cache[oldest]

    # -- tree ---------------------------------------------------------------------------
    def _uct(self, parent: _Node, child: _Node) -> float:
        exploit = child.total / child.visits / self._best_reward
        return exploit + self.exploration * math.sqrt(math.log(parent.visits) / child.visits)

    def _select_and_expand(self, root: _Node) -> _Node:
        node = root
        while not node.terminal:
            if node.untried is None:
                at_limit = len(node.path) >= self.max_depth
                actions = [] if at_limit else self.space.actions(self._state(node))
                node.untried = [*actions, None]
                self.rng.shuffle(node.untried)
            if node.untried:
                action = node.untried.pop()
                path = node.path if action is None else (*node.path, action)
                child = _Node(path, node, terminal=action is None)
                node.children[action] = child
                return child
            live = [c for c in node.children.values() if not c.exhausted]
            node = max(live, key=lambda c: self._uct(node, c))
        return node

    def _rollout(self, state: PartitionState, depth: int) -> tuple[list[Action], PartitionState]:
        seq: list[Action] = []
        for _ in range(max(0, min(self.rollout_depth, self.max_depth - depth))):
            choice = self.rng.choice([*self.space.actions(state), None])
            if choice is None:
                break
            state = self.space.step(state, choice)
            seq.append(choice)
        return seq, state

    @staticmethod
    def _backup(node: _Node, reward: float) -> None:
        n: _Node | None = node
        while n is not None:
            n.visits += 1
            n.total += reward
            if not n.exhausted and n.untried == [] and all(c.exhausted
                                                           for c in n.children.values()):
                n.exhausted = True
            n = n.parent

    # -- search -------------------------------------------------------------------------
    def search(self, ctx: TacticContext, axes: list[str]) -> SearchResult:
        """Search tile actions on `axes`, then apply the best sequence found to `ctx`."""
        self.space = SearchSpace(ctx, axes, self.hardware, self.min_leaf_bytes,
                                 self.memory_penalty)
        self._cache: OrderedDict[tuple[Action, ...], PartitionState] = OrderedDict()
        self._cache[()] = ctx.state.copy()
        baseline = self.space.cost(self._cache[()])
        best_cost, best_seq = baseline, ()
        self._best_reward = 1.0
        root = _Node((), None, terminal=False)
        root.visits = 1
        self.budget.start()
        it = 0
        with progress_bar(self.budget.iterations, self.progress, "AutomaticPartition") as bar:
            while not root.exhausted and not self.budget.spent(it):
                node = self._select_and_expand(root)
                state = self._state(node)
                tried = [(node.path, self.space.cost(state))]
                if not node.terminal:
                    seq, end = self._rollout(state, len(node.path))
                    if seq:
                        tried.append(((*node.path, *seq), self.space.cost(end)))
                improved = False
                for path, cost in tried:
                    if cost < best_cost * (1 - 1e-9) or (cost <= best_cost
                                                         and len(path) < len(best_seq)):
                        best_cost, best_seq, improved = cost, path, True
                reward = baseline / max(min(c for _, c in tried), 1e-30)
                self._best_reward = max(self._best_reward, reward)
                self._backup(node, reward)
                it += 1
                bar.set_postfix(best=f"{best_cost:.3g}s", speedup=f"{baseline / best_cost:.2f}x",
                                refresh=improved)
                bar.update(1)
        self.space.apply(list(best_seq))
        self.result = SearchResult([a.describe(self.space.leaves) for a in best_seq], best_cost,
                                   baseline, it, self.space.evaluations, self.budget.elapsed())
        log.info("mcts: %d iterations, %d simulations, %.2fs: %s (%.3g s -> %.3g s)", it,
                 self.space.evaluations, self.result.seconds, self.result.actions, baseline,
                 best_cost)
        self._cache.clear()
        return self.result
