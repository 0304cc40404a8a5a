"""A step that calls `jax.shard_map` on the partitioned step's mesh: the body, already
written per device, is inlined with its operands in the layouts its in_specs name, and the
step gives jax.jit's numbers, gradients (jax's transposed shard_maps) included. It used to
crash in MLIR's parser, and an estimate left the body out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from oracle import assert_matches_jax_jit

import partir_plugin as partir

MESH = {"data": 2, "model": 4}
BP = partir.ManualPartition({"x": 0}, axis="data")


def _jax_mesh(shape=(2, 4), names=("data", "model")) -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(shape), names)


def _row_parallel(mesh: Mesh):
    """Megatron's row-parallel matmul written by hand: x's columns and w's rows tiled over
    model, the partial products summed with psum, the rows of x over data."""
    def local(x, w):
        return jax.lax.psum(x @ w, "model")
    return jax.shard_map(local, mesh=mesh, in_specs=(P("data", "model"), P("model", None)),
                         out_specs=P("data", None))


def _loss(x, w, w2):
    return jnp.mean(jnp.tanh(_row_parallel(_jax_mesh())(x, w)) @ w2)


def _args():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    return (jax.random.normal(k[0], (64, 128)), jax.random.normal(k[1], (128, 64)) * 0.1,
            jax.random.normal(k[2], (64, 32)) * 0.1)


@pytest.mark.parametrize("schedule", [
    [], [BP], [BP, partir.ManualPartition({"w2": 1}, axis="model")],
    [partir.ManualPartition({"x": 1}, axis="data")],  # x arrives tiled on the other dim
], ids=["none", "BP", "BP MP", "x tiled on columns"])
def test_a_step_with_a_shard_map_gives_jax_jits_numbers_and_gradients(schedule):
    step = jax.value_and_grad(_loss, argnums=(0, 1, 2))
    matched = assert_matches_jax_jit(step, _args(), MESH, schedule)
    assert "sdy.manual_computation" not in matched.meta.report()  # not "kept replicated"
    if schedule and schedule[0] is BP:
        # The results come out tiled as out_specs say, and their consumers start from that:
        # nothing is gathered (they used to start replicated: 4 all_gathers here).
        assert matched.meta.tactics[-1].collectives["all_gather"] == 0, matched.meta.report()


def test_a_shard_map_in_a_scanned_layer():
    def layer(h, w):
        return jnp.tanh(_row_parallel(_jax_mesh())(h, w)), None

    def loss(x, ws):
        return jnp.mean(jax.lax.scan(layer, x, ws)[0] ** 2)

    args = (jax.random.normal(jax.random.PRNGKey(0), (64, 64)),
            jax.random.normal(jax.random.PRNGKey(1), (3, 64, 64)) * 0.2)
    assert_matches_jax_jit(jax.value_and_grad(loss, argnums=(0, 1)), args, MESH, [BP])


def test_the_estimate_costs_the_body():
    """The body's matmul and psum are in the estimate (no uncosted op, EstimateWarning is an
    error in this suite): its flops exceed the same step's with the shard_map's operands
    gathered first, and the psum is one more all_reduce per call."""
    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in _args()]
    est = partir.estimate(_loss, *abstract, mesh=MESH, schedule=[BP], hardware="a100-80gb")
    assert not est.simulation.unknown_ops
    local_matmul = 2 * 32 * 32 * 64  # one device's [32, 32] @ [32, 64]
    assert est.flops >= local_matmul
    assert est.collectives.get("all_reduce", 0) >= 1


def test_a_shard_map_on_another_mesh_is_refused_naming_it():
    def loss(x, w, w2):
        return jnp.mean(_row_parallel(_jax_mesh((4, 2)))(x, w) @ w2)

    with pytest.raises(partir.PartitionError,
                       match=r"shard_map at .*test_shard_map.py:\d+.*\"data\"=4.*same axes"):
        partir.jit(loss, MESH, [])[0](*_args())
    with pytest.raises(partir.PartitionError, match="shard_map at"):
        partir.estimate(loss, *_args(), mesh=MESH, hardware="a100-80gb")


def test_a_shard_map_manual_over_some_axes_is_refused():
    def loss(x, w, w2):
        part = jax.shard_map(lambda x, w: jax.lax.psum(x @ w, "model"), mesh=_jax_mesh(),
                             in_specs=(P(None, "model"), P("model", None)), out_specs=P(),
                             axis_names={"model"})
        return jnp.mean(part(x, w) @ w2)

    with pytest.raises(partir.PartitionError, match=r"manual over \['model'\] only"):
        partir.jit(loss, MESH, [])[0](*_args())


def test_a_shard_map_on_jax_make_meshs_explicit_axes():
    """`jax.make_mesh` gives Explicit axes, and a shard_map on such a mesh checks its
    in_specs against its arguments' types: the step is traced with the arguments' shardings
    where it needs them, as jax.jit traces it (it failed: the trace had dropped them). An
    argument that does not carry them is refused saying so."""
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    assert jax.sharding.AxisType.Explicit in mesh.axis_types

    def loss(x, w):  # (Explicit mode makes jax refuse the w2 matmul's gradient, unannotated)
        return jnp.mean(jnp.tanh(_row_parallel(mesh)(x, w)))

    x, w, _ = _args()
    placed = (jax.device_put(x, jax.sharding.NamedSharding(mesh, P("data", "model"))),
              jax.device_put(w, jax.sharding.NamedSharding(mesh, P("model", None))))
    step = jax.value_and_grad(loss, argnums=(0, 1))
    for schedule in ([], [BP]):
        assert_matches_jax_jit(step, placed, mesh, schedule)
    fn, _ = partir.jit(step, mesh, [BP])
    with pytest.raises(partir.PartitionError, match="placed as the in_specs say"):
        fn(x, w)
