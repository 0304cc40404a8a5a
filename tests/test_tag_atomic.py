"""`tag` and `atomic` (paper 1 §8): the x @ x.T example and keeping values replicated."""

from __future__ import annotations

import jax
import numpy as np

import partir_plugin as partir


def gram(x):
    return x @ x.T


def gram_tagged(x):
    return x @ partir.tag(x.T, "transposed")


X = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (256, 256)))


def test_transpose_conflict_is_recorded_not_resolved():
    step, meta = partir.jit(gram, {"M": 8}, [partir.ManualPartition({"x": 0}, axis="M")])
    np.testing.assert_allclose(np.asarray(step(X)), np.asarray(jax.jit(gram)(X)),
                               rtol=1e-4, atol=1e-3)
    [conflict] = meta.tactics[0].conflicts
    assert "dot_general" in conflict and "'M'" in conflict
    assert "conflict after ManualPartition(M)" in meta.report()
    assert meta.tactics[0].collectives["all_gather"] == 2  # both operands gathered


def test_atomic_on_tagged_transpose_gives_the_papers_program():
    schedule = [partir.ManualPartition({"x": 0}, axis="M",
                                       tags={"transposed": partir.REPLICATED})]
    step, meta = partir.jit(gram_tagged, {"M": 8}, schedule)
    out = step(X)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(gram_tagged)(X)),
                               rtol=1e-4, atol=1e-3)
    assert meta.tactics[0].conflicts == []
    assert meta.tactics[0].collectives["all_gather"] == 1
    text = meta.device_local_stablehlo
    # %tx = transpose (local 256x32); %gx = all_gather [{}, {"M"}] %tx; y = x @ %gx
    assert "-> tensor<256x32xf32>" in text
    assert 'all_gather_dim = 1 : i64' in text
    assert out.sharding.spec == jax.sharding.PartitionSpec("M")
    assert "atomic<tag 'transposed', 'M'>" in meta.tactics[0].actions


def test_atomic_parameter_stays_replicated_z2():
    """Z2 keeps params replicated even though the optimizer state is sharded."""
    import optax

    from partir_plugin.examples import mlp

    model, optimizer = mlp.MLP(hidden=32, layers=2, classes=8), optax.adam(1e-2)
    params, opt_state, batch = mlp.init(model, optimizer, batch_size=32, features=16)
    train_step = mlp.make_train_step(model, optimizer)
    schedule = [partir.tactic("BP", axis="batch"), partir.tactic("Z2", axis="batch")]
    step, meta = partir.jit(train_step, {"batch": 8}, schedule)
    new_params, _, loss = step(params, opt_state, batch)
    ref_params, _, ref_loss = jax.jit(train_step)(params, opt_state, batch)
    for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)
    for s in jax.tree.leaves(meta.in_shardings[0]):
        assert s.is_fully_replicated
    n = len(jax.tree.leaves(params))
    z2 = meta.tactics[1].collectives
    # Gradients reduce-scattered onto the sharded optimizer state, parameters gathered back.
    assert z2["reduce_scatter"] == n and z2["all_gather"] == n and z2["all_reduce"] == 1
