"""jax idioms users write in a train step, each partitioned with the batch tiled, and with
ZeRO-3, against jax.jit: loss and the SGD-updated parameters.

Written as a user's checklist (control flow, sorting, scans, indexing with out-of-range
indices, random numbers, mixed precision, complex numbers, optimizer wrappers), not from the
lowering's code. The nineteenth session's sweep of these found three crashes (host callbacks,
complex constants, jax.shard_map), each with its own test elsewhere; these guard the rest.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from oracle import assert_matches_jax_jit

import partir_plugin as partir

BP = partir.ManualPartition({"batch": 0, "labels": 0}, axis="data")
Z3 = partir.ManualPartition({"params": partir.FIRST_DIVISIBLE_DIM}, axis="data")


def _h(p, batch):
    return batch @ p["w"] + p["b"]


# name -> loss(params, batch, labels); batch [16, 32], labels int32 [16], w [32, 32], b [32]
LOSSES = {
    "cond": lambda p, b, y: jax.lax.cond(jnp.sum(b) > 0, lambda: jnp.sum(jnp.tanh(_h(p, b))),
                                         lambda: jnp.sum(jnp.cos(_h(p, b)))),
    "while with a data-dependent exit": lambda p, b, y: jnp.sum(jax.lax.stop_gradient(
        jax.lax.while_loop(lambda c: (c[0] < 4) & (jnp.sum(c[1]) < 1e6),
                           lambda c: (c[0] + 1, jnp.tanh(c[1] @ p["w"])), (0, b))[1]))
        + jnp.sum(_h(p, b) ** 2),
    "sort with a payload": lambda p, b, y: jnp.sum(
        jax.lax.sort((_h(p, b), b), num_keys=1)[1] * _h(p, b)),
    "argsort and take_along_axis": lambda p, b, y: jnp.sum(
        jnp.take_along_axis(_h(p, b), jnp.argsort(b, axis=0), axis=0) ** 2),
    "cumsum over the batch": lambda p, b, y: jnp.sum(jnp.cumsum(_h(p, b), axis=0) ** 2),
    "cumprod": lambda p, b, y: jnp.sum(jnp.cumprod(jnp.tanh(_h(p, b)) * 0.5 + 1, axis=0)),
    "checkpoint with a policy": lambda p, b, y: jnp.sum(jax.checkpoint(
        lambda q: jnp.tanh(b @ q["w"]) @ q["w"],
        policy=jax.checkpoint_policies.dots_saveable)(p) ** 2),
    "top_k": lambda p, b, y: jnp.sum(jax.lax.top_k(_h(p, b), 4)[0]),
    "roll over the batch": lambda p, b, y: jnp.sum(jnp.roll(_h(p, b), 3, axis=0) * b),
    "flip over the batch": lambda p, b, y: jnp.sum(jnp.flip(_h(p, b), axis=0) * b),
    "pad with a negative edge": lambda p, b, y: jnp.sum(
        jax.lax.pad(_h(p, b), 0.0, [(-1, 2, 0), (0, 0, 0)]) ** 2),
    "interior padding": lambda p, b, y: jnp.sum(
        jax.lax.pad(_h(p, b), 1.0, [(0, 0, 1), (0, 0, 0)]) ** 2),
    "dynamic_update_slice into the batch": lambda p, b, y: jnp.sum(
        jax.lax.dynamic_update_slice(_h(p, b), jnp.ones((4, 32)), (jnp.int32(5), 0)) ** 2),
    "scatter-add of rows": lambda p, b, y: jnp.sum(
        jnp.zeros((16, 32)).at[jnp.array([0, 3, 3, 15])].add(_h(p, b)[:4]) ** 2),
    "take clipped and filled": lambda p, b, y: jnp.sum(
        jnp.take(_h(p, b), jnp.array([0, 40, -3]), axis=0, mode="clip")) + jnp.sum(
        jnp.take(_h(p, b), jnp.array([0, 40, 3]), axis=0, mode="fill", fill_value=0.0)),
    "segment_sum by label": lambda p, b, y: jnp.sum(
        jax.ops.segment_sum(_h(p, b), y % 4, num_segments=4) ** 2),
    "softmax over the batch": lambda p, b, y: jnp.sum(jax.nn.softmax(_h(p, b), axis=0) * b),
    "median": lambda p, b, y: jnp.sum(jnp.median(_h(p, b), axis=0)),
    "associative_scan": lambda p, b, y: jnp.sum(
        jax.lax.associative_scan(jnp.add, jnp.tanh(_h(p, b)), axis=0)),
    "random numbers from a folded key": lambda p, b, y: jnp.sum(
        jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(3), 7), (16, 32)) * _h(p, b)),
    "bfloat16 matmul": lambda p, b, y: jnp.sum(jnp.tanh(
        b.astype(jnp.bfloat16) @ p["w"].astype(jnp.bfloat16)).astype(jnp.float32)),
    "complex values": lambda p, b, y: jnp.sum(
        jnp.abs(jnp.fft.fft(_h(p, b).astype(jnp.complex64) * (1 + 2j), axis=1)) ** 2),
    "cross entropy with integer labels": lambda p, b, y: jnp.mean(
        optax.softmax_cross_entropy_with_integer_labels(_h(p, b), y)),
    "one_hot labels": lambda p, b, y: jnp.sum(jax.nn.one_hot(y, 32) * jax.nn.log_softmax(
        _h(p, b))),
}

def _step(loss):
    def step(params, batch, labels):
        value, grads = jax.value_and_grad(loss)(params, batch, labels)
        grads = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())[0]
        return value, jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)
    return step


def _args():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w": jax.random.normal(k[0], (32, 32)) * 0.2,
              "b": jax.random.normal(k[1], (32,)) * 0.1}
    return params, jax.random.normal(k[2], (16, 32)), jnp.arange(16, dtype=jnp.int32) * 5 % 32


@pytest.mark.parametrize("name", list(LOSSES))
def test_an_idiom_partitioned_by_the_batch_gives_jax_jits_numbers(name):
    assert_matches_jax_jit(_step(LOSSES[name]), _args(), {"data": 8}, [BP], what=name)


@pytest.mark.parametrize("name", list(LOSSES))
def test_an_idiom_with_zero3_gives_jax_jits_numbers(name):
    assert_matches_jax_jit(_step(LOSSES[name]), _args(), {"data": 8}, [BP, Z3], what=name)


@pytest.mark.parametrize("transform,data", [
    ("adamw with a mask", 8), ("lamb", 8), ("adafactor", 8), ("MultiSteps", 8),
    ("noisy_sgd", 2)])
def test_optimizers_that_reduce_over_parameters_with_zero3(transform, data):
    """Trust ratios and factored moments reduce over a parameter's dimensions, which ZeRO-3
    tiles: partial sums the partitioner must complete. noisy_sgd keeps a typed PRNG key in
    its state, a scalar whose program type is its 2 uint32 words: ZeRO on 2 devices tiled
    those, and jax refused the rank-1 spec on a rank-0 key (helper-23)."""
    opt = {"adamw with a mask": optax.adamw(1e-2, weight_decay=0.1,
                                            mask=lambda p: jax.tree.map(lambda a: a.ndim > 1, p)),
           "lamb": optax.lamb(1e-2), "adafactor": optax.adafactor(1e-2),
           "MultiSteps": optax.MultiSteps(optax.sgd(1e-1, momentum=0.9), every_k_schedule=2),
           "noisy_sgd": optax.noisy_sgd(1e-1, eta=0.01, seed=3),
           }[transform]
    loss = LOSSES["cross entropy with integer labels"]

    def step(params, opt_state, batch, labels):
        value, grads = jax.value_and_grad(loss)(params, batch, labels)
        updates, opt_state = opt.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    params, batch, labels = _args()
    # A rule over leaves sees a scalar key as the user does, shape () (not its 2 words).
    state_dims = ((lambda path, shape: 0 if shape else None) if transform == "noisy_sgd"
                  else partir.FIRST_DIVISIBLE_DIM)
    zero3 = partir.ManualPartition({"params": partir.FIRST_DIVISIBLE_DIM,
                                    "opt_state": state_dims}, axis="data")
    assert_matches_jax_jit(step, (params, opt.init(params), batch, labels), {"data": data},
                           [BP, zero3], what=transform)


def test_vmapped_dynamic_slices_keep_whole_dimensions_tiled():
    """`jax.vmap` of `dynamic_slice`/`dynamic_update_slice` (a per-row KV-cache write, a
    per-stage buffer slot) is a gather/scatter whose index vector names every dimension,
    most with a slice or window spanning the whole dimension. Those tile as pass-throughs:
    each device reads and writes its own columns, with starts that are out of range and
    negative, on even and padded tiles; before, every tile was all-gathered."""
    import numpy as np
    from jax import lax

    def write(arg0, arg1, arg2):
        def one(cache, new, t):
            old = lax.dynamic_slice(cache, (t, 0), (1, cache.shape[1]))
            return lax.dynamic_update_slice(cache, jnp.tanh(new[None] + old), (t, 0)), old
        return jax.vmap(one)(arg0, arg1, arg2)

    rng = np.random.default_rng(0)
    for heads, mesh in ((16, {"data": 4}), (13, {"data": 4}), (8, {"data": 2, "model": 4})):
        cache = rng.normal(size=(4, 6, heads)).astype(np.float32)
        new = rng.normal(size=(4, heads)).astype(np.float32)
        starts = np.array([0, 9, -2, 3], np.int32)
        schedule = [partir.ManualPartition({"arg0": 2, "arg1": 1}, axis="data")]
        if "model" in mesh:
            schedule.append(partir.ManualPartition({"arg0": 0, "arg1": 0, "arg2": 0},
                                                   axis="model"))
        matched = assert_matches_jax_jit(write, (cache, new, starts), mesh, schedule,
                                         gradients=True, uneven_outputs="replicate")
        if heads % 4 == 0:
            assert not matched.meta.tactics[-1].collectives.get("all_gather"), heads
