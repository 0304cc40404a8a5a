"""Random draws in a pipelined layer body: each microbatch draws exactly its rows of the draw
the unpipelined step makes over the whole batch (issue 34).

A layer body that draws `jax.random.bernoulli(key, p, h.shape)` (dropout) draws, once
pipelined, with the microbatch's shape: every microbatch would get the same mask, the first
`B/M` rows of nothing in particular. With jax's partitionable threefry (the default,
`jax_threefry_partitionable`), the bits of element `i` of a `random_bits(key, shape)` draw are
`threefry2x32(key, (hi, lo) of i's linear index in shape)` (`jax._src.random.threefry2x32.
_threefry_random_bits_partitionable`), so a microbatch can compute its own elements' bits from
their indices in the whole batch's array, without the whole array: microbatch m of M holds
rows m, m+M, ... (strided), so its local row r along the draw's batch dimension is global row
`r*M + m` (for a dimension that folds the batch with k inner elements, `((r//k)*M + m)*k + r%k`).

`find_draws` matches the `random_bits` equations of the layer traced at two microbatch sizes to
find which dimension of each draw is the batch's; `evaluate` runs the layer's jaxpr with those
draws replaced, inlining the calls (`jit`) that contain one and keeping `jax.checkpoint` as it
was. Draws that cannot be matched (another PRNG implementation, non-partitionable threefry,
draws inside loops or custom derivatives, over 2**32 elements) are refused with a
PartitionError naming the op and its source line: never a silent reuse of one mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

from ...errors import PartitionError

_INLINED = frozenset({"jit", "pjit", "closed_call", "core_call"})
_REMAT = frozenset({"remat2", "checkpoint", "remat"})
# Calls whose jaxpr reads the call's operands positionally, with the same values, and returns
# its results: what an analysis of the layer may follow inside (`layer_program.call_body`).
CALLS = _INLINED | _REMAT


def where(eqn) -> str:
    """`file:line (function)` of the user code that made `eqn`, for messages."""
    from jax._src import source_info_util

    try:
        return source_info_util.summarize(eqn.source_info)
    except Exception:  # noqa: BLE001 -- a message without a line is still a message
        return "an unknown line"


@dataclass(frozen=True)
class Draw:
    """A `random_bits` draw whose shape has the batch: dimension `dim` (of the draw's `shape`
    parameter) holds `rows` microbatch rows, each with `inner` consecutive elements."""

    dim: int
    inner: int


def _sub_jaxprs(eqn) -> list:
    return list(jex_core.jaxprs_in_params(eqn.params))


def _draw_eqns(jaxpr, trail: tuple = ()) -> Iterator[tuple]:
    """Every `random_bits` equation under `jaxpr`, depth first, with the primitives it sits in."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "random_bits":
            yield eqn, trail
        elif eqn.primitive.name == "random_split" or eqn.primitive.name == "random_fold_in":
            yield eqn, trail
        for sub in _sub_jaxprs(eqn):
            yield from _draw_eqns(sub, (*trail, eqn))


def _draw_shape(eqn) -> tuple:
    if eqn.primitive.name == "random_bits":
        return tuple(eqn.params["shape"])
    if eqn.primitive.name == "random_split":
        return tuple(eqn.params["shape"])
    return ()


def find_draws(real, sentinel, rows: int, sentinel_rows: int) -> dict[int, Draw]:
    """The draws of `real` (the layer's jaxpr traced with microbatches of `rows`) whose shape
    has the batch, found by comparing them with the same draws in `sentinel` (traced with
    `sentinel_rows`): keyed by `id` of the equation. Refuses what `evaluate` cannot match."""
    ours, theirs = list(_draw_eqns(real)), list(_draw_eqns(sentinel))
    if len(ours) != len(theirs) or any(
            a.primitive is not b.primitive for (a, _), (b, _) in zip(ours, theirs)):
        first = ours[0][0] if ours else theirs[0][0]
        raise PartitionError(
            f"PP: the layer body draws random numbers ({first.primitive.name} at "
            f"{where(first)}) in a way that changes with the microbatch size; the pipeline "
            f"cannot match its draws to the unpipelined step's")
    found: dict[int, Draw] = {}
    for (eqn, trail), (other, _) in zip(ours, theirs):
        keys, keys_s = eqn.invars[0].aval.shape, other.invars[0].aval.shape
        shape, shape_s = _draw_shape(eqn), _draw_shape(other)
        if keys != keys_s and len(keys) == len(keys_s) and shape == shape_s:
            continue  # one key per row (keys made from the rows): already row by row
        if shape == shape_s and keys == keys_s:
            continue  # no batch in the draw: the same draw as the unpipelined step's
        dims = [d for d, (a, b) in enumerate(zip(shape, shape_s)) if a != b]
        why = None
        if eqn.primitive.name != "random_bits":
            why = (f"{eqn.primitive.name} with a shape that has the batch (one key per "
                   f"example): draw the examples' numbers with one key instead")
        elif len(shape) != len(shape_s) or len(dims) != 1 or keys != keys_s:
            why = "a draw whose shape has the batch in more than one dimension"
        else:
            d = dims[0]
            inner, rem = divmod(shape[d], rows)
            if rem or shape_s[d] != sentinel_rows * inner:
                why = (f"a draw whose dimension {d} ({shape[d]}) is not the microbatch's rows "
                       f"times a fixed number of elements")
            else:
                inside = [e.primitive.name for e in trail
                          if e.primitive.name not in _INLINED | _REMAT]
                if inside:
                    why = (f"a draw inside {inside[0]} (only jit and jax.checkpoint calls "
                           f"around a draw are supported)")
                else:
                    found[id(eqn)] = Draw(d, inner)
        if why:
            raise PartitionError(f"PP: cannot give each microbatch its rows of the random "
                                 f"draw {eqn.primitive.name} at {where(eqn)}: {why}")
    return found


def _check_key(key) -> None:
    impl = getattr(getattr(key, "dtype", None), "_impl", None)
    name = getattr(impl, "name", None)
    if name != "threefry2x32":
        raise PartitionError(
            f"PP: the layer body draws with a {name or 'non-threefry'} PRNG key; a pipelined "
            f"microbatch can draw exactly its rows of the whole batch's numbers only with "
            f"threefry2x32 (jax's default)")
    if not jax.config.jax_threefry_partitionable:
        raise PartitionError(
            "PP: the layer body draws random numbers with jax_threefry_partitionable=False, "
            "whose bits depend on the whole array's size; a pipelined microbatch cannot draw "
            "its rows of them. Set jax.config.update('jax_threefry_partitionable', True) "
            "(jax's default)")


def microbatch_bits(key, *, bit_width: int, shape: Sequence[int], draw: Draw, microbatch,
                    microbatches: int):
    """Rows `microbatch`, `microbatch + microbatches`, ... of `random_bits(key, bit_width,
    full shape)`, where the full shape has `microbatches` times the rows of `shape` along
    `draw.dim`: bit for bit what jax's partitionable threefry draws there."""
    _check_key(key)
    M, d, k = microbatches, draw.dim, draw.inner
    full = list(shape)
    full[d] *= M
    if math.prod(full) >= 2 ** 32:
        raise PartitionError(f"PP: a random draw of {math.prod(full)} elements over the batch "
                             f"(>= 2**32) in the layer body cannot be split by microbatch")
    strides = [math.prod(full[i + 1:]) for i in range(len(full))]
    m = jnp.asarray(microbatch).astype(jnp.uint32)
    lin = jnp.zeros(tuple(shape), jnp.uint32)
    for i, stride in enumerate(strides):
        idx = lax.broadcasted_iota(jnp.uint32, tuple(shape), i)
        if i == d:
            idx = ((idx // k) * M + m) * k + idx % k
        lin = lin + idx * np.uint32(stride)
    data = jax.random.key_data(key)
    hi = jnp.zeros(tuple(shape), jnp.uint32)
    from jax.extend.random import threefry2x32_p

    bits1, bits2 = threefry2x32_p.bind(data[0], data[1], hi, lin)
    dtype = np.dtype(f"uint{bit_width}")
    if bit_width == 64:
        return lax.shift_left(bits1.astype(dtype), jnp.asarray(32, dtype)) | bits2.astype(dtype)
    if bit_width == 32:
        return bits1 ^ bits2
    return (bits1 ^ bits2).astype(dtype)


def _draw(key, draw: Draw, params: dict, microbatch, microbatches: int):
    """One `random_bits` equation's result: keys of any shape, each drawing `shape`."""
    def one(k):
        return microbatch_bits(k, bit_width=params["bit_width"], shape=params["shape"],
                               draw=draw, microbatch=microbatch, microbatches=microbatches)

    for _ in range(key.ndim):
        one = jax.vmap(one)
    return one(key)


def contains(jaxpr, draws: dict[int, Draw]) -> bool:
    return any(id(e) in draws for e, _ in _draw_eqns(jaxpr))


def evaluate(jaxpr, consts: Sequence, args: Sequence, draws: dict[int, Draw], microbatch,
             microbatches: int) -> list:
    """`jax.core.eval_jaxpr(jaxpr, consts, *args)` with every draw of `draws` giving rows
    `microbatch`, `microbatch + microbatches`, ... of the whole batch's draw."""
    if not draws:
        return jex_core.jaxpr_as_fun(jex_core.ClosedJaxpr(jaxpr, consts))(*args)
    from jax._src import source_info_util

    env: dict = {}

    def read(v):
        return v.val if isinstance(v, jex_core.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        with source_info_util.user_context(eqn.source_info.traceback,
                                           name_stack=source_info_util.current_name_stack()
                                           + eqn.source_info.name_stack):
            outs = _eval_eqn(eqn, invals, draws, microbatch, microbatches)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _eval_eqn(eqn, invals: list, draws: dict[int, Draw], microbatch, microbatches: int):
    name = eqn.primitive.name
    if id(eqn) in draws:
        return _draw(invals[0], draws[id(eqn)], eqn.params, microbatch, microbatches)
    subs = _sub_jaxprs(eqn)
    if not any(contains(s, draws) for s in subs):
        return eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
    if name in _INLINED:  # a call: the same numbers inlined
        closed = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        out = evaluate(closed.jaxpr, closed.consts, invals, draws, microbatch, microbatches)
        return out if eqn.primitive.multiple_results else out[0]
    if name in _REMAT:  # jax.checkpoint kept: its policy decides what the backward recomputes
        inner: Callable = lambda m, *a: evaluate(eqn.params["jaxpr"], (), a, draws, m,
                                                 microbatches)
        remat = jax.checkpoint(inner, prevent_cse=eqn.params.get("prevent_cse", True),
                               policy=eqn.params.get("policy"))
        return remat(microbatch, *invals)
    raise PartitionError(f"PP: a random draw inside {name} at {where(eqn)} in the layer body "
                         f"cannot be given each microbatch's rows")
