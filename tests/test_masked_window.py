"""A window of a tiled dimension read or written where it falls (`spmd/rules/masked_window.py`):
a `dynamic_update_slice` whose update covers a tiled dimension only partly writes, on each
device, the part of the update in its tile; a `dynamic_slice` reads each tile's part of the
window (zeros elsewhere) and the parts add up. Checked against jax.jit over the ops'
attribute space (windows below, equal to and above a tile; starts inside, across tiles and
clamped; even and padded tiles; a dimension tiled over two axes; two tiled dimensions; signed
and unsigned starts; integers), and on the users' recipes they are for: a scan over stacked
layers that ZeRO shards on the layer dimension (each layer's parameters read, its gradient
written, in every iteration), and a decode loop writing into a sequence-sharded KV cache."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import partir_plugin as partir
from partir_plugin.models import transformer

STARTS = [(0, 0), (3, 2), (-1, 7), (6, 1), (8, 4), (2, -3)]
TILE_ROWS = partir.ManualPartition({"x": 0}, axis="a")
MESHES = {
    "rows": ({"a": 4}, [TILE_ROWS]),
    "rows and columns": ({"a": 2, "b": 4}, [TILE_ROWS, partir.ManualPartition({"x": 1}, axis="b")]),
    "rows over two axes": ({"a": 2, "b": 4}, [partir.ManualPartition({"x": 0}, axis="b"),
                                              TILE_ROWS]),
}


def _write(x, u, i, j):
    return jax.lax.dynamic_update_slice(x, u, (i, j)) + 1.0


def _moved(meta) -> list[tuple[str, str]]:
    """(kind, reason) of every collective but a padded output's gathers at the program's
    boundary (jax shards only divisible dimensions)."""
    return [(r.kind.value, r.reason.value) for r in meta.tactics[-1].records
            if r.reason.value != "boundary"]


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("shape,update", [((8, 6), (1, 1)), ((8, 6), (3, 6)), ((8, 6), (5, 4)),
                                          ((9, 5), (2, 3)), ((9, 5), (9, 2))],
                         ids=lambda v: "x".join(map(str, v)))
def test_a_write_into_tiled_rows_is_jax_jits(mesh, shape, update):
    """Every start (negative and past the end clamp as StableHLO clamps) on one compiled step;
    tiles of 2 rows meet updates of 1, 3 (across tiles), 5 and 9 rows; 9 rows pad the tiles."""
    axes, schedule = MESHES[mesh]
    x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
    u = -1.0 - jnp.arange(np.prod(update), dtype=jnp.float32).reshape(update)
    fn, meta = partir.jit(_write, axes, schedule, uneven_outputs="replicate")
    want = jax.jit(_write)
    for i, j in STARTS:
        got = fn(x, u, jnp.int32(i), jnp.int32(j))
        np.testing.assert_array_equal(got, want(x, u, jnp.int32(i), jnp.int32(j)),
                                      err_msg=f"start {(i, j)}")
    assert not _moved(meta)  # no gather of the operand around the write


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("shape,window", [((8, 6), (1, 1)), ((8, 6), (3, 5)), ((8, 6), (5, 6)),
                                          ((9, 5), (2, 3)), ((9, 5), (8, 2))],
                         ids=lambda v: "x".join(map(str, v)))
def test_a_read_of_tiled_rows_is_jax_jits(mesh, shape, window):
    """The read: windows of 1, 3 (across tiles), 5 and 8 rows from tiles of 2 or 3 (9 rows
    pad them), every start on one compiled step; the tiles' parts add up in one all_reduce
    of the window, and nothing gathers the operand."""
    axes, schedule = MESHES[mesh]
    x = 1.0 + jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)

    def read(x, i, j):
        return jax.lax.dynamic_slice(x, (i, j), window) * 2.0

    fn, meta = partir.jit(read, axes, schedule, uneven_outputs="replicate")
    for i, j in STARTS:
        np.testing.assert_array_equal(fn(x, jnp.int32(i), jnp.int32(j)),
                                      jax.jit(read)(x, jnp.int32(i), jnp.int32(j)),
                                      err_msg=f"start {(i, j)}")
    assert _moved(meta) == [("all_reduce", "partial sum")]


def test_unsigned_starts_and_integer_values():
    def write_then_read(x, u, i):
        y = jax.lax.dynamic_update_slice(x, u, (i, jnp.uint32(1)))
        return y, jax.lax.dynamic_slice(y, (i + 1, jnp.uint32(0)), (3, 6))

    x = jnp.arange(48, dtype=jnp.int32).reshape(8, 6)
    u = -jnp.ones((3, 2), jnp.int32)
    fn, _ = partir.jit(write_then_read, {"a": 4}, [TILE_ROWS])
    for i in (0, 1, 5, 7, 100):
        for got, want in zip(fn(x, u, jnp.uint32(i)), write_then_read(x, u, jnp.uint32(i))):
            np.testing.assert_array_equal(got, want)


def test_a_boolean_read_gathers_instead():
    """No sum combines booleans: a read of a tiled mask gathers it, as before."""
    def read(m, i):
        return jax.lax.dynamic_slice(m, (i, 0), (2, 4))

    m = jnp.arange(32).reshape(8, 4) % 3 == 0
    fn, meta = partir.jit(read, {"a": 4}, [partir.ManualPartition({"m": 0}, axis="a")])
    np.testing.assert_array_equal(fn(m, jnp.int32(3)), read(m, jnp.int32(3)))
    assert [kind for kind, _ in _moved(meta)] == ["all_gather"]


def _gradients(loss, optimizer):
    def step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, grads, value
    return step


@pytest.mark.parametrize("zero", ["Z2", "Z3"])
def test_zero_on_the_layer_dimension_moves_one_layer_per_iteration(zero):
    """ZeRO sharding `nn.scan`-style stacked leaves on their layer dimension (`dim=`, as a user
    may choose; the default takes another): the backward loop writes layer i's gradient into
    the stack where it falls, and Z3's loops read layer i's parameters with one all_reduce of
    the layer. Before, each access gathered the whole stack in every iteration. Nothing ZeRO
    adds inside a loop moves more than one layer (Z2 adds nothing there), and loss and
    gradients are jax.jit's."""
    layers = 4
    cfg = dataclasses.replace(transformer.Config.small(layers=layers, scan=True), batch=8,
                              seq_len=16, vocab=64, d_model=32, heads=4, head_dim=8, ffw=64)
    params, opt_state, batch = transformer.init(cfg, jax.random.PRNGKey(0))
    step = _gradients(lambda p, b: transformer.loss_fn(cfg, p, b), optax.adam(1e-3))

    def on_layers(path, shape):
        return 0 if "blocks" in str(path) and len(shape) >= 2 and shape[0] == layers else None

    bp = partir.tactic("BP", axis="batch", inputs=("batch",))
    ours, meta = partir.jit(step, {"batch": 4}, [bp, partir.tactic(zero, axis="batch",
                                                                   dim=on_layers)])
    got, want = ours(params, opt_state, batch), jax.jit(step)(params, opt_state, batch)
    np.testing.assert_allclose(got[3], want[3], rtol=1e-5)
    for g, w in zip(jax.tree.leaves(got[2]), jax.tree.leaves(want[2])):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
    sharded = meta.in_shardings[0 if zero == "Z3" else 1]
    stacked = (sharded if zero == "Z3" else sharded[0].mu)["blocks"]
    assert all(s.spec[0] == "batch" for s in jax.tree.leaves(
        stacked, is_leaf=lambda s: hasattr(s, "spec")) if len(s.spec) >= 2)
    layer_bytes = max(4 * np.prod(x.shape[1:]) for x in jax.tree.leaves(params["blocks"]))
    in_loop = [r for r in meta.tactics[-1].records if r.tactic == zero and r.count == layers]
    assert all(r.bytes <= layer_bytes for r in in_loop), [(r.kind, r.bytes) for r in in_loop]
    assert bool(in_loop) == (zero == "Z3")


def test_a_decode_loop_writes_into_a_sequence_sharded_cache():
    """A KV cache [batch, seq, d] sharded on its sequence over 4 devices; each of 16 decode
    steps writes its token's row at the current position: the cache stays sharded through the
    loop (no gather of it) and the outputs are jax.jit's."""
    def decode(cache, x, w):
        def body(t, carry):
            cache, h = carry
            h = jnp.tanh(h @ w)
            cache = jax.lax.dynamic_update_slice(cache, h[:, None, :], (0, t, 0))
            return cache, h
        cache, h = jax.lax.fori_loop(0, cache.shape[1], body, (cache, x))
        return cache, h

    cache = jnp.zeros((2, 16, 8), jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 8))
    w = jax.random.normal(jax.random.PRNGKey(1), (8, 8)) / 3
    fn, meta = partir.jit(decode, {"seq": 4},
                          [partir.ManualPartition({"cache": 1}, axis="seq")])
    got, want = fn(cache, x, w), jax.jit(decode)(cache, x, w)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    assert meta.tactics[-1].collectives.get("all_gather", 0) == 0
    assert got[0].sharding.spec[1] == "seq"
