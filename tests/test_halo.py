"""Issue 21, part 3: a spatially tiled convolution or pooling exchanges halo rows with its
neighbours (collective_permute) instead of gathering, and gives jax.jit's numbers, gradients
included. H is tiled 8 ways; every check is against the unpartitioned jax.jit."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oracle import assert_matches_jax_jit, hlo_collective_counts

import partir_plugin as partir
from partir_plugin.core.rules.halo import Halo, HaloEntry
from partir_plugin.extend import PADDED_SCATTER_OP, verify_entry, verify_registry
from partir_plugin.ir.graph import walk
from partir_plugin.ir.importer import import_lowered
from partir_plugin.plugin.manager import default_registry
from partir_plugin.spmd.rules.halo import HaloWarning

pytestmark = pytest.mark.slow  # compiles convolution and pooling gradients per geometry

MESH = {"m": 8}
TILE_H = [partir.ManualPartition({"img": 1}, axis="m")]


def _conv_loss(window: int, stride: int):
    def loss(img, ker):
        y = jax.lax.conv_general_dilated(img, ker, (stride, stride), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y ** 2).sum()
    return loss


def _compiled_counts(f, *args) -> dict[str, int]:
    return hlo_collective_counts(f.lower(*args).jax_lowered.compile().as_text())


@pytest.mark.parametrize("window,stride,height", [(3, 1, 32), (7, 2, 64)],
                         ids=["3x3-same", "7x7-stride2-same"])
def test_tiled_height_convolution_exchanges_halos(window, stride, height):
    """Forward, input gradient (lhs_dilation = stride) and weight gradient (a partial sum of
    the kernel) all run on H tiles with halos: permutes, and no all_gather anywhere."""
    step = jax.value_and_grad(_conv_loss(window, stride), argnums=(0, 1))
    img = jax.random.normal(jax.random.PRNGKey(0), (2, height, 8, 4))
    ker = jax.random.normal(jax.random.PRNGKey(1), (window, window, 4, 8))
    matched = assert_matches_jax_jit(step, (img, ker), MESH, TILE_H)
    meta = matched.meta
    ours = meta.tactics[-1].collectives
    assert ours["all_gather"] == 0 and ours["all_permute"] >= 6, ours
    compiled = _compiled_counts(matched.step, img, ker)
    assert compiled["all_gather"] == 0 and compiled["all_permute"] >= 6, compiled


def _pool(stride: int, window: int = 3):
    return lambda img: jax.lax.reduce_window(img, -jnp.inf, jax.lax.max, (1, window, window, 1),
                                             (1, stride, stride, 1), "SAME")


@pytest.mark.parametrize("stride", [1, 2])
def test_max_pool_over_negative_inputs_pads_with_minus_infinity(stride):
    """A 3x3 SAME max-pool over strictly negative inputs: a zero halo at the image border
    would win every border window. The pool and its gradient (jax's pad, select_and_scatter
    and slice, which the importer fuses into one padded select_and_scatter) exchange halos:
    permutes, no all_gather, no warning, and jax.jit's numbers."""
    pool = _pool(stride)
    img = -jnp.abs(jax.random.normal(jax.random.PRNGKey(0), (2, 32, 8, 4))) - 0.5
    f, meta = partir.jit(pool, MESH, TILE_H)
    np.testing.assert_array_equal(np.asarray(f(img)), np.asarray(jax.jit(pool)(img)))
    assert float(jnp.max(f(img))) < 0
    ours = meta.tactics[-1].collectives
    assert ours["all_gather"] == 0 and ours["all_permute"] >= 1, ours
    compiled = _compiled_counts(f, img)
    assert compiled["all_gather"] == 0 and compiled["all_permute"] >= 1, compiled

    step = jax.value_and_grad(lambda img: (pool(img) ** 2).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("error", HaloWarning)
        matched = assert_matches_jax_jit(step, (img,), MESH, TILE_H)
        meta = matched.meta
    ours = meta.tactics[-1].collectives
    assert ours["all_gather"] == 0 and ours["all_permute"] >= 3, ours
    compiled = _compiled_counts(matched.step, img)
    assert compiled["all_gather"] == 0 and compiled["all_permute"] >= 3, compiled


@pytest.mark.parametrize("mesh,dims", [({"h": 4, "w": 2}, (1, 2)), ({"b": 2, "h": 4}, (0, 1))],
                         ids=["height-and-width", "batch-and-height"])
def test_max_pool_gradient_picks_the_first_maximum_like_jax(mesh, dims):
    """Ties and -inf: the gradient goes to the first maximum of each window, and where a
    window holds only -inf (image rows and jax's -inf padding alike) to the position jax's
    padded select_and_scatter picks, which may be a padding row whose gradient is dropped.
    The halos carry the global values and the pad value past the edges, so every device picks
    what jax.jit picks: bit for bit, on two tiled dimensions."""
    img = jnp.round(jax.random.normal(jax.random.PRNGKey(0), (4, 32, 16, 4)))
    img = img.at[:, 0:3].set(-jnp.inf).at[:, 14:17, 3:6].set(-jnp.inf)
    schedule = [partir.ManualPartition({"img": d}, axis=a) for a, d in zip(mesh, dims)]
    for stride in (1, 2):
        pool = _pool(stride)
        step = jax.value_and_grad(
            lambda img, pool=pool: (jnp.where(jnp.isinf(p := pool(img)), 0.0, p) ** 2).sum())
        f, meta = partir.jit(step, mesh, schedule)
        np.testing.assert_array_equal(np.asarray(f(img)[1]), np.asarray(jax.jit(step)(img)[1]))
        assert meta.tactics[-1].collectives["all_gather"] == 0, meta.tactics[-1].collectives


def test_max_pool_gradient_window_wider_than_a_tile_warns_and_gathers():
    """A 5x5 stride-3 pool on tiles of 3 rows: its gradient's windows reach past the
    neighbours. The lowering warns, naming the fused op, and gathers; the numbers stay right."""
    pool = _pool(3, 5)
    step = jax.value_and_grad(lambda img: (pool(img) ** 2).sum())
    img = jax.random.normal(jax.random.PRNGKey(0), (2, 24, 6, 4))
    _warns_and_gathers(step, (img,), r"partir.padded_select_and_scatter at .*more than a "
                                     r"neighbour holds")


def _causal_conv(img, ker):
    """A causal 1-D convolution written as PyTorch code writes it: pad, then VALID."""
    padded = jnp.pad(img, ((0, 0), (ker.shape[0] - 1, 0), (0, 0)))
    y = jax.lax.conv_general_dilated(padded, ker, (1,), "VALID",
                                     dimension_numbers=("NWC", "WIO", "NWC"))
    return (y ** 2).sum()


def _padded_strided_conv(img, ker):
    padded = jnp.pad(img, ((0, 0), (1, 1), (1, 1), (0, 0)))
    y = jax.lax.conv_general_dilated(padded, ker, (2, 2), "VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return (jnp.tanh(y) ** 2).sum()


def _gated_causal_conv(img, ker):
    """WaveNet's gated unit: one padded input read by two dilated causal convolutions, so
    its gradient crops the sum of two input gradients (helper-21: that gathered)."""
    padded = jnp.pad(img, ((0, 0), (2 * (ker.shape[0] - 1), 0), (0, 0)))

    def conv(k):
        return jax.lax.conv_general_dilated(padded, k, (1,), "VALID", rhs_dilation=(2,),
                                            dimension_numbers=("NWC", "WIO", "NWC"))

    half = ker.shape[-1] // 2
    return (jnp.tanh(conv(ker[..., :half])) * jax.nn.sigmoid(conv(ker[..., half:]))).sum()


@pytest.mark.parametrize("loss,img_shape,ker_shape", [
    (_causal_conv, (2, 32, 4), (3, 4, 8)), (_padded_strided_conv, (2, 32, 16, 3), (4, 4, 3, 8)),
    (_gated_causal_conv, (2, 32, 4), (2, 4, 8))],
    ids=["causal-1d", "pad-then-stride2-2d", "gated-causal-two-readers"])
def test_explicit_pad_before_a_convolution_folds_into_its_padding(loss, img_shape, ker_shape):
    """`conv(jnp.pad(x), VALID)`: the importer folds the pad into the convolution's padding
    (forward and weight gradient) and the gradient's crop (a negative pad) into the input
    gradient's, so the tiled dimension exchanges halos: no pad left, no all_gather, no
    warning, jax.jit's numbers."""
    step = jax.value_and_grad(loss, argnums=(0, 1))
    img = jax.random.normal(jax.random.PRNGKey(0), img_shape)
    ker = jax.random.normal(jax.random.PRNGKey(1), ker_shape)
    func = import_lowered(jax.jit(step).lower(img, ker))
    assert not [op for op in walk(func.ops) if op.name == "stablehlo.pad"  # on the space
                and op.operands[0].type.shape[1] != op.results[0].type.shape[1]]
    with warnings.catch_warnings():
        warnings.simplefilter("error", HaloWarning)
        meta = assert_matches_jax_jit(step, (img, ker), MESH, TILE_H).meta
    ours = meta.tactics[-1].collectives
    assert ours["all_gather"] == 0 and ours["all_permute"] >= 3, ours


def test_pad_of_a_tiled_dimension_warns_and_gathers():
    """A pad alone (not a max-pool's gradient) shifts every tile: no halo rule, so the
    dimension is gathered with a warning naming pad and why."""
    step = jax.value_and_grad(lambda img: (jnp.pad(img, ((0, 0), (1, 2), (0, 0), (0, 0)))
                                           [:, 1:33] ** 3).sum())
    img = jax.random.normal(jax.random.PRNGKey(0), (2, 32, 8, 4))
    _warns_and_gathers(step, (img,),  # the op's name and the user's line
                       r"stablehlo.pad at \S*pad \(\S*test_halo.py:\d+\): "
                       r"dimension 1 .*no halo rule")


def _warns_and_gathers(step, args, where: str, **options) -> None:
    """A fallback: jax.jit's numbers, a HaloWarning matching `where`, and an all_gather."""
    with pytest.warns(HaloWarning, match=where):
        meta = assert_matches_jax_jit(step, args, MESH, TILE_H, **options).meta
    assert meta.tactics[-1].collectives["all_gather"] > 0


def test_halo_wider_than_a_tile_warns_and_gathers():
    """A 7x7 window over tiles of 2 rows needs 3 rows from each side: not a neighbour's. The
    lowering warns, naming the op, and gathers that dimension; the numbers stay right."""
    step = jax.value_and_grad(_conv_loss(7, 1), argnums=(0, 1))
    img = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 8, 4))
    ker = jax.random.normal(jax.random.PRNGKey(1), (7, 7, 4, 8))
    _warns_and_gathers(step, (img, ker),
                       r"stablehlo.convolution at .*conv_general_dilated \(.*test_halo.py:\d+")


def test_halo_entries_of_a_strided_step_verify_and_a_wrong_one_is_caught():
    """The forward convolution (output tiled), the input gradient (lhs_dilation = stride), the
    weight gradient (kernel a partial Sum) and the strided max-pool each get a halo entry on
    H, as does the pool's gradient (the fused padded select_and_scatter) on H and W, and the
    TMR verifier runs each on 2 and 4 devices against the whole op. A halo shifted by one row
    is caught, in the convolution and in the pool's gradient."""
    registry = default_registry()
    img = jnp.ones((2, 16, 8, 4))
    step = jax.grad(lambda img, ker: (jax.lax.reduce_window(
        _conv_out(img, ker), -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME") ** 2
    ).sum(), argnums=(0, 1))
    ops = list(walk(import_lowered(jax.jit(step).lower(img, jnp.ones((5, 5, 4, 8)))).ops))
    report = verify_registry(ops, registry, parts=(2, 4))
    assert report.verdicts and not report.wrong, str(report)
    kinds = {(v.op_name, v.entry.halo.lhs_dilation, v.entry.halo.weight_gradient)
             for v in report.verdicts if isinstance(v.entry, HaloEntry)
             and isinstance(v.entry.halo, Halo) and v.entry.halo.dim == 1}
    assert kinds == {("stablehlo.convolution", 1, False), ("stablehlo.convolution", 2, False),
                     ("stablehlo.convolution", 1, True), ("stablehlo.reduce_window", 1, False)}
    pooled = {(v.parts, v.entry.halo.dim) for v in report.verdicts
              if v.op_name == PADDED_SCATTER_OP and isinstance(v.entry, HaloEntry)}
    assert pooled == {(2, 1), (4, 1), (2, 2)}, pooled  # W: 2 windows

    scatter = next(op for op in ops if op.name == PADDED_SCATTER_OP)
    entry = next(e for e in registry.entries(scatter) if isinstance(e, HaloEntry))
    early = dataclasses.replace(entry, halo=dataclasses.replace(entry.halo,
                                                                lo=entry.halo.lo + 1))
    assert not verify_entry(scatter, early, parts=4).ok

    conv = next(op for op in ops if op.name == "stablehlo.convolution")
    entry = next(e for e in registry.entries(conv) if isinstance(e, HaloEntry))
    shifted = dataclasses.replace(entry, halo=dataclasses.replace(entry.halo,
                                                                  lo=entry.halo.lo + 1))
    verdict = verify_entry(conv, shifted)
    assert not verdict.ok and "largest difference" in verdict.detail


def _conv_out(img, ker):
    return jax.lax.conv_general_dilated(img, ker, (2, 2), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def test_height_and_width_tiled_on_two_axes():
    """H over 4 devices and W over 2: the second exchange carries the first's rows, so the
    corner a 3x3 window reads comes along. Values and gradients equal jax.jit's."""
    step = jax.value_and_grad(_conv_loss(3, 1), argnums=(0, 1))
    img = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 8, 4))
    ker = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 4, 8))
    schedule = [partir.ManualPartition({"img": 1}, axis="h"),
                partir.ManualPartition({"img": 2}, axis="w")]
    meta = assert_matches_jax_jit(step, (img, ker), {"h": 4, "w": 2}, schedule).meta
    ours = meta.tactics[-1].collectives
    assert ours["all_gather"] == 0 and ours["all_permute"] >= 12, ours


def _conv(stride, padding, dilation=1):
    return lambda x, w: jax.lax.conv_general_dilated(
        x, w, (stride, 1), padding, rhs_dilation=(dilation, 1),
        dimension_numbers=("NHWC", "HWIO", "NHWC"))


GEOMETRIES = {
    # A 1x1 stride-2 shortcut reads one row fewer than it holds (a negative right halo).
    "1x1-stride2": (_conv(2, "VALID"), (1, 1, 3, 2)),
    "3x3-dilated2-same": (_conv(1, "SAME", 2), (3, 1, 3, 2)),
    "4x4-stride2-asymmetric": (_conv(2, ((1, 2), (0, 0))), (4, 1, 3, 2)),
    "avg-pool-2x2-stride2": (lambda x, w: jax.lax.reduce_window(
        x, 0.0, jax.lax.add, (1, 2, 1, 1), (1, 2, 1, 1), "VALID") + w.sum(), (1,)),
    "max-pool-base-dilated": (lambda x, w: jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1, 3, 1, 1), (1, 1, 1, 1), ((0, 0), (1, 2), (0, 0), (0, 0)),
        base_dilation=(1, 2, 1, 1)) + w.sum(), (1,)),
    # Padded tiles: 16 rows -> 14 (tiles of 4 and ceil(14/4) = 4 on 4 devices, not on 2).
    "3x3-valid": (_conv(1, "VALID"), (3, 1, 3, 2)),
    # 16 rows -> 7 windows (tiles of 8 and 4, of 4 and 2): the gradient is a sum pool with
    # base dilation 2 over the padded 7 rows.
    "max-pool-3-stride2-valid": (lambda x, w: jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1, 3, 1, 1), (1, 2, 1, 1), "VALID") + w.sum(), (1,)),
    "avg-pool-3-stride2-valid": (lambda x, w: jax.lax.reduce_window(
        x, 0.0, jax.lax.add, (1, 3, 1, 1), (1, 2, 1, 1), "VALID") + w.sum(), (1,)),
}


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_halo_geometries_verify_with_their_gradients(name):
    """Stride with a negative halo, window dilation, asymmetric padding, a pool whose windows
    do not overlap, base dilation, VALID windows on padded tiles: every halo entry of the op
    and of its gradient is true on 2 and 4 devices (where its tiles keep the geometry)."""
    fn, ker_shape = GEOMETRIES[name]
    x, w = jnp.ones((2, 16, 4, 3)), jnp.ones(ker_shape)
    step = jax.grad(lambda x, w: (fn(x, w) ** 2).sum(), argnums=(0, 1))
    ops = list(walk(import_lowered(jax.jit(step).lower(x, w)).ops))
    report = verify_registry(ops, default_registry(), parts=(2, 4))
    halos = [v for v in report.verdicts if isinstance(v.entry, HaloEntry)]
    assert halos and not report.wrong, str(report)
    if "valid" in name:  # entries that only padded tiles fit were verified too
        assert any(v.entry.factor_size == 1 for v in halos), str(report)


PADDED = {
    # VALID: 32 rows -> 30, in tiles of 4 and ceil(30/8) = 4 (the last holds 2 valid).
    "3x3-valid-32": (3, 1, "VALID", 32),
    # Uneven: 37 rows in tiles of 5, the last holding 2 valid and 3 of padding.
    "3x3-same-37": (3, 1, "SAME", 37),
    # 64 rows -> 29 by a 7x7 window moved by 2: tiles of 8 input rows for 4 output rows.
    "7x7-stride2-valid-64": (7, 2, "VALID", 64),
}


@pytest.mark.parametrize("name", sorted(PADDED))
def test_valid_and_uneven_convolutions_exchange_halos_on_padded_tiles(name):
    """Output-driven on padded tiles: device j computes ceil(out/8) output rows from its
    ceil(in/8) input rows plus halos, which holds wherever the two padded tiles are in the
    stride's ratio. The padding reads as the convolution's zero padding (masked before the
    exchange: the inputs are negative, so garbage or a wrong fill would show). Forward,
    input gradient and weight gradient: permutes, no all_gather, jax.jit's numbers."""
    window, stride, padding, height = PADDED[name]

    def loss(img, ker):
        y = jax.lax.conv_general_dilated(img, ker, (stride, stride), padding,
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (jnp.tanh(y) ** 2).sum()

    # The image's gradient has its height: where that is uneven (37), the program output
    # would be gathered, so only the kernel's gradient is returned there.
    argnums = (0, 1) if height % 8 == 0 else 1
    step = jax.value_and_grad(loss, argnums=argnums)
    img = -1.0 - jnp.abs(jax.random.normal(jax.random.PRNGKey(0), (2, height, 8, 4)))
    ker = jax.random.normal(jax.random.PRNGKey(1), (window, window, 4, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HaloWarning)
        matched = assert_matches_jax_jit(step, (img, ker), MESH, TILE_H)
        meta = matched.meta
    ours = meta.tactics[-1].collectives
    assert ours["all_gather"] == 0 and ours["all_permute"] >= 3, ours
    padding_lines = meta.tactics[-1].padding
    assert any("stablehlo.convolution (pad value)" in line for line in padding_lines), \
        padding_lines
    compiled = _compiled_counts(matched.step, img, ker)
    assert compiled["all_gather"] == 0 and compiled["all_permute"] >= 3, compiled


@pytest.mark.parametrize("stride,padding,height", [(2, "VALID", 32), (1, "SAME", 37)])
def test_max_pools_and_gradients_on_padded_tiles_exchange_halos(stride, padding, height):
    """A VALID 3x3 stride-2 max-pool (32 rows -> 15, tiles of 4 and 2) and a SAME one over 37
    rows, inputs negative with a run of -inf (ties with jax's own -inf padding): the image's
    padding is filled with -inf and the output gradient's with 0 before the exchange (a zero
    would win the border windows; garbage would scatter). The pool and its gradient (the
    fused padded select_and_scatter) exchange halos: no all_gather, jax.jit's numbers (the
    step returns scalars, so no uneven program output is gathered)."""
    pool = lambda img: jax.lax.reduce_window(  # noqa: E731
        img, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, stride, stride, 1), padding)
    img = -1.0 - jnp.abs(jax.random.normal(jax.random.PRNGKey(0), (2, height, 8, 4)))
    img = img.at[0, 3:9, 2, 1].set(-jnp.inf)
    forward = lambda img: (pool(img) ** 2).sum()  # noqa: E731
    step = lambda img: (forward(img), (jax.grad(forward)(img) ** 2).sum())  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", HaloWarning)
        f, meta = partir.jit(step, MESH, TILE_H)
        for got, want in zip(f(img), jax.jit(step)(img), strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)
    assert meta.tactics[-1].collectives["all_gather"] == 0
    assert meta.tactics[-1].collectives["all_permute"] >= 4


@pytest.mark.parametrize("stride,padding,height", [(2, "VALID", 32), (1, "SAME", 37),
                                                    (2, "SAME", 32)])
def test_sum_pool_and_its_gradient_exchange_halos(stride, padding, height):
    """An average pool and its gradient, which jax writes as a zero pad (interior padding
    stride - 1) read by a stride-1 sum pool: the importer folds the pad into the pool's
    padding and base dilation, so the gradient is a windowed op with halos too, on even and
    padded tiles: permutes, no all_gather, jax.jit's numbers (the returned values are
    scalars, so no uneven program output is gathered)."""
    pool = lambda img: jax.lax.reduce_window(  # noqa: E731
        img, 0.0, jax.lax.add, (1, 3, 3, 1), (1, stride, stride, 1), padding) / 9
    forward = lambda img: (jnp.tanh(pool(img)) ** 2).sum()  # noqa: E731
    step = lambda img: (forward(img), (jax.grad(forward)(img) ** 2).sum())  # noqa: E731
    img = jax.random.normal(jax.random.PRNGKey(0), (2, height, 8, 4))
    ops = list(walk(import_lowered(jax.jit(jax.grad(forward)).lower(img)).ops))
    assert not [op for op in ops if op.name == "stablehlo.pad"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", HaloWarning)
        meta = assert_matches_jax_jit(step, (img,), MESH, TILE_H).meta
    ours = meta.tactics[-1].collectives
    assert ours["all_gather"] == 0 and ours["all_permute"] >= 2, ours


@pytest.mark.parametrize("mesh,exchanged", [({"a": 4, "b": 2}, True), ({"a": 2, "b": 4}, False)])
def test_padded_height_on_two_axes_exchanges_only_contiguous_tiles(mesh, exchanged):
    """30 rows over 'a' then 'b', level by level. On {a: 4, b: 2} the tiles are 8 rows then 4,
    the padding only after the last valid row: halos are exchanged. On {a: 2, b: 4} each half
    of 15 rows is cut into 4-row tiles, leaving a padding row in the middle of the height,
    which a window must not read as a neighbour's: gathered, with a warning."""
    step = jax.value_and_grad(_conv_loss(3, 1), argnums=1)
    img = -1.0 - jnp.abs(jax.random.normal(jax.random.PRNGKey(0), (2, 30, 8, 4)))
    ker = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 4, 8))
    schedule = [partir.ManualPartition({"img": 1}, axis="a"),
                partir.ManualPartition({"img": 1}, axis="b")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        meta = assert_matches_jax_jit(step, (img, ker), mesh, schedule).meta
    halo_warnings = [w for w in caught if issubclass(w.category, HaloWarning)]
    ours = meta.tactics[-1].collectives
    if exchanged:
        assert not halo_warnings and ours["all_gather"] == 0 and ours["all_permute"] >= 3, ours
    else:
        assert halo_warnings and ours["all_gather"] > 0, ours


def test_window_whose_padded_tiles_are_not_in_the_stride_ratio_warns_and_gathers():
    """A SAME 3x3 stride-2 convolution over 37 rows: input tiles of 5 rows, output tiles of
    ceil(19/8) = 3 rows, whose windows span 6 input rows, so device j's halo would grow with
    j. The image is gathered instead, with a warning naming the op, the user's line and the
    reason; the numbers stay right."""
    def loss(img, ker):
        y = jax.lax.conv_general_dilated(img, ker, (2, 2), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y ** 2).sum()

    step = jax.value_and_grad(loss, argnums=1)
    img = jax.random.normal(jax.random.PRNGKey(0), (2, 37, 8, 4))
    ker = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 4, 8))
    _warns_and_gathers(
        step, (img, ker),
        r"stablehlo.convolution at .*conv_general_dilated \(.*test_halo.py:\d+.*do not split "
        r"into tiles of ceil\(n/k\) rows in the ratio of its stride")
