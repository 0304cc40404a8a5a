"""Regressions from an outside differential tester: random programs, minimized, whose
partitioned numbers (values and gradients) differed from `jax.jit`'s or that crashed.

Each test partitions a small function under an explicit `ManualPartition` schedule and
compares the value and the gradient of a scalar of its outputs with the unpartitioned
`jax.jit`. A `PartitionError` would be a refusal, not a pass: these programs are all
partitionable, so every one must give jax.jit's numbers.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from oracle import assert_matches_jax_jit

import partir_plugin as partir

pytestmark = pytest.mark.slow  # two partitions and compilations per finding

CUBE = {"a": 2, "b": 2, "c": 2}
WIDE = {"a": 4, "b": 2}


def mp(axis: str, inputs: dict | None = None, tags: dict | None = None
       ) -> partir.ManualPartition:
    """A ManualPartition of argument dims `inputs` and tag dims `tags` on `axis`."""
    return partir.ManualPartition(inputs or {}, axis=axis, tags=tags or {})


def assert_matches_jit(fn: Callable, args: Sequence, mesh: dict[str, int], schedule: list
                       ) -> None:
    """`fn(*args)` partitioned over `mesh` by `schedule` gives jax.jit's outputs, and so does
    the value and gradient (every float argument) of their mean sines."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", partir.UnevenOutputWarning)
        assert_matches_jax_jit(fn, args, mesh, schedule, gradients=True,
                               uneven_outputs="replicate")


def _uniform(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


# -- 1. pad with low + high = 0 along a tiled dimension ---------------------------------------

@pytest.mark.parametrize("config", [
    [(-1, 1, 0), (0, 0, 0)], [(1, -1, 0), (0, 0, 0)],
    [(-1, 1, 0), (0, 0, 1)],   # interior padding on the other dimension
    [(-1, 1, 0), (1, -1, 1)]], ids=["crop_low_pad_high", "pad_low_crop_high", "interior",
                                    "interior_asymmetric"])
def test_pad_that_crops_one_side_and_pads_the_other(config):
    def fn(arg0):
        return lax.pad(arg0, np.float32(-0.1), config)

    assert_matches_jit(fn, [_uniform(32, 16)], CUBE, [mp("a", {"arg0": 0})])
    assert_matches_jit(fn, [_uniform(12, 16)], CUBE,
                       [mp("a", {"arg0": 0}), mp("b", {"arg0": 0})])


def test_pad_that_crops_one_side_tagged_and_tiled_on_another_axis():
    def fn(arg0):
        return partir.tag(lax.pad(arg0, np.float32(-0.1), [(-1, 1, 0), (0, 0, 0)]), "padded")

    x = _uniform(32, 16)
    assert_matches_jit(fn, [x], CUBE, [mp("a", {"arg0": 0}), mp("b", tags={"padded": 0})])
    assert_matches_jit(fn, [x], CUBE, [mp("a", tags={"padded": 0})])


# -- 2. padding tiles leaking into gathers over two mesh axes -------------------------------

def test_take_of_rows_tiled_over_two_axes():
    def fn(arg0):
        return jnp.take(arg0 + 1.0, jnp.array([1, 1]), axis=0)

    assert_matches_jit(fn, [_uniform(2, 7)], CUBE,
                       [mp("a", {"arg0": 0}), mp("c", {"arg0": 0})])


def test_embedding_lookup_of_ids_tiled_over_two_axes_then_a_row_gather():
    def fn(arg0, arg1):
        rows = arg0[arg1]                      # [4, 8]: an embedding lookup
        return rows[jnp.array([0, 3, 3])]      # a constant row gather

    table = _uniform(16, 8)
    ids = np.array([3, 0, 15, 7], np.int32)
    assert_matches_jit(fn, [table, ids], WIDE, [mp("a", {"arg1": 0}), mp("b", {"arg1": 0})])


# -- 3. dynamic_slice with a traced start that jax clamps -------------------------------------

def test_dynamic_slice_with_a_clamped_traced_start_then_tiled():
    def fn(arg0, arg1, arg2):
        v = lax.dynamic_slice(arg0, (arg2,), (18,))  # start 16 clamps to 12
        return v * arg1

    assert_matches_jit(fn, [_uniform(30), _uniform(18, seed=1), np.int32(16)], CUBE,
                       [mp("a", {"arg1": 0})])


# -- 4. top_k along a tiled last dimension while another is tiled too -------------------------

@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_along_a_tiled_dim_with_the_other_dim_tiled(k):
    def fn(arg0):
        values, indices = lax.top_k(arg0, k)
        return values, indices

    assert_matches_jit(fn, [_uniform(8, 4)], WIDE,
                       [mp("a", {"arg0": 0}), mp("b", {"arg0": 1})])


# -- 5. a reshape whose tiles do not line up ----------------------------------------------

def test_reshape_whose_tiles_do_not_line_up():
    def fn(arg0):
        return arg0.reshape(16, 5)

    assert_matches_jit(fn, [_uniform(10, 8)], WIDE, [mp("a", {"arg0": 1})])


# -- 6. gradient of an elementwise op through an uneven reshape --------------------------------

@pytest.mark.parametrize("shapes", [((5, 3), (3, 5)), ((5, 4), (4, 5))],
                         ids=["5x3->3x5", "5x4->4x5"])
def test_gradient_of_a_reshape_of_a_tiled_dim(shapes):
    src, dst = shapes

    def fn(arg0):
        return jnp.sin(arg0).reshape(dst)

    assert_matches_jit(fn, [_uniform(*src)], CUBE, [mp("a", {"arg0": 1})])


# -- 7. a max pool whose stride exceeds its window -------------------------------------------

@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_max_pool_with_stride_greater_than_window(padding):
    def fn(arg0):
        return lax.reduce_window(arg0, -jnp.inf, lax.max, (1, 2, 1), (1, 3, 1), padding)

    # 24 rows (8 windows) over 2 devices: the gradient's select_and_scatter fails to parse.
    assert_matches_jit(fn, [_uniform(2, 24, 4)], CUBE, [mp("a", {"arg0": 1})])


# -- 8. a tag tiling a size-1 dimension, an einsum, a second tag ------------------------------

def test_tag_on_a_size_one_dim_then_einsum_then_another_tag():
    def fn(arg0, arg1):
        h = partir.tag(jnp.sin(arg0), "h")                 # [1, 8, 16]: tiled on dim 0
        y = jnp.einsum("bsd,de->bse", h, arg1)             # [1, 8, 4]
        return partir.tag(y, "y")                          # tiled on dim 2

    assert_matches_jit(fn, [_uniform(1, 8, 16), _uniform(16, 4, seed=1)], CUBE,
                       [mp("a", tags={"h": 0}), mp("b", tags={"y": 2})])


# -- Found by our own generator (tests/property_programs.py) once it covered these spaces ----

@pytest.mark.parametrize("shape,to,mesh,inputs", [
    ((3, 8), (4, 6), CUBE, {"arg0": 1}), ((3, 8), (2, 2, 6), CUBE, {"arg0": 1}),
    ((6, 6), (4, 9), WIDE, {"arg0": 1})], ids=["3x8->4x6", "3x8->2x2x6", "6x6->4x9"])
def test_reshape_refactoring_a_tiled_dim(shape, to, mesh, inputs):
    axis = "b" if mesh is WIDE else "a"
    assert_matches_jit(lambda arg0: arg0.reshape(to), [_uniform(*shape)], mesh,
                       [mp(axis, inputs)])


def test_reshape_of_a_padded_dim_with_a_second_use():
    def fn(arg0):
        return arg0.reshape(2, 4, 37) * 0.5, arg0 * 0.5

    assert_matches_jit(fn, [_uniform(37, 8)], CUBE, [mp("c", {"arg0": 1})])


def test_reserved_tag_decided_after_propagation_reaches_it_under_gradients():
    """docs/tactics.md: a tactic reserves the tags it decides, so an earlier tactic's
    propagation leaves them; the gradient's copy of the tag too."""
    def fn(arg0):
        return partir.tag(jnp.sin(arg0), "h")

    assert_matches_jit(fn, [_uniform(8, 8)], CUBE,
                       [mp("a", {"arg0": 1}), mp("a", tags={"h": 0})])


def test_chained_dynamic_slices_on_a_padded_tiled_dim_follow_stablehlo():
    """The second start (3) is clamped to 1. XLA folds the two slices of the unpartitioned
    program into one and clamps the folded start, so jax.jit reads row 6, not row 4: the
    reference is the program run op by op (`jax.disable_jit`), as StableHLO specifies."""
    zero = np.int32(0)

    def fn(arg0, arg1, arg2):
        v = lax.dynamic_slice(arg0, (arg1, zero), (2, 5))
        return lax.dynamic_slice(v, (arg2, zero), (1, 3))

    args = [np.arange(40, dtype=np.float32).reshape(8, 5), np.int32(3), np.int32(3)]
    step, _ = partir.jit(fn, CUBE, [mp("c", {"arg0": 1})], uneven_outputs="replicate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", partir.UnevenOutputWarning)
        got = np.asarray(step(*args))
    with jax.disable_jit():
        want = np.asarray(fn(*args))
    np.testing.assert_array_equal(want, args[0][4:5, :3])
    np.testing.assert_array_equal(got, want)


def test_take_from_a_dynamic_slice_follows_stablehlo():
    """The same XLA fold through a gather (openxla/xla#49121): `take` of row 1 of a slice
    whose start 3 clamps to 2. jax.jit (jax 0.10.2, CPU) returns row 4; StableHLO, numpy
    and op-by-op jax give row 3, and so must the partitioned step, on a padded tiling too."""
    def fn(arg0, arg1):
        v = lax.dynamic_slice_in_dim(arg0, arg1, 3, axis=0)
        return jnp.take(v, jnp.array([1]), axis=0, mode="fill")

    args = [np.arange(40, dtype=np.float32).reshape(5, 4, 2), np.int32(3)]
    with jax.disable_jit():
        want = np.asarray(fn(*args))
    np.testing.assert_array_equal(want, args[0][3:4])
    for mesh, schedule in (({"a": 2}, [mp("a", {"arg0": 1})]), ({"a": 2}, [mp("a", {"arg0": 0})]),
                           (WIDE, [mp("a", {"arg0": 0}), mp("b", {"arg0": 1})])):
        step, _ = partir.jit(fn, mesh, schedule, uneven_outputs="replicate")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", partir.UnevenOutputWarning)
            np.testing.assert_array_equal(np.asarray(step(*args)), want)


def test_lookup_of_a_lookup_with_ids_tiled_over_two_axes():
    def fn(arg0, arg1, arg2):
        return arg0[arg1][arg2]

    args = [_uniform(2, 12), np.array([0, 1], np.int32),
            np.array([[1, 0, 1, 1], [0, 0, 1, 0]], np.int32)]
    assert_matches_jit(fn, args, CUBE, [mp("c", {"arg1": 0}), mp("b", {"arg1": 0})])


def test_scatter_max_gradient_with_an_out_of_range_id():
    """jax's scatter-max gradient scatter-adds one update per id; an id out of range (5 of
    4 rows) is dropped by the global scatter, and must not be clamped onto the last row of
    a device's vocabulary tile (it added a 0/0 there: NaN)."""
    def fn(arg0, arg1):
        return jnp.abs(jnp.abs(arg0).at[arg1].max(arg0))

    args = [np.array([0.27, -0.46, -0.91, -0.96], np.float32), np.array([0, 0, 0, 5], np.int32)]
    for mesh, schedule in (({"a": 4, "b": 2}, [mp("a", {"arg0": 0})]),
                           (WIDE, [mp("a", {"arg0": 0}), mp("b", {"arg0": 0})])):
        assert_matches_jit(fn, args, mesh, schedule)


def test_an_empty_dimension_is_never_tiled():
    """A dimension of size 0 stays whole when a tactic names it or propagation reaches it:
    tiled, its tiles were empty and the all_gather of one fails StableHLO's verifier (a
    `concatenate` of an empty and a full array over the tiled dimension crashed)."""
    def fn(arg0, arg1):
        return jnp.sum(arg0, 0), jnp.concatenate([arg0, arg1], 0), jnp.max(arg1 * 2, 0)

    args = [np.zeros((0, 8), np.float32), _uniform(8, 8)]
    for inputs in ({"arg0": 0, "arg1": 0}, {"arg0": partir.FIRST_DIVISIBLE_DIM, "arg1": 0}):
        assert_matches_jit(fn, args, WIDE, [mp("a", inputs)])


def test_top_k_of_a_padded_tile_ranks_negative_nans_below_its_padding():
    """top_k orders floats totally: a NaN with its sign bit set (`log` of a negative number)
    is below -inf. The padding of an uneven tile was -inf and beat it (top_k returned -inf
    where jax.jit returns the NaN); it is now the lowest NaN."""
    def fn(arg0):
        return lax.top_k(jnp.log(arg0 - 2.0).T, 2)

    x = np.array([[2.8, 3.5, 1.3], [1.5, 1.6, 3.3], [1.3, 3.3, 1.4]], np.float32)
    for mesh in ({"a": 2}, WIDE):
        assert_matches_jit(fn, [x], mesh, [mp("a", {"arg0": 0})])


def test_weight_gradient_of_a_convolution_on_padded_spatial_tiles():
    """The weight gradient of a SAME convolution (4 columns, a window of 3) is itself a
    convolution of image and output gradient with two halo entries on the image's columns:
    a forward one (image to kernel columns) and a weight-gradient one (image and output
    gradient to a partial kernel). On 8 padded tiles of 4 columns propagation nested one
    over `a` and the other over `b` and `c`, and the local convolution's result type did
    not match its operands (MLIR's parser refused it). One nest keeps one window geometry
    per dimension."""
    def fn(arg0, arg1):
        return lax.conv_general_dilated(arg1, arg0, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))

    args = [_uniform(1, 3, 2, 2), _uniform(2, 1, 4, 2, seed=1)]
    assert_matches_jit(fn, args, CUBE, [mp(a, {"arg1": 2}) for a in "abc"])
