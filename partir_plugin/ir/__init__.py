"""StableHLO in, StableHLO out: a small Python IR between (DESIGN.md §2.1)."""

from .graph import Block, Func, Op, Region, Value, users_of, walk
from .importer import import_lowered, import_stablehlo
from .printer import print_module
from .types import TensorType

__all__ = ["Block", "Func", "Op", "Region", "TensorType", "Value", "import_lowered",
           "import_stablehlo", "print_module", "users_of", "walk"]
