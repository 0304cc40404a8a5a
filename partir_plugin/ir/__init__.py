"""The small Python IR (graph, types), its StableHLO importer and its printer; partir's own
vocabulary in StableHLO (`dialect`), the op-name sets the passes share (`opsets`), and the
rewrites the importer runs (`passes`).

Names resolve lazily: `partir_plugin.ir.graph` needs no MLIR, only the importer and printer
do, so the IR's data types load without jaxlib's bindings.
"""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "Block": "graph", "Func": "graph", "Op": "graph", "Region": "graph", "Value": "graph",
    "users_of": "graph", "walk": "graph", "import_lowered": "importer",
    "import_stablehlo": "importer", "print_module": "printer", "TensorType": "types",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
