"""The planner (`partir.plan`): which mesh and schedule to run a step with, chosen by
estimates (`partir.estimate`) over a search space of ordinary schedules (`space`), pruned by
memory bounds (`bounds`), searched within a time budget (`search`)."""

from __future__ import annotations

from .search import Plan, PlanError, Plans, SearchStats, plan

__all__ = ["Plan", "PlanError", "Plans", "SearchStats", "plan"]
