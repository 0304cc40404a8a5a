"""partir_plugin: schedule-driven SPMD partitioning of JAX programs (PartIR) on StableHLO.

    step, meta = partir_plugin.jit(train_step, mesh, schedule=[BP, MP, Z3])

Heavy modules (jax, MLIR) load on first use, so `import partir_plugin` stays fast.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "jit": "api", "reshard": "api", "plan_redistribution": "api", "tag": "markers",
    "roll": "markers",
    "PartitionedFunction": "api", "estimate": "estimation", "Estimate": "estimation",
    "plan": "planner", "Plan": "planner", "Lowered": "stages", "Compiled": "stages",
    "ManualPartition": "tactics.manual", "AutomaticPartition": "tactics.automatic",
    "tactic": "tactics",
    "REPLICATED": "tactics.manual", "FIRST_DIVISIBLE_DIM": "tactics.manual",
    "UNKNOWN": "tactics.manual", "Regather": "spmd.rules.regather",
    "Metadata": "report.metadata", "TacticReport": "report.tactic_report",
    "PartitionError": "errors", "InputMismatchError": "errors",
    "UnevenOutputWarning": "errors", "EstimateWarning": "errors",
    "PartitionWarning": "tactics.manual", "Budget": "tactics.automatic",
    "SearchResult": "tactics.automatic", "Decision": "tactics.automatic",
    "DecisionKind": "tactics.automatic", "FrozenPartition": "tactics.automatic",
    "hookimpl": "plugin.hookspecs",
    "CollectiveRecord": "report.records", "SourceLocation": "report.records",
    "Phase": "report.records", "Reason": "report.records",
}

__all__ = sorted(_EXPORTS)


def lazy_exports(package: str, namespace: dict, exports: dict[str, str]):
    """A module `__getattr__` importing `exports[name]` (a submodule of `package`) on first
    use of `name` and caching it in `namespace`: how a package keeps its import light."""

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(f".{exports[name]}", package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
