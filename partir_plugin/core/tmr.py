"""The tile-mapping registry (TMR, paper 1 §5.2.1).

For every op, a set of entries `(t1⊥, …, tn⊥) -> (σ1, …, σk)`: slicing input i on dimension
`operands[i]` (None: not sliced) lets the op run per tile, producing result j tiled on dimension
`results[j]` or as a partial `Sum` to be reduced. Entries come from the kernel's providers
(`core/rules/`: its own ops, OpenXLA Shardy's op sharding rules, halos, prefix scans, the
embedding lookup) unless a rule registered by a plugin says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..ir.graph import Op

# The reduction of a `Sum` whose partials only the op's own reducer can combine (a variadic
# `reduce` such as argmax: a value and its index): the lowering gathers the k partials and
# runs the reducer over them inside the op, so none stays pending after it.
OWN_REDUCER = "reducer"


@dataclass(frozen=True)
class Sum:
    """A result that each tile computes partially; `reduction` combines the partials."""

    reduction: str  # an `ir.opsets.Reduction` ("add", "max", ...), or OWN_REDUCER

    @property
    def pending(self) -> bool:
        """Do the partials leave the op unreduced (an all_reduce's work, which may wait)?"""
        return self.reduction != OWN_REDUCER

    def __str__(self) -> str:
        return f"sum<{self.reduction}>"


def pending_sums(entry_nest, j: int) -> list[tuple[str, str]]:
    """The (axis, reduction) pairs result j of an op in loop nest `entry_nest` leaves pending."""
    return [(a, e.results[j].reduction) for a, e in entry_nest
            if isinstance(e.results[j], Sum) and e.results[j].pending]


@dataclass(frozen=True)
class TMREntry:
    """One linear-algebra homomorphism of an op.

    `operands` has one item per op input (explicit operands, then implicitly captured values);
    `factor_size` bounds how finely the tiled dimensions may be split (the size of the Shardy
    factor, which is smaller than the dimension for the major part of a reshaped dimension).
    """

    operands: tuple[int | None, ...]
    results: tuple[int | Sum, ...]
    factor_size: int

    def __str__(self) -> str:
        ins = ", ".join("⊥" if d is None else f"tile<{d}>" for d in self.operands)
        outs = ", ".join(str(r) if isinstance(r, Sum) else f"tile<{r}>" for r in self.results)
        return f"({ins}) -> ({outs})"


Rule = Callable[[Op], "list[TMREntry] | None"]
# Given an op and what the providers before it found (None: no entries yet), its entries.
Provider = Callable[[Op, "list[TMREntry] | None"], "list[TMREntry] | None"]


class TileMappingRegistry:
    """Rules by op name, queried by generic propagation. Later registrations win; a rule that
    returns None defers to earlier ones and finally to the `providers`, each in turn given
    what the ones before it found (the kernel's, `core.rules.PROVIDERS`)."""

    def __init__(self, providers: Sequence[Provider] = ()):
        self._rules: dict[str, list[Rule]] = {}
        self._providers = tuple(providers)
        self._cache: dict[Op, list[TMREntry] | None] = {}

    def register(self, op_name: str, rule: Rule) -> None:
        self._rules.setdefault(op_name, []).append(rule)
        self._cache.clear()

    def has_rule(self, op_name: str) -> bool:
        return op_name in self._rules

    def entries(self, op: Op) -> list[TMREntry] | None:
        """The op's entries; None when no rule knows the op (it stays replicated)."""
        if op in self._cache:
            return self._cache[op]
        result = None
        for rule in reversed(self._rules.get(op.name, [])):
            result = rule(op)
            if result is not None:
                break
        if result is None:
            for provide in self._providers:
                result = provide(op, result)
        self._cache[op] = result
        return result

