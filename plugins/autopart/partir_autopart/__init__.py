"""Built-in automatic partitioning (DESIGN.md §2.6, paper 1 §3, §7.3.1, app. A.5.3).

`AutomaticPartition(axes, budget, searcher="beam" | "mcts" | "greedy", options={...})`
searches `tile`/`atomic` actions on parameter groups (a role across layers with its optimizer
moments, `groups.py`) and tagged values with the analytical
simulator as cost (runtime, penalised when peak memory exceeds the device's), then applies the
best sequence found through the tactic context, so it composes with manual tactics.
"""

from __future__ import annotations

from partir_plugin.extend import hookimpl

from .beam import BeamSearcher
from .greedy import GreedySearcher
from .groups import Group, find_groups
from .mcts import MCTSSearcher
from .space import Action, SearchSpace, Target

__all__ = ["Action", "BeamSearcher", "GreedySearcher", "Group", "MCTSSearcher", "SearchSpace",
           "Target", "find_groups"]


@hookimpl
def partir_add_searchers() -> dict[str, type]:
    return {"mcts": MCTSSearcher, "beam": BeamSearcher, "greedy": GreedySearcher}


@hookimpl
def partir_default_searcher() -> str:
    # Beam: deterministic, and the searcher that reaches the expert schedules on the Fig. 11
    # models (docs/BENCHMARKS.md); MCTS stays available as searcher="mcts".
    return "beam"
