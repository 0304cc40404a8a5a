"""The layer loop: the step's `jax.lax.scan` over stacked layers, found while the step is traced.

Tactics that change how the layer loop runs hook the same patched `jax.lax.scan`: PP
substitutes a pipeline for it (`pipeline_parallel`), RM rematerializes its body
(`rematerialization`), and both together rematerialize each pipeline iteration. Each such
tactic's trace hook is a `LayerLoopHook`; while any is entered, `jax.lax.scan` is
`_dispatching_scan`, which hands the first scan over stacked layers of this context's trace
to the hooks entered for it and every other scan to jax.

The loop's units of work go through the hooks' `remat`, each with its `Unit`: a plain loop's
body is one layer and one iteration of the loop at once; a pipelined loop offers its
iterations (every layer of a stage on a microbatch) and, inside them, each layer, and RM
recomputes the one it was asked for (`unit=`).
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
from jax import lax

from ..errors import PartitionError
from .base import Tactic


class Unit(enum.Flag):
    """What a unit of work of the layer loop is: one layer, one iteration of the loop, or both
    (a plain loop's body)."""

    LAYER = enum.auto()
    ITERATION = enum.auto()


# (the loop's unit of work, how many times the step runs it, what it is in words, which Unit)
# -> the same function, rematerialized
Remat = Callable[[Callable, int, str, Unit], Callable]


def call_site() -> str:
    """`file:line` of the model code that called the scan (the first frame outside jax, flax
    and partir_plugin's own machinery), for messages."""
    import traceback

    skip = ("/jax/", "/flax/", "/jaxlib/", "contextlib.py", "functools.py")
    for frame in reversed(traceback.extract_stack()[:-1]):
        f = frame.filename.replace("\\", "/")
        if any(s in f for s in skip):
            continue
        if "/partir_plugin/" in f and "/partir_plugin/models/" not in f:
            continue
        return f"{frame.filename}:{frame.lineno}"
    return "an unknown line"


def why_not_layer_loop(init, xs) -> str | None:
    """Why a scan is not a loop over stacked layers (None: it is one): every `xs` leaf has
    the same leading (layer) length and the carry holds an array (the activations)."""
    xs_leaves, carry_leaves = jax.tree.leaves(xs), jax.tree.leaves(init)
    if not xs_leaves:
        return "it scans no per-layer inputs (xs)"
    if any(getattr(x, "ndim", 0) < 1 for x in xs_leaves) or len(
            {x.shape[0] for x in xs_leaves}) != 1:
        return "its xs leaves do not share a leading (layer) dimension"
    if not any(getattr(c, "ndim", 0) >= 1 for c in carry_leaves):
        return "its carry holds no array with a batch dimension"
    return None


@dataclass(frozen=True, eq=False)
class LoopRun(Tactic):
    """A layer-loop tactic on one trace (what its hook's `entered` gives): the tactic's
    options, `tactic`, with what that trace found (a subclass's field)."""

    tactic: Any

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.tactic.name


def no_layer_loop(name: str, does: str, passed_over: list[str]) -> PartitionError:
    """The error of a layer-loop tactic `name` on a step with no layer loop; `does` says what
    it does to one ("pipelines", "rematerializes the body of")."""
    return PartitionError(
        f"{name}: no layer loop found: {name} {does} a `jax.lax.scan` over stacked layers "
        f"(parameters with a leading [L] dimension passed as the scan's xs, a batch-major "
        f"carry), as Flax nn.scan, nnx.scan or a plain lax.scan write it; the traced step "
        f"has none" + ("" if not passed_over else " (passed over: " + "; ".join(passed_over)
                       + ")"))


@dataclass
class ScanCall:
    """One call of `jax.lax.scan`, as the model made it; `site` is its line."""

    body: Callable
    init: Any
    xs: Any
    length: int | None = None
    reverse: bool = False
    unroll: int | bool = 1
    kwargs: dict = field(default_factory=dict)
    site: str = ""

    def run(self, body: Callable | None = None) -> Any:
        """The scan as jax runs it, with `body` (default: the model's) as its body."""
        return _SCAN.original(body or self.body, self.init, self.xs, length=self.length,
                              reverse=self.reverse, unroll=self.unroll, **self.kwargs)


class LayerLoopHook:
    """A tactic's trace hook on the layer loop of one trace (a context manager; entering it
    gives the tactic that runs on that trace, `entered`).

    The first scan over stacked layers traced while the hook is entered is its layer loop:
    every open hook is told (`found`) and closes, so scans inside that loop's body and every
    later scan are jax's own; scans passed over before it are recorded with the reason, for
    a "no layer loop found" error. A hook that `substitutes` the loop (PP) runs it; else
    jax's scan does. Either way the loop's unit of work, the body or a pipeline iteration,
    goes through every hook's `remat` (RM's `jax.checkpoint`)."""

    substitutes = False

    def __init__(self) -> None:
        self.open = True
        self.passed_over: list[str] = []

    def entered(self) -> Tactic:
        """The tactic that runs on this trace."""
        raise NotImplementedError(f"{type(self).__name__} must define entered()")

    def found(self, call: ScanCall) -> None:
        """This trace's layer loop is `call` (raise to refuse it)."""

    def remat(self, fn: Callable, trips: int, unit: str, kind: Unit) -> Callable:
        """`fn`, a unit of work of the loop (`unit` says what it is in words, `kind` which
        `Unit`; the step runs it `trips` times), as this hook would have it recomputed
        (itself by default)."""
        return fn

    def substitute(self, call: ScanCall, remat: Remat) -> Any:
        """Run the loop in place of jax's scan, its unit of work wrapped by `remat`."""
        raise NotImplementedError(f"{type(self).__name__} does not substitute the loop")

    def __enter__(self) -> Tactic:
        _SCAN.__enter__()
        traces = _ACTIVE.get()
        # Alone (not inside `one_trace`): a trace of its own.
        self._token = None if traces else _ACTIVE.set(([],))
        self._group = _ACTIVE.get()[-1]
        self._group.append(self)
        return self.entered()

    def __exit__(self, *exc) -> None:
        self._group.remove(self)
        if self._token is not None:
            _ACTIVE.reset(self._token)
        _SCAN.__exit__()


# The layer-loop hooks of the traces running in this context (thread, task), one list per
# trace, the innermost last: the one `jax.lax.scan` wrapper dispatches on the innermost
# trace's hooks, so traces on two threads, or a trace inside another's step, each hook
# their own loop.
_ACTIVE: contextvars.ContextVar[tuple[list[LayerLoopHook], ...]] = contextvars.ContextVar(
    "partir_layer_loop_hooks", default=())


@contextlib.contextmanager
def one_trace():
    """The hooks entered inside belong to one trace (`frontend.trace` enters a schedule's
    hooks so), apart from the hooks of any trace around it."""
    token = _ACTIVE.set((*_ACTIVE.get(), []))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


class _ScanPatch:
    """`jax.lax.scan` replaced by `_dispatching_scan` while any layer-loop hook is entered
    (a count under a lock, so the last hook to leave, on any thread, restores it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.original: Callable = lax.scan

    def __enter__(self) -> None:
        with self.lock:
            if self.users == 0:
                self.original = jax.lax.scan
                jax.lax.scan = _dispatching_scan
            self.users += 1

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0:
                jax.lax.scan = self.original


_SCAN = _ScanPatch()


def original_scan() -> Callable:
    """jax's own `lax.scan` (what a substituted loop runs its inner loops with)."""
    return _SCAN.original


def _dispatching_scan(f, init, xs=None, length=None, reverse=False, unroll=1, **kwargs):
    """`jax.lax.scan` while a hook is entered: the first scan over stacked layers goes to
    this context's open hooks (`LayerLoopHook`), every other to jax."""
    call = ScanCall(f, init, xs, length, reverse, unroll, kwargs)
    traces = _ACTIVE.get()
    hooks = [h for h in traces[-1] if h.open] if traces else []
    if not hooks:
        return call.run()
    call.site = call_site()
    why = why_not_layer_loop(init, xs)
    if why is not None:
        for h in hooks:
            h.passed_over.append(f"the scan at {call.site}: {why}")
        return call.run()
    for h in hooks:
        h.open = False
    for h in hooks:
        h.found(call)

    def remat(fn: Callable, trips: int, unit: str, kind: Unit) -> Callable:
        for h in hooks:
            fn = h.remat(fn, trips, unit, kind)
        return fn

    runners = [h for h in hooks if h.substitutes]
    if len(runners) > 1:
        runs = [h.entered() for h in runners]
        names = " and ".join(f"{r.name} (axis {getattr(r.tactic, 'axis', '?')!r})"
                             for r in runs)
        raise PartitionError(
            f"{names} each pipeline the layer loop at {call.site}: a step's layer loop is "
            f"pipelined by one tactic (for more stages, give one PP a larger axis, or "
            f"`repeats` for a circular schedule)")
    runner = runners[0] if runners else None
    if runner is not None:
        return runner.substitute(call, remat)
    layers = jax.tree.leaves(xs)[0].shape[0]
    return call.run(remat(f, layers, "layer body", Unit.LAYER | Unit.ITERATION))
