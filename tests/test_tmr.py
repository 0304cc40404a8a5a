"""The tile-mapping registry (DESIGN.md §2.2): the entries it gives per op, and end to end.

Part 1 checks, op by op, that `default_registry()` gives exactly the expected TMR entries for the
op jax emits (Shardy-derived, or hand-written where Shardy has no rule). Part 2 partitions a
small function per op family on the mesh {"a": 4, "b": 2}, runs it, compares with `jax.jit` and
checks the collectives the last tactic reports. Part 3: an op without a rule stays replicated,
computes the right numbers and is reported.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from oracle import assert_matches_jax_jit
from partir_tmr_rules import CHLO_ELEMENTWISE
from tmr_corpus import CHLO, ELEMENTWISE, F32, I32

import partir_plugin as partir
from partir_plugin.core.tmr import Sum
from partir_plugin.ir.importer import import_lowered, import_stablehlo
from partir_plugin.ir.opsets import Reduction
from partir_plugin.plugin.manager import default_registry

MESH = {"a": 4, "b": 2}


@pytest.fixture(scope="module")
def registry():
    return default_registry()


def _func(fn, specs):
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in specs]
    return import_lowered(jax.jit(fn).lower(*args))


def _entries(registry, op, with_sizes=False):
    entries = registry.entries(op)
    if entries is None:
        return None
    if with_sizes:
        return {(e.operands, e.results, e.factor_size) for e in entries}
    return {(e.operands, e.results) for e in entries}


def tmr_of(registry, fn, specs, op_name, with_sizes=False):
    """The entry set of the (single) `op_name` op in `fn`'s lowering."""
    func = _func(fn, specs)
    ops = [op for op in func.ops if op.name == op_name]
    names = sorted({op.name for op in func.ops})
    assert len(ops) == 1, f"expected one {op_name} in the lowering, got {names}"
    return _entries(registry, ops[0], with_sizes)


# --------------------------------------------------------------------------------------------
# Part 1: entries per op.

@pytest.mark.parametrize("name,fn,dtypes", ELEMENTWISE, ids=[c[0] for c in ELEMENTWISE])
def test_elementwise_entries(registry, name, fn, dtypes):
    n = len(dtypes)
    specs = [((8, 4), d) for d in dtypes]
    if name.startswith("chlo.") and not any(op.name == name for op in _func(fn, specs).ops):
        # Newer jax decomposes some CHLO ops (jax 0.12: asin, lgamma) into StableHLO: then
        # every full-size op of the decomposition must pass both dimensions through.
        full = [op for op in _func(fn, specs).ops if op.results
                and op.results[0].type.shape == (8, 4)
                and all(v.type.shape in ((8, 4), ()) for v in op.operands)
                and op.name not in ("stablehlo.broadcast_in_dim", "stablehlo.constant",
                                    "stablehlo.iota", "stablehlo.gather")]
        assert full
        for op in full:
            k = len(op.operands)
            assert {((0,) * k, (0,), 8), ((1,) * k, (1,), 4)} <= _entries(registry, op, True)
        return
    got = tmr_of(registry, fn, specs, name, with_sizes=True)
    assert got == {((0,) * n, (0,), 8), ((1,) * n, (1,), 4)}


def test_every_chlo_op_jax_emits_is_covered():
    assert {c[0] for c in CHLO} <= set(CHLO_ELEMENTWISE)


def test_logistic_lowers_to_elementwise_ops_only(registry):
    # jax 0.10 spells logistic as exp/add/divide (newer versions may emit stablehlo.logistic):
    # whatever it emits on the (8, 4) operand passes both dimensions through.
    func = _func(lax.logistic, [((8, 4), F32)])
    full = [op for op in func.ops if op.results[0].type.shape == (8, 4)
            and op.name != "stablehlo.broadcast_in_dim"]
    assert full
    for op in full:
        n = len(op.operands)
        assert _entries(registry, op) == {((0,) * n, (0,)), ((1,) * n, (1,))}, op.name


def test_chlo_broadcasting_form_has_no_elementwise_rule(registry):
    text = """
    func.func @main(%a: tensor<8x4xf32>, %b: tensor<4xf32>) -> tensor<8x4xf32> {
      %0 = "chlo.broadcast_add"(%a, %b) {broadcast_dimensions = array<i64: 1>}
           : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
      return %0 : tensor<8x4xf32>
    }"""
    (op,) = import_stablehlo(text).ops
    assert registry.entries(op) is None


def test_broadcast_in_dim_entries(registry):
    fn = lambda x: lax.broadcast_in_dim(x, (4, 8, 16), (1, 2))  # noqa: E731
    assert tmr_of(registry, fn, [((8, 16), F32)], "stablehlo.broadcast_in_dim") == {
        ((None,), (0,)), ((0,), (1,)), ((1,), (2,))}
    # A size-1 operand dimension is expanded: tiling it means nothing, the result's is free.
    assert tmr_of(registry, fn, [((1, 16), F32)], "stablehlo.broadcast_in_dim") == {
        ((None,), (0,)), ((None,), (1,)), ((1,), (2,))}


def test_transpose_entries(registry):
    fn = lambda x: jnp.transpose(x, (2, 0, 1))  # noqa: E731
    assert tmr_of(registry, fn, [((8, 16, 4), F32)], "stablehlo.transpose") == {
        ((2,), (0,)), ((0,), (1,)), ((1,), (2,))}


def test_reshape_entries(registry):
    def reshape(shape):
        return lambda x: x.reshape(shape)

    # One-to-one (a unit dimension added): every dimension maps to itself.
    assert tmr_of(registry, reshape((32, 16, 1)), [((32, 16), F32)], "stablehlo.reshape",
                  with_sizes=True) == {((0,), (0,), 32), ((1,), (1,), 16)}
    # Split 32x16 -> 8x4x16: dimension 0 maps to the major part, of size 8.
    assert tmr_of(registry, reshape((8, 4, 16)), [((32, 16), F32)], "stablehlo.reshape",
                  with_sizes=True) == {((0,), (0,), 8), ((1,), (2,), 16)}
    # Merge 8x4x16 -> 32x16: the minor part (dimension 1) has no entry.
    assert tmr_of(registry, reshape((32, 16)), [((8, 4, 16), F32)], "stablehlo.reshape",
                  with_sizes=True) == {((0,), (0,), 8), ((2,), (1,), 16)}
    # Merge everything, and regroup 32x16 -> 16x32.
    assert tmr_of(registry, reshape((512,)), [((32, 16), F32)], "stablehlo.reshape",
                  with_sizes=True) == {((0,), (0,), 32)}
    assert tmr_of(registry, reshape((16, 32)), [((32, 16), F32)], "stablehlo.reshape",
                  with_sizes=True) == {((0,), (0,), 16)}


def test_dot_general_entries(registry):
    assert tmr_of(registry, jnp.matmul, [((32, 8), F32), ((8, 16), F32)],
                  "stablehlo.dot_general") == {
        ((0, None), (0,)), ((None, 1), (1,)), ((1, 0), (Sum("add"),))}
    batched = lambda x, y: jnp.einsum("bij,bjk->bik", x, y)  # noqa: E731
    assert tmr_of(registry, batched, [((4, 32, 8), F32), ((4, 8, 16), F32)],
                  "stablehlo.dot_general") == {
        ((0, 0), (0,)), ((1, None), (1,)), ((None, 2), (2,)), ((2, 1), (Sum("add"),))}


def test_reduce_entries(registry):
    x = [((32, 8), F32)]
    assert tmr_of(registry, lambda a: a.sum(0), x, "stablehlo.reduce") == {
        ((0, None), (Sum("add"),)), ((1, None), (0,))}
    assert tmr_of(registry, lambda a: a.max(1), x, "stablehlo.reduce") == {
        ((0, None), (0,)), ((1, None), (Sum("max"),))}
    assert tmr_of(registry, lambda a: a.min(1), x, "stablehlo.reduce") == {
        ((0, None), (0,)), ((1, None), (Sum("min"),))}
    assert tmr_of(registry, lambda a: a.prod(1), x, "stablehlo.reduce") == {
        ((0, None), (0,)), ((1, None), (Sum("mul"),))}
    # An add with an init value other than 0 would add it once per tile: no Sum entry.
    plus_one = lambda a: lax.reduce(a, np.float32(1.0), lax.add, (1,))  # noqa: E731
    assert tmr_of(registry, plus_one, x, "stablehlo.reduce") == {((0, None), (0,))}


def test_constant_entries(registry):
    text = """
    func.func @main() -> (tensor<8x16xf32>, tensor<2x2xf32>) {
      %0 = stablehlo.constant dense<3.0> : tensor<8x16xf32>
      %1 = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
      return %0, %1 : tensor<8x16xf32>, tensor<2x2xf32>
    }"""
    splat, dense = import_stablehlo(text).ops
    assert _entries(registry, splat) == {((), (0,)), ((), (1,))}
    assert _entries(registry, dense) == set()  # stays replicated; consumers slice it locally


def test_iota_entries(registry):
    fn = lambda x: x + lax.broadcasted_iota(F32, (8, 16), 1)  # noqa: E731
    assert tmr_of(registry, fn, [((8, 16), F32)], "stablehlo.iota") == {
        ((), (0,)), ((), (1,))}


def test_slice_pad_concatenate_reverse_entries(registry):
    x = [((8, 16), F32)]
    # A strided slice of dimension 1 keeps dimension 0 whole: only dimension 0 may be tiled.
    assert tmr_of(registry, lambda a: a[:, ::2], x, "stablehlo.slice") == {((0,), (0,))}
    assert tmr_of(registry, lambda a: a[2:6, 4:12], x, "stablehlo.slice") == set()
    assert tmr_of(registry, lambda a: jnp.pad(a, ((1, 2), (0, 0))), x, "stablehlo.pad") == {
        ((1, None), (1,))}
    assert tmr_of(registry, lambda a, b: jnp.concatenate([a, b], 0), x * 2,
                  "stablehlo.concatenate") == {((1, 1), (1,))}
    assert tmr_of(registry, lambda a: a[::-1], x, "stablehlo.reverse") == {((1,), (1,))}


def test_dynamic_slice_entries(registry):
    # A dimension the slice takes whole passes through; one it takes partly is read per tile
    # (the rows outside the tile zero) and the tiles' reads add up (MaskedSlice).
    ds = lambda a, i: lax.dynamic_slice(a, (i, 0), (4, 16))  # noqa: E731
    assert tmr_of(registry, ds, [((8, 16), F32), ((), I32)], "stablehlo.dynamic_slice") == {
        ((1, None, None), (1,)), ((0, None, None), (Sum(Reduction.ADD),))}
    flags = [((8, 16), jnp.bool_), ((), I32)]  # no sum combines booleans: no masked read
    assert tmr_of(registry, ds, flags, "stablehlo.dynamic_slice") == {((1, None, None), (1,))}
    # A dimension the update covers whole is tiled in both; one it covers partly only in the
    # operand (each device writes the part of the update in its tile: MaskedUpdate).
    dus = lambda a, u, i: lax.dynamic_update_slice(a, u, (i, 0))  # noqa: E731
    assert tmr_of(registry, dus, [((8, 16), F32), ((2, 16), F32), ((), I32)],
                  "stablehlo.dynamic_update_slice") == {((1, 1, None, None), (1,)),
                                                        ((0, None, None, None), (0,))}
    dus1 = lambda a, u, i: lax.dynamic_update_slice(a, u, (0, i))  # noqa: E731
    assert tmr_of(registry, dus1, [((8, 16), F32), ((8, 4), F32), ((), I32)],
                  "stablehlo.dynamic_update_slice") == {((0, 0, None, None), (0,)),
                                                        ((1, None, None, None), (1,))}


# --------------------------------------------------------------------------------------------
# Part 2: end to end per op family.

def _args(specs, seed=0):
    out = []
    for i, (shape, dtype) in enumerate(specs):
        key = jax.random.PRNGKey(seed + i)
        if dtype == jnp.bool_:
            out.append(jax.random.bernoulli(key, 0.5, shape))
        elif jnp.issubdtype(dtype, jnp.integer):
            out.append(jax.random.randint(key, shape, 0, 8).astype(dtype))
        else:
            out.append(jax.random.uniform(key, shape, dtype, 0.1, 0.9))
    return out


def run_partitioned(fn, args, schedule):
    """Partition `fn` with `schedule` on MESH, run it, check it against `jax.jit`; return the
    last tactic's report. Sums a consumer tiles are reduce-scattered, as on accelerators
    (`scatter_sums`; CPU would all-reduce and slice them)."""
    meta = assert_matches_jax_jit(fn, args, MESH, schedule, scatter_sums=True).meta
    return meta.tactics[-1], meta


def counts(**kw):
    out = dict(all_gather=0, all_reduce=0, reduce_scatter=0, all_to_all=0, all_permute=0)
    out.update(kw)
    return out


def tile(axis, **inputs):
    return partir.ManualPartition(inputs, axis=axis)


NONE = counts()


def _unary_float(x):
    y = lax.abs(lax.neg(x))
    y = lax.exp(y) + lax.expm1(y) + lax.log(y) + lax.log1p(y) + lax.tanh(y) + lax.logistic(y)
    y = y + lax.sqrt(x) + lax.rsqrt(x) + lax.cbrt(x) + lax.sin(x) + lax.cos(x) + lax.tan(x)
    y = y + lax.floor(x * 8) + lax.ceil(x * 8) + lax.sign(x - 0.5) + lax.round(x * 8)
    y = y + lax.reduce_precision(x, 5, 10) + lax.convert_element_type(x * 8, I32)
    return jnp.where(lax.is_finite(y), y, 0.0)


def _chlo(x, y):
    out = lax.acos(x) + lax.acosh(x + 1) + lax.asin(x) + lax.asinh(x) + lax.atan(x)
    out = out + lax.atanh(x) + lax.cosh(x) + lax.sinh(x) + lax.square(x) + lax.erf(x)
    out = out + lax.erfc(x) + lax.erf_inv(x) + lax.lgamma(x) + lax.digamma(x)
    out = out + lax.bessel_i1e(x) + lax.nextafter(x, y) + lax.zeta(x + 1, y)
    return out + lax.polygamma(jnp.ones_like(x), y)


def _binary(x, y):
    out = x + y - x * y / (y + 1) + lax.max(x, y) + lax.min(x, y) + lax.pow(x, y)
    out = out + lax.rem(x, y) + lax.atan2(x, y)
    out = jnp.where(x < y, out, -out)
    return lax.clamp(x * 0.5, out, y * 4.0)


def _integer(i, j):
    out = (i & j) | (i ^ j) | lax.shift_left(i, 2) | lax.shift_right_arithmetic(j, 1)
    out = out + lax.shift_right_logical(i, 1) + lax.population_count(i) + lax.clz(j)
    return lax.bitwise_not(out)


FAMILIES = {
    # name: (function, operand specs, schedule, expected collectives of the last tactic)
    "unary": (_unary_float, [((16, 8), F32)],
              [tile("a", x=0), tile("b", x=1)], NONE),
    "chlo": (_chlo, [((16, 8), F32), ((16, 8), F32)],
             [tile("a", x=0), tile("b", y=1)], NONE),
    "binary_select_clamp": (_binary, [((16, 8), F32), ((16, 8), F32)],
                            [tile("a", x=0), tile("b", y=1)], NONE),
    "integer": (_integer, [((16, 8), I32), ((16, 8), I32)],
                [tile("a", i=1), tile("b", j=0)], NONE),
    # broadcast_in_dim: a new dimension tiled because the consumer slices it (backward), an
    # operand dimension tiled forward.
    "broadcast_in_dim": (lambda x, z: z * lax.broadcast_in_dim(x, (4, 8, 16), (1, 2)),
                         [((8, 16), F32), ((4, 8, 16), F32)],
                         [tile("a", z=0), tile("b", x=1)], NONE),
    "transpose": (lambda x, y: jnp.transpose(x, (2, 0, 1)) + y,
                  [((8, 16, 4), F32), ((4, 8, 16), F32)],
                  [tile("a", x=2), tile("b", x=1)], NONE),
    "reshape_split": (lambda x: x.reshape(8, 4, 16) * 2, [((32, 16), F32)],
                      [tile("a", x=0), tile("b", x=0)], NONE),
    "reshape_merge": (lambda x: x.reshape(32, 16) * 2, [((8, 4, 16), F32)],
                      [tile("a", x=0), tile("b", x=2)], NONE),
    # The minor part of a merged dimension cannot stay tiled: gathered before the reshape.
    "reshape_merge_minor": (lambda x: x.reshape(32, 16) * 2, [((8, 4, 16), F32)],
                            [tile("b", x=1)], counts(all_gather=1)),
    "reshape_one_to_one": (lambda x: x.reshape(32, 16, 1) + 1, [((32, 16), F32)],
                           [tile("a", x=0), tile("b", x=1)], NONE),
    # dot_general: batch (a) and free (b) dimensions need nothing; contracting gives a sum.
    "dot_general_batch_free": (lambda x, y: jnp.einsum("bij,bjk->bik", x, y),
                               [((4, 32, 8), F32), ((4, 8, 16), F32)],
                               [tile("a", x=0), tile("b", y=2)], NONE),
    "dot_general_contracting": (lambda x, y: x @ y, [((32, 8), F32), ((8, 16), F32)],
                                [tile("a", x=1), tile("b", x=0)], counts(all_reduce=1)),
    "reduce": (lambda x: (x.sum(1), x.max(1), x.min(1)), [((16, 32), F32)],
               [tile("a", x=1), tile("b", x=0)], counts(all_reduce=3)),
    "reduce_kept_dim": (lambda x: x.sum(0) * 3, [((16, 32), F32)],
                        [tile("a", x=1), tile("b", x=1)], NONE),
    "reduce_two_axes": (lambda x: x.sum((0, 1)), [((16, 32), F32)],
                        [tile("a", x=0), tile("b", x=1)], counts(all_reduce=1)),
    # A partial sum consumed tiled on the summed axis: reduce_scatter, not all_reduce.
    "reduce_scatter": (lambda x, y: x.sum(1) * y, [((16, 32), F32), ((16,), F32)],
                       [tile("a", x=1, y=0)], counts(reduce_scatter=1)),
    "iota_two_axes": (lambda x: x * lax.broadcasted_iota(F32, (16, 8), 0),
                      [((16, 8), F32)], [tile("a", x=0), tile("b", x=0)], NONE),
    "constant_iota": (lambda x: x * lax.broadcasted_iota(F32, (16, 8), 1)
                      + lax.broadcasted_iota(F32, (16, 8), 0) + 3.0,
                      [((16, 8), F32)], [tile("a", x=0), tile("b", x=1)], NONE),
    "slice": (lambda x: x[:, ::2] + 1, [((16, 8), F32)],
              [tile("a", x=0), tile("b", x=1)], counts(all_gather=1)),
    "pad": (lambda x: jnp.pad(x, ((1, 2), (0, 0))), [((16, 8), F32)],
            [tile("a", x=1), tile("b", x=0)], counts(all_gather=1)),
    "concatenate": (lambda x, y: jnp.concatenate([x, y], 0) * 2,
                    [((16, 8), F32), ((16, 8), F32)],
                    [tile("a", x=1), tile("b", y=0)], counts(all_gather=1)),
    "reverse": (lambda x: x[::-1] * 2, [((16, 8), F32)],
                [tile("a", x=1), tile("b", x=0)], counts(all_gather=1)),
    "dynamic_slice": (lambda x, i: lax.dynamic_slice(x, (i, 0), (4, 8)),
                      [((16, 8), F32), ((), I32)], [tile("a", x=1)], NONE),
    "dynamic_update_slice": (lambda x, u, i: lax.dynamic_update_slice(x, u, (i, 0)),
                             [((16, 8), F32), ((2, 8), F32), ((), I32)],
                             [tile("a", x=1), tile("b", u=1)], NONE),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_end_to_end(family):
    fn, specs, schedule, expected = FAMILIES[family]
    report, _ = run_partitioned(fn, _args(specs), schedule)
    assert report.collectives == expected
    assert report.unsupported_ops == {}


# --------------------------------------------------------------------------------------------
# Part 3: ops without a rule.

def test_custom_call_without_rule_stays_replicated():
    # A batch of Cholesky factorisations: on CPU a LAPACK custom_call, which has no rule.
    def f(x):
        y = x * 2
        spd = y @ jnp.swapaxes(y, 1, 2) + 64 * jnp.eye(16, dtype=y.dtype)
        return jnp.linalg.cholesky(spd) + 1, y

    report, meta = run_partitioned(f, _args([((4, 16, 8), F32)]), [tile("a", x=0)])
    (key,) = report.unsupported_ops
    assert key.startswith("stablehlo.custom_call[") and report.unsupported_ops[key] == 1
    assert key in meta.report() and "kept replicated" in meta.report()
    # Everything before the custom_call stays tiled on the batch; its operand is gathered.
    assert report.collectives == counts(all_gather=1)
    assert meta.out_shardings[0].spec == jax.sharding.PartitionSpec()
    assert meta.out_shardings[1].spec == jax.sharding.PartitionSpec("a")


def test_fft_without_rule_stays_replicated():
    def f(x):
        y = jnp.sin(x)
        return jnp.fft.fft(y).real * 2, y

    report, meta = run_partitioned(f, _args([((16, 8), F32)]), [tile("a", x=0)])
    assert report.unsupported_ops == {"stablehlo.fft": 1}
    assert "stablehlo.fft x1" in meta.report()
    assert report.collectives == counts(all_gather=1)
    assert meta.out_shardings[0].spec == jax.sharding.PartitionSpec()
    assert meta.out_shardings[1].spec == jax.sharding.PartitionSpec("a")


def test_pooling_and_its_gradient_partition_on_batch_and_channels():
    """reduce_window (max/avg pool) and select_and_scatter (max-pool gradient): batch and
    channel dimensions pass through; windowed dimensions stay whole."""
    import flax.linen as nn

    def loss(x, w):
        y = nn.max_pool(x, (2, 2), strides=(2, 2)) + nn.avg_pool(x, (2, 2), strides=(2, 2))
        return (y @ w).sum()

    grad = jax.grad(loss)
    x = jax.random.normal(jax.random.PRNGKey(0), (8, 16, 16, 4))
    w = jnp.ones((4, 6))
    schedule = [partir.ManualPartition({"x": 0}, axis="a"),
                partir.ManualPartition({"x": 3}, axis="b")]
    step, meta = partir.jit(grad, {"a": 4, "b": 2}, schedule)
    out = step(x, w)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(grad)(x, w)), atol=1e-6)
    assert out.sharding.spec == jax.sharding.PartitionSpec("a", None, None, "b")
    # Only the channel contraction with w (tiled on b) needs a reduction; nothing is gathered.
    assert meta.tactics[-1].collectives["all_reduce"] == 1
    assert meta.tactics[-1].collectives["all_gather"] == 0
    assert meta.tactics[-1].unsupported_ops == {}


def test_rematerialized_layers_optimization_barrier():
    """jax.checkpoint emits optimization barriers around the saved values; the importer gives
    each value its own barrier, an identity that tiles like its operand."""

    def layer(h, w):
        return jnp.tanh(h @ w)

    def loss(x, w1, w2):
        h = jax.checkpoint(layer)(x, w1)
        return (jax.checkpoint(layer)(h, w2) ** 2).sum()

    grad = jax.grad(loss, argnums=(1, 2))
    args = [jax.random.normal(jax.random.PRNGKey(i), s)
            for i, s in enumerate([(64, 16), (16, 16), (16, 16)])]
    assert "optimization_barrier" in jax.jit(grad).lower(*args).as_text()
    step, meta = partir.jit(grad, {"batch": 8}, [partir.ManualPartition({"x": 0},
                                                                        axis="batch")])
    for a, b in zip(step(*args), jax.jit(grad)(*args)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    # Batch parallelism through the barriers: one all_reduce per weight gradient, nothing else.
    assert meta.tactics[0].collectives["all_reduce"] == 2
    assert sum(meta.tactics[0].collectives.values()) == 2
    assert meta.tactics[0].unsupported_ops == {}


def test_composite_is_partitioned_through_its_decomposition():
    """`jax.lax.composite` lowers to `stablehlo.composite` naming a decomposition function;
    the importer inlines it, so the op partitions like its body (no gather) and the
    device-local module has no dangling reference to the decomposition."""
    gelu = jax.lax.composite(lambda x: x * jax.nn.sigmoid(1.702 * x), name="test.gelu")

    def f(x, w):
        return gelu(x @ w)

    report, meta = run_partitioned(f, _args([((16, 8), F32), ((8, 4), F32)]),
                                   [tile("a", x=0)])
    assert report.collectives == counts()
    assert report.unsupported_ops == {}
    assert meta.out_shardings.spec == jax.sharding.PartitionSpec("a")
    # The ops, not the location aliases closing the module (jax's names for the traced ops).
    ops = [x for x in meta.device_local_stablehlo.splitlines() if not x.startswith("#loc")]
    assert not any("composite" in x for x in ops)
