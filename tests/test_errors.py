"""Bad input gets an error naming the argument, dimension, axis and sizes."""

from __future__ import annotations

import numpy as np
import pytest

import partir_plugin as partir


def f(x, w1, w2):
    return (x @ w1) @ w2


ARGS = (np.ones((256, 8), np.float32), np.ones((8, 16), np.float32),
        np.ones((16, 8), np.float32))


def _lower(schedule, mesh=None, args=ARGS, **options):
    step, _ = partir.jit(f, mesh or {"B": 4, "M": 2}, schedule, **options)
    return step.lower(*args)


def test_not_divisible_with_padding_off_names_argument_dimension_axis_and_sizes():
    args = (np.ones((250, 8), np.float32), *ARGS[1:])
    with pytest.raises(partir.PartitionError) as e:
        _lower([partir.ManualPartition({"x": 0}, axis="B")], args=args, padding="error")
    msg = str(e.value)
    assert "'x'" in msg and "dimension 0" in msg and "'B'" in msg
    assert "250" in msg and "size 4" in msg and "padding" in msg


def test_unknown_argument_name():
    with pytest.raises(partir.PartitionError, match=r"unknown argument name 'y'.*\['x', 'w1', "
                                                    r"'w2'\]"):
        _lower([partir.ManualPartition({"y": 0}, axis="B")])


def test_axis_not_in_mesh():
    with pytest.raises(partir.PartitionError, match=r"axis 'Q' is not in the mesh .*'B': 4"):
        _lower([partir.ManualPartition({"x": 0}, axis="Q")])


def test_mesh_larger_than_devices():
    with pytest.raises(partir.PartitionError, match=r"needs 16 devices but only 8"):
        partir.jit(f, {"a": 16}, [])


def test_dimension_out_of_range_and_bad_selector():
    with pytest.raises(partir.PartitionError, match=r"'w1' of shape \(8, 16\) on dimension 2"):
        _lower([partir.ManualPartition({"w1": 2}, axis="M")])
    with pytest.raises(partir.PartitionError, match="must be an int dimension"):
        _lower([partir.ManualPartition({"w1": "rows"}, axis="M")])


def test_nested_dict_selector_unknown_key():
    def g(params, x):
        return x @ params["dense"]["kernel"]

    params = {"dense": {"kernel": np.ones((8, 4), np.float32)}}
    step, _ = partir.jit(g, {"M": 2}, [partir.ManualPartition({"params": {"dens": {
        "kernel": 1}}}, axis="M")])
    with pytest.raises(partir.PartitionError, match=r"'params' has no key 'dens'.*'dense'"):
        step.lower(params, np.ones((4, 8), np.float32))


def test_same_axis_twice_on_one_value():
    with pytest.raises(partir.PartitionError, match="already tiled on axis 'B'"):
        _lower([partir.ManualPartition({"w1": 0}, axis="B"),
                partir.ManualPartition({"w1": 1}, axis="B")])


def test_a_tag_decided_twice_on_one_axis_names_the_earlier_decision():
    """Two tactics deciding one tag on an axis, on different dimensions: the message says an
    earlier tactic decided it (not that propagation tiled it, whose remedy does not apply)."""
    import jax.numpy as jnp

    def g(x):
        return jnp.sin(partir.tag(x * 2, "t0"))

    step, _ = partir.jit(g, {"a": 2, "b": 4}, [
        partir.ManualPartition({}, axis="a", tags={"t0": 0}),
        partir.ManualPartition({}, axis="a", tags={"t0": 1})])
    with pytest.raises(partir.PartitionError,
                       match=r"tag 't0' on axis 'a': an earlier tactic already decided it "
                             r"there \(dimension 0\)"):
        step.lower(np.ones((8, 8), np.float32))


def test_a_loop_carry_tiled_two_ways_says_it_is_a_loop_carry():
    """A tag on a loop's carry, or a shard_map inside the loop, decides the carry's tiling,
    which the loop's operand shares: an argument the loop starts from cannot be tiled
    otherwise. The messages blamed an earlier tactic (there was none) or named only the
    dimension (helper-22)."""
    import jax
    from jax import lax
    from jax.sharding import PartitionSpec as P

    x = np.ones((32, 16), np.float32)

    def tagged(x):
        return lax.fori_loop(0, 3, lambda i, c: partir.tag(c * 0.5 + 1, "w"), x)

    step, _ = partir.jit(tagged, {"a": 8}, [
        partir.ManualPartition({"x": 0}, axis="a", tags={"w": 1})])
    with pytest.raises(partir.PartitionError, match=r"tag 'w' on axis 'a': it is a loop's "
                                                    r"carry .* already tiled on dimension 0"):
        step.lower(x)

    mesh = jax.make_mesh((8,), ("a",), axis_types=(jax.sharding.AxisType.Auto,))
    inner = jax.shard_map(lambda c: c * 2, mesh=mesh, in_specs=P("a"), out_specs=P("a"))

    def mapped(x):
        return lax.fori_loop(0, 2, lambda i, c: inner(c) * 0.1, x)

    step, _ = partir.jit(mapped, mesh, [partir.ManualPartition({"x": 1}, axis="a")])
    with pytest.raises(partir.PartitionError, match=r"argument 'x' on dimension 1 .* enters a "
                                                    r"loop .*shard_map"):
        step.lower(x)


def test_symbolic_dimensions_are_refused_clearly():
    """A shape-polymorphic export of the step (jax.export.symbolic_shape) is refused naming
    the shape; it failed deep in MLIR's pass pipeline."""
    import jax

    step, _ = partir.jit(f, {"B": 4, "M": 2}, [partir.ManualPartition({"x": 0}, axis="B")])
    b, = jax.export.symbolic_shape("b")
    args = (jax.ShapeDtypeStruct((8 * b, 8), np.float32),
            jax.ShapeDtypeStruct((8, 16), np.float32), jax.ShapeDtypeStruct((16, 8), np.float32))
    with pytest.raises(partir.PartitionError, match=r"shape \(8\*b, 8\) has symbolic"):
        jax.export.export(jax.jit(step))(*args)


def test_a_non_array_argument_says_how_to_pass_it():
    """jax's message speaks of static_argnums, which partir.jit does not have: the message
    says to close over such arguments."""
    def g(x, mode):
        return x * 2

    step, _ = partir.jit(g, {"B": 4}, [partir.ManualPartition({"x": 0}, axis="B")])
    with pytest.raises(TypeError, match=r"no static_argnums: close over"):
        step(np.ones(8, np.float32), "fast")


def test_a_module_entering_a_manual_region_by_custom_call_is_refused():
    """Without Shardy, jax writes a shard_map as custom calls around a body of local shapes
    (@SPMDFullToShardShape ... @SPMDShardToFullShape), which say nothing of which values are
    the body's: refused, saying to lower with Shardy."""
    import jax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from partir_plugin.frontend.trace import Traced

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))

    def g(x):
        return jax.shard_map(lambda x: jax.lax.psum(x, "model"), mesh=mesh,
                             in_specs=P("data", "model"), out_specs=P("data", None))(x)

    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        text = jax.jit(g).lower(np.ones((8, 8), np.float32)).as_text()
    finally:
        jax.config.update("jax_use_shardy_partitioner", before)
    assert "SPMDFullToShardShape" in text
    with pytest.raises(partir.PartitionError, match="calls jax.shard_map.*without Shardy"):
        Traced.from_stablehlo(text)


def test_an_estimate_with_ops_it_cannot_cost_warns_once_and_still_partitions():
    """chlo.top_k and a LAPACK custom call (cholesky) have no cost in the simulator: the
    estimate says it is a lower bound (once per step, though a planner estimates it many
    times), and another custom call is not taken for a shard_map."""
    import warnings

    import jax
    import jax.numpy as jnp

    def step(x):
        c = jnp.linalg.cholesky(x @ x.T + 64 * jnp.eye(64))
        return jax.lax.top_k(c, 4)[0].sum()

    x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    est = partir_estimator(step, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = est.estimate({"d": 2})
        est.estimate({"d": 4})
    found = [w for w in caught if issubclass(w.category, partir.EstimateWarning)]
    assert len(found) == 1, [str(w.message) for w in caught]
    message = str(found[0].message)
    assert "chlo.top_k" in message and "stablehlo.custom_call" in message
    assert "lower bound" in message
    assert first.simulation.unknown_ops == ["chlo.top_k", "stablehlo.custom_call"]


def partir_estimator(fn, *args):
    from partir_plugin.estimation import Estimator

    return Estimator(fn, args, "a100-80gb")
