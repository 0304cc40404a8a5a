"""partir_plugin: schedule-driven SPMD partitioning of JAX programs (PartIR) on StableHLO.

    step, meta = partir_plugin.jit(train_step, mesh, schedule=[BP, MP, Z3])

Heavy modules (jax, MLIR) load on first use, so `import partir_plugin` stays fast.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "jit": "api", "reshard": "api", "tag": "api", "plan_redistribution": "api",
    "PartitionedFunction": "api", "Compiled": "api",
    "ManualPartition": "tactics", "AutomaticPartition": "tactics", "tactic": "tactics",
    "REPLICATED": "tactics", "FIRST_DIVISIBLE_DIM": "tactics", "UNKNOWN": "tactics",
    "Metadata": "metadata", "TacticReport": "metadata",
    "PartitionError": "errors", "InputMismatchError": "errors",
    "PartitionWarning": "tactics", "Budget": "search",
    "hookimpl": "hookspecs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'partir_plugin' has no attribute {name!r}")
