"""The tests' one oracle: a partitioned step gives the unpartitioned `jax.jit(fn)`'s numbers.

Tolerance policy (one for every test). A partitioned program computes the same values as
`jax.jit`, but its sums are split into per-device partial sums added in another order, so
floating-point results differ by rounding. The rounding error of a sum is relative to the
magnitude of its terms, not of its result (an entry near zero can be the difference of large
terms), so every leaf is compared as
    |got - want| <= rtol * |want| + rtol * scale,   scale = max(FLOOR, largest finite |want|)
with `rtol` from the dtype (`RTOL`: float32 1e-5, about 80 ulps) unless a test passes a
looser one with a comment saying why. `FLOOR` keeps a leaf that is zero in exact arithmetic
(rounding noise on both sides) from being compared at zero ulps. NaNs must be NaN on both
sides; integer, boolean and key leaves must be equal; shapes and dtypes must match.
One exception, for a reason of the step's own arithmetic: the parameters a train step
returns beside its Adam state (`adam_step_parameters`) are compared to `ADAM_PARAMS_RTOL`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import partir_plugin as partir

RTOL: dict[np.dtype, float] = {np.dtype(jnp.bfloat16): 1e-2, np.dtype(np.float16): 1e-3,
                               np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}
FLOOR = 1e-3


def dtype_rtol(dtype: np.dtype) -> float:
    """The policy's rtol for a dtype (float32's for one it does not list)."""
    return RTOL.get(dtype, RTOL[np.dtype(np.float32)])


def tolerances(want: np.ndarray, rtol: float | None = None) -> tuple[float, float]:
    """(rtol, atol) for comparing a leaf with `want` (the policy above)."""
    rtol = dtype_rtol(want.dtype) if rtol is None else rtol
    finite = np.abs(want[np.isfinite(want)])
    scale = max(FLOOR, float(finite.max())) if finite.size else FLOOR
    return rtol, rtol * scale


def _leaf_mismatch(g: np.ndarray, w: np.ndarray, rtol: float | None) -> str | None:
    if g.shape != w.shape or g.dtype != w.dtype:
        return f"{g.shape}{g.dtype} vs jax.jit's {w.shape}{w.dtype}"
    if not jnp.issubdtype(w.dtype, jnp.inexact):  # numpy does not count bfloat16 as inexact
        return None if np.array_equal(g, w) else f"{np.sum(g != w)} of {w.size} entries differ"
    if np.iscomplexobj(w):  # real and imaginary parts, each to the policy of its float type
        return _leaf_mismatch(np.stack([g.real, g.imag], -1), np.stack([w.real, w.imag], -1),
                              rtol)
    r, a = tolerances(w, rtol)
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    bad = ~np.isclose(g64, w64, rtol=r, atol=a, equal_nan=True)
    if not bad.any():
        return None
    diff = np.where(bad, np.abs(g64 - w64), -np.inf)
    diff[np.isnan(diff)] = np.inf  # a NaN on one side only
    i = np.unravel_index(np.argmax(diff), diff.shape)
    return (f"{w.shape}: {int(bad.sum())} of {w.size} entries off (rtol={r:.2g}, atol={a:.2g}),"
            f" worst at {i}: got {g[i]!r}, jax.jit {w[i]!r}")


ADAM_PARAMS_RTOL = 1e-4


def adam_step_parameters(want: Any) -> bool:
    """Whether `want` is a train step's `(params, opt_state, ...)` with an Adam state, whose
    parameters (element 0) the policy compares to `ADAM_PARAMS_RTOL`. Why: at step one Adam
    moves an entry by lr * g / (|g| + eps), which multiplies float32 rounding of g by up to
    lr / eps (1e6 at lr 1e-2, eps 1e-8) where g cancels to near eps. The moments, compared to
    the policy, carry g itself; the parameters carry the update's amplification of its
    rounding. Seen on one host: a key kernel entry whose gradient was 1e-7, its moments well
    within the policy, its parameter 1.9e-5 from jax.jit's against the policy's 8.1e-6."""
    if not isinstance(want, tuple) or len(want) < 2:
        return False
    adam = optax.ScaleByAdamState
    return any(isinstance(x, adam) for x in
               jax.tree.leaves(want[1], is_leaf=lambda x: isinstance(x, adam)))


def _words(x: Any) -> np.ndarray:
    """A leaf as numpy; typed PRNG keys (an optimizer's noise key) as their key data."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        x = jax.random.key_data(x)
    return np.asarray(x)


def mismatches(got: Any, want: Any, rtol: float | None = None) -> list[str]:
    """One line per leaf of `got` that is not `want`'s to the policy's tolerance (an Adam
    step's parameters to `ADAM_PARAMS_RTOL` or their dtype's, whichever is looser, unless
    `rtol` is given)."""
    gl, gdef = jax.tree_util.tree_flatten_with_path(got)
    wl, wdef = jax.tree_util.tree_flatten_with_path(want)
    if gdef != wdef:
        return [f"output structure differs:\n got  {gdef}\n want {wdef}"]
    adam = rtol is None and adam_step_parameters(want)
    out = []
    for (path, g), (_, w) in zip(gl, wl, strict=True):
        g, w = _words(g), _words(w)
        leaf_rtol = rtol
        if adam and path and path[0] == jax.tree_util.SequenceKey(0):  # never below the dtype's
            leaf_rtol = max(dtype_rtol(w.dtype), ADAM_PARAMS_RTOL)
        why = _leaf_mismatch(g, w, leaf_rtol)
        if why:
            out.append(f"  {jax.tree_util.keystr(path) or '<root>'} {why}")
    return out


def assert_close(got: Any, want: Any, rtol: float | None = None, what: str = "") -> None:
    """`got` is `want` leaf by leaf, to the policy's tolerance; the message names each leaf
    that differs with its worst entry."""
    bad = mismatches(got, want, rtol)
    assert not bad, f"{what}: {len(bad)} leaves differ from jax.jit's:\n" + "\n".join(bad)


@dataclass(frozen=True)
class Matched:
    """What `assert_matches_jax_jit` ran: the partitioned step, its metadata and both results."""

    step: Callable
    meta: Any
    got: Any
    want: Any


def assert_matches_jax_jit(fn: Callable, args: Sequence, mesh: dict[str, int] | Any,
                           schedule: list, *, gradients: bool = False, rtol: float | None = None,
                           what: str = "", **options) -> Matched:
    """`partir.jit(fn, mesh, schedule, **options)` on `args` gives `jax.jit(fn)`'s outputs;
    with `gradients`, so does `value_and_grad_of(fn)` over every float argument (for a step
    that does not return its gradients itself). The failure message carries the partition's
    report. Returns what ran for `fn`."""
    matched = _matches(fn, args, mesh, schedule, rtol, what, options)
    if gradients:
        floats = [i for i, a in enumerate(args) if jnp.issubdtype(jnp.result_type(a), jnp.floating)]
        _matches(value_and_grad_of(fn, floats), args, mesh, schedule, rtol,
                 f"value and gradients of {what or getattr(fn, '__name__', 'fn')}", options)
    return matched


def _matches(fn: Callable, args: Sequence, mesh: Any, schedule: list, rtol: float | None,
             what: str, options: dict) -> Matched:
    step, meta = partir.jit(fn, mesh, schedule, **options)
    got = step(*args)
    want = jax.jit(fn)(*args)
    bad = mismatches(got, want, rtol)
    if bad:
        tactics = [getattr(t, "name", type(t).__name__) for t in schedule]
        raise AssertionError(f"{what or getattr(fn, '__name__', 'fn')} under {tactics} on {mesh}:"
                             f" {len(bad)} leaves differ from jax.jit's:\n" + "\n".join(bad)
                             + "\n" + meta.report())
    return Matched(step, meta, got, want)


def _mean_sines(outputs: Any) -> jax.Array:
    """A scalar that depends on each entry of every output (not a plain sum, whose gradient
    is all ones and would hide a wrong permutation); integer outputs count in the value."""
    return sum(jnp.mean(jnp.sin(o if jnp.issubdtype(o.dtype, jnp.floating)
                                else o.astype(jnp.float32)))
               for o in jax.tree.leaves(outputs))


def value_and_grad_of(fn: Callable, argnums: Sequence[int]) -> Callable:
    """The value and gradients (`argnums`) of the mean sines of `fn`'s float outputs, so a
    comparison checks the partitioned backward pass too."""
    argnums = tuple(argnums)

    def value_and_grad(*args):
        return jax.value_and_grad(lambda *a: _mean_sines(fn(*a)), argnums=argnums)(*args)

    return value_and_grad


_HLO_KINDS = {"all_reduce": "all-reduce", "all_gather": "all-gather",
              "reduce_scatter": "reduce-scatter", "all_to_all": "all-to-all",
              "all_permute": "collective-permute"}


def hlo_collective_counts(hlo: str) -> dict[str, int]:
    """Collectives in compiled HLO text, by our kind names (async pairs counted once; XLA:CPU
    writes an all_to_all as a tuple-shaped all-to-all of its split pieces)."""
    return {k: len(re.findall(rf"= (?:\S+|\([^()]*\)) {op}(?:-start)?\(", hlo))
            for k, op in _HLO_KINDS.items()}
