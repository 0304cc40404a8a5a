"""`tag` and `atomic` (paper 1 §8): the x @ x.T example and keeping values replicated."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from oracle import assert_matches_jax_jit

import partir_plugin as partir


def gram(x):
    return x @ x.T


def gram_tagged(x):
    return x @ partir.tag(x.T, "transposed")


X = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (256, 256)))


def test_transpose_conflict_is_resolved_or_recorded():
    """x @ x.T with x tiled on rows: the dot's operands are tiled on different dimensions of
    the same axis. By default the conflict is resolved as the paper's tagged program does it
    (x.T gathered once, the dot stays tiled on rows); with conflicts="stop" it is recorded
    and both operands are gathered (PartIR's semantics)."""
    meta = assert_matches_jax_jit(gram, (X,), {"M": 8},
                                  [partir.ManualPartition({"x": 0}, axis="M")]).meta
    [resolution] = meta.tactics[0].resolutions
    assert resolution.startswith("stablehlo.dot_general at jit(gram)/dot_general on axis 'M'")
    assert "operand 1 tensor<256x256xf32> tile<1> -> full (all_gather" in resolution
    assert meta.tactics[0].conflicts == [] and meta.tactics[0].collectives["all_gather"] == 1
    assert "resolved after x@M" in meta.report()

    meta = assert_matches_jax_jit(gram, (X,), {"M": 8},
                                  [partir.ManualPartition({"x": 0}, axis="M")],
                                  conflicts="stop").meta
    [conflict] = meta.tactics[0].conflicts
    assert "dot_general" in conflict and "'M'" in conflict
    assert "conflict after x@M" in meta.report()  # the row name derived from inputs, axis
    assert meta.tactics[0].collectives["all_gather"] == 2  # both operands gathered


def test_atomic_on_tagged_transpose_gives_the_papers_program():
    schedule = [partir.ManualPartition({"x": 0}, axis="M",
                                       tags={"transposed": partir.REPLICATED})]
    matched = assert_matches_jax_jit(gram_tagged, (X,), {"M": 8}, schedule)
    meta, out = matched.meta, matched.got
    assert meta.tactics[0].conflicts == []
    assert meta.tactics[0].collectives["all_gather"] == 1
    text = meta.device_local_stablehlo
    # %tx = transpose (local 256x32); %gx = all_gather [{}, {"M"}] %tx; y = x @ %gx
    assert "-> tensor<256x32xf32>" in text
    assert 'all_gather_dim = 1 : i64' in text
    assert out.sharding.spec == jax.sharding.PartitionSpec("M")
    assert "atomic<tag 'transposed', 'M'>" in meta.tactics[0].actions


@pytest.mark.slow  # compiles an MLP train step per schedule
def test_atomic_parameter_stays_replicated_z2():
    """Z2 keeps params replicated even though the optimizer state is sharded."""
    import optax

    from partir_plugin.examples import mlp

    model, optimizer = mlp.MLP(hidden=32, layers=2, classes=8), optax.adam(1e-2)
    params, opt_state, batch = mlp.init(model, optimizer, batch_size=32, features=16)
    train_step = mlp.make_train_step(model, optimizer)
    schedule = [partir.tactic("BP", axis="batch"), partir.tactic("Z2", axis="batch")]
    step, meta = partir.jit(train_step, {"batch": 8}, schedule, scatter_sums=True)
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


def test_control_flow_branches_sort_and_argmax_partition():
    """`case` branches are partitioned like the top level (their results share one
    distribution with the case's results); sort and argmax keep their non-sorted/non-reduced
    dimensions tiled."""
    import jax.numpy as jnp

    def f(x, w, flag):
        h = x @ w
        y = jax.lax.cond(flag > 0, lambda: jnp.tanh(h) * 2.0, lambda: h - 1.0)
        total = jax.lax.cond(flag > 0, lambda: y.sum(), lambda: y.max())
        return jnp.sort(y, axis=1), jnp.argmax(y, axis=1), total

    x = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (64, 16)))
    w = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (16, 8)))
    schedule = [partir.ManualPartition({"x": 0}, axis="a"),
                partir.ManualPartition({"w": 1}, axis="b")]
    step, meta = partir.jit(f, {"a": 4, "b": 2}, schedule)
    for flag in (1, -1):
        out = step(x, w, np.int32(flag))
        ref = jax.jit(f)(x, w, np.int32(flag))
        for a, b in zip(out, ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    counts = meta.tactics[-1].collectives
    # y is tiled (a on rows, b on columns) through both branches; sort along the b-tiled
    # columns gathers them; argmax reduces its tiles and gathers its two partials (value and
    # index, 16 x 1 each); each branch's full reduction is one all_reduce.
    assert counts == dict(all_gather=3, all_reduce=2, reduce_scatter=0, all_to_all=0,
                          all_permute=0)
    assert meta.tactics[-1].unsupported_ops == {}
    assert out[0].sharding.spec == jax.sharding.PartitionSpec("a")
    text = meta.device_local_stablehlo
    assert '"stablehlo.case"' in text and "tensor<16x4xf32>" in text


def two_stage(x, w1, w2):
    h = jax.numpy.tanh(x @ w1)
    return partir.tag(h, "hidden") @ w2


def test_a_decided_tag_is_a_redistribution_point():
    """Tiling a tag on another dimension than the value it names propagates to the tag's
    users only: `h` stays column-tiled (w1's columns), the tagged value is row-tiled, and
    the lowering converts with one all_to_all (not an all_gather plus a slice)."""
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (64, 32)))
    w1 = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (32, 16)))
    w2 = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (16, 8)))
    schedule = [partir.ManualPartition({"w1": 1}, axis="M", tags={"hidden": 0})]
    step, meta = partir.jit(two_stage, {"M": 8}, schedule)
    out = step(x, w1, w2)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(two_stage)(x, w1, w2)),
                               rtol=1e-5, atol=1e-5)
    counts = meta.tactics[0].collectives
    assert counts["all_to_all"] == 1 and counts["all_gather"] == 0
    assert counts["all_reduce"] == 0  # the row-tiled tagged value keeps the second matmul local
    assert out.sharding.spec == jax.sharding.PartitionSpec("M")
    # Undecided, the same tag is transparent: the column tiling flows through it.
    plain, meta = partir.jit(two_stage, {"M": 8}, [partir.ManualPartition({"w1": 1}, axis="M")])
    plain.lower(x, w1, w2)
    assert meta.tactics[0].collectives["all_to_all"] == 0


def test_one_name_tags_every_layer_and_a_callable_selects_tags():
    def f(x, w):
        for _ in range(3):
            x = partir.tag(jax.numpy.tanh(x @ w), "act")
        return x

    x = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (64, 16)))
    w = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (16, 16)))
    tactic = partir.ManualPartition(
        {}, axis="M", tags=lambda name, shape: 0 if name == "act" else None)
    step, meta = partir.jit(f, {"M": 8}, [tactic])
    out = step(x, w)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(f)(x, w)), rtol=1e-5,
                               atol=1e-5)
    # Every tagged activation is row-tiled; the first matmul's input is not (x is replicated,
    # so the first tag slices locally): no collective at all.
    assert sum(meta.tactics[0].collectives.values()) == 0
    assert out.sharding.spec == jax.sharding.PartitionSpec("M")
    assert meta.device_local_stablehlo.count("tensor<8x16xf32>") >= 3


def _state(fn, *shapes, mesh):
    from partir_plugin.core.mesh import Mesh
    from partir_plugin.core.state import PartitionState
    from partir_plugin.ir.importer import import_lowered
    from partir_plugin.plugin.manager import default_registry

    args = [jax.ShapeDtypeStruct(s, np.float32) for s in shapes]
    func = import_lowered(jax.jit(fn).lower(*args))
    return PartitionState(func, Mesh.of(mesh), default_registry())


def test_an_atomic_result_is_not_tiled_on_a_part_of_its_axis():
    """A value atomic on `model` stays replicated on `model:(1)2` too, when propagation
    reaches it as a result (it used to check the exact axis only)."""
    from partir_plugin.core.propagation import propagate

    state = _state(lambda x: jax.numpy.sin(x) * 2.0, (16, 8), mesh={"model": 4})
    (x,) = state.func.args
    sine = next(op for op in state.position if op.name == "stablehlo.sine")
    state.atomic.add((sine.results[0], "model"))
    propagate(state, state.tile_value(x, 0, "model:(1)2"))
    assert state.tiles_of(sine.results[0]) == ()
    assert "atomic" in state.blocked(sine.results[0], "model:(1)2")


def test_an_atomic_while_operand_is_not_tiled_through_its_alias():
    """The loop-carried value of a while shares one distribution: a body result tiled by
    propagation would tile the atomic operand it aliases (it used to)."""
    from partir_plugin.core.propagation import propagate

    def f(a, b):
        return jax.lax.fori_loop(0, 3, lambda i, c: b * 2.0, a)

    state = _state(f, (16, 8), (16, 8), mesh={"M": 4})
    a, b = state.func.args
    state.atomic.add((a, "M"))
    propagate(state, state.tile_value(b, 0, "M"))
    assert state.tiles_of(b) == (("M", 0),)
    assert state.tiles_of(a) == ()
    assert all(state.tiles_of(m) == () for m in state.aliases[a])


def test_a_conflict_a_later_loop_settles_leaves_the_state_not_its_snapshot():
    """`conflicts` are those remaining: the report row of a tactic lists the conflicts left
    after it, so a conflict that a later step loops the op through drops out of later rows
    (it used to stay, still counted and labelled)."""
    from partir_plugin.core.propagation import propagate

    state = _state(gram, (256, 256), mesh={"M": 8})
    state.options = state.options.replace(conflicts="stop")
    (x,) = state.func.args
    propagate(state, state.tile_value(x, 0, "M"))
    dot = next(op for op in state.position if op.name == "stablehlo.dot_general")
    assert state.stopped_at(dot, "M") and len(state.conflicts) == 1
    before = state.copy()
    state.add_loop(dot, "M", state.registry.entries(dot)[0])
    assert state.conflicts == [] and not state.stopped_at(dot, "M")
    assert len(before.conflicts) == 1 and before.stopped_at(dot, "M")


def test_copy_copies_every_container_field():
    import dataclasses

    state = _state(gram, (8, 8), mesh={"M": 2})
    new = state.copy()
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if isinstance(value, (dict, set, list)):
            assert getattr(new, f.name) is not value, f.name
