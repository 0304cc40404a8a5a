"""Flax modules selected by name, found while the step is traced (RM's `modules=`).

A tactic that acts on "the calls of these modules" (RM recomputes them) cannot find them in
the traced program: a Flax module leaves no boundary in the jaxpr. It finds them while the
step is traced instead: `ModuleCalls` enters `flax.linen.intercept_methods` around the trace
and hands each call of a matching linen module's `__call__` to the tactic's `wrap`, which
returns the function to run in its place: a function of the module (taking it first, as
Flax's lifted transforms do: `nn.checkpoint(fn)(module, *args)`). A pattern matches a linen
module's class name or its name (`fnmatch` globs: `"Block"`, `"block_*"`, `"*Attention"`).
NNX has no method interceptor: while the trace runs, each `flax.nnx.Module` class whose name
matches has its `__call__` replaced by one that does the same (NNX modules have no names).
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Iterator
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
        name = getattr(self.module, "name", None)
        return type(self.module).__name__ + (f" {name!r}" if isinstance(name, str) else "")


def matches(module: Any, patterns: tuple[str, ...]) -> bool:
    """Whether `module`'s class name or name matches one of `patterns`."""
    names = (type(module).__name__, getattr(module, "name", None) or "")
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)


@dataclass
class ModuleCalls:
    """A context manager around a trace: every call of a Flax module (linen or NNX) matching
    `patterns` runs `wrap(call)(module, *args, **kwargs)` instead. After the trace, `matched`
    lists the calls' labels in order, `seen` the class names of every linen module called (for
    an error naming what a pattern could have matched)."""

    patterns: tuple[str, ...]
    wrap: Wrap
    matched: list[str] = field(default_factory=list)
    seen: dict[str, None] = field(default_factory=dict)
    _inside: int = 0  # > 0 while a wrapped call runs its own figures (no re-entry)

    def __enter__(self) -> ModuleCalls:
        import flax.linen as nn

        self._context = nn.intercept_methods(self._intercept)
        self._context.__enter__()
        self._patched = self._patch_nnx()
        return self

    def __exit__(self, *exc) -> None:
        for cls, own in reversed(self._patched):
            if own is None:
                del cls.__call__
            else:
                cls.__call__ = own
        self._context.__exit__(*exc)

    def _patch_nnx(self) -> list[tuple[type, Any]]:
        """Replace `__call__` of every NNX module class whose name matches (its own
        `__call__`, or None where it inherits one, for `__exit__` to put back)."""
        from flax import nnx

        patched = []
        for cls in _subclasses(nnx.Module):
            # the instances' __call__ (its class's or inherited), not the metaclass's
            method = next((c.__dict__["__call__"] for c in cls.__mro__
                           if "__call__" in c.__dict__), None)
            if method is None or not any(fnmatch.fnmatchcase(cls.__name__, p)
                                         for p in self.patterns):
                continue
            patched.append((cls, cls.__dict__.get("__call__")))
            cls.__call__ = self._nnx_call(cls, method)
        return patched

    def _nnx_call(self, cls: type, method: Callable) -> Callable:
        """`cls.__call__` while the trace runs: a call of a `cls` instance (not of a subclass
        that inherits it) goes through `wrap`, as `_intercept` does for linen."""

        @functools.wraps(method)
        def call(module, *args, **kwargs):
            if self._inside or type(module) is not cls:
                return method(module, *args, **kwargs)
            return self._run(MatchedCall(module, method, tuple(args), dict(kwargs)))

        return call

    def _run(self, call: MatchedCall) -> Any:
        """Record `call` and run what `wrap` returns in its place."""
        self.matched.append(call.label)
        self._inside += 1
        try:
            replacement = self.wrap(call)
        finally:
            self._inside -= 1
        return replacement(call.module, *call.args, **call.kwargs)

    def _intercept(self, next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        self.seen.setdefault(f"{type(module).__name__} ({module.name})", None)
        if self._inside or not matches(module, self.patterns):
            return next_fun(*args, **kwargs)
        method = context.orig_method
        method = getattr(method, "func", method)  # Flax binds it to the module: unbind
        return self._run(MatchedCall(module, method, tuple(args), dict(kwargs)))


def _subclasses(cls: type) -> Iterator[type]:
    """Every subclass of `cls`, however deep, once."""
    seen: set[type] = set()
    stack = list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        if sub not in seen:
            seen.add(sub)
            yield sub
            stack.extend(sub.__subclasses__())
