"""Actions and the context tactics issue them through (paper 1 §3, §5, §8).

A tactic sees the function's arguments by name and key path, and issues `tile`, `atomic` and
(on tagged intermediates) the same actions by tag. `propagate` runs after every tactic.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PartitionError
from ..ir.graph import Value
from .propagation import propagate
from .state import PartitionState


@dataclass(frozen=True)
class Leaf:
    """One array leaf of a function argument."""

    arg: str  # the argument's name
    path: str  # key path inside the argument, joined by "/" ("" for an array argument)
    value: Value
    rank: int | None = None  # of a typed PRNG key array, whose program type adds its words

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape as the user sees it (a scalar key is `()`, not its words)."""
        shape = self.value.type.shape
        return shape if self.rank is None else shape[:self.rank]

    @property
    def qualified(self) -> str:
        return f"{self.arg}/{self.path}" if self.path else self.arg


class TacticContext:
    """What a tactic may do. Actions are recorded in `actions` for the report."""

    def __init__(self, state: PartitionState, leaves: list[Leaf],
                 arg_names: list[str] | None = None, hardware=None):
        self.state = state
        self.leaves = leaves
        self._arg_names = arg_names
        self.hardware = hardware  # the jit's hardware spec (name or object), for searchers
        self.actions: list[str] = []
        self.search = None  # an automatic tactic's SearchResult, for the report
        self.rematerialization = None  # RM's RematerializationFigures, for the report
        self._touched: list[Value] = []

    @property
    def mesh(self):
        return self.state.mesh

    def arg_names(self) -> list[str]:
        if self._arg_names is not None:
            return list(self._arg_names)
        return list(dict.fromkeys(leaf.arg for leaf in self.leaves))

    def leaves_of(self, arg: str) -> list[Leaf]:
        found = [leaf for leaf in self.leaves if leaf.arg == arg]
        if not found and arg not in self.arg_names():
            raise PartitionError(f"unknown argument name {arg!r}; the function's "
                                 f"arguments are {self.arg_names()}")
        return found

    def _targets(self, target: Value | Leaf | str) -> tuple[list[Value], str, bool]:
        """The values an action applies to, how to name them in messages, and whether they
        are tagged (a tag name addresses every value tagged so)."""
        if isinstance(target, Leaf):
            return [target.value], f"argument {target.qualified!r}", False
        if isinstance(target, str):
            return self.state.tagged(target), f"tag {target!r}", True
        return [target], repr(target), False

    def tile(self, target: Value | Leaf | str, dim: int, axis: str) -> None:
        """tile<value, dim, axis>: slice `value` on `dim` across `axis`.

        On a tag, the tag becomes a redistribution point on `axis`: the tagged value takes
        this tiling, the value it names keeps whatever propagation and other tactics give it,
        and the lowering converts between the two (an all_to_all, say). A tag that
        propagation already tiled cannot be decided again: tactics reserve the tags they
        decide before the schedule runs (`ManualPartition.reserve`).
        """
        values, what, tagged = self._targets(target)
        self.state.mesh.check_axis(axis)
        changed = False
        for v in values:
            d = dim + v.type.rank if dim < 0 else dim
            if self.state.dim_of(v, axis) == d or empty_dimension(v, d):
                continue  # an empty dimension has nothing to split: it stays whole
            if tagged:
                self._check_undecided(v, axis, what)
            self.state.check_divisible(v, d, axis, what)
            if tagged:
                self.state.boundaries.add((v.producer, axis))
            self._touched += self.state.tile_value(v, d, axis)
            changed = True
        if changed:
            self.actions.append(f"tile<{what}, {dim}, {axis!r}>")

    def atomic(self, target: Value | Leaf | str, axis: str) -> None:
        """atomic<value, axis>: keep `value` replicated on `axis`, blocking propagation (on a
        tag: the tagged value is replicated whatever the value it names is)."""
        values, what, tagged = self._targets(target)
        self.state.mesh.check_axis(axis)
        for v in values:
            if tagged:
                self._check_undecided(v, axis, what)
            if self.state.dim_of(v, axis) is not None:
                raise PartitionError(f"cannot make {what} atomic on axis {axis!r}: an earlier "
                                     f"action already tiled it on that axis")  # not a tag
            if tagged:
                self.state.boundaries.add((v.producer, axis))
            self.state.atomic.add((v, axis))
        self.actions.append(f"atomic<{what}, {axis!r}>")

    def _check_undecided(self, v: Value, axis: str, what: str) -> None:
        current = self.state.dim_of(v, axis)
        if current is not None and len(self.state.aliases.get(v, (v,))) > 1:
            raise PartitionError(
                f"cannot decide {what} on axis {axis!r}: it is a loop's carry (a while, "
                f"fori_loop or scan body returns it), which has one distribution with the "
                f"loop's operand and result, and that is already tiled on dimension {current} "
                f"(an earlier tiling reached the loop's operand); tile the value the loop "
                f"starts from alike, or tag the loop's result instead")
        if current is not None and (v.producer, axis) in self.state.boundaries:
            raise PartitionError(
                f"cannot decide {what} on axis {axis!r}: an earlier tactic already decided it "
                f"there (dimension {current}); a tag is decided once per axis")
        if current is not None:
            raise PartitionError(
                f"cannot decide {what} on axis {axis!r}: propagation from an earlier tactic "
                f"already tiled it on dimension {current}; reserve the tag (a tactic's "
                f"`reserve(state)`, as ManualPartition's `tags` do) or decide it first")

    def propagate(self) -> None:
        propagate(self.state, seeds=self._touched or None)
        self._touched = []
        self.actions.append("propagate")


def empty_dimension(v: Value, dim: int) -> bool:
    """Is `dim` of `v` a dimension of size 0 (tiling it would leave collectives of empty
    operands, which StableHLO rejects)?"""
    return v.type.is_tensor and 0 <= dim < v.type.rank and v.type.shape[dim] == 0
