"""Monte-Carlo tree search (UCT) over group, tag and atomic actions (paper 1 app. A.5.3, refs
[2, 51]), with two changes that fit how programs are built:

- a transposition table: nodes are distributions (`SearchSpace.key`), not action sequences,
  so "tile A then B" and "tile B then A" share one node, its statistics and its cost;
- progressive widening: a node visited n times has at most 1 + widening * n^alpha children,
  taken in a fixed prior order (the largest targets first, tile before atomic), so the search
  deepens along promising lines instead of trying every action at every node.

An iteration selects by UCT, expands one action (or "stop"), plays a random rollout of bounded
depth, and backs up the reward `baseline cost / cost` of the better of the two states it
simulated along the path it took. Same seed, same budget in iterations: same result.
"""

from __future__ import annotations

import logging
import math
import random
from collections import OrderedDict
from typing import Any

from partir_plugin.extend import Budget, PartitionState, SearchResult, TacticContext

from .space import Action, SpaceOptions, progress_bar

log = logging.getLogger(__name__)


class _Node:
    __slots__ = ("key", "parent", "action", "depth", "children", "untried", "visits", "total",
                 "terminal", "exhausted")

    def __init__(self, key: tuple, parent: _Node | None, action: Action | None, depth: int,
                 terminal: bool = False):
        self.key = key
        self.parent = parent  # the node it was first reached from (to rebuild its state)
        self.action = action
        self.depth = depth
        self.children: dict[Action | None, _Node] = {}
        self.untried: list[Action | None] | None = None  # None: not listed yet
        self.visits = 0
        self.total = 0.0
        self.terminal = terminal
        self.exhausted = terminal


class MCTSSearcher:
    """UCT search with a transposition table and progressive widening. Options
    (`AutomaticPartition(options=...)`): `hardware` (name or spec; default the context's, else
    the `partir_default_hardware` hook's), `seed` (0), `progress` (None: when stderr is a TTY),
    `exploration` (UCT constant, 1.0), `widening` (1.0) and `alpha` (0.5) for progressive
    widening, `rollout_depth` (4), `max_depth` (12 decisions), `min_leaf_bytes` (1024),
    `memory_penalty` (10.0), `atomic` (True: offer atomic actions), `tags` (True: offer tagged
    values), `cache_states` (256 states kept). `budget`: a `Budget(iterations=...,
    seconds=...)` or an int (iterations; default 200)."""

    name = "mcts"
    default_iterations = 200

    def __init__(self, budget: Budget | int | None = None, *, hardware: Any = None, seed: int = 0,
                 progress: bool | None = None, exploration: float = 1.0, widening: float = 1.0,
                 alpha: float = 0.5, rollout_depth: int = 4, max_depth: int = 12,
                 min_leaf_bytes: int = 1024, memory_penalty: float = 10.0, atomic: bool = True,
                 tags: bool = True, cache_states: int = 256):
        self.budget = Budget.parse(budget, self.default_iterations)
        self.options = SpaceOptions(hardware, min_leaf_bytes, memory_penalty, atomic, tags)
        self.seed = seed
        self.progress = progress
        self.exploration = exploration
        self.widening = widening
        self.alpha = alpha
        self.rollout_depth = rollout_depth
        self.max_depth = max_depth
        self.cache_states = cache_states
        self.result: SearchResult | None = None

    # -- states -------------------------------------------------------------------------
    def _state(self, node: _Node) -> PartitionState:
        """The node's state: from the cache, else replayed from its nearest cached ancestor."""
        missing = []
        n = node
        while n.key not in self._cache:
            missing.append(n)
            n = n.parent
        state = self._cache[n.key]
        self._cache.move_to_end(n.key)
        for m in reversed(missing):
            state = self.space.step(state, m.action)
            self._remember(m.key, state)
        return state

    def _remember(self, key: tuple, state: PartitionState) -> None:
        self._cache[key] = state
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_states:
            oldest = next(iter(self._cache))
            if oldest == self._root_key:
                self._cache.move_to_end(oldest)
                continue
            del self._cache[oldest]

    # -- tree ---------------------------------------------------------------------------
    def _prior_order(self, actions: list[Action]) -> list[Action | None]:
        """Untried actions, the next to expand last: "stop" first, then tile actions on the
        largest targets, atomic actions last; ties in a seeded order."""
        ties = {a: self.rng.random() for a in actions}
        ranked = sorted(actions, key=lambda a: (a.dim is None,
                                                -self.space.targets[a.target].nbytes, ties[a]))
        return [*reversed(ranked), None]

    def _uct(self, parent: _Node, child: _Node) -> float:
        exploit = child.total / child.visits / self._best_reward
        return exploit + self.exploration * math.sqrt(math.log(parent.visits + 1)
                                                      / child.visits)

    def _expand(self, node: _Node) -> _Node | None:
        """A new child of `node` from its next untried action (a transposition links the
        node already in the table); None when every untried action changed nothing."""
        while node.untried:
            action = node.untried.pop()
            if action is None:
                child = _Node(node.key, node, None, node.depth, terminal=True)
                node.children[None] = child
                return child
            state = self.space.step(self._state(node), action)
            key = self.space.key(state)
            if key == node.key:
                continue
            child = self._table.get(key)
            if child is None:
                child = self._table[key] = _Node(key, node, action, node.depth + 1)
                self._remember(key, state)
            node.children[action] = child
            return child
        return None

    def _select(self) -> tuple[list[_Node], list[Action]]:
        """The path to a node to evaluate, and the actions along it."""
        node, path, seq = self._root, [self._root], []
        while not node.terminal:
            if node.untried is None:
                at_limit = node.depth >= self.max_depth
                node.untried = [None] if at_limit else self._prior_order(
                    self.space.actions(self._state(node)))
            allowed = 1 + int(self.widening * node.visits ** self.alpha)
            live = [(a, c) for a, c in node.children.items() if not c.exhausted]
            child = None
            if node.untried and (len(node.children) < allowed or not live):
                child = self._expand(node)
            if child is None:
                live = [(a, c) for a, c in node.children.items() if not c.exhausted]
                if not live:
                    node.exhausted = True
                    break
                action, child = max(live, key=lambda ac: self._uct(node, ac[1]))
            else:
                action = next(a for a, c in node.children.items() if c is child)
            path.append(child)
            if action is not None:
                seq.append(action)
            node = child
            if child.visits == 0:
                break
        return path, seq

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
    def _backup(path: list[_Node], reward: float) -> None:
        for n in reversed(path):
            n.visits += 1
            n.total += reward
            if not n.exhausted and n.untried == [] and all(c.exhausted
                                                           for c in n.children.values()):
                n.exhausted = True

    # -- search -------------------------------------------------------------------------
    def search(self, ctx: TacticContext, axes: list[str]) -> SearchResult:
        """Search on `axes`, then apply the best sequence found to `ctx`."""
        self.rng = random.Random(self.seed)
        self.space = space = self.options.space(ctx, axes)
        start = ctx.state.copy()
        self._root_key = space.key(start)
        self._cache: OrderedDict[tuple, PartitionState] = OrderedDict({self._root_key: start})
        self._root = _Node(self._root_key, None, None, 0)
        self._table = {self._root_key: self._root}
        baseline = space.cost(start, self._root_key)
        best_cost, best_seq = baseline, []
        self._best_reward = 1.0
        self.budget.start()
        it = 0
        with progress_bar(self.budget.iterations, self.progress, "AutomaticPartition") as bar:
            while not self._root.exhausted and not self.budget.spent(it):
                path, seq = self._select()
                node = path[-1]
                state = self._state(node)
                tried = [(seq, space.cost(state, node.key))]
                if not node.terminal and not node.exhausted:
                    more, end = self._rollout(state, node.depth)
                    if more:
                        tried.append(([*seq, *more], space.cost(end)))
                improved = False
                for s, cost in tried:
                    if cost < best_cost * (1 - 1e-9) or (cost <= best_cost
                                                         and len(s) < len(best_seq)):
                        best_cost, best_seq, improved = cost, s, True
                reward = baseline / max(min(c for _, c in tried), 1e-30)
                self._best_reward = max(self._best_reward, reward)
                self._backup(path, reward)
                it += 1
                bar.set_postfix(best=f"{best_cost:.3g}s", speedup=f"{baseline / best_cost:.2f}x",
                                refresh=improved)
                bar.update(1)
        self.result = space.apply(best_seq, self.name, best_cost, baseline, it,
                                  self.budget.elapsed())
        log.info("mcts: %d iterations, %d simulations, %d distributions, %.2fs: %s "
                 "(%.3g s -> %.3g s)", it, space.evaluations, len(self._table),
                 self.result.seconds, self.result.actions, baseline, best_cost)
        self._cache.clear()
        self._table.clear()
        return self.result
