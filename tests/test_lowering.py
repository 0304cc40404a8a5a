"""Edge conversions of the lowering (paper 1 §6): which collectives each layout change emits."""

from __future__ import annotations

import pytest

from partir_plugin.core.mesh import Mesh
from partir_plugin.ir.graph import Block
from partir_plugin.ir.types import TensorType
from partir_plugin.spmd.collectives import collective_axes, collective_kind
from partir_plugin.spmd.convert import convert
from partir_plugin.spmd.emitter import Emitter
from partir_plugin.spmd.layout import Layout

MESH = Mesh.of({"a": 4, "b": 2})
GLOBAL = TensorType((32, 16), "f32")


def _convert(src: Layout, dst: Layout):
    block = Block()
    em = Emitter(MESH, block)
    x = block.add_arg(src.local_type(GLOBAL, MESH))
    y = convert(em, x, src, dst)
    kinds = [(collective_kind(op), collective_axes(op)) for op in block.ops
             if collective_kind(op)]
    return kinds, y.type.shape


CASES = [
    # tile -> full: all_gather
    (Layout(((("a",)), ())), Layout(((), ())), [("all_gather", ("a",))], (32, 16)),
    # full -> tile: all_slice, no communication
    (Layout(((), ())), Layout((("a",), ("b",))), [("all_slice", ("a", "b"))], (8, 8)),
    # all_slice(all_gather) across dimensions fuses into one all_to_all
    (Layout((("a",), ())), Layout(((), ("a",))), [("all_to_all", ("a",))], (32, 4)),
    # sum -> full: all_reduce
    (Layout(((), ()), (("a", "add"),)), Layout(((), ())), [("all_reduce", ("a",))], (32, 16)),
    # all_slice(all_reduce) fuses into reduce_scatter
    (Layout(((), ()), (("a", "add"),)), Layout((("a",), ())),
     [("reduce_scatter", ("a",))], (8, 16)),
    # the minor axis of a deep tiling is gathered alone; the major one stays
    (Layout((("a", "b"), ())), Layout((("a",), ())), [("all_gather", ("b",))], (8, 16)),
    # sums over two axes, one scattered, one reduced
    (Layout(((), ()), (("a", "add"), ("b", "add"))), Layout(((), ("b",))),
     [("all_reduce", ("a",)), ("reduce_scatter", ("b",))], (32, 8)),
]


@pytest.mark.parametrize("src,dst,expected,local", CASES)
def test_conversion_emits_the_fused_collective(src, dst, expected, local):
    kinds, shape = _convert(src, dst)
    assert kinds == expected
    assert shape == local


def test_identity_conversion_emits_nothing():
    layout = Layout((("a",), ("b",)))
    assert _convert(layout, layout) == ([], (8, 8))


def test_reordered_axes_go_through_the_redistribution_planner():
    """(a, b) -> (b, a) on one dimension is not one gather/slice: the planner takes it,
    within max(source tile, target tile)."""
    kinds, shape = _convert(Layout((("a", "b"), ())), Layout((("b", "a"), ())))
    # Every device already holds a tile of the right size, only on the wrong device: one
    # collective_permute, never a gather to the full dimension.
    assert kinds == [("all_permute", ("a", "b"))]
    assert shape == (4, 16)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_max_and_min_across_devices_propagate_nan_like_the_unpartitioned_program(dtype):
    """XLA's float max/min all-reduce drops NaN (jax.jit's own sharded program gives 0 for
    max(0, nan) over a sharded dimension); ours runs on integers that order like the floats,
    so NaN wins as in `stablehlo.maximum`, and -0.0, infinities and negatives stay exact."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import partir_plugin as partir

    x = np.zeros((16, 6), np.float32)
    x[3, 0] = np.nan  # NaN in one device's rows only
    x[:, 1] = -np.inf
    x[:, 2] = -0.0
    x[9, 2] = 0.0
    x[:, 3] = -np.abs(np.random.default_rng(0).normal(size=16)) - 1
    x[12, 4], x[1, 4] = np.inf, np.nan
    x[:, 5] = np.arange(16) - 7.5
    x = jnp.asarray(x, dtype)
    fn = lambda x: (jnp.max(x, axis=0), jnp.min(x, axis=0))  # noqa: E731
    f, meta = partir.jit(fn, {"m": 8}, [partir.ManualPartition({"x": 0}, axis="m")])
    for got, want in zip(f(x), jax.jit(fn)(x), strict=True):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        numbers = ~np.isnan(want)  # a NaN's sign means nothing
        assert np.array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))  # -0.0
    assert meta.tactics[-1].collectives["all_reduce"] == 2


@pytest.mark.parametrize("scatter_sums", [False, True])
def test_max_reduce_scattered_propagates_nan(scatter_sums):
    """A max whose consumer tiles it is reduce-scattered (`scatter_sums`, as on GPU) or
    all-reduced and sliced: both run on the order-preserving integers, so NaN survives."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import partir_plugin as partir

    x = np.random.default_rng(0).normal(size=(16, 32)).astype(np.float32)
    x[3, 5] = np.nan
    y = np.random.default_rng(1).normal(size=(32,)).astype(np.float32)
    fn = lambda x, y: jnp.max(x, axis=0) * y  # noqa: E731
    f, meta = partir.jit(fn, {"m": 8}, [partir.ManualPartition({"x": 0, "y": 0}, axis="m")],
                         scatter_sums=scatter_sums)
    np.testing.assert_array_equal(np.asarray(f(x, y)), np.asarray(jax.jit(fn)(x, y)))
    kind = "reduce_scatter" if scatter_sums else "all_reduce"
    assert meta.tactics[-1].collectives[kind] == 1
