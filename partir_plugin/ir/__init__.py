"""The small Python IR (graph, types), its StableHLO importer and its printer.

Names resolve lazily: `partir_plugin.ir.graph` needs no MLIR, only the importer and printer
do, so the IR's data types load without jaxlib's bindings.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Block": "graph", "Func": "graph", "Op": "graph", "Region": "graph", "Value": "graph",
    "users_of": "graph", "walk": "graph", "import_lowered": "importer",
    "import_stablehlo": "importer", "print_module": "printer", "TensorType": "types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'partir_plugin.ir' has no attribute {name!r}")
