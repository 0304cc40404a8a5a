"""Reductions over a tiled dimension, every reducer jax emits in every dtype it applies to,
on an even and on a padded tiling: partials combined across devices give jax.jit's numbers.

XLA's all-reduce computes sums, products, maxima and minima, and and/or of booleans only: a
bitwise and/or of integers (`lax.reduce(x, 0, lax.bitwise_or, ...)`) crashed at run time
("Unsupported reduction computation") until the partials of such a reduction were gathered
and reduced locally. Padding masked with a complex identity crashed MLIR's parser.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from oracle import assert_matches_jax_jit

import partir_plugin as partir

pytestmark = pytest.mark.slow  # two dozen partitions, each compiled

FLOATS = ["float32", "bfloat16", "float16"]
INTEGERS = ["int8", "uint8", "int16", "uint16", "int32", "uint32"]


def _all_ones(dtype) -> np.ndarray:
    return np.array(np.iinfo(dtype).max if np.dtype(dtype).kind == "u" else -1, dtype)


def reductions(dtype: str):
    """A function of one [n, 3] array returning every reduction over its dimension 0 that
    jax applies to `dtype`."""
    kind = np.dtype(jnp.dtype(dtype)).kind

    def fn(arg0):  # the name `oracle.value_and_grad_of` gives its arguments
        a = arg0
        out = {"max": jnp.max(a, 0), "min": jnp.min(a, 0)} if kind != "c" else {}
        if kind == "b":
            return {**out, "any": jnp.any(a, 0), "all": jnp.all(a, 0),
                    "or": lax.reduce(a, np.array(False), lax.bitwise_or, (0,))}
        out.update(sum=jnp.sum(a, 0), prod=jnp.prod(a, 0), argmax=jnp.argmax(jnp.abs(a), 0))
        if kind in "iu":
            out.update(
                bit_or=lax.reduce(a, np.array(0, a.dtype), lax.bitwise_or, (0,)),
                bit_and=lax.reduce(a, _all_ones(a.dtype), lax.bitwise_and, (0,)),
                bit_xor=lax.reduce(a, np.array(0, a.dtype), lax.bitwise_xor, (0,)))
        return out

    return fn


def sample(dtype: str, rows: int) -> jax.Array:
    rng = np.random.default_rng(rows)
    kind = np.dtype(jnp.dtype(dtype)).kind
    if kind == "b":
        return jnp.asarray(rng.integers(0, 2, (rows, 3)).astype(bool))
    if kind == "c":
        return jnp.asarray((rng.normal(size=(rows, 3)) + 1j * rng.normal(size=(rows, 3)))
                           .astype(dtype) * 0.5)
    if kind == "f":
        return jnp.asarray(rng.uniform(0.5, 1.5, (rows, 3)) * rng.choice([-1, 1], (rows, 3)),
                           dtype)
    high = 4 if dtype in ("int8", "uint8") else 1 << 12  # products stay in range
    values = rng.integers(0, high, (rows, 3))
    if kind == "i":
        values = values * rng.choice([-1, 1], (rows, 3))
    return jnp.asarray(values.astype(dtype))


@pytest.mark.filterwarnings("ignore::partir_plugin.UnevenOutputWarning")  # the padded gradient
@pytest.mark.parametrize("rows", [8, 12], ids=["even", "padded"])
@pytest.mark.parametrize("dtype", [*FLOATS, *INTEGERS, "bool", "complex64"])
def test_reductions_over_a_tiled_dimension(dtype, rows):
    x = sample(dtype, rows)
    rtol = 5e-2 if dtype in ("bfloat16", "float16") else None  # 12-term products
    assert_matches_jax_jit(reductions(dtype), [x], {"a": 8},
                           [partir.ManualPartition({"arg0": 0}, axis="a")], rtol=rtol,
                           gradients=dtype == "float32", uneven_outputs="replicate")


def test_bitwise_or_partials_gathered_not_all_reduced():
    """The partials of a bitwise or are all-gathered over the tiling axes and reduced on
    each device, on a 2-D mesh where the sum's consumer tiles it further (with and without
    `scatter_sums`)."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.integers(0, 1 << 20, (8, 16)).astype(np.int32))
    b = jnp.asarray(rng.integers(0, 5, (16,)).astype(np.int32))

    def fn(a, b):
        return lax.reduce(a, np.int32(0), lax.bitwise_or, (0,)) * b

    for scatter_sums in (False, True):
        matched = assert_matches_jax_jit(
            fn, [a, b], {"x": 4, "y": 2},
            [partir.ManualPartition({"a": 0, "b": 0}, axis="x")], scatter_sums=scatter_sums)
        counts = matched.meta.tactics[-1].collectives
        assert counts["all_gather"] == 1 and counts["all_reduce"] == 0, counts
