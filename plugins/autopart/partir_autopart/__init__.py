"""Built-in automatic partitioning (DESIGN.md §2.6, paper 1 §3, §7.3.1, app. A.5.3).

`AutomaticPartition(axes, budget, searcher="mcts" | "greedy", options={...})` searches
`tile<leaf, dim, axis>` actions on the function's argument leaves with the analytical
simulator as cost (runtime, penalised when peak memory exceeds the device's), then applies the
best sequence found through the tactic context, so it composes with manual tactics.
"""

from __future__ import annotations

from partir_plugin.extend import hookimpl

from .greedy import GreedySearcher
from .mcts import MCTSSearcher
from .space import Action, SearchSpace

__all__ = ["Action", "GreedySearcher", "MCTSSearcher", "SearchSpace"]


@hookimpl
def partir_add_searchers() -> dict[str, type]:
    return {"mcts": MCTSSearcher, "greedy": GreedySearcher}


@hookimpl
def partir_default_searcher() -> str:
    return "mcts"
