"""AutomaticPartition: a searcher plugin chooses the tile/atomic actions (paper 1 §3, §7.3.1),
and what a searcher is given and returns (DESIGN.md §2.6): its budget and its result. Kernel
types, so `AutomaticPartition` checks a budget before any searcher plugin is loaded, and
searchers from any plugin report the same way."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ..errors import PartitionError
from .base import Tactic

if TYPE_CHECKING:
    from ..core.actions import TacticContext


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


class DecisionKind(StrEnum):
    """What a decision does: `tile` a dimension on an axis, or keep the value `atomic`
    (replicated) on it."""

    TILE = "tile"
    ATOMIC = "atomic"


@dataclass(frozen=True)
class Decision:
    """One action a search chose, by name so it replays on any trace of the same function:
    `tile` (on `dim`) or `atomic` (kept replicated) on `axis`, applied to every argument leaf
    in `targets` (qualified names, "params/Block_0/attn/query/kernel"), or with `tag=True` to
    the values tagged `targets[0]`. A group decision names every leaf of the group, so one
    decision covers a role across layers and its optimizer moments."""

    kind: DecisionKind  # a plain "tile" / "atomic" is accepted (pasted `as_code()`)
    targets: tuple[str, ...]
    axis: str
    dim: int | None = None
    tag: bool = False
    label: str = ""  # the group's name, for reading ("*/attn/query/kernel"); not replayed

    def __post_init__(self):
        if (self.kind not in tuple(DecisionKind)
                or (self.kind == DecisionKind.TILE) != (self.dim is not None)):
            raise PartitionError(f"a decision is tile (with a dim) or atomic (without): "
                                 f"{self.kind!r}, dim={self.dim!r}")
        object.__setattr__(self, "kind", DecisionKind(self.kind))

    def apply(self, ctx: TacticContext) -> None:
        """Issue the decision's actions on `ctx` (without propagating)."""
        if self.tag:
            found: list[Any] = list(self.targets)
        else:
            by_name = {lf.qualified: lf for lf in ctx.leaves}
            missing = [t for t in self.targets if t not in by_name]
            if missing:
                raise PartitionError(f"{self}: no argument leaf {missing[0]!r}")
            found = [by_name[t] for t in self.targets]
        for target in found:
            if self.kind == DecisionKind.TILE:
                ctx.tile(target, self.dim, self.axis)
            else:
                ctx.atomic(target, self.axis)

    def target_text(self, quote: bool = True) -> str:
        """What it applies to, for reading: the tag, or the group's label (first leaf) and
        how many leaves it covers."""
        if self.tag:
            return f"tag {self.targets[0]!r}" if quote else f"tag {self.targets[0]}"
        count = f" (x{len(self.targets)})" if len(self.targets) > 1 else ""
        return (self.label or self.targets[0]) + count

    def __str__(self) -> str:
        what = self.target_text()
        if self.kind == DecisionKind.TILE:
            return f"tile {what} dim {self.dim} on {self.axis!r}"
        return f"atomic {what} on {self.axis!r}"

    def as_code(self) -> str:
        extra = (", tag=True" if self.tag else "") + (f", label={self.label!r}"
                                                      if self.label else "")
        return (f"partir.Decision({str(self.kind)!r}, {self.targets!r}, {self.axis!r}, "
                f"{self.dim!r}{extra})")


@dataclass
class FrozenPartition:
    """A searched choice, frozen: replays `decisions` in order, propagating after each as the
    search did, so it gives the distribution (and report) the search gave without searching.
    `SearchResult.as_tactic()` builds one; `as_code()` prints one to paste into a schedule."""

    decisions: list[Decision]
    name: str = "Frozen"

    def apply(self, ctx: TacticContext) -> None:
        for decision in self.decisions:
            decision.apply(ctx)
            ctx.propagate()

    def as_code(self) -> str:
        body = "".join(f"\n    {d.as_code()}," for d in self.decisions)
        return f"partir.FrozenPartition([{body}\n], name={self.name!r})"


@dataclass
class SearchResult:
    """What a search found: the best decisions and their cost against the starting state
    (simulated seconds, with the memory penalty), and what finding them took."""

    actions: list[str]  # the decisions, readable
    cost: float
    baseline_cost: float
    iterations: int
    evaluations: int
    seconds: float
    decisions: list[Decision] = field(default_factory=list)
    searcher: str = ""
    tactic: str = "Auto"  # the AutomaticPartition's name, which a frozen copy keeps

    def as_tactic(self) -> FrozenPartition:
        """A tactic replaying this result: put it where the AutomaticPartition was to keep
        the choice without searching again (same distribution, same report)."""
        return FrozenPartition(list(self.decisions), self.tactic)

    def as_code(self) -> str:
        """`as_tactic()` as Python source, with `import partir_plugin as partir` in scope."""
        return self.as_tactic().as_code()

    def pretty(self) -> str:
        """A small table: the decisions in order, then cost, speed-up and search effort."""
        speedup = self.baseline_cost / self.cost if self.cost else float("inf")
        lines = [f"{self.tactic}: {self.searcher or 'search'} chose {len(self.decisions)} "
                 f"decision(s); {_ms(self.baseline_cost)} -> {_ms(self.cost)} "
                 f"({speedup:.2f}x), {self.iterations} iterations, {self.evaluations} "
                 f"simulations, {self.seconds:.1f} s"]
        rows = [("#", "action", "target", "dim", "axis")]
        for i, d in enumerate(self.decisions):
            rows.append((str(i + 1), d.kind, d.target_text(quote=False),
                         "-" if d.dim is None else str(d.dim),
                         d.axis))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines += ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]
        lines.append("freeze it: result.as_tactic() in place of the AutomaticPartition, or "
                     "paste result.as_code()")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.pretty()


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


@dataclass
class AutomaticPartition(Tactic):
    """Let a searcher plugin choose `tile`/`atomic` actions on `axes` (paper 1 §3, §7.3.1).

    The budget: `budget=200` or `iterations=200` (search iterations), `seconds=30` (wall
    time), or `budget=Budget(iterations=..., seconds=...)`; with both limits the search stops
    at the first reached. Nothing given: the searcher's default iteration count.
    """

    axes: list[str]
    budget: Budget | int | None = None
    searcher: str | None = None  # None: the one `partir_default_searcher` names (beam)
    name: str | None = None
    options: dict = field(default_factory=dict)
    iterations: int | None = None
    seconds: float | None = None

    def __post_init__(self):
        if isinstance(self.axes, str):
            self.axes = [self.axes]
        if self.name is None:
            self.name = "Auto(" + ",".join(self.axes) + ")"
        if self.iterations is not None or self.seconds is not None:
            if self.budget is not None:
                raise PartitionError("give budget= or iterations=/seconds=, not both")
            self.budget = Budget(self.iterations, self.seconds)
        elif self.budget is not None:
            self.budget = Budget.parse(self.budget)  # checked now, not when the schedule runs

    def apply(self, ctx: TacticContext) -> None:
        from ..plugin.manager import default_searcher_name, searchers

        available = searchers()
        name = self.searcher if self.searcher is not None else default_searcher_name()
        if name not in available:
            raise PartitionError(f"no automatic-partitioning searcher {name!r} is "
                                 f"installed (available: {sorted(available) or 'none'})")
        for axis in self.axes:
            ctx.mesh.check_axis(axis)
        result = available[name](budget=self.budget, **self.options).search(ctx, self.axes)
        # The programs a search evaluated, and the searcher, are garbage now (cyclic IR). The
        # schedule pauses the collector and tenures what it allocated (`gc_paused`), which
        # would keep them until the interpreter's next full collection: collect them now.
        gc.collect()
        if isinstance(result, SearchResult):
            result.tactic = self.name
            result.searcher = result.searcher or name
            ctx.search = result
