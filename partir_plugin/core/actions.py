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

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.type.shape

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

    def _value(self, target: Value | Leaf | str) -> tuple[Value, str]:
        if isinstance(target, Leaf):
            return target.value, f"argument {target.qualified!r}"
        if isinstance(target, str):
            if target in self.state.tags:
                return self.state.tags[target], f"tag {target!r}"
            raise PartitionError(f"no tagged value named {target!r} (tags: "
                                 f"{sorted(self.state.tags)})")
        return target, repr(target)

    def tile(self, target: Value | Leaf | str, dim: int, axis: str) -> None:
        """tile<value, dim, axis>: slice `value` on `dim` across `axis`."""
        v, what = self._value(target)
        self.state.mesh.check_axis(axis)
        if dim < 0:
            dim += v.type.rank
        if self.state.dim_of(v, axis) == dim:
            return
        self.state.check_divisible(v, dim, axis, what)
        self._touched += self.state.tile_value(v, dim, axis)
        self.actions.append(f"tile<{what}, {dim}, {axis!r}>")

    def atomic(self, target: Value | Leaf | str, axis: str) -> None:
        """atomic<value, axis>: keep `value` replicated on `axis`, blocking propagation."""
        v, what = self._value(target)
        self.state.mesh.check_axis(axis)
        if self.state.dim_of(v, axis) is not None:
            raise PartitionError(f"cannot make {what} atomic on axis {axis!r}: an earlier "
                                 f"action already tiled it on that axis")
        self.state.atomic.add((v, axis))
        self.actions.append(f"atomic<{what}, {axis!r}>")

    def propagate(self) -> None:
        propagate(self.state, seeds=self._touched or None)
        self._touched = []
        self.actions.append("propagate")
