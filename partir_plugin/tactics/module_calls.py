"""Flax modules selected by name, found while the step is traced (RM's `modules=`).

A tactic that acts on "the calls of these modules" (RM recomputes them) cannot find them in
the traced program: a Flax linen module leaves no boundary in the jaxpr. It finds them while
the step is traced instead: `ModuleCalls` enters `flax.linen.intercept_methods` around the
trace and hands each call of a matching module's `__call__` to the tactic's `wrap`, which
returns the function to run in its place: a function of the module (taking it first, as
Flax's lifted transforms do: `nn.checkpoint(fn)(module, *args)`). A pattern matches a
module's class name or its name (`fnmatch` globs: `"Block"`, `"block_*"`, `"*Attention"`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# A matched call -> the function of (module, *args, **kwargs) that runs instead of it.
Wrap = Callable[["MatchedCall"], Callable[..., Any]]


@dataclass(frozen=True)
class MatchedCall:
    """One call of a selected module: the bound module, its method's function (unbound: call
    it with a module first) and the call's arguments."""

    module: Any
    method: Callable[..., Any]
    args: tuple
    kwargs: dict

    @property
    def label(self) -> str:
        return f"{type(self.module).__name__} {self.module.name!r}"


def matches(module: Any, patterns: tuple[str, ...]) -> bool:
    """Whether `module`'s class name or name matches one of `patterns`."""
    names = (type(module).__name__, getattr(module, "name", None) or "")
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)


@dataclass
class ModuleCalls:
    """A context manager around a trace: every call of a linen module matching `patterns`
    runs `wrap(call)(module, *args, **kwargs)` instead. After the trace, `matched` lists the
    calls' labels in order, `seen` the class names of every module called (for an error
    naming what a pattern could have matched)."""

    patterns: tuple[str, ...]
    wrap: Wrap
    matched: list[str] = field(default_factory=list)
    seen: dict[str, None] = field(default_factory=dict)
    _inside: int = 0  # > 0 while a wrapped call runs its own figures (no re-entry)

    def __enter__(self) -> ModuleCalls:
        import flax.linen as nn

        self._context = nn.intercept_methods(self._intercept)
        self._context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._context.__exit__(*exc)

    def _intercept(self, next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        self.seen.setdefault(f"{type(module).__name__} ({module.name})", None)
        if self._inside or not matches(module, self.patterns):
            return next_fun(*args, **kwargs)
        method = context.orig_method
        method = getattr(method, "func", method)  # Flax binds it to the module: unbind
        call = MatchedCall(module, method, tuple(args), dict(kwargs))
        self.matched.append(call.label)
        self._inside += 1
        try:
            replacement = self.wrap(call)
        finally:
            self._inside -= 1
        return replacement(module, *args, **kwargs)
