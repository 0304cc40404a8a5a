"""What an automatic-partitioning searcher is given and returns (DESIGN.md §2.6): its budget
and its result. Kernel types, so `AutomaticPartition` checks a budget before any searcher
plugin is loaded, and searchers from any plugin report the same way."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .errors import PartitionError


@dataclass
class Budget:
    """At most `iterations` search iterations and/or `seconds` of wall time (None: no limit
    of that kind; both None: the searcher's default iteration count).

    `AutomaticPartition(axes, budget=200)` means 200 iterations; a time limit is written
    `seconds=30` or `budget=Budget(seconds=30)`. A bare float is refused: `budget=1.5` read
    as seconds while `budget=2` read as iterations was a trap.
    """

    iterations: int | None = None
    seconds: float | None = None
    _t0: float = field(default=0.0, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.iterations is not None and (isinstance(self.iterations, bool)
                                            or not isinstance(self.iterations, int)):
            raise PartitionError(f"budget iterations must be an int, got {self.iterations!r}")
        if self.seconds is not None and (isinstance(self.seconds, bool)
                                         or not isinstance(self.seconds, (int, float))):
            raise PartitionError(f"budget seconds must be a number, got {self.seconds!r}")
        for what, value in (("iterations", self.iterations), ("seconds", self.seconds)):
            if value is not None and not value > 0:
                raise PartitionError(f"budget {what} must be positive, got {value!r}")

    @classmethod
    def parse(cls, budget: Budget | int | dict | None, default_iterations: int | None = None,
              ) -> Budget:
        """`None` (the searcher's default iterations), an int (iterations), a `Budget`, or a
        dict with keys `iterations` and/or `seconds`."""
        if budget is None:
            return cls(default_iterations, None)
        if isinstance(budget, Budget):
            if budget.iterations is None and budget.seconds is None:
                return cls(default_iterations, None)
            return cls(budget.iterations, budget.seconds)
        if isinstance(budget, bool):
            raise PartitionError(f"budget must be an int (iterations) or a Budget, not "
                                 f"{budget!r}")
        if isinstance(budget, int):
            return cls(budget, None)
        if isinstance(budget, float):
            raise PartitionError(f"budget={budget!r} is ambiguous: an int budget counts "
                                 f"iterations; for a time limit write seconds={budget!r} or "
                                 f"budget=Budget(seconds={budget!r})")
        if isinstance(budget, dict):
            unknown = sorted(set(budget) - {"iterations", "seconds"})
            if unknown:
                raise PartitionError(f"unknown budget keys {unknown} (use 'iterations' and/or "
                                     f"'seconds')")
            return cls(budget.get("iterations"), budget.get("seconds"))
        raise PartitionError(f"budget must be an int (iterations), a Budget(iterations=..., "
                             f"seconds=...) or a dict; got {budget!r}")

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def spent(self, iterations: int) -> bool:
        if self.iterations is not None and iterations >= self.iterations:
            return True
        return self.seconds is not None and self.elapsed() >= self.seconds


@dataclass
class SearchResult:
    """What a search found: the best action sequence and its cost against the starting one."""

    actions: list[str]
    cost: float
    baseline_cost: float
    iterations: int
    evaluations: int
    seconds: float
