"""The importer's rewrites of the imported program as a small typed pipeline (in the style of
xDSL's `ModulePass`: a frozen dataclass with a `name` and an `apply`).

Each pass says which ops make it worth its walk over the program (`wanted`, from the op
names the import saw), so a program with no select_and_scatter never pays for looking for
one; the pipeline runs the wanted passes in its order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Set
from dataclasses import dataclass
from typing import ClassVar

from ..graph import Func


class FuncPass(ABC):
    """One rewrite of an imported function, in place."""

    name: ClassVar[str]

    @abstractmethod
    def wanted(self, seen: Set[str]) -> bool:
        """Can the pass change a program whose ops have the names `seen`?"""

    @abstractmethod
    def apply(self, func: Func) -> None:
        """Rewrite `func` (its regions included)."""


@dataclass(frozen=True)
class Pipeline:
    """Passes run in order, each where the program has the ops it rewrites."""

    passes: tuple[FuncPass, ...]

    def run(self, func: Func, seen: Set[str]) -> None:
        for p in self.passes:
            if p.wanted(seen):
                p.apply(func)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.passes)
