"""Issue 18: spatially tiled convolutions, windows and data movement give jax.jit's numbers
(values and gradients), the issue's case first. Their TMR entries are checked one by one in
tests/test_tmr_verifier.py; here whole programs are partitioned and run."""

from __future__ import annotations

import inspect

import jax
import pytest
from oracle import assert_matches_jax_jit
from tmr_corpus import CASES

import partir_plugin as partir


def test_issue_18_weight_gradient_with_tiled_height():
    def loss(img, ker):
        y = jax.lax.conv_general_dilated(img, ker, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y ** 2).sum()

    step = lambda img, ker: jax.value_and_grad(loss, argnums=(0, 1))(img, ker)
    img = jax.random.normal(jax.random.PRNGKey(0), (2, 32, 32, 4))
    ker = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 4, 8))
    assert_matches_jax_jit(step, (img, ker), jax.make_mesh((8,), ("m",)),
                           [partir.ManualPartition({"img": 1}, axis="m")])


@pytest.mark.parametrize("groups,height,mesh", [
    (8, 32, {"h": 4, "b": 2}), (4, 30, {"h": 4, "b": 2}), (8, 28, {"h": 8})])
def test_grouped_and_depthwise_convolutions_tile_batch_and_space(groups, height, mesh):
    """A depthwise (MobileNet, ConvNeXt) or grouped convolution keeps the batch and its
    spatial dimensions tiled, with halos, forward and backward: grouped convolutions had no
    entries at all, so BP gathered the batch and a spatial tiling gathered the image
    (helper-21). The groups themselves stay whole (their local count would change)."""
    def step(img, ker):
        def loss(img, ker):
            y = jax.lax.conv_general_dilated(img, ker, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                             feature_group_count=groups)
            return (jax.nn.gelu(y) ** 2).sum()
        return jax.value_and_grad(loss, argnums=(0, 1))(img, ker)

    img = jax.random.normal(jax.random.PRNGKey(0), (4, height, 16, 8))
    ker = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 8 // groups, 16))
    schedule = [partir.ManualPartition({"img": 1}, axis="h")]
    if "b" in mesh:
        schedule.append(partir.ManualPartition({"img": 0}, axis="b"))
    matched = assert_matches_jax_jit(step, (img, ker), mesh, schedule,
                                     uneven_outputs="replicate")
    if height % mesh["h"] == 0:
        counts = matched.meta.tactics[-1].collectives
        assert not counts.get("all_gather") and counts.get("all_permute"), counts


SPATIAL = [(c, arg, dim) for c in CASES for arg, dim in c.spatial]


@pytest.mark.slow  # 45 programs, each compiled with its gradients
@pytest.mark.parametrize("case,arg,dim", SPATIAL,
                         ids=[f"{c.name}-arg{a}-dim{d}" for c, a, d in SPATIAL])
def test_spatial_tilings_give_jax_jit_numbers(case, arg, dim):
    names = list(inspect.signature(case.loss).parameters)  # value_and_grad keeps them
    schedule = [partir.ManualPartition({names[arg]: dim}, axis="m")]
    assert_matches_jax_jit(case.step(), case.args(), {"m": 4}, schedule)


@pytest.mark.slow  # compiles a transformer's gradients
@pytest.mark.parametrize("conflicts", ["redistribute", "stop"])
def test_sequence_tiled_transformer_gradients_equal_jax_jit(conflicts):
    """Context parallelism (the sequence tiled over 4): the loss and every parameter's
    gradient equal the unpartitioned jax.jit's, whether the attention conflicts are resolved
    by redistribution or left to PartIR's stop-and-gather."""
    import functools

    from partir_plugin.models import transformer

    config = transformer.Config.small()
    params, _, batch = transformer.init(config, jax.random.PRNGKey(0))
    grad_step = jax.value_and_grad(functools.partial(transformer.loss_fn, config))

    def step(params, batch):
        return grad_step(params, batch)

    cp = partir.ManualPartition({"batch": 1}, axis="seq", name="CP")
    meta = assert_matches_jax_jit(step, (params, batch), {"seq": 4}, [cp],
                                  conflicts=conflicts).meta
    row = meta.tactics[-1]
    assert bool(row.resolutions) == (conflicts == "redistribute")
    assert bool(row.conflicts) == (conflicts == "stop")
