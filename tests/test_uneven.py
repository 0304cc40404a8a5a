"""Issue 21 item 1: uneven dimensions. A dimension of any size tiled over an axis that does not
divide it gets padded tiles; every result equals the unpartitioned `jax.jit(fn)`'s on 8 CPU
devices (never XLA's sharded output), with inputs that a zero in the padding would corrupt."""

from __future__ import annotations

import dataclasses
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oracle import assert_matches_jax_jit

import partir_plugin as partir
from partir_plugin.core.padding import is_padded, local_extent, tile_bounds
from partir_plugin.core.rules.prefix_scan import ScanEntry
from partir_plugin.extend import Sum, verify_entry, verify_registry
from partir_plugin.ir.graph import walk
from partir_plugin.ir.importer import import_lowered
from partir_plugin.plugin.manager import default_registry

pytestmark = pytest.mark.slow  # compiles a program per uneven case

MESH = {"m": 8}


def _check(fn, args, inputs, mesh=None, axis="m", schedule=None, **options):
    """Partition `fn` with `inputs` tiled on `axis`, compare every output with jax.jit's."""
    schedule = schedule or [partir.ManualPartition(inputs, axis=axis)]
    matched = assert_matches_jax_jit(fn, args, mesh or MESH, schedule, **options)
    return matched.step, matched.meta


def _negative(shape, seed=0):
    """All values below -1: a zero in the padding would win a max and shift a sum."""
    return -1.0 - np.abs(np.random.default_rng(seed).normal(size=shape)).astype(np.float32)


def _positive(shape, seed=0):
    return 1.0 + np.abs(np.random.default_rng(seed).normal(size=shape)).astype(np.float32)


def test_padding_arithmetic():
    assert local_extent(37, [8]) == 5 and is_padded(37, [8]) and not is_padded(40, [8])
    assert [tile_bounds(37, [8], [j]) for j in (0, 7)] == [(0, 5), (35, 2)]
    assert tile_bounds(3, [8], [5]) == (5, 0)  # a tile that is all padding
    # Level by level: 37 over 2 then 4: tiles of 19 then 5.
    assert local_extent(37, [2, 4]) == 5 and tile_bounds(37, [2, 4], [1, 3]) == (34, 3)


REDUCTIONS = {
    "sum": (lambda x: jnp.sum(x, axis=0), _negative),
    "mean": (lambda x: jnp.mean(x, axis=0), _negative),
    "max": (lambda x: jnp.max(x, axis=0), _negative),
    "min": (lambda x: jnp.min(x, axis=0), _positive),
    "prod": (lambda x: jnp.prod(x * 0.5, axis=0), _positive),
    "argmax": (lambda x: jnp.argmax(x, axis=0), _negative),
    "argmin": (lambda x: jnp.argmin(x, axis=0), _positive),
    "cumsum": (lambda x: jnp.cumsum(x, axis=0)[-1], _negative),
    "logsumexp": (lambda x: jax.nn.logsumexp(x, axis=0), _negative),
    # 1/x and log(x) turn a zero padding into inf: the masks select, never multiply.
    "reciprocal_sum": (lambda x: jnp.sum(1.0 / x, axis=0), _positive),
    "log_sum": (lambda x: jnp.sum(jnp.log(x), axis=0), _positive),
    # sqrt(x - 1) of a zero padding is NaN: a masked multiply would keep it.
    "sqrt_sum": (lambda x: jnp.sum(jnp.sqrt(x - 1.0), axis=0), _positive),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions_over_37_tiled_8_ways(name):
    fn, data = REDUCTIONS[name]
    _check(fn, (data((37, 6)),), {"x": 0})


@pytest.mark.parametrize("rows", [37, 40])
def test_argmax_reduces_tiles_and_gathers_only_partials(rows):
    """argmax and argmin (a reduce of values and their indices) run on their tiles and
    combine the k partials with their own reducer: two all_gathers of [8, 6] (values,
    indices), never of the operand. Ties go to the first index, NaN wins and a column of
    -inf gives index 0, as in jax.jit, padded or not: bit for bit."""
    x = np.random.default_rng(0).normal(size=(rows, 6)).astype(np.float32) - 3.0
    x[5, 0] = np.nan
    x[:, 1] = -np.inf
    x[3:9, 2] = 7.0
    x[rows - 1, 3] = 9.0  # the maximum in the last (padded) tile
    for fn in (lambda x: jnp.argmax(x, axis=0), lambda x: jnp.argmin(x, axis=0)):
        f, meta = partir.jit(fn, MESH, [partir.ManualPartition({"x": 0}, axis="m")])
        np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(jax.jit(fn)(x)))
        gathers = re.findall(r'"stablehlo.all_gather".*-> tensor<([^>]*)>',
                             meta.device_local_stablehlo)
        assert sorted(gathers) == ["8x6xf32", "8x6xi32"], gathers

    func = import_lowered(jax.jit(lambda x: jnp.argmax(x, axis=0)).lower(x[:32]))
    report = verify_registry(walk(func.ops), default_registry(), parts=(2, 4))
    own = [v for v in report.verdicts if any(isinstance(r, Sum) and not r.pending
                                            for r in v.entry.results)]
    assert len(own) == 2 and not report.wrong, str(report)


SCANS = {
    "cumsum": lambda x: jnp.cumsum(x, axis=0),
    "cumsum-reversed": lambda x: jax.lax.cumsum(x, 0, reverse=True),
    "cummax": lambda x: jax.lax.cummax(x, 0),
    "cummin-reversed": lambda x: jax.lax.cummin(x, 0, reverse=True),
    "cumprod": lambda x: jax.lax.cumprod(x * 0.5, 0),
    "cumsum-gradient": jax.grad(lambda x: (jnp.cumsum(x, axis=0) ** 2).sum()),
}


@pytest.mark.parametrize("rows", [37, 64])
@pytest.mark.parametrize("name", sorted(SCANS))
def test_scans_over_a_tiled_dimension_gather_only_tile_totals(name, rows):
    """A scan (jax's cumsum is a reduce_window as long as the dimension) runs on each tile and
    adds the carry of the tiles before it: one all_gather of the tile totals ([8, 6]), never of
    the operand, on one axis and on two (37 over 2 then 4 pads a tile in the middle). The
    padding holds the reducer's identity, so reversed scans are right too. An uneven output
    is gathered and trimmed (the one other all_gather, of the result)."""
    x = _negative((rows, 6))
    for mesh, axes in (({"m": 8}, ("m",)), ({"a": 2, "b": 4}, ("a", "b"))):
        schedule = [partir.ManualPartition({"x": 0}, axis=a) for a in axes]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", partir.UnevenOutputWarning)
            _, meta = _check(SCANS[name], (x,), {"x": 0}, mesh=mesh, schedule=schedule,
                             uneven_outputs="replicate")
        text = meta.device_local_stablehlo
        gathers = re.findall(r'"stablehlo.all_gather".*-> tensor<([^>]*)>', text)
        assert gathers.count("8x6xf32") == (2 if "gradient" in name else 1), gathers
        if rows == 64:
            assert set(gathers) == {"8x6xf32"}, gathers
        else:  # the output's gather, after the last scan
            last_scan = text.rindex('"stablehlo.reduce_window"')
            assert all(m.start() > last_scan for m in re.finditer(
                r'"stablehlo.all_gather".*-> tensor<(?!8x6xf32)', text)), gathers


def test_scan_entries_verify_side_by_side():
    """The forward cumsum and its gradient (a reversed cumsum): each scan entry, run on 2 and
    4 devices side by side, gives the whole op's result; a scan entry with the direction
    flipped is caught."""
    func = import_lowered(jax.jit(jax.grad(lambda x: (jnp.cumsum(x, 1) ** 2).sum()))
                          .lower(jnp.ones((4, 32))))
    ops = list(walk(func.ops))
    registry = default_registry()
    report = verify_registry(ops, registry, parts=(2, 4))
    scans = [v for v in report.verdicts if isinstance(v.entry, ScanEntry)]
    assert {(v.entry.reverse, v.parts) for v in scans} == {
        (False, 2), (False, 4), (True, 2), (True, 4)}, str(report)
    assert not report.wrong, str(report)
    op = next(op for op in ops if op.name == "stablehlo.reduce_window")
    entry = next(e for e in registry.entries(op) if isinstance(e, ScanEntry))
    assert not verify_entry(op, dataclasses.replace(entry, reverse=not entry.reverse), 4).ok


@pytest.mark.parametrize("n,k", [(37, 3), (64, 5), (37, 12)])
def test_top_k_merges_tile_candidates_like_top_k_on_the_whole_dimension(n, k):
    """top_k over a tiled last dimension: each tile's top k (a tile shorter than k padded
    with -inf), their indices made global, gathered and merged by a second top_k: two
    all_gathers of [4, 8k] candidates and nothing of the operand. Ties go to the lower
    index, a row of -inf gives indices 0..k-1, NaN counts as the largest, as jax.jit's
    top_k gives them: bit for bit, on one axis and on two (37 over 2 then 4)."""
    x = np.round(np.random.default_rng(n + k).normal(size=(4, n)) * 2).astype(np.float32)
    x[0] = -np.inf
    x[1, 5] = np.nan
    x[2, n - 1] = 50.0  # the largest in the last (padded) tile
    fn = lambda x: jax.lax.top_k(x, k)  # noqa: E731
    for mesh, axes in (({"m": 8}, ("m",)), ({"a": 2, "b": 4}, ("a", "b"))):
        schedule = [partir.ManualPartition({"x": 1}, axis=a) for a in axes]
        f, meta = partir.jit(fn, mesh, schedule)
        for got, want in zip(f(x), jax.jit(fn)(x), strict=True):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        gathers = re.findall(r'"stablehlo.all_gather".*-> tensor<([^>]*)>',
                             meta.device_local_stablehlo)
        assert sorted(gathers) == [f"4x{8 * k}xf32", f"4x{8 * k}xi32"], gathers

    func = import_lowered(jax.jit(fn).lower(x[:, :32]))
    report = verify_registry(walk(func.ops), default_registry(), parts=(2, 4))
    own = [v for v in report.verdicts if any(isinstance(r, Sum) and not r.pending
                                            for r in v.entry.results)]
    assert len(own) == 2 and not report.wrong, str(report)


def test_max_masks_padding_with_minus_infinity_and_reports_it():
    _, meta = _check(lambda x: jnp.max(x, axis=0), (_negative((37, 6)),), {"x": 0})
    [line] = meta.tactics[-1].padding
    assert line.startswith("pad size 37 over 'm'(8): 5 per device, 3 padding")
    assert "masks: 1 (stablehlo.reduce (max identity) x1)" in line
    assert line in meta.report()


def test_softmax_over_uneven_dimension_replicated_output_warns():
    x = _negative((4, 37))
    with pytest.warns(partir.UnevenOutputWarning, match=r"dimension 1 of size 37"):
        _check(lambda x: jax.nn.softmax(x, axis=1), (x,), {"x": 1},
               uneven_outputs="replicate")


def test_matmul_contracting_and_free_uneven_dimensions():
    a, b = _negative((37, 16), 1), _positive((37, 24), 2)
    _check(lambda a, b: a.T @ b, (a, b), {"a": 0, "b": 0})  # contraction over 37
    c = _negative((16, 37), 3)
    # 37 is a free dimension of the first matmul, the contraction of the second.
    _check(lambda a, c: jnp.sum(jnp.tanh(a @ c) @ a, axis=0), (a, c), {"a": 0})


def test_gradients_through_uneven_tiles():
    def loss(x, w):
        return jnp.mean(jax.nn.log_softmax(x @ w, axis=0) ** 2)

    x, w = _negative((37, 16)), _positive((16, 5), 1) * 0.1
    _check(jax.value_and_grad(loss, argnums=(0, 1)), (x, w), {"x": 0},
           uneven_outputs="replicate")


def test_two_axes_on_one_uneven_dimension_and_all_to_all():
    """37 tiled over 'a' (2) then 'b' (4): padded level by level; the value then moves to
    another dimension (all_to_all with padding on both sides) and back."""
    x = _negative((37, 6))

    def fn(x):
        y = jnp.exp(x) * 2.0
        return jnp.sum(y, axis=0), jnp.max(y, axis=0), jnp.argmax(y, axis=0)

    schedule = [partir.ManualPartition({"x": 0}, axis="a"),
                partir.ManualPartition({"x": 0}, axis="b")]
    _check(fn, (x,), None, mesh={"a": 2, "b": 4}, schedule=schedule)

    def moved(x):
        z = partir.tag(jnp.sin(x), "z")
        return jnp.sum(z * z, axis=1), jnp.max(z, axis=0)

    schedule = [partir.ManualPartition({"x": 0}, axis="m", tags={"z": 1})]
    _check(moved, (_negative((37, 21)),), None, schedule=schedule, uneven_outputs="replicate")


def test_batch_of_12_over_8():
    """A data-parallel MLP train step with a batch of 12 on 8 devices: loss and gradients."""
    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(10, 32)).astype(np.float32) * 0.3,
              "w2": rng.normal(size=(32, 4)).astype(np.float32) * 0.3}
    x = rng.normal(size=(12, 10)).astype(np.float32)
    y = rng.integers(0, 4, size=(12,))

    def loss(params, x, y):
        h = jax.nn.relu(x @ params["w1"])
        logits = h @ params["w2"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    step = jax.value_and_grad(loss)
    f, meta = _check(step, (params, x, y), {"x": 0, "y": 0})
    assert any("pad size 12 over 'm'(8): 2 per device, 4 padding" in line
               for line in meta.tactics[-1].padding)
    # The inputs come in replicated (jax shards only divisible dimensions) and are sliced.
    assert meta.in_shardings[1].spec == jax.sharding.PartitionSpec()


def test_uneven_embedding_table_in_flax_optax_train_step():
    """A [1001, D] embedding table tiled on the vocabulary inside a Flax/optax train step:
    the loss, the updated table (gathered and trimmed) and the optimizer state."""
    import flax.linen as nn
    import optax

    class Model(nn.Module):
        @nn.compact
        def __call__(self, ids):
            h = nn.Embed(1001, 16)(ids)
            return nn.Dense(3)(jnp.tanh(h).mean(axis=1))

    model, optimizer = Model(), optax.adam(1e-2)
    ids = np.random.default_rng(0).integers(0, 1001, size=(8, 5)).astype(np.int32)
    labels = np.arange(8) % 3
    params = model.init(jax.random.PRNGKey(0), ids)
    opt_state = optimizer.init(params)

    def train_step(params, opt_state, ids, labels):
        def loss(p):
            logits = model.apply(p, ids)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value, grads

    vocab = {"params": {"Embed_0": {"embedding": 0}}}
    schedule = [partir.ManualPartition({"params": vocab}, axis="m")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f, meta = _check(train_step, (params, opt_state, ids, labels), None, schedule=schedule,
                         uneven_outputs="replicate")
    assert any(issubclass(w.category, partir.UnevenOutputWarning)
               and "params/Embed_0/embedding" in str(w.message) for w in caught)
    assert any("pad size 1001 over 'm'(8): 126 per device, 7 padding" in line
               for line in meta.tactics[-1].padding)


def test_uneven_output_is_an_error_by_default_naming_it():
    def fn(x):
        return {"out": jnp.sin(x)}

    f, _ = partir.jit(fn, MESH, [partir.ManualPartition({"x": 0}, axis="m", name="SEQ")])
    with pytest.raises(partir.PartitionError) as e:
        f(np.ones((37, 3), np.float32))
    msg = str(e.value)
    for part in ("output 'out'", "dimension 0", "size 37", "8 ways", "'m'", "tactic 'SEQ'",
                 "uneven_outputs='replicate'"):
        assert part in msg, (part, msg)


def test_padding_error_option():
    fn = lambda x: jnp.sum(x, axis=0)  # noqa: E731
    f, _ = partir.jit(fn, MESH, [partir.ManualPartition({"x": 0}, axis="m")], padding="error")
    with pytest.raises(partir.PartitionError, match=r"dimension 0 has local size 37 .*"
                                                    r"'m' of size 8.*padding='error'"):
        f(np.ones((37, 3), np.float32))
    # Propagation never pads under it either: a divisible tiling stops at the uneven value.
    g = lambda x, y: jnp.sum(x, axis=1) @ y  # noqa: E731
    _check(g, (np.ones((40, 3), np.float32), np.ones((40, 37), np.float32)), {"x": 0},
           padding="error")
    with pytest.raises(ValueError, match="padding='sometimes'"):
        partir.jit(fn, MESH, [], padding="sometimes")


MOVES = {
    "concatenate": lambda x: jnp.concatenate([x, 2.0 * x[:5]], axis=0),
    "pad": lambda x: jnp.pad(x, ((3, 2), (0, 0)), constant_values=-7.0),
    "reverse": lambda x: x[::-1],
    "slice": lambda x: x[4:33],
    "iota": lambda x: x + jnp.arange(37, dtype=x.dtype)[:, None],
    "sort": lambda x: jnp.sort(x, axis=0),
    "top_k": lambda x: jax.lax.top_k(x.T, 4)[0],
    "roll": lambda x: jnp.roll(x, 3, axis=0),
}


@pytest.mark.parametrize("name", sorted(MOVES))
def test_data_movement_along_the_uneven_dimension(name):
    """Ops that move rows along the padded dimension read it whole (trimmed), or, for iota,
    offset by the device's tile start: each result, reduced over the rows, is jax.jit's."""
    move = MOVES[name]
    _check(lambda x: (jnp.max(move(x), axis=0), jnp.sum(move(x) ** 2)),
           (_negative((37, 6)),), {"x": 0})


def test_scatter_add_gradient_with_padded_updates():
    """An embedding lookup with a batch of 12 over 8: the table's gradient is a scatter-add of
    padded updates at padded ids, masked to zero before the scatter."""
    table = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    ids = np.random.default_rng(1).integers(0, 50, size=(12,)).astype(np.int32)

    def loss(table, ids):
        return jnp.sum(jnp.tanh(table[ids]) ** 2)

    _, meta = _check(jax.value_and_grad(loss), (table, ids), {"ids": 0})
    assert any("scatter" in line for line in meta.tactics[-1].padding)


def test_input_comes_in_on_its_largest_divisible_layout():
    """12 rows over 'a' (2) then 'b' (4): 'a' divides 12, 'b' does not divide the 6 left, so
    the argument is sharded over 'a' at the program's boundary and sliced over 'b' inside."""
    schedule = [partir.ManualPartition({"x": 0}, axis="a"),
                partir.ManualPartition({"x": 0}, axis="b")]
    _, meta = _check(lambda x: jnp.sum(jnp.exp(x), axis=0), (_negative((12, 3)),), None,
                     mesh={"a": 2, "b": 4}, schedule=schedule)
    assert meta.in_shardings[0].spec == jax.sharding.PartitionSpec("a")


def test_sorted_unique_index_hints_are_dropped_on_padded_indices():
    """Padding holds any index, so a gather's or scatter's promise of sorted, unique indices
    is dropped where its indices are padded tiles."""
    table = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    ids = np.sort(np.random.default_rng(1).choice(50, size=12, replace=False)).astype(np.int32)

    def loss(table, ids):
        rows = table.at[ids].get(indices_are_sorted=True, unique_indices=True)
        return jnp.sum(jnp.tanh(rows) ** 2)

    f, _ = _check(jax.value_and_grad(loss), (table, ids), {"ids": 0})
    text = f.lower(table, ids).as_text()
    padded = [line for line in text.splitlines()
              if ("stablehlo.gather" in line or "stablehlo.scatter" in line) and "2x1xi32" in line]
    assert padded and not any("= true" in line for line in padded)


def _sgd_step(loss):
    """The loss and one SGD update of the table (the update tiles the table's gradient like
    the table, as ZeRO's optimizer state does)."""
    def step(table, ids):
        value, grad = jax.value_and_grad(loss)(table, ids)
        return value, table - 0.1 * grad
    return step


def _scatter_results(f, *args) -> list[str]:
    """The device-local result type of each scatter (its region closes the op: the type is
    on the line closing it)."""
    lines = f.lower(*args).as_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        if "stablehlo.scatter" in line:
            end = next(x for x in lines[i:] if x.strip().startswith("})"))
            found.append(end.rsplit("->", 1)[-1].split(" loc(")[0].strip())
    return found


def test_embedding_gradient_exchange_into_padded_vocabulary_tiles():
    """Batch and an uneven vocabulary (1001) tiled on the same axis: the table's gradient is
    made per padded vocabulary tile from every device's updates (spmd/scatter_exchange.py)."""
    table = np.random.default_rng(0).normal(size=(1001, 8)).astype(np.float32)
    ids = np.random.default_rng(1).integers(0, 1001, size=(16, 3)).astype(np.int32)

    def loss(table, ids):
        return jnp.mean(jnp.tanh(table[ids]) ** 2)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", partir.UnevenOutputWarning)
        f, meta = _check(_sgd_step(loss), (table, ids), {"table": 0, "ids": 0},
                         uneven_outputs="replicate")
        assert _scatter_results(f, table, ids) == ["tensor<126x8xf32>"]
    assert any("pad size 1001 over 'm'(8)" in line for line in meta.tactics[-1].padding)


@pytest.mark.parametrize("ids_dim", [0, 1])
def test_embedding_gradient_exchange_with_padded_batch_on_another_axis(ids_dim):
    """The exchange over 'b' while a batch of 10 stays summed over 'a' (3 ways: padded): the
    updates' padding on 'a' is masked before the scatter (garbage ids would add garbage rows
    of the table's gradient)."""
    table = np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32)
    ids = np.random.default_rng(1).integers(0, 40, size=(10, 4)).astype(np.int32)

    def loss(table, ids):
        return jnp.sum(jnp.tanh(table[ids]) ** 2)

    schedule = [partir.ManualPartition({"ids": 0}, axis="a"),
                partir.ManualPartition({"table": 0, "ids": ids_dim}, axis="b")]
    f, _ = _check(_sgd_step(loss), (table, ids), None, mesh={"a": 3, "b": 2},
                  schedule=schedule)
    assert _scatter_results(f, table, ids) == ["tensor<20x8xf32>"]
