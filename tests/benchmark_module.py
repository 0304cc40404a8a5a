"""Import a script of `benchmarks/` as a module, for the tests that run a benchmark small (the
scripts import `harness.py` from beside them, so `benchmarks/` is on the path meanwhile)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
