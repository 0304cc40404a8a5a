"""A table of convolution, window and data-movement programs for the TMR verifier and the
spatial-tiling regression tests: each is a loss of one or two arrays, differentiated, so the
corpus holds the forward ops and their transposes (input- and weight-gradient convolutions,
`select_and_scatter` for max pooling, `pad` for `slice`, scatter for gather, ...).

`CASES` is written by hand; `GENERATED_CASES` (the verifier's only) walks the property test's
attribute spaces (`property_programs.py`): pads with every sign of low/high and interior
padding, windows with every stride against every size, dilation and padding kind,
convolutions with strides beyond the kernel and asymmetric padding, re-factoring reshapes,
and the indexing ops with clamped, negative and dropped indices, each a one-op recipe of the
same vocabulary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from property_programs import (
    CONV_DILATIONS,
    CONV_KERNELS,
    CONV_STRIDES,
    UNEVEN_RESHAPES,
    Recipe,
    build,
    pad_configs,
    window_configs,
)

from partir_plugin.ir.graph import walk
from partir_plugin.ir.importer import import_lowered


@dataclass(frozen=True)
class Case:
    """`loss(*args) -> scalar` on arguments of `shapes`; `spatial` names (arg, dim) pairs a
    schedule may tile to put a window or data-movement op across tiles."""

    name: str
    loss: Callable
    shapes: tuple[tuple[int, ...], ...]
    spatial: tuple[tuple[int, int], ...] = ()
    int_args: tuple[int, ...] = ()  # arguments holding indices
    int_values: tuple[tuple[int, tuple[int, ...]], ...] = ()  # fixed values of some of them

    def args(self, seed: int = 0) -> list[jax.Array]:
        rng = np.random.default_rng(seed)
        out = []
        fixed = dict(self.int_values)
        for i, s in enumerate(self.shapes):
            if i in fixed:
                out.append(jnp.asarray(np.reshape(fixed[i], s), jnp.int32))
            elif i in self.int_args:
                out.append(jnp.asarray(rng.integers(0, 16, s), jnp.int32))
            else:
                out.append(jnp.asarray(rng.normal(size=s), jnp.float32))
        return out

    def step(self) -> Callable:
        float_args = tuple(i for i in range(len(self.shapes)) if i not in self.int_args)
        return jax.value_and_grad(self.loss, argnums=float_args)


def _conv(padding, strides=(1, 1), lhs_dil=(1, 1), rhs_dil=(1, 1), groups=1, batch_groups=1,
          dims=("NHWC", "HWIO", "NHWC")):
    def loss(img, ker):
        y = lax.conv_general_dilated(img, ker, strides, padding, lhs_dilation=lhs_dil,
                                     rhs_dilation=rhs_dil, dimension_numbers=dims,
                                     feature_group_count=groups,
                                     batch_group_count=batch_groups)
        return (y ** 2).sum()
    return loss


def _pool(kind, window, strides, padding):
    def loss(x):
        if kind == "max":
            y = lax.reduce_window(x, -jnp.inf, lax.max, window, strides, padding)
        else:
            y = lax.reduce_window(x, 0.0, lax.add, window, strides, padding) / np.prod(window)
        return (y ** 2).sum()
    return loss


IMG, KER = (2, 16, 16, 4), (3, 3, 4, 8)
CASES = [
    Case("conv_same", _conv("SAME"), (IMG, KER), ((0, 1), (0, 2))),
    Case("conv_valid", _conv("VALID"), (IMG, KER), ((0, 1),)),
    Case("conv_asym_pad", _conv(((2, 0), (0, 1))), (IMG, KER), ((0, 1),)),
    Case("conv_stride2", _conv("SAME", strides=(2, 2)), (IMG, KER), ((0, 1),)),
    Case("conv_lhs_dilation", _conv(((1, 1), (1, 1)), lhs_dil=(2, 2)), (IMG, KER), ((0, 1),)),
    Case("conv_rhs_dilation", _conv("SAME", rhs_dil=(2, 2)), (IMG, KER), ((0, 1),)),
    Case("conv_feature_groups", _conv("SAME", groups=2), (IMG, (3, 3, 2, 8)), ((0, 1), (0, 3))),
    Case("conv_batch_groups", _conv("VALID", batch_groups=2), ((4, 8, 8, 4), (3, 3, 4, 8)),
         ((0, 1),)),
    Case("conv_1x1", _conv("VALID"), (IMG, (1, 1, 4, 8)), ((0, 1),)),
    Case("conv_whole_window", _conv("VALID"), ((2, 8, 8, 4), (8, 8, 4, 8)), ((0, 1), (1, 0))),
    Case("conv_nchw", _conv("SAME", dims=("NCHW", "OIHW", "NCHW")), ((2, 4, 16, 16),
         (8, 4, 3, 3)), ((0, 2),)),
    Case("conv_1d", _conv("SAME", strides=(1,), lhs_dil=(1,), rhs_dil=(1,),
                          dims=("NWC", "WIO", "NWC")), ((2, 16, 4), (5, 4, 4)), ((0, 1),)),
    Case("max_pool", _pool("max", (1, 2, 2, 1), (1, 2, 2, 1), "VALID"), (IMG,), ((0, 1),)),
    Case("max_pool_same", _pool("max", (1, 3, 3, 1), (1, 1, 1, 1), "SAME"), (IMG,), ((0, 1),)),
    Case("avg_pool", _pool("avg", (1, 2, 2, 1), (1, 2, 2, 1), "VALID"), (IMG,), ((0, 1),)),
    Case("avg_pool_overlap", _pool("avg", (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), (IMG,),
         ((0, 1),)),
    Case("cumsum", lambda x: (jnp.cumsum(x, axis=1) ** 2).sum(), ((4, 16),), ((0, 1),)),
    Case("cummax", lambda x: (lax.cummax(x, axis=1) ** 2).sum(), ((4, 16),), ((0, 1),)),
    Case("pad_edges", lambda x: (jnp.pad(x, ((0, 0), (3, 1))) ** 2 * jnp.arange(20.0)).sum(),
         ((4, 16),), ((0, 1),)),
    Case("pad_interior", lambda x: (lax.pad(x, 0.5, ((0, 0, 0), (1, -1, 1))) ** 2
                                    * jnp.arange(31.0)).sum(), ((4, 16),), ((0, 1),)),
    Case("slice_strided", lambda x: (x[:, 1::2] ** 2 * jnp.arange(8.0)).sum(), ((4, 16),),
         ((0, 1),)),
    Case("slice_window", lambda x: (x[:, 2:10] ** 3).sum(), ((4, 16),), ((0, 1),)),
    Case("reverse", lambda x: (x[:, ::-1] * jnp.arange(16.0)).sum(), ((4, 16),), ((0, 1),)),
    Case("concatenate", lambda x, y: (jnp.concatenate([x, y], 1) ** 2
                                      * jnp.arange(32.0)).sum(), ((4, 16), (4, 16)),
         ((0, 1), (1, 1))),
    Case("roll", lambda x: (jnp.roll(x, 3, axis=1) * jnp.arange(16.0)).sum(), ((4, 16),),
         ((0, 1),)),
    Case("gather_rows", lambda t, i: (t[i] ** 2).sum(), ((16, 8), (4, 6)), ((0, 0), (0, 1)),
         int_args=(1,)),
    Case("take_along_axis", lambda x, i: (jnp.take_along_axis(x, i % 16, axis=1) ** 2).sum(),
         ((4, 16), (4, 16)), ((0, 1), (0, 0)), int_args=(1,)),
    Case("scatter_add", lambda x, i: (x.at[:, i[0] % 16].add(1.0) ** 2
                                      * jnp.arange(16.0)).sum(), ((4, 16), (1, 5)), ((0, 1),),
         int_args=(1,)),
    Case("scatter_set", lambda x, i: (x.at[:, i[0] % 16].set(2.0) ** 2).sum(),
         ((4, 16), (1, 5)), ((0, 1),), int_args=(1,)),
    Case("sort", lambda x: (jnp.sort(x, axis=1) * jnp.arange(16.0)).sum(), ((4, 16),),
         ((0, 1), (0, 0))),
    Case("argsort", lambda x: (x * jnp.argsort(x, axis=1)).sum(), ((4, 16),), ((0, 1),)),
    Case("argmax", lambda x: (x * jnp.argmax(x, axis=1)[:, None]).sum(), ((4, 16),), ((0, 1),)),
    Case("logsumexp", lambda x: jax.nn.logsumexp(x, axis=1).sum(), ((4, 16),), ((0, 1),)),
    Case("reduce_window_sum_rows", lambda x: (lax.reduce_window(
        x, 0.0, lax.add, (1, 4), (1, 4), "VALID") ** 2).sum(), ((4, 16),), ((0, 1),)),
    Case("dynamic_slice", lambda x, i: (lax.dynamic_slice_in_dim(x, i[0, 0] % 8, 8, 1)
                                        ** 2).sum(), ((4, 16), (1, 1)), ((0, 1), (0, 0)),
         int_args=(1,)),
    Case("top_k", lambda x: (lax.top_k(x, 4)[0] ** 2).sum(), ((4, 16),), ((0, 1), (0, 0))),
]


# -- generated from the property test's attribute spaces ---------------------------------------

def _op_case(name: str, spec: tuple, shapes: tuple[tuple[int, ...], ...],
             ints: tuple[tuple[int, tuple[int, ...]], ...] = ()) -> Case:
    """A one-op recipe of the property test's vocabulary as a loss: its output's sines,
    weighted by position (so that every element's gradient differs)."""
    fn = build(Recipe(shapes, (spec,), (("v", 0),), ints))

    def loss(*args):
        (y,) = fn(*args)
        return (jnp.sin(y) * jnp.linspace(0.5, 1.5, y.size).reshape(y.shape)).sum()

    return Case(name, loss, shapes, tuple((0, d) for d in range(len(shapes[0]))),
                int_args=tuple(i for i, _ in ints), int_values=ints)


def _sign(v: int) -> int:
    return (v > 0) - (v < 0)


def _pad_cases() -> list[Case]:
    """One pad per (sign of low, sign of high, interior) class of `pad_configs()`, on the
    tiled-to-be dimension 0, with a second dimension padded the other way."""
    seen, cases = set(), []
    for lo, hi, interior in pad_configs():
        key = (_sign(lo), _sign(hi), interior)
        if key in seen:
            continue
        seen.add(key)
        config = ((lo, hi, interior), (hi, lo, 0))
        cases.append(_op_case(f"gen_pad_{lo}_{hi}_{interior}",
                              ("pad", ("a", 0), -0.1, config), ((12, 6),)))
    return cases


def _window_cases() -> list[Case]:
    """Every (window, stride, dilation, padding) of `window_configs()` with a stride beyond
    the window or explicit padding, as max and average pools over 13 rows."""
    cases = []
    for k, (w, s, d, pad) in enumerate(window_configs()):
        if s <= w and isinstance(pad, str):
            continue
        # jax has no gradient of a max/min pool with window dilation
        kind = ("max", "avg", "min", "sum")[k % 4] if d == 1 else ("avg", "sum")[k % 2]
        padding = pad if isinstance(pad, str) else (pad,)
        spec = ("window", kind, ("a", 0), (1,), (w,), (s,), padding, (d,))
        cases.append(_op_case(f"gen_window_{kind}_w{w}s{s}d{d}_{pad}", spec, ((2, 13, 3),)))
    return cases


def _conv_cases() -> list[Case]:
    """1-D convolutions over 13 positions: each kernel size with each stride (beyond the
    kernel included), SAME, VALID and an asymmetric explicit padding (the low side below the
    kernel: XLA:CPU's float32 convolution is wrong beyond it); dilated kernels SAME."""
    cases = []
    for k in CONV_KERNELS:
        for s in CONV_STRIDES:
            for d in sorted(set(CONV_DILATIONS)):
                eff = (k - 1) * d + 1
                for pad in ("SAME", "VALID", ((eff - 1, 0),)) if d == 1 else ("SAME",):
                    spec = ("conv", ("a", 0), ("a", 1), (s,), pad, (1,), (d,), 1)
                    cases.append(_op_case(f"gen_conv_k{k}s{s}d{d}_{pad}", spec,
                                          ((2, 13, 4), (k, 4, 6))))
    spec = ("conv", ("a", 0), ("a", 1), (2, 1), ((1, 0), (0, 1)), (2, 1), (1, 2), 2)
    cases.append(_op_case("gen_conv2d_lhs_dilated_grouped", spec, ((2, 7, 6, 4), (3, 2, 2, 4))))
    return cases


def _reshape_cases() -> list[Case]:
    return [_op_case(f"gen_reshape_{src}_{dst}", ("reshape", ("a", 0), dst), (src,))
            for src, dst in UNEVEN_RESHAPES]


def _indexing_cases() -> list[Case]:
    """Gathers, scatters and dynamic slices with indices that are negative, out of range
    (clamped, filled or dropped) or repeated."""
    n = 6
    ids = (-n, n + 1, 2, 2, -1)
    return [
        _op_case("gen_take_clip", ("gather", ("a", 0), 0, (-3, 7, 1, 1), "clip"), ((n, 4),)),
        _op_case("gen_take_fill", ("gather", ("a", 0), 1, (-1, 4, 0), "fill"), ((3, n),)),
        _op_case("gen_embed_negative_ids", ("embed", ("a", 0), ("a", 1), None),
                 ((n, 4), (2, 2)), ((1, (-1, 0, 5, -6)),)),
        _op_case("gen_embed_clip", ("embed", ("a", 0), ("a", 1), "clip"), ((n, 4), (5,)),
                 ((1, ids),)),
        _op_case("gen_scatter_ids_dropped", ("scatter_ids", "add", ("a", 0), ("a", 1),
                                             ("a", 2)), ((n, 3), (5, 3), (5,)), ((2, ids),)),
        _op_case("gen_scatter_max", ("scatter", "max", ("a", 0), ("a", 1), 1, (0, 3, 3)),
                 ((2, n), (2, 3)),),
        _op_case("gen_dslice_clamped", ("dslice", ("a", 0), (("a", 1), 0), (4, 3)),
                 ((n, 3), ()), ((1, (n + 2,)),)),
        _op_case("gen_dupdate_clamped", ("dupdate", ("a", 0), ("a", 1), (("a", 2), 1)),
                 ((n, 3), (4, 2), ()), ((2, (-2,)),)),
        _op_case("gen_top_k_dim0", ("top_k", ("a", 0), 3, 0, "values"), ((n, 4),)),
        _op_case("gen_sort_pair", ("sort", ("a", 0), 1, "pair", ("a", 1)), ((3, n), (3, n))),
        _op_case("gen_cumprod_reverse", ("cumulative", "cumprod", ("a", 0), 0, True), ((n, 2),)),
    ]


GENERATED = {"pad": _pad_cases(), "window": _window_cases(), "conv": _conv_cases(),
             "reshape": _reshape_cases(), "indexing": _indexing_cases()}
GENERATED_CASES = [case for cases in GENERATED.values() for case in cases]



def ops_of(fn: Callable, *args) -> list:
    """Every op of `fn`'s lowering on `args`, nested regions included: what the verifier probes."""
    return list(walk(import_lowered(jax.jit(fn).lower(*args)).ops))


def assert_none_wrong(report) -> None:
    """The verifier checked something and found no entry wrong."""
    assert report.verdicts, "nothing was verified"
    assert not report.wrong, str(report)


# -- elementwise ops: the entries test_tmr checks op by op, the verifier checks true --------

F32, I32, U32, C64 = jnp.float32, jnp.int32, jnp.uint32, jnp.complex64

# (op jax emits, function, operand dtypes). Shapes are all (8, 4).
UNARY = [
    ("stablehlo.abs", lax.abs, [F32]),
    ("stablehlo.negate", lax.neg, [F32]),
    ("stablehlo.exponential", lax.exp, [F32]),
    ("stablehlo.exponential_minus_one", lax.expm1, [F32]),
    ("stablehlo.log", lax.log, [F32]),
    ("stablehlo.log_plus_one", lax.log1p, [F32]),
    ("stablehlo.tanh", lax.tanh, [F32]),
    ("stablehlo.sqrt", lax.sqrt, [F32]),
    ("stablehlo.rsqrt", lax.rsqrt, [F32]),
    ("stablehlo.cbrt", lax.cbrt, [F32]),
    ("stablehlo.sine", lax.sin, [F32]),
    ("stablehlo.cosine", lax.cos, [F32]),
    ("stablehlo.tan", lax.tan, [F32]),
    ("stablehlo.floor", lax.floor, [F32]),
    ("stablehlo.ceil", lax.ceil, [F32]),
    ("stablehlo.sign", lax.sign, [F32]),
    ("stablehlo.round_nearest_afz", lax.round, [F32]),
    ("stablehlo.round_nearest_even",
     lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN), [F32]),
    ("stablehlo.is_finite", lax.is_finite, [F32]),
    ("stablehlo.convert", lambda x: x.astype(I32), [F32]),
    ("stablehlo.bitcast_convert", lambda x: lax.bitcast_convert_type(x, I32), [F32]),
    ("stablehlo.reduce_precision", lambda x: lax.reduce_precision(x, 5, 10), [F32]),
    ("stablehlo.not", lax.bitwise_not, [I32]),
    ("stablehlo.popcnt", lax.population_count, [I32]),
    ("stablehlo.count_leading_zeros", lax.clz, [I32]),
    ("stablehlo.real", lax.real, [C64]),
    ("stablehlo.imag", lax.imag, [C64]),
]
BINARY = [
    ("stablehlo.add", lax.add, [F32, F32]),
    ("stablehlo.subtract", lax.sub, [F32, F32]),
    ("stablehlo.multiply", lax.mul, [F32, F32]),
    ("stablehlo.divide", lax.div, [F32, F32]),
    ("stablehlo.maximum", lax.max, [F32, F32]),
    ("stablehlo.minimum", lax.min, [F32, F32]),
    ("stablehlo.power", lax.pow, [F32, F32]),
    ("stablehlo.remainder", lax.rem, [F32, F32]),
    ("stablehlo.atan2", lax.atan2, [F32, F32]),
    ("stablehlo.compare", lax.lt, [F32, F32]),
    ("stablehlo.complex", lax.complex, [F32, F32]),
    ("stablehlo.and", lax.bitwise_and, [I32, I32]),
    ("stablehlo.or", lax.bitwise_or, [I32, I32]),
    ("stablehlo.xor", lax.bitwise_xor, [I32, I32]),
    ("stablehlo.shift_left", lax.shift_left, [I32, I32]),
    ("stablehlo.shift_right_arithmetic", lax.shift_right_arithmetic, [I32, I32]),
    ("stablehlo.shift_right_logical", lax.shift_right_logical, [U32, U32]),
]
TERNARY = [
    ("stablehlo.select", lax.select, [jnp.bool_, F32, F32]),
    ("stablehlo.clamp", lax.clamp, [F32, F32, F32]),
]
# Every elementwise CHLO op jax emits (Shardy has no rule for CHLO: ours is hand-written).
CHLO = [
    ("chlo.acos", lax.acos, [F32]),
    ("chlo.acosh", lax.acosh, [F32]),
    ("chlo.asin", lax.asin, [F32]),
    ("chlo.asinh", lax.asinh, [F32]),
    ("chlo.atan", lax.atan, [F32]),
    ("chlo.atanh", lax.atanh, [F32]),
    ("chlo.cosh", lax.cosh, [F32]),
    ("chlo.sinh", lax.sinh, [F32]),
    ("chlo.square", lax.square, [F32]),
    ("chlo.erf", lax.erf, [F32]),
    ("chlo.erfc", lax.erfc, [F32]),
    ("chlo.erf_inv", lax.erf_inv, [F32]),
    ("chlo.lgamma", lax.lgamma, [F32]),
    ("chlo.digamma", lax.digamma, [F32]),
    ("chlo.bessel_i1e", lax.bessel_i1e, [F32]),
    ("chlo.next_after", lax.nextafter, [F32, F32]),
    ("chlo.polygamma", lax.polygamma, [F32, F32]),
    ("chlo.zeta", lax.zeta, [F32, F32]),
]
ELEMENTWISE = UNARY + BINARY + TERNARY + CHLO
