"""One lowering rule at a time (`spmd/rules/`): a tiny program, partitioned and lowered (no XLA
compile), and the rule's signature ops in its device-local text, as Shardy tests each
rewrite pattern on a small .mlir file."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import partir_plugin as partir
from partir_plugin.frontend.trace import trace
from partir_plugin.ir.graph import walk
from partir_plugin.markers import interleave
from partir_plugin.options import PartitionOptions
from partir_plugin.spmd.lowering import LoweringCache, SpmdProgram, lower_to_spmd
from partir_plugin.spmd.rules import registry
from partir_plugin.spmd.rules.halo import HaloWarning
from partir_plugin.stages import partition, partition_function


def _lowered(fn, args: tuple, schedule, mesh: dict) -> SpmdProgram:
    return partition_function(fn, args, mesh, schedule,
                              PartitionOptions(scatter_sums=True))[1].program


def _ops(program: SpmdProgram) -> list[str]:
    return [op.name for op in walk(program.func.ops)]


def _tile(name: str, dim: int, axis: str = "m") -> partir.ManualPartition:
    return partir.ManualPartition({name: dim}, axis=axis)


def _conv(window: int):
    def conv(img, ker):
        return jax.lax.conv_general_dilated(img, ker, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))
    img = jax.ShapeDtypeStruct((1, 16, 4, 2), jnp.float32)
    return conv, (img, jax.ShapeDtypeStruct((window, window, 2, 2), jnp.float32))


def test_halo_exchange_permutes_the_windowed_dimension():
    conv, args = _conv(3)
    program = _lowered(conv, args, [_tile("img", 1)], {"m": 4})
    ops = _ops(program)
    assert ops.count("stablehlo.collective_permute") == 2  # one halo from each side
    assert "stablehlo.all_gather" not in ops
    assert not program.diagnostics


def test_a_halo_wider_than_a_tile_is_gathered_with_a_diagnostic():
    conv, args = _conv(11)  # 5 rows each side of tiles of 2
    with pytest.warns(HaloWarning):  # emitted once, by the driver
        program = _lowered(conv, args, [_tile("img", 1)], {"m": 8})
    assert "stablehlo.all_gather" in _ops(program)
    assert [type(d) for d in program.diagnostics] == [HaloWarning]
    assert "more than a neighbour holds" in str(program.diagnostics[0])


def test_a_cached_segment_still_reports_a_window_arriving_tiled():
    """Review §6c-5: the incoming layout is no part of an op's cache key. Lowered after the
    first tactic, a pad reads a replicated image; after the second the image arrives tiled on
    the padded dimension, which is gathered: the reused segment reports it, once."""
    def padded(img, w):
        return jnp.pad(img * w, ((0, 0), (1, 1)))

    t = trace(padded, (jax.ShapeDtypeStruct((4, 16), jnp.float32),
                       jax.ShapeDtypeStruct((4, 16), jnp.float32)))
    part = partition(t, {"b": 2, "m": 4}, [_tile("w", 0, "b"), _tile("img", 1)],
                     PartitionOptions(scatter_sums=True))
    first, second = (r.state for r in part.reports._after)
    cache = LoweringCache()
    assert not lower_to_spmd(first, cache).diagnostics
    program = lower_to_spmd(second, cache)
    assert [type(d) for d in program.diagnostics] == [HaloWarning]
    assert "stablehlo.pad" in str(program.diagnostics[0])


def test_roll_permutes_blocks():
    program = _lowered(lambda x: partir.roll(x, 4, axis=0),
                       (jax.ShapeDtypeStruct((16, 2), jnp.float32),), [_tile("x", 0)],
                       {"m": 4})
    ops = _ops(program)
    assert ops.count("stablehlo.collective_permute") == 1  # a whole block: one permute
    assert "stablehlo.all_gather" not in ops


def test_interleave_permutes_chunks():
    program = _lowered(lambda x: interleave(x, repeats=2, stages=4),
                       (jax.ShapeDtypeStruct((16, 2), jnp.float32),), [_tile("x", 0)],
                       {"m": 4})
    ops = _ops(program)
    assert ops.count("stablehlo.collective_permute") == 4  # R² permutes of one chunk each
    assert "stablehlo.all_gather" not in ops


def test_embedding_lookup_masks_foreign_ids():
    program = _lowered(lambda table, ids: table[ids],
                       (jax.ShapeDtypeStruct((32, 4), jnp.float32),
                        jax.ShapeDtypeStruct((8,), jnp.int32)), [_tile("table", 0)], {"m": 4})
    text = program.text()
    assert "comparison_direction GE" in text and "comparison_direction LT" in text
    assert "stablehlo.all_reduce" in _ops(program)  # the tiles' partial lookups add up
    assert "stablehlo.all_gather" not in _ops(program)


def test_prefix_scan_combines_tile_totals():
    program = _lowered(lambda x: jnp.cumsum(x, axis=0),
                       (jax.ShapeDtypeStruct((16,), jnp.float32),), [_tile("x", 0)], {"m": 4})
    ops = _ops(program)
    assert ops.count("stablehlo.all_gather") == 1  # the totals, one row per device
    assert "stablehlo.reduce_window" in ops and "stablehlo.reduce" in ops


def test_iota_on_a_tiled_dimension_counts_from_its_tile():
    program = _lowered(lambda x: x + jnp.arange(16.0),
                       (jax.ShapeDtypeStruct((16,), jnp.float32),), [_tile("x", 0)], {"m": 4})
    ops = _ops(program)
    assert "stablehlo.iota" in ops and "stablehlo.partition_id" in ops
    assert "stablehlo.all_gather" not in ops


def test_own_reducer_gathers_partials_and_reduces_again():
    program = _lowered(lambda x: jnp.argmax(x, axis=1),
                       (jax.ShapeDtypeStruct((2, 16), jnp.float32),), [_tile("x", 1)], {"m": 4})
    ops = _ops(program)
    assert ops.count("stablehlo.all_gather") == 2  # the values and their indices
    assert ops.count("stablehlo.reduce") == 2  # per tile, then over the partials


def test_padded_tiles_are_masked_before_a_sum():
    program = _lowered(lambda x: x.sum(), (jax.ShapeDtypeStruct((10,), jnp.float32),),
                       [_tile("x", 0)], {"m": 4})
    ops = _ops(program)
    i = ops.index("stablehlo.reduce")
    assert "stablehlo.select" in ops[:i] and "stablehlo.iota" in ops[:i]


def test_dynamic_slice_clamps_traced_starts():
    program = _lowered(lambda x, i: jax.lax.dynamic_slice_in_dim(x, i, 4, axis=1),
                       (jax.ShapeDtypeStruct((16, 8), jnp.float32),
                        jax.ShapeDtypeStruct((), jnp.int32)), [_tile("x", 0)], {"m": 4})
    assert "stablehlo.clamp" in _ops(program)


def test_a_write_into_a_tiled_dimension_stays_in_its_tiles():
    """dynamic_update_slice of one row into rows tiled 4 ways: each device writes the part of
    the update that falls in its tile (a select and an in-place write), no gather."""
    program = _lowered(lambda x, u, i: jax.lax.dynamic_update_slice_in_dim(x, u, i, axis=0),
                       (jax.ShapeDtypeStruct((16, 8), jnp.float32),
                        jax.ShapeDtypeStruct((1, 8), jnp.float32),
                        jax.ShapeDtypeStruct((), jnp.int32)), [_tile("x", 0)], {"m": 4})
    ops = _ops(program)
    assert "stablehlo.all_gather" not in ops
    assert {"stablehlo.select", "stablehlo.dynamic_update_slice"} <= set(ops)
    assert program.func.returns[0].type.shape == (4, 8)


@pytest.mark.parametrize("rule", registry.RULES, ids=repr)
def test_every_rule_is_exercised_by_its_own_module(rule):
    """The registry lists each rule once, defined in a module of `spmd/rules/`."""
    assert type(rule).__module__.startswith("partir_plugin.spmd.rules.")
    assert [type(r) for r in registry.RULES].count(type(rule)) == 1
