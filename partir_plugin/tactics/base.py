"""What a schedule is made of: a `Tactic` has a `name` (its report row) and `apply(ctx)`, which
issues actions on a `TacticContext`; `propagate` runs after it. Three optional steps, no-ops
here, let a tactic act outside its turn:

- `reserve(state)`, for every tactic before the schedule runs (ManualPartition reserves the
  tags it decides, so earlier tactics' propagation stops there);
- `finish(state)`, after the whole schedule (PP checks that data parallelism reached its
  microbatches);
- `trace_hook(mesh)`, a context manager entered while the step is traced (PP substitutes the
  layer loop), or None; what it gives on entering is the tactic that runs on that trace, so
  whatever the trace found stays with that one run (`Traced.tactic_for`), not on the tactic
  object.

The kernel's tactics subclass `Tactic`. A schedule may also hold any object with `name` and
`apply` and any of the optional steps (a third-party tactic through `partir_plugin.extend`),
or a plain function `(ctx) -> None`: `as_tactic` adapts those, once, so the driver never asks
what an entry has.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.actions import TacticContext
    from ..core.mesh import Mesh
    from ..core.state import PartitionState


class Tactic:
    """A schedule entry (see the module docstring); subclasses set `name` and `apply`."""

    name: str

    def apply(self, ctx: TacticContext) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define apply(ctx)")

    def reserve(self, state: PartitionState) -> None:
        """Before the schedule runs (nothing by default)."""

    def finish(self, state: PartitionState) -> None:
        """After the whole schedule (nothing by default)."""

    def trace_hook(self, mesh: Mesh) -> AbstractContextManager[Tactic] | None:
        """A context manager entered while the step is traced, giving the tactic to run on
        that trace; None (the default): the trace is jax's own and this tactic runs as is."""
        return None


@dataclass(frozen=True, eq=False)
class _Adapted(Tactic):
    """A schedule entry that does not subclass `Tactic`: a duck-typed tactic or a function."""

    entry: Any

    @property
    def name(self) -> str:  # type: ignore[override]
        if self._is_function:
            return getattr(self.entry, "__name__", "tactic")
        return self.entry.name

    @property
    def _is_function(self) -> bool:
        return callable(self.entry) and not hasattr(self.entry, "apply")

    def apply(self, ctx: TacticContext) -> None:
        if self._is_function:
            self.entry(ctx)
        else:
            self.entry.apply(ctx)

    def reserve(self, state: PartitionState) -> None:
        self._optional("reserve")(state)

    def finish(self, state: PartitionState) -> None:
        self._optional("finish")(state)

    def trace_hook(self, mesh: Mesh) -> AbstractContextManager[Tactic] | None:
        hook = getattr(self.entry, "trace_hook", None)
        return None if hook is None else _entered(hook(mesh), self)

    def _optional(self, step: str) -> Callable[[PartitionState], None]:
        return getattr(self.entry, step, None) or (lambda _state: None)


@contextlib.contextmanager
def _entered(hook: AbstractContextManager, tactic: Tactic):
    """A third party's hook, entered as it is, giving `tactic` (which keeps its own state,
    as such a tactic always has)."""
    with hook:
        yield tactic


def as_tactic(entry: Any) -> Tactic:
    """`entry` as a `Tactic`: itself if it is one, else adapted (`_Adapted`)."""
    if isinstance(entry, Tactic):
        return entry
    if not (hasattr(entry, "apply") or callable(entry)):
        from ..errors import PartitionError

        raise PartitionError(f"a schedule entry must be a tactic (an object with name and "
                             f"apply(ctx)) or a function (ctx) -> None, got {entry!r}")
    return _Adapted(entry)
