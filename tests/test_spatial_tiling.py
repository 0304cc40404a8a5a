"""Issue 18: spatially tiled convolutions, windows and data movement give jax.jit's numbers
(values and gradients), the issue's case first. Their TMR entries are checked one by one in
tests/test_tmr_verifier.py; here whole programs are partitioned and run."""

from __future__ import annotations

import inspect

import jax
import numpy as np
import pytest
from tmr_corpus import CASES

import partir_plugin as partir


def _check_against_jax_jit(step, args, schedule, mesh):
    f, meta = partir.jit(step, mesh, schedule)
    got = f(*args)
    want = jax.jit(step)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        scale = max(1.0, float(np.abs(np.asarray(w)).max()))
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-4, atol=2e-5 * scale)
    return meta


def test_issue_18_weight_gradient_with_tiled_height():
    def loss(img, ker):
        y = jax.lax.conv_general_dilated(img, ker, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y ** 2).sum()

    step = lambda img, ker: jax.value_and_grad(loss, argnums=(0, 1))(img, ker)
    img = jax.random.normal(jax.random.PRNGKey(0), (2, 32, 32, 4))
    ker = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 4, 8))
    _check_against_jax_jit(step, (img, ker), [partir.ManualPartition({"img": 1}, axis="m")],
                           jax.make_mesh((8,), ("m",)))


SPATIAL = [(c, arg, dim) for c in CASES for arg, dim in c.spatial]


@pytest.mark.parametrize("case,arg,dim", SPATIAL,
                         ids=[f"{c.name}-arg{a}-dim{d}" for c, a, d in SPATIAL])
def test_spatial_tilings_give_jax_jit_numbers(case, arg, dim):
    names = list(inspect.signature(case.loss).parameters)  # value_and_grad keeps them
    schedule = [partir.ManualPartition({names[arg]: dim}, axis="m")]
    _check_against_jax_jit(case.step(), case.args(), schedule, {"m": 4})
