"""benchmarks/pipeline_prototype.py (design B of docs/pipeline_design.md): a GPipe schedule
written before autodiff over a `stage` axis gives jax.jit's loss and gradients on 8 CPU
devices, its NaN-poisoned bubble slots leak nothing, and its bubble is the closed form."""

from functools import partial

import benchmark_module
import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def test_gpipe_prototype_matches_jit():
    pp = benchmark_module.load("pipeline_prototype")
    params, x, y = pp.init(jax.random.key(0), 16)
    ref_loss, ref_grads = jax.jit(jax.value_and_grad(pp.reference_loss))(params, x, y)
    mesh = jax.make_mesh((4, 2), ("stage", "data"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    p = {k: jax.device_put(v, NamedSharding(mesh, P(None if k == "head" else "stage")))
         for k, v in params.items()}
    x, y = (jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (x, y))
    fn = partial(pp.pipelined_loss, mesh=mesh, microbatches=4)
    loss, grads = jax.jit(jax.value_and_grad(partial(fn, poison=float("nan"))))(p, x, y)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for k in params:
        np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-4, atol=1e-5)
    assert grads["w1"].sharding.spec == P("stage")  # the stacked layers never left their stage
    work = pp.schedule(4, 4, 1)
    assert work.shape[0] == 4 + 4 - 1 and np.mean(work < 0) == 3 / 7
