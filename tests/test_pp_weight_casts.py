"""PP casts mixed-precision weights once per step, not once per microbatch (issue 38: the
per-microbatch weight work that made pipelined GPT steps slower than Megatron-LM's).

A layer written as users write mixed precision (f32 parameters, a bf16 cast at the matmul:
Flax's `dtype=bfloat16`) casts its weights at each call; pipelined, each layer runs once per
microbatch. `pipelined_scan` casts the stacked weights once, outside its loop, and sums the
weight gradients over microbatches in f32 as the per-call cast's transpose did. Checked here:
the same numbers as `lax.scan` / `jax.jit` (the forward pass is the same bits), gradients in
f32, no weight-sized cast left inside the pipeline's loop, and the inputs that may not be
narrowed (read in f32 too, cast twice) are left alone.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from oracle import assert_close, assert_matches_jax_jit

import partir_plugin as partir
from partir_plugin.tactics.pipeline_parallel import pipelined_scan
from partir_plugin.tactics.pipeline_parallel.weight_casts import narrowed_inputs

LAYERS, B, D, F = 4, 16, 16, 32
BF16 = np.dtype(jnp.bfloat16)


def _stack(seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    params = {"w1": jax.random.normal(k[0], (LAYERS, D, F)) / 4,
              "w2": jax.random.normal(k[1], (LAYERS, F, D)) / 6,
              "scale": 1 + jax.random.normal(k[2], (LAYERS, D)) / 10}
    return params, jax.random.normal(k[3], (B, D)), jax.random.normal(k[4], (B, D))


def _layer(h, p):
    """bf16 matmuls on f32 weights (each cast at its use), an f32 scale read as it is."""
    w1, w2 = p["w1"].astype(jnp.bfloat16), p["w2"].astype(jnp.bfloat16)
    u = jnp.tanh(h.astype(jnp.bfloat16) @ w1) @ w2
    return h + u.astype(jnp.float32) * p["scale"], None


def _loss(params, x, y, scan):
    return jnp.mean((scan(_layer, x, params)[0] - y) ** 2)


def _converts_in_loops(jaxpr, inside: bool = False) -> list[tuple]:
    """Shapes of the f32 -> bf16 casts of matrices inside loop bodies of `jaxpr`."""
    found = []
    for eqn in jaxpr.eqns:
        if (inside and eqn.primitive.name == "convert_element_type"
                and eqn.params["new_dtype"] == BF16 and eqn.invars[0].aval.dtype == np.float32
                and eqn.invars[0].aval.ndim >= 2 and eqn.invars[0].aval.shape[-2:] in
                ((D, F), (F, D))):
            found.append(eqn.invars[0].aval.shape)
        loop = inside or eqn.primitive.name in ("scan", "while")
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _converts_in_loops(sub, loop)
    return found


def test_narrowed_inputs_are_the_weights_only_cast_once():
    params, x, _ = _stack()
    layer = jax.tree.map(lambda a: a[0], params)

    def twice(h, p):  # w1 cast at two uses, w2 read in f32 beside its cast
        h16 = h.astype(jnp.bfloat16)
        a = h16 @ p["w1"].astype(jnp.bfloat16) + h16 @ p["w1"].astype(jnp.bfloat16)
        u = (a @ p["w2"].astype(jnp.bfloat16)).astype(jnp.float32)
        return h + u + jnp.sum(p["w2"] ** 2), None

    def checkpointed(h, p):  # the cast inside jax.checkpoint and a nested jit
        return jax.checkpoint(jax.jit(_layer))(h, p)

    def names(f):
        jaxpr = jax.make_jaxpr(f)(x, layer).jaxpr
        keys = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(layer)[0]]
        return {k: d for k, d in zip(keys, narrowed_inputs(jaxpr, 1))}

    assert names(_layer) == {"['scale']": None, "['w1']": BF16, "['w2']": BF16}
    assert names(checkpointed) == {"['scale']": None, "['w1']": BF16, "['w2']": BF16}
    assert names(twice) == {"['scale']": None, "['w1']": None, "['w2']": None}


def test_pipelined_bf16_layers_cast_their_weights_outside_the_loop():
    params, x, y = _stack()
    pipelined = lambda f, c, xs: pipelined_scan(f, c, xs, stages=2, microbatches=4)  # noqa: E731
    grad = jax.value_and_grad(_loss)
    got = jax.jit(grad, static_argnums=3)(params, x, y, pipelined)
    want = jax.jit(grad, static_argnums=3)(params, x, y, lax.scan)
    assert_close(got, want, rtol=2e-2)  # bf16 matmuls, microbatched sums in another order
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(got[1]))
    # The pipeline's loop (forward and backward) casts no weight: the stack is cast once.
    assert _converts_in_loops(jax.make_jaxpr(grad, static_argnums=3)(
        params, x, y, pipelined).jaxpr) == []
    # Without the hoist, the plain scan casts each layer's weights in its loop (the check
    # can fail).
    assert _converts_in_loops(jax.make_jaxpr(grad, static_argnums=3)(
        params, x, y, lax.scan).jaxpr)


# -- a Flax bf16 LM (dtype=bfloat16, f32 parameters) under partir.jit ------------------------

class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        h = nn.LayerNorm(dtype=jnp.bfloat16, name="ln")(x)
        h = nn.Dense(F, dtype=jnp.bfloat16, name="up")(h)
        return x + nn.Dense(D, dtype=jnp.bfloat16, name="down")(nn.gelu(h)), None


class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        blocks = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                         in_axes=nn.broadcast, length=LAYERS)(name="blocks")
        return blocks(x, None)[0].astype(jnp.float32)


@pytest.mark.slow  # compiles a pipelined Flax step (about 15 s)
@pytest.mark.parametrize("rm", [{"unit": "layer"},
                                pytest.param({"modules": "Block"},
                                             marks=pytest.mark.exhaustive)],
                         ids=["unit=layer", "modules=Block"])
def test_flax_bf16_lm_under_pp_bp_rm_gives_jax_jit_numbers(rm):
    """The cast weights under each layer's recomputation (RM each layer of each iteration,
    by unit or by module): jax.jit's numbers, f32 gradients."""
    _, x, y = _stack()
    x = x.reshape(B, 1, D)
    params = Model().init(jax.random.PRNGKey(0), x)["params"]

    def step(params, x):
        def loss(params):
            return optax.l2_loss(Model().apply({"params": params}, x), y[:, None]).mean()

        return jax.value_and_grad(loss)(params)

    matched = assert_matches_jax_jit(
        step, (params, x), {"stage": 2, "batch": 2},
        [partir.tactic("PP", axis="stage", microbatches=4),
         partir.tactic("BP", axis="batch", inputs=("x",)),
         partir.tactic("RM", policy="full", **rm)],
        rtol=2e-2, what=f"bf16 nn.scan LM [PP(4), BP, RM({rm})]")
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(matched.got[1]))
