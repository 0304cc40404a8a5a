"""Host callbacks in a partitioned step (`jax.debug.print`, `jax.debug.callback`,
`jax.pure_callback`, `io_callback`) run as under jax.jit: once per execution, on the whole
value, their results reaching every device. They used to crash the step (the module named a
Shardy mesh it did not declare), and once parsed, the compiled step would not have held the
Python callables (a segfault)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import partir_plugin as partir

BP = partir.ManualPartition({"batch": 0}, axis="data")
MP = partir.ManualPartition({"params": {"w1": 1, "w2": 0}}, axis="model")
MESH = {"data": 4, "model": 2}


def _args():
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w1": jax.random.normal(k1, (32, 64)) * 0.2,
              "w2": jax.random.normal(k2, (64, 32)) * 0.2}
    return params, jax.random.normal(k3, (16, 32))


def _run_both(step, schedule, seen: list):
    """(jax.jit's outputs and callback calls, ours), each from one call."""
    args = _args()
    want = jax.jit(step)(*args)
    jax.effects_barrier()
    theirs, seen[:] = list(seen), []
    got = partir.jit(step, MESH, schedule)[0](*args)
    jax.effects_barrier()
    return want, theirs, got, list(seen)


def _close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-6)


def test_a_debug_callback_sees_the_whole_activation_once_per_step():
    seen = []

    def step(params, batch):
        def loss_fn(p):
            h = jnp.tanh(batch @ p["w1"])  # tiled by batch and model
            jax.debug.callback(lambda v: seen.append(np.asarray(v)), h)
            return jnp.mean((h @ p["w2"]) ** 2)
        return jax.value_and_grad(loss_fn)(params)

    want, theirs, got, ours = _run_both(step, [BP, MP], seen)
    _close(got, want)
    assert len(theirs) == 1 and len(ours) == 1, (len(theirs), len(ours))
    assert ours[0].shape == (16, 64)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=2e-5, atol=2e-6)


def test_a_debug_print_runs_once(capfd):
    def step(params, batch):
        loss = jnp.mean((jnp.tanh(batch @ params["w1"]) @ params["w2"]) ** 2)
        jax.debug.print("partir loss {}", loss)
        return loss

    args = _args()
    partir.jit(step, MESH, [BP, MP])[0](*args)
    jax.effects_barrier()
    printed = [line for line in capfd.readouterr().out.splitlines() if "partir loss" in line]
    assert len(printed) == 1, printed
    want = float(jax.jit(step)(*args))
    assert abs(float(printed[0].split()[-1]) - want) <= 1e-5 * abs(want)


@pytest.mark.parametrize("kind", ["pure_callback", "io_callback"])
def test_a_callback_result_reaches_every_device_and_gradients_match(kind):
    """The callback's result feeds tiled compute; loss and gradients as jax.jit's, and the
    callback ran once per step."""
    seen = []

    def host_scale(v):
        seen.append(v.shape)
        return (np.asarray(v) * 0.5).astype(np.float32)

    def step(params, batch):
        def loss_fn(p):
            h = batch @ p["w1"]
            shape = jax.ShapeDtypeStruct(h.shape, h.dtype)
            scale = (jax.pure_callback(host_scale, shape, jax.lax.stop_gradient(h))
                     if kind == "pure_callback" else
                     io_callback(host_scale, shape, jax.lax.stop_gradient(h)))
            return jnp.mean((jnp.tanh(h * scale) @ p["w2"]) ** 2)
        return jax.value_and_grad(loss_fn)(params)

    want, theirs, got, ours = _run_both(step, [BP, MP], seen)
    _close(got, want)
    assert theirs == ours == [(16, 64)]


def test_a_callback_in_a_scanned_layer_runs_once_per_iteration():
    seen = []

    def step(params, batch):
        def layer(h, w):
            h = jnp.tanh(h @ w)
            jax.debug.callback(lambda v: seen.append(float(np.sum(v))), h)
            return h, None
        stacked = jnp.stack([params["w1"][:, :32], params["w2"][:32, :],
                             params["w1"][:, 32:]])
        return jnp.mean(jax.lax.scan(layer, batch, stacked)[0] ** 2)

    want, theirs, got, ours = _run_both(step, [BP], seen)
    _close(got, want)
    assert len(theirs) == len(ours) == 3
    np.testing.assert_allclose(ours, theirs, rtol=2e-5)


def test_ordered_effects_are_refused_saying_what_to_pass():
    def step(params, batch):
        loss = jnp.mean((batch @ params["w1"]) ** 2)
        jax.debug.print("{}", loss, ordered=True)
        return loss

    with pytest.raises(partir.PartitionError, match=r"ordered effects.*ordered=False"):
        partir.jit(step, MESH, [BP])[0](*_args())


def test_an_estimate_charges_a_callback_without_calling_it_unknown():
    """A host callback is charged its bytes (the Python time is not modeled) and the sum that
    brings its result to every device; it is not an uncosted op (`EstimateWarning` is an
    error in this suite)."""
    def step(params, batch):
        loss = jnp.mean(jnp.tanh(batch @ params["w1"]) ** 2)
        jax.debug.print("{}", loss)
        shape = jax.ShapeDtypeStruct(batch.shape, batch.dtype)
        return loss + jnp.mean(jax.pure_callback(lambda v: np.asarray(v), shape, batch))

    params, batch = jax.eval_shape(_args)
    est = partir.estimate(step, params, batch, mesh={"data": 8}, hardware="host-cpu",
                          schedule=[partir.ManualPartition({"batch": 0}, axis="data")])
    assert not est.simulation.unknown_ops
    # the loss's sum over the batch tiles, and the callback's result sent to every device;
    # the whole batch gathered for the callback (used inside the branch that runs it)
    assert est.collectives == {"all_gather": 1, "all_reduce": 2}, est.collectives


def test_a_callback_in_a_pipelined_layer_warns_and_the_numbers_stay():
    """PP runs the layer body at every step of its loop on each stage: a callback there sees
    the first device's stage, microbatches and bubbles. Said, not silent."""
    from partir_plugin.tactics.pipeline_parallel import PipelineWarning

    seen = []

    def step(params, batch):
        def loss_fn(p):
            def layer(h, w):
                h = jnp.tanh(h @ w)
                jax.debug.callback(lambda v: seen.append(v.shape), h)
                return h, None
            return jnp.mean(jax.lax.scan(layer, batch, p["stack"])[0] ** 2)
        return jax.value_and_grad(loss_fn)(params)

    params = {"stack": jax.random.normal(jax.random.PRNGKey(0), (8, 16, 16)) * 0.3}
    batch = jax.random.normal(jax.random.PRNGKey(1), (32, 16))
    want = jax.jit(step)(params, batch)
    with pytest.warns(PipelineWarning, match="host callbacks.*first device"):
        fn, _ = partir.jit(step, {"stage": 4, "batch": 2},
                           [partir.tactic("PP", axis="stage", microbatches=4),
                            partir.ManualPartition({"batch": 0}, axis="batch")])
        got = fn(params, batch)
    _close(got, want)


def test_a_jax_that_keeps_callbacks_elsewhere_fails_clearly_not_in_the_process():
    """Run without its callables, a callback's custom call would crash the process: where
    the lowering holds none, the step fails naming the callback's line."""
    import types

    from partir_plugin.frontend.trace import host_callbacks, trace

    def step(x):
        jax.debug.print("{}", jnp.sum(x))
        return x * 2

    traced = trace(step, (jnp.ones(4),))
    assert len(traced.host_callbacks) == 1
    with pytest.raises(partir.PartitionError, match=r"host callback at .*test_callbacks.py"):
        host_callbacks(types.SimpleNamespace(), traced.func)


def test_boolean_and_integer_callback_results_reach_every_device():
    """A bool result is combined by an or (false elsewhere), an integer by a sum."""
    seen = []

    def step(params, batch):
        rows = jnp.sum(batch @ params["w1"], axis=1)
        positive = jax.pure_callback(lambda v: (seen.append(1), np.asarray(v) > 0)[1],
                                     jax.ShapeDtypeStruct(rows.shape, jnp.bool_), rows)
        count = jax.pure_callback(lambda v: np.asarray(np.sum(v > 0), np.int32),
                                  jax.ShapeDtypeStruct((), jnp.int32), batch)
        return jnp.sum(jnp.where(positive, rows, -rows)) + count, positive, count

    want, theirs, got, ours = _run_both(step, [BP], seen)
    _close(got, want)
    assert len(ours) == len(theirs) == 1
