"""Multi-axis propagation and deep tiling (paper 1 appendix B)."""

from __future__ import annotations

import jax
import numpy as np
from oracle import assert_matches_jax_jit

import partir_plugin as partir


def mlp(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2


ARGS = tuple(np.asarray(jax.random.normal(jax.random.PRNGKey(i), s))
             for i, s in enumerate([(256, 16), (16, 32), (32, 8)]))


def _run(schedule, mesh=None):
    matched = assert_matches_jax_jit(mlp, ARGS, mesh or {"B": 4, "M": 2}, schedule)
    return matched.got, matched.meta


def test_deep_tiling_one_dimension_over_two_axes():
    """Tiling x's batch on B then again on M: the dimension is split B-major, M-minor, every
    op follows, and the output comes back with the same two-axis spec."""
    out, meta = _run([partir.ManualPartition({"x": 0}, axis="B"),
                      partir.ManualPartition({"x": 0}, axis="M")])
    assert out.sharding.spec == jax.sharding.PartitionSpec(("B", "M"))
    assert sum(meta.tactics[-1].collectives.values()) == 0
    assert "tensor<32x16xf32>" in meta.device_local_stablehlo


def test_two_axes_on_different_dimensions_compose():
    """BP on B and Megatron on M: loops over both axes nest around the matmuls."""
    out, meta = _run([partir.ManualPartition({"x": 0}, axis="B"),
                      partir.ManualPartition({"w1": 1}, axis="M")])
    assert meta.tactics[-1].collectives["all_reduce"] == 1
    assert meta.in_shardings[2].spec == jax.sharding.PartitionSpec("M")  # w2 inferred
    assert out.sharding.spec == jax.sharding.PartitionSpec("B")


def test_no_second_loop_over_the_same_axis():
    """After BP claims the matmul over B, tiling w1 on B cannot nest a second B loop: w1 is
    gathered where it is used (the essence of Z3), never a wrong program."""
    _, meta = _run([partir.ManualPartition({"x": 0}, axis="B"),
                    partir.ManualPartition({"w1": 1}, axis="B")])
    assert meta.tactics[-1].collectives["all_gather"] == 1
    assert meta.in_shardings[1].spec == jax.sharding.PartitionSpec(None, "B")


def test_three_axis_mesh():
    out, meta = _run([partir.ManualPartition({"x": 0}, axis="a"),
                      partir.ManualPartition({"w1": 1}, axis="b"),
                      partir.ManualPartition({"x": 0}, axis="c")], mesh={"a": 2, "b": 2, "c": 2})
    assert out.sharding.spec == jax.sharding.PartitionSpec(("a", "c"))
    assert meta.tactics[-1].collectives["all_reduce"] == 1
