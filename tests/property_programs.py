"""The vocabulary of random programs for the property test (`test_property.py`) and the TMR
verifier's corpus (`tmr_corpus.py`): op kinds, their attribute spaces, a hypothesis strategy
for programs (`recipes`) and for schedules (`schedules`), and `check`, which compares a
partitioned program (values, or values and gradients) with the unpartitioned `jax.jit`.

A program is a `Recipe`: arguments (float arrays, or int arrays/scalars with fixed values:
ids and traced indices), and op specs whose operands are refs ("a", i) (argument i) or
("v", j) (result of op j). Every op result is float32 (indices are scaled into floats), so any
op may follow any other. `build` turns a recipe into a Python function, which hypothesis
shrinks to a small failing recipe.

Op kinds (`OP_KINDS`), each with its whole attribute space:
  elementwise: unary (incl. custom-jvp softplus/gelu, rounding, a bfloat16 round trip),
    binary (incl. compare+select), clamp, iota
  contraction: dot (dot_general with 1-2 contracting and 0-1 batch dimensions)
  reductions: reduce (sum/max/min over 1-2 dims), argreduce (argmax/argmin, any/all),
    normalize (softmax, log_softmax, logsumexp, standardize along a dim)
  layout: transpose, broadcast (incl. expanding size-1 dims), reshape (split, merge, unit
    dims, and re-factorings whose tiles do not line up: 10x8 -> 16x5)
  data movement: slice (start/limit/stride), pad (negative, interior, asymmetric:
    `PAD_LOW_HIGH` x `PAD_INTERIOR`), concatenate (unequal sizes), reverse (1-2 dims), roll
    (`partir_plugin.roll` and `jnp.roll`)
  indexing: gather (`jnp.take` at constant indices, modes clip/fill with out-of-range ids),
    embed (table[int ids], ids of rank 1-2 with negative and out-of-range values, or ids
    computed on the devices), gather_nd (points of two dims),
    take_along (int ids), scatter (constant indices: add/set/max/min), scatter_ids (int ids,
    out-of-range dropped), dslice / dupdate (dynamic_slice / dynamic_update_slice with traced
    starts that jax clamps)
  windows: conv (1-D and 2-D: strides, SAME/VALID/explicit asymmetric padding, lhs and rhs
    dilation, feature groups), window (reduce_window sum/max/min/avg over 1-2 dims: stride
    greater than the window, explicit padding, window dilation)
  scans: cumulative (cumsum/cumprod/cummax/cummin/cumlogsumexp, reversed), sort (values,
    indices, a key-value pair), top_k (values, indices, along any dim)
  control flow: scan (a layer loop over a stacked weight), scan_xs (tiled xs, a carry and a
    closure, reversed), while (fori_loop reading an outer value), while_data (a trip count
    that depends on the data), cond (a data-dependent branch)
  tag: `partir_plugin.tag` on any intermediate, which schedules may decide.

Sizes: powers of two, one in four uneven (3, 5, 6, 12, 37: not every axis divides them), one
in ten 1. Convolutions never get a low padding of at least the (dilated) kernel size: on
XLA:CPU a float32 convolution with such padding returns garbage even under plain `jax.jit`
(its gradient's convolutions are kept within that bound too).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax
from oracle import RTOL, mismatches, value_and_grad_of

import partir_plugin as partir

CUBE = {"a": 2, "b": 2, "c": 2}
WIDE = {"a": 4, "b": 2}
MESHES = (CUBE, WIDE)
EVEN = (2, 4, 8, 16)
UNEVEN = (3, 5, 6, 12, 37)
MAX_RANK = 4
MAX_ELEMENTS = 4096

UNARY: dict[str, Callable] = {
    "sin": jnp.sin, "cos": jnp.cos, "tanh": jnp.tanh, "neg": jnp.negative, "abs": jnp.abs,
    "erf": lax.erf, "logistic": lax.logistic, "atan": jnp.arctan, "half": lambda x: x * 0.5,
    "relu": lambda x: jnp.maximum(x, 0), "log1p_abs": lambda x: jnp.log1p(jnp.abs(x)),
    "square": jnp.square, "softplus": jax.nn.softplus, "gelu": jax.nn.gelu,
    "rsqrt1p": lambda x: lax.rsqrt(1 + x * x), "round": lambda x: jnp.round(x * 4) / 4,
    "rem": lambda x: jnp.remainder(x, 0.3),
    "bf16": lambda x: x.astype(jnp.bfloat16).astype(x.dtype)}
BINARY: dict[str, Callable] = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum,
    "min": jnp.minimum, "select": lambda x, y: jnp.where(x > y, x, y * 0.5),
    "atan2": jnp.arctan2}
REDUCE = {"sum": lax.add, "max": lax.max, "min": lax.min}
REDUCE_INIT = {"sum": 0.0, "max": -np.inf, "min": np.inf}
NORMALIZE = {"softmax": jax.nn.softmax, "log_softmax": jax.nn.log_softmax,
             "logsumexp": lambda x, axis: jax.nn.logsumexp(x, axis=axis, keepdims=True),
             "standardize": lambda x, axis: jax.nn.standardize(x, axis=axis, epsilon=1e-3)}
CUMULATIVE = {"cumsum": lax.cumsum, "cumprod": lax.cumprod, "cummax": lax.cummax,
              "cummin": lax.cummin, "cumlogsumexp": lax.cumlogsumexp}

# Attribute spaces, shared with the TMR verifier's corpus (`tmr_corpus.py`).
PAD_LOW_HIGH = (-2, -1, 0, 1, 2, 3)  # per side: crop, nothing, pad
PAD_INTERIOR = (0, 0, 1, 2)
WINDOW_SIZES = (1, 2, 3)
WINDOW_STRIDES = (1, 2, 3, 4)  # stride > window included
WINDOW_DILATIONS = (1, 1, 2)
WINDOW_PADDINGS = ("SAME", "VALID", "explicit")
CONV_KERNELS = (1, 2, 3)
CONV_STRIDES = (1, 2, 3)
CONV_DILATIONS = (1, 1, 2)
# Re-factorings whose tiles do not line up with the source's (and the findings' shapes).
UNEVEN_RESHAPES = (((10, 8), (16, 5)), ((5, 3), (3, 5)), ((5, 4), (4, 5)), ((6, 4), (8, 3)),
                   ((12,), (3, 4)), ((4, 6), (3, 8)), ((2, 3, 4), (4, 6)))

Ref = tuple[str, int]


def pad_configs() -> list[tuple[int, int, int]]:
    """Every (low, high, interior) of the pad attribute space."""
    return [(lo, hi, i) for lo in PAD_LOW_HIGH for hi in PAD_LOW_HIGH
            for i in sorted(set(PAD_INTERIOR))]


def window_configs() -> list[tuple[int, int, int, object]]:
    """Every (window, stride, dilation, padding) of a 1-D window; explicit paddings stay
    below the dilated window (a window of padding alone has no value)."""
    out = []
    for w in WINDOW_SIZES:
        for s in WINDOW_STRIDES:
            for d in sorted(set(WINDOW_DILATIONS)):
                eff = (w - 1) * d + 1
                pads: list[object] = ["SAME", "VALID"]
                pads += [(lo, hi) for lo in range(eff) for hi in range(eff) if lo != hi][:2]
                out += [(w, s, d, p) for p in pads]
    return out


@dataclass(frozen=True)
class Recipe:
    """`args`: argument shapes. `ints`: (arg index, values) for int32 arguments (ids,
    traced starts), the rest are float32. `ops`: op specs. `outputs`: refs returned."""

    args: tuple[tuple[int, ...], ...]
    ops: tuple[tuple, ...]
    outputs: tuple[Ref, ...]
    ints: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def int_values(self) -> dict[int, np.ndarray]:
        return {i: np.asarray(v, np.int32).reshape(self.args[i]) for i, v in self.ints}

    def float_args(self) -> tuple[int, ...]:
        ints = dict(self.ints)
        return tuple(i for i in range(len(self.args)) if i not in ints)

    def kinds(self) -> set[str]:
        return {spec[0] for spec in self.ops}


def example_args(recipe: Recipe, seed: int = 0, dtype=np.float32) -> list[np.ndarray]:
    """Arguments for `recipe`: floats uniform in [-1, 1], ints as the recipe says."""
    rng = np.random.default_rng(seed)
    ints = recipe.int_values()
    return [ints[i] if i in ints else rng.uniform(-1, 1, s).astype(dtype)
            for i, s in enumerate(recipe.args)]


def _c(v, x):
    """A constant `v` in `x`'s dtype."""
    return np.asarray(v, x.dtype)


def _window(v, kind, dims, window, stride, padding, dilation):
    wd, st_, dl = [1] * v.ndim, [1] * v.ndim, [1] * v.ndim
    pad = [(0, 0)] * v.ndim
    for k, d in enumerate(dims):
        wd[d], st_[d], dl[d] = window[k], stride[k], dilation[k]
        if not isinstance(padding, str):
            pad[d] = tuple(padding[k])
    if isinstance(padding, str):
        pad = lax.padtype_to_pads(v.shape, [(w - 1) * d + 1 for w, d in zip(wd, dl)], st_,
                                  padding)
    red = "sum" if kind == "avg" else kind
    out = lax.reduce_window(v, _c(REDUCE_INIT[red], v), REDUCE[red], wd, st_, pad,
                            window_dilation=dl)
    return out / math.prod(window) if kind == "avg" else out


def apply_op(spec: tuple, get: Callable) -> jax.Array:
    """The result of op `spec`, its operands read through `get(ref)`."""
    op = spec[0]
    if op == "unary":
        return UNARY[spec[1]](get(spec[2]))
    if op == "binary":
        return BINARY[spec[1]](get(spec[2]), get(spec[3]))
    if op == "clamp":
        _, x, lo, hi = spec
        v = get(x)
        return lax.clamp(_c(lo, v), v, _c(hi, v))
    if op == "dot":
        _, x, w, (cx, cw), batch = spec
        cx, cw = (cx,) if isinstance(cx, int) else cx, (cw,) if isinstance(cw, int) else cw
        bx, bw = (((batch[0],), (batch[1],)) if isinstance(batch[0], int) else batch
                  ) if batch else ((), ())
        return lax.dot_general(get(x), get(w), ((cx, cw), (bx, bw)))
    if op == "reduce":
        _, kind, x, dims = spec
        if kind in ("argmax", "argmin"):  # old form: ("reduce", "argmax", x, dim)
            return apply_op(("argreduce", kind, x, dims), get)
        v = get(x)
        dims = (dims,) if isinstance(dims, int) else dims
        return lax.reduce(v, _c(REDUCE_INIT[kind], v), REDUCE[kind], tuple(dims))
    if op == "argreduce":  # the index (or a boolean reduction), as a float
        _, kind, x, dim = spec
        v = get(x)
        if kind in ("any", "all"):
            return getattr(jnp, kind)(v > 0, axis=dim).astype(v.dtype) * 0.1
        f = jnp.argmax if kind == "argmax" else jnp.argmin
        return f(v, axis=dim).astype(v.dtype) * 0.1
    if op == "normalize":
        _, kind, x, dim = spec
        return NORMALIZE[kind](get(x), axis=dim)
    if op == "transpose":
        return lax.transpose(get(spec[1]), spec[2])
    if op == "broadcast":
        _, x, shape, dims = spec
        return lax.broadcast_in_dim(get(x), shape, dims)
    if op == "reshape":
        return lax.reshape(get(spec[1]), tuple(spec[2]))
    if op == "iota":
        _, x, dim = spec
        v = get(x)
        return v + lax.broadcasted_iota(v.dtype, v.shape, dim) * 0.01
    if op == "slice":
        _, x, dim, start, stride, *limit = spec
        v = get(x)
        return lax.slice_in_dim(v, start, limit[0] if limit else v.shape[dim], stride, dim)
    if op == "pad":
        _, x, value, config = spec
        v = get(x)
        return lax.pad(v, _c(value, v), [tuple(c) for c in config])
    if op == "concatenate":
        _, x, y, dim = spec
        return lax.concatenate([get(x), get(y)], dim)
    if op == "reverse":
        dims = spec[2]
        return lax.rev(get(spec[1]), (dims,) if isinstance(dims, int) else tuple(dims))
    if op == "roll":  # partir_plugin.roll: block rotations between devices where tiled
        _, x, dim, shift, *via = spec
        if via and via[0] == "jnp":
            return jnp.roll(get(x), shift, dim)
        return partir.roll(get(x), shift, dim)
    if op == "gather":  # rows picked by constant indices (an embedding lookup's shape)
        _, x, dim, index, *mode = spec
        mode = mode[0] if mode else None
        return jnp.take(get(x), np.asarray(index, np.int32), axis=dim, mode=mode,
                        fill_value=0.5 if mode == "fill" else None)
    if op == "embed":  # table[ids] with int ids (an argument)
        _, table, ids, mode = spec
        if mode is None:
            return get(table)[get(ids)]
        if mode == "mod":  # ids computed on the devices: integer remainder, then a lookup
            t = get(table)
            return t[jnp.remainder(get(ids) * 3 + 1, t.shape[0])]
        return jnp.take(get(table), get(ids), axis=0, mode=mode,
                        fill_value=0.5 if mode == "fill" else None)
    if op == "gather_nd":  # x[ids[:, 0], ids[:, 1]]: points of the first two dims
        _, x, ids = spec
        i = get(ids)
        return get(x)[i[:, 0], i[:, 1]]
    if op == "take_along":
        _, x, ids, dim = spec
        return jnp.take_along_axis(get(x), get(ids), axis=dim)
    if op == "scatter":  # rows updated at constant indices
        _, mode, x, u, dim, index = spec
        at = get(x).at[(slice(None),) * dim + (np.asarray(index, np.int32),)]
        return getattr(at, mode)(get(u))
    if op == "scatter_ids":  # rows of dim 0 updated at int ids; out-of-range ids dropped
        _, mode, x, u, ids = spec
        return getattr(get(x).at[get(ids)], mode)(get(u))
    if op == "dslice":  # starts: per dim an int or a ref to an int scalar (traced)
        _, x, starts, sizes = spec
        starts = [get(s) if isinstance(s, tuple) else np.int32(s) for s in starts]
        return lax.dynamic_slice(get(x), starts, sizes)
    if op == "dupdate":
        _, x, u, starts = spec
        starts = [get(s) if isinstance(s, tuple) else np.int32(s) for s in starts]
        return lax.dynamic_update_slice(get(x), get(u), starts)
    if op == "conv":
        if len(spec) == 6:  # 1-D: ("conv", x, w, stride, padding, rhs dilation)
            _, x, w, stride, padding, dilation = spec
            spec = ("conv", x, w, (stride,), padding, (1,), (dilation,), 1)
        _, x, w, strides, padding, lhs_dil, rhs_dil, groups = spec
        n = len(strides)
        dims = (("NWC", "WIO", "NWC") if n == 1 else ("NHWC", "HWIO", "NHWC"))
        padding = padding if isinstance(padding, str) else [tuple(p) for p in padding]
        return lax.conv_general_dilated(get(x), get(w), strides, padding,
                                        lhs_dilation=lhs_dil, rhs_dilation=rhs_dil,
                                        dimension_numbers=dims, feature_group_count=groups)
    if op == "window":
        if len(spec) == 7:
            _, kind, x, dim, window, stride, padding = spec  # old 1-D form
            return _window(get(x), kind, (dim,), (window,), (stride,), padding, (1,))
        _, kind, x, dims, window, stride, padding, dilation = spec
        return _window(get(x), kind, dims, window, stride, padding, dilation)
    if op == "cumsum":
        _, x, dim, reverse = spec
        return lax.cumsum(get(x), dim, reverse=reverse)
    if op == "cumulative":
        _, kind, x, dim, reverse = spec
        return CUMULATIVE[kind](get(x), dim, reverse=reverse)
    if op == "sort":
        _, x, dim, what, *other = spec
        v = get(x)
        if what == "values":
            return jnp.sort(v, axis=dim)
        if what == "indices":
            return jnp.argsort(v, axis=dim).astype(v.dtype) * 0.1
        return lax.sort((v, get(other[0])), dimension=dim, num_keys=1)[1]
    if op == "top_k":
        _, x, k, dim, what = spec
        v = jnp.moveaxis(get(x), dim, -1)
        values, indices = lax.top_k(v, k)
        out = values if what == "values" else indices.astype(v.dtype) * 0.1
        return jnp.moveaxis(out, -1, dim)
    if op == "scan":  # a layer loop: x [..., D] through L layers of a stacked w [L, D, D]
        _, x, w = spec
        scale = get(x).shape[-1] ** -0.5  # keeps the contraction's rounding at output scale
        return lax.scan(lambda h, wl: (jnp.tanh((h @ wl) * scale), None), get(x), get(w))[0]
    if op == "scan_xs":  # xs [L, ...] scanned with a carry and a closure; ys + final carry
        _, xs, init, closure, reverse = spec
        c = get(closure)

        def body(carry, x):
            return jnp.sin(carry) * 0.5 + x * c, carry * x

        carry, ys = lax.scan(body, get(init), get(xs), reverse=reverse)
        return ys + carry
    if op == "while":  # a loop carrying x, reading y from outside
        _, x, y = spec
        v, c = get(x), get(y)
        return lax.fori_loop(0, 3, lambda i, acc: jnp.sin(acc) * 0.5 + c, v)
    if op == "while_data":  # at most 4 trips while the carried sum stays below `bound`
        _, x, y, bound = spec
        v, c = get(x), get(y)

        def cond(s):
            return (s[0] < 4) & (jnp.sum(s[1]) < bound)

        return lax.while_loop(cond, lambda s: (s[0] + 1, jnp.sin(s[1]) * 0.5 + c), (0, v))[1]
    if op == "cond":
        _, x, y = spec
        v, w = get(x), get(y)
        return lax.cond(jnp.sum(v) > 0, lambda a, b: jnp.sin(a) * b, lambda a, b: a - b,
                        v, w)
    if op == "tag":
        return partir.tag(get(spec[1]), spec[2])
    raise AssertionError(spec)


OP_KINDS = ("unary", "binary", "clamp", "iota", "dot", "reduce", "argreduce", "normalize",
            "transpose", "broadcast", "reshape", "slice", "pad", "concatenate", "reverse",
            "roll", "gather", "embed", "gather_nd", "take_along", "scatter", "scatter_ids",
            "dslice", "dupdate", "conv", "window", "cumulative", "sort", "top_k", "scan",
            "scan_xs", "while", "while_data", "cond", "tag")
NOT_DIFFERENTIABLE = frozenset({"while_data"})  # reverse-mode AD of a data-dependent loop


def build(recipe: Recipe) -> Callable:
    """The recipe as a function of its arguments, returning a tuple of its outputs."""
    def fn(*args):
        values: list = []

        def get(ref):
            kind, i = ref
            return args[i] if kind == "a" else values[i]

        for spec in recipe.ops:
            values.append(apply_op(spec, get))
        return tuple(get(r) for r in recipe.outputs)

    return fn


def _refs(spec) -> list[Ref]:
    """The operand refs inside a spec (nested tuples included)."""
    out = []
    for item in spec[1:]:
        if isinstance(item, tuple):
            if len(item) == 2 and item[0] in ("a", "v") and isinstance(item[1], int):
                out.append(item)
            else:
                out += _refs((None, *item))
    return out


def result_shape(spec: tuple, shapes: dict, int_refs=frozenset()) -> tuple[int, ...]:
    """The shape of op `spec`'s result, from jax's own shape rules."""
    refs = sorted(set(_refs(spec)))
    structs = [jax.ShapeDtypeStruct(shapes[r], np.int32 if r in int_refs else np.float32)
               for r in refs]
    out = jax.eval_shape(lambda *xs: apply_op(spec, dict(zip(refs, xs)).__getitem__),
                         *structs)
    return tuple(out.shape)


# -- the program strategy -----------------------------------------------------------------

class _Builder:
    """A recipe under construction: its arguments, int arguments, ops and value shapes."""

    def __init__(self, draw, grad: bool = False):
        self.draw = draw
        self.grad = grad
        self.args: list[tuple[int, ...]] = []
        self.ints: list[tuple[int, tuple[int, ...]]] = []
        self.ops: list[tuple] = []
        self.shapes: dict[Ref, tuple[int, ...]] = {}  # float values only
        self.int_shapes: dict[Ref, tuple[int, ...]] = {}
        self.tags: dict[str, tuple[int, ...]] = {}

    # sizes and operands
    def size(self) -> int:
        r = self.draw(st.integers(0, 19))
        if r < 2:
            return 1
        if r < 7:
            return self.draw(st.sampled_from(UNEVEN))
        return self.draw(st.sampled_from(EVEN))

    def shape(self, rank_min: int = 1, rank_max: int = 3) -> tuple[int, ...]:
        rank = self.draw(st.integers(rank_min, rank_max))
        out = tuple(self.size() for _ in range(rank))
        while math.prod(out) > MAX_ELEMENTS:
            out = tuple(max(1, s // 2) for s in out)
        return out

    def new_arg(self, shape) -> Ref:
        self.args.append(tuple(shape))
        ref = ("a", len(self.args) - 1)
        self.shapes[ref] = tuple(shape)
        return ref

    def new_int_arg(self, shape, lo: int, hi: int) -> Ref:
        shape = tuple(shape)
        values = self.draw(st.lists(st.integers(lo, hi), min_size=math.prod(shape),
                                    max_size=math.prod(shape)))
        self.args.append(shape)
        self.ints.append((len(self.args) - 1, tuple(values)))
        ref = ("a", len(self.args) - 1)
        self.int_shapes[ref] = shape
        return ref

    def pick(self, pred=lambda s: True) -> Ref | None:
        refs = [r for r, s in self.shapes.items() if pred(s)]
        if not refs:
            return None
        latest = max(refs, key=lambda r: (r[0] == "v", r[1]))
        return latest if self.draw(st.booleans()) else self.draw(st.sampled_from(refs))

    def operand_like(self, shape) -> Ref:
        same = [r for r, s in self.shapes.items() if s == tuple(shape)]
        if same and self.draw(st.booleans()):
            return self.draw(st.sampled_from(same))
        return self.new_arg(shape)

    def dim(self, x: Ref) -> int:
        return self.draw(st.integers(0, len(self.shapes[x]) - 1))

    def dims(self, x: Ref, most: int = 2) -> tuple[int, ...]:
        rank = len(self.shapes[x])
        n = self.draw(st.integers(1, min(most, rank)))
        return tuple(sorted(self.draw(st.permutations(range(rank)))[:n]))

    def add(self, spec: tuple) -> bool:
        """Append `spec` if jax accepts it and its result is non-empty and small enough."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                shape = result_shape(spec, {**self.shapes, **self.int_shapes},
                                     frozenset(self.int_shapes))
        except (TypeError, ValueError, IndexError):
            return False
        if 0 in shape or len(shape) > MAX_RANK or math.prod(shape) > 4 * MAX_ELEMENTS:
            return False
        self.ops.append(spec)
        self.shapes[("v", len(self.ops) - 1)] = shape
        return True


SCALAR_OPERAND = frozenset({"unary", "binary", "clamp", "broadcast", "while", "while_data",
                            "cond", "tag"})  # kinds that take a rank-0 operand too


def _draw_op(b: _Builder, kind: str) -> tuple | None:
    """The spec of an op of `kind` on the builder's values, or None if none suits it."""
    d = b.draw
    x = b.pick() if kind in SCALAR_OPERAND else b.pick(lambda s: len(s) >= 1)
    if x is None:
        return None
    xs = b.shapes[x]
    if kind == "unary":
        return ("unary", d(st.sampled_from(sorted(UNARY))), x)
    if kind == "binary":
        return ("binary", d(st.sampled_from(sorted(BINARY))), x, b.operand_like(xs))
    if kind == "clamp":
        return ("clamp", x, d(st.sampled_from([-0.5, -0.1])), d(st.sampled_from([0.1, 0.5])))
    if kind == "iota":
        return ("iota", x, b.dim(x))
    if kind == "dot":
        rank = len(xs)
        perm = d(st.permutations(range(rank)))
        n_c = d(st.integers(1, min(2, rank)))
        cx = tuple(perm[:n_c])
        rest = perm[n_c:]
        bx = tuple(rest[:d(st.integers(0, min(1, len(rest))))])
        n_free = d(st.integers(0, 2))
        rhs = [xs[c] for c in cx] + [xs[c] for c in bx] + [b.size() for _ in range(n_free)]
        if len(bx) + rank - n_c - len(bx) + n_free > MAX_RANK:
            return None
        order = d(st.permutations(range(len(rhs))))
        w_shape = tuple(rhs[p] for p in order)
        cw = tuple(order.index(i) for i in range(n_c))
        bw = tuple(order.index(n_c + i) for i in range(len(bx)))
        return ("dot", x, b.operand_like(w_shape), (cx, cw), (bx, bw) if bx else None)
    if kind == "reduce":
        dims = b.dims(x) if len(xs) > 1 else (0,)
        return ("reduce", d(st.sampled_from(sorted(REDUCE))), x, dims)
    if kind == "argreduce":
        return ("argreduce", d(st.sampled_from(["argmax", "argmin", "argmax", "any", "all"])),
                x, b.dim(x))
    if kind == "normalize":
        return ("normalize", d(st.sampled_from(sorted(NORMALIZE))), x, b.dim(x))
    if kind == "transpose":
        if len(xs) < 2:
            return None
        return ("transpose", x, tuple(d(st.permutations(range(len(xs))))))
    if kind == "broadcast":
        rank = d(st.integers(len(xs), min(MAX_RANK, len(xs) + 2)))
        dims = tuple(sorted(d(st.permutations(range(rank)))[: len(xs)]))
        out = [b.size() for _ in range(rank)]
        for dd, s in zip(dims, xs):
            out[dd] = s if s != 1 or d(st.booleans()) else b.size()  # expand a size-1 dim
        return ("broadcast", x, tuple(out), dims)
    if kind == "reshape":
        return _draw_reshape(b, x)
    if kind == "slice":
        dim = b.dim(x)
        n = xs[dim]
        start = d(st.integers(0, n - 1))
        limit = d(st.integers(start + 1, n))
        return ("slice", x, dim, start, d(st.sampled_from([1, 1, 2, 3])), limit)
    if kind == "pad":
        config = [(0, 0, 0)] * len(xs)
        for dim in b.dims(x):
            lo = d(st.sampled_from(PAD_LOW_HIGH))
            # Half the time crop one side by what the other is padded (low + high = 0).
            hi = -lo if d(st.booleans()) else d(st.sampled_from(PAD_LOW_HIGH))
            config[dim] = (lo, hi, d(st.sampled_from(PAD_INTERIOR)))
        return ("pad", x, d(st.sampled_from([0.0, -0.1, 0.25])), tuple(config))
    if kind == "concatenate":
        dim = b.dim(x)
        other = list(xs)
        other[dim] = d(st.sampled_from([xs[dim], b.size()]))
        return ("concatenate", x, b.operand_like(other), dim)
    if kind == "reverse":
        return ("reverse", x, b.dims(x))
    if kind == "roll":
        dim = b.dim(x)
        return ("roll", x, dim, d(st.integers(-xs[dim], 2 * xs[dim])),
                d(st.sampled_from(["partir", "jnp"])))
    if kind == "gather":
        dim = b.dim(x)
        n = xs[dim]
        mode = d(st.sampled_from([None, "clip", "fill"]))
        lo, hi = (0, n - 1) if mode is None else (-n - 2, n + 2)
        index = tuple(d(st.lists(st.integers(lo, hi), min_size=1, max_size=6)))
        return ("gather", x, dim, index, mode)
    if kind == "embed":
        table = b.pick(lambda s: len(s) == 2) or b.new_arg((b.size(), b.size()))
        vocab = b.shapes[table][0]
        mode = d(st.sampled_from([None, None, "clip", "fill", "mod"]))
        lo, hi = (-vocab, vocab - 1) if mode is None else (-vocab - 2, vocab + 2)
        ids_shape = (b.size(),) if d(st.booleans()) else (b.size(), b.size())
        if math.prod(ids_shape) > 64:
            ids_shape = (min(ids_shape[0], 8),)
        return ("embed", table, b.new_int_arg(ids_shape, lo, hi), mode)
    if kind == "gather_nd":
        if len(xs) < 2:
            return None
        count = d(st.integers(1, 6))
        values = [d(st.integers(0, n - 1)) for _ in range(count) for n in xs[:2]]
        b.args.append((count, 2))
        b.ints.append((len(b.args) - 1, tuple(values)))
        ids = ("a", len(b.args) - 1)
        b.int_shapes[ids] = (count, 2)
        return ("gather_nd", x, ids)
    if kind == "take_along":
        dim = b.dim(x)
        ids_shape = list(xs)
        ids_shape[dim] = d(st.sampled_from([1, 2, xs[dim]]))
        if math.prod(ids_shape) > 256:
            return None
        return ("take_along", x, b.new_int_arg(ids_shape, 0, xs[dim] - 1), dim)
    if kind == "scatter":
        dim = b.dim(x)
        n = xs[dim]
        mode = d(st.sampled_from(["add", "set", "max", "min"]))
        count = d(st.integers(1, min(n, 6)))
        index = tuple(d(st.lists(st.integers(0, n - 1), min_size=count, max_size=count,
                                 unique=mode == "set")))
        u = b.operand_like(xs[:dim] + (count,) + xs[dim + 1:])
        return ("scatter", mode, x, u, dim, index)
    if kind == "scatter_ids":
        n = xs[0]
        count = d(st.integers(1, 6))
        u = b.operand_like((count,) + xs[1:])
        ids = b.new_int_arg((count,), -n - 1, n + 1)
        return ("scatter_ids", d(st.sampled_from(["add", "add", "max", "min"])), x, u, ids)
    if kind in ("dslice", "dupdate"):
        starts, sizes = [], []
        traced = b.dims(x)
        for dim, n in enumerate(xs):
            size = d(st.integers(1, n)) if dim in traced or d(st.booleans()) else n
            sizes.append(size)
            if dim in traced:  # may lie outside [0, n - size]: jax clamps it
                starts.append(b.new_int_arg((), -2, n + 2))
            else:
                starts.append(d(st.integers(0, n - size)))
        if kind == "dslice":
            return ("dslice", x, tuple(starts), tuple(sizes))
        return ("dupdate", x, b.operand_like(tuple(sizes)), tuple(starts))
    if kind == "conv":
        return _draw_conv(b)
    if kind == "window":
        dims = b.dims(x)
        window, stride, dilation, padding = [], [], [], []
        explicit = d(st.sampled_from(WINDOW_PADDINGS))
        for _ in dims:
            w, s, dl = (d(st.sampled_from(WINDOW_SIZES)), d(st.sampled_from(WINDOW_STRIDES)),
                        d(st.sampled_from(WINDOW_DILATIONS)))
            eff = (w - 1) * dl + 1
            window.append(w)
            stride.append(s)
            dilation.append(dl)
            padding.append((d(st.integers(0, eff - 1)), d(st.integers(0, eff - 1))))
        pad = tuple(padding) if explicit == "explicit" else explicit
        # jax has no gradient of a max/min pool with window dilation
        kinds = ["sum", "avg"] if b.grad and max(dilation) > 1 else ["sum", "max", "min", "avg"]
        return ("window", d(st.sampled_from(kinds)), x, dims,
                tuple(window), tuple(stride), pad, tuple(dilation))
    if kind == "cumulative":
        return ("cumulative", d(st.sampled_from(sorted(CUMULATIVE))), x, b.dim(x),
                d(st.booleans()))
    if kind == "sort":
        what = d(st.sampled_from(["values", "indices", "pair"]))
        return ("sort", x, b.dim(x), what) + ((b.operand_like(xs),) if what == "pair" else ())
    if kind == "top_k":
        dim = b.dim(x)
        return ("top_k", x, d(st.integers(1, min(xs[dim], 4))), dim,
                d(st.sampled_from(["values", "indices"])))
    if kind == "scan":
        layers = d(st.sampled_from([1, 2, 3, 4]))
        return ("scan", x, b.operand_like((layers, xs[-1], xs[-1])))
    if kind == "scan_xs":
        return ("scan_xs", x, b.operand_like(xs[1:]), b.operand_like(xs[1:]),
                d(st.booleans()))
    if kind == "while":
        return ("while", x, b.operand_like(xs))
    if kind == "while_data":
        return ("while_data", x, b.operand_like(xs), d(st.sampled_from([0.0, 1.0])))
    if kind == "cond":
        return ("cond", x, b.operand_like(xs))
    if kind == "tag":
        same = [name for name, s in b.tags.items() if s == xs]
        name = (d(st.sampled_from(same)) if same and d(st.integers(0, 3)) == 0
                else f"t{len(b.tags)}")
        b.tags[name] = xs
        return ("tag", x, name)
    raise AssertionError(kind)


def _factorizations(n: int, rank: int) -> list[tuple[int, ...]]:
    """Shapes of `rank` dimensions with `n` elements."""
    if rank == 1:
        return [(n,)]
    return [(f, *rest) for f in range(1, n + 1) if n % f == 0
            for rest in _factorizations(n // f, rank - 1)]


def _draw_reshape(b: _Builder, x: Ref) -> tuple | None:
    """Split a dimension, merge two neighbours, insert or drop a size-1 dimension, or
    re-factor the whole shape (tiles that do not line up: 10x8 -> 16x5)."""
    d = b.draw
    # Half the time an argument, which the schedule may tile: a reshape across a tiled dim.
    args = [r for r in b.shapes if r[0] == "a"]
    if args and d(st.booleans()):
        x = d(st.sampled_from(args))
    xs = list(b.shapes[x])
    how = d(st.sampled_from(["split", "merge", "unit", "refactor"]))
    if how == "split":
        cands = [(i, f) for i, s in enumerate(xs) for f in range(2, s) if s % f == 0]
        if not cands or len(xs) >= MAX_RANK:
            return None
        i, f = d(st.sampled_from(cands))
        xs[i: i + 1] = [f, xs[i] // f]
    elif how == "merge":
        if len(xs) < 2:
            return None
        i = d(st.integers(0, len(xs) - 2))
        xs[i: i + 2] = [xs[i] * xs[i + 1]]
    elif how == "unit":
        if 1 in xs and d(st.booleans()):
            xs.remove(1)
            if not xs:
                xs = [1]
        elif len(xs) < MAX_RANK:
            xs.insert(d(st.integers(0, len(xs))), 1)
        else:
            return None
    else:
        n = math.prod(xs)
        shapes = [s for r in (1, 2, 3) for s in _factorizations(n, r)
                  if list(s) != xs and 1 not in s]
        if not shapes:
            return None
        xs = list(d(st.sampled_from(shapes)))
    return ("reshape", x, tuple(xs))


def _draw_conv(b: _Builder) -> tuple | None:
    """A 1-D (NWC) or 2-D (NHWC) convolution with every attribute drawn. Low padding stays
    below the dilated kernel size (XLA:CPU's float32 convolution is wrong beyond it)."""
    d = b.draw
    x = b.pick(lambda s: len(s) in (3, 4) and math.prod(s) <= 1024)
    if x is None:
        x = b.new_arg((b.draw(st.sampled_from([1, 2])), b.size(), 4) if d(st.booleans())
                      else (2, b.size(), b.size(), 2))
    xs = b.shapes[x]
    n = len(xs) - 2
    channels = xs[-1]
    groups = 2 if channels % 2 == 0 and d(st.integers(0, 3)) == 0 else 1
    out_ch = d(st.sampled_from([2, 4])) * groups
    kernel = tuple(d(st.sampled_from(CONV_KERNELS)) for _ in range(n))
    rhs_dil = tuple(d(st.sampled_from(CONV_DILATIONS)) for _ in range(n))
    lhs_dil = tuple(d(st.sampled_from([1, 1, 2])) for _ in range(n))
    strides = tuple(d(st.sampled_from(CONV_STRIDES)) for _ in range(n))
    kind = d(st.sampled_from(["SAME", "VALID", "explicit"]))
    if kind == "explicit":
        padding = []
        for k, dl in zip(kernel, rhs_dil):
            eff = (k - 1) * dl + 1
            padding.append((d(st.integers(0, eff - 1)), d(st.integers(-1, eff - 1))))
        padding = tuple(padding)
    else:
        padding = kind
    w = b.operand_like(kernel + (channels // groups, out_ch))
    return ("conv", x, w, strides, padding, lhs_dil, rhs_dil, groups)


KIND_WEIGHTS = {k: 1 for k in OP_KINDS} | {"binary": 2, "dot": 2, "reshape": 3, "tag": 2,
                                          "transpose": 2}


@st.composite
def recipes(draw, kinds: tuple[str, ...] = OP_KINDS, max_ops: int = 5, grad: bool = False
            ) -> Recipe:
    """A random program over `kinds` (no data-dependent loops when `grad`)."""
    b = _Builder(draw, grad)
    b.new_arg(b.shape())
    pool = [k for k in kinds for _ in range(KIND_WEIGHTS.get(k, 1))
            if not (grad and k in NOT_DIFFERENTIABLE)]
    # A focus kind, drawn for half the ops: a program exercises one op kind in several
    # configurations and compositions instead of touching many once.
    focus = draw(st.sampled_from(pool))
    for _ in range(draw(st.integers(1, max_ops))):
        spec = _draw_op(b, focus if draw(st.booleans()) else draw(st.sampled_from(pool)))
        if spec is not None:
            b.add(spec)
    if not b.ops:
        b.add(("unary", "sin", ("a", 0)))
    outputs = [("v", len(b.ops) - 1)]
    if len(b.ops) > 1 and draw(st.booleans()):
        outputs.append(("v", draw(st.integers(0, len(b.ops) - 2))))
    return Recipe(tuple(b.args), tuple(b.ops), tuple(outputs), tuple(b.ints))


# -- schedules ------------------------------------------------------------------------------

class TileIfPossible:
    """A tactic tiling `(arg index, dim)` pairs and `(tag name, dim)` pairs on `axis`,
    skipping those the current state cannot take (already tiled on that axis). Like a
    ManualPartition, it reserves the tags it decides before the schedule runs."""

    def __init__(self, axis: str, tiles: tuple[tuple[int, int], ...] = (),
                 tags: tuple[tuple[str, int], ...] = ()):
        self.axis = axis
        self.tiles = tiles
        self.tags = dict(tags)
        self.name = f"tile{tiles}{tuple(self.tags.items()) if tags else ''}@{axis}"

    def reserve(self, state) -> None:
        if self.tags:
            partir.ManualPartition({}, axis=self.axis, tags=self.tags).reserve(state)

    def apply(self, ctx) -> None:
        for arg, dim in self.tiles:
            (leaf,) = ctx.leaves_of(f"arg{arg}")
            if ctx.state.can_tile(leaf.value, dim, self.axis) is None:
                ctx.tile(leaf, dim, self.axis)
        for tag, dim in self.tags.items():
            values = ctx.state.tagged(tag)
            if all(ctx.state.can_tile(v, dim, self.axis) is None for v in values):
                ctx.tile(tag, dim, self.axis)

    def __repr__(self) -> str:
        return self.name


@st.composite
def schedules(draw, recipe: Recipe, mesh: dict[str, int]) -> list[TileIfPossible]:
    """Tactics tiling 1-2 argument or tag dimensions on one axis each: one time in four a
    target over every mesh axis in turn, then 0-3 more (1-3 otherwise), each pick half the
    time a target already tiled, again on another axis (a dimension over 2-3 axes)."""
    ints = dict(recipe.ints)
    targets: list[tuple[str, object, int]] = [
        ("arg", i, dim) for i, s in enumerate(recipe.args) for dim in range(len(s))
        if i not in ints or len(s) > 0]
    tags: dict[str, int] = {}
    for spec in recipe.ops:
        if spec[0] == "tag":
            tags.setdefault(spec[2], len(_tag_shape(recipe, spec)))
    targets += [("tag", name, dim) for name, rank in tags.items() for dim in range(rank)]
    if not targets:
        return []
    chosen: list[tuple[str, object, int]] = []
    out = []
    if draw(st.integers(0, 3)) == 0:  # one target over every axis of the mesh, in some order
        kind, target, dim = draw(st.sampled_from(targets))
        chosen.append((kind, target, dim))
        for axis in draw(st.permutations(sorted(mesh))):
            out.append(TileIfPossible(axis, ((target, dim),) if kind == "arg" else (),
                                      ((target, dim),) if kind == "tag" else ()))
    for _ in range(draw(st.integers(0 if out else 1, 3))):
        axis = draw(st.sampled_from(sorted(mesh)))
        picks = []
        for _ in range(draw(st.integers(1, 2))):
            again = chosen and draw(st.booleans())
            picks.append(draw(st.sampled_from(chosen if again else targets)))
        chosen += picks
        out.append(TileIfPossible(
            axis, tuple((i, dim) for k, i, dim in picks if k == "arg"),
            tuple((name, dim) for k, name, dim in picks if k == "tag")))
    return out


def _tag_shape(recipe: Recipe, spec: tuple) -> tuple[int, ...]:
    shapes: dict = {("a", i): s for i, s in enumerate(recipe.args)}
    ints = frozenset(("a", i) for i, _ in recipe.ints)
    for j, op in enumerate(recipe.ops):
        shapes[("v", j)] = result_shape(op, shapes, ints)
        if op is spec:
            return shapes[("v", j)]
    raise AssertionError(spec)


# -- checking -------------------------------------------------------------------------------

def program(recipe: Recipe, grad: bool) -> Callable:
    """The recipe's function, or (`grad`) the value and gradients (every float argument)
    of the mean sines of its outputs, so backward passes are partitioned too."""
    fn = build(recipe)
    return value_and_grad_of(fn, recipe.float_args()) if grad else fn


# Gradients of random programs are judged 10x looser than values (the oracle's float32 RTOL):
# a backward pass adds the partial sums of every transposed broadcast and reduction in
# another order, and a difference that float64 explains away is judged again below anyway.
GRAD_RTOL = 10 * RTOL[np.dtype(np.float32)]


def _close(got, want, grad: bool, factor: float = 1.0) -> str | None:
    """None if every leaf of `got` is within the oracle's tolerance of `want` (either may be
    float64: both are compared in float64), else what differs."""
    as64 = lambda tree: [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]  # noqa: E731
    rtol = (GRAD_RTOL if grad else RTOL[np.dtype(np.float32)]) * factor
    bad = mismatches(as64(got), as64(want), rtol)
    return "\n".join(bad) or None


@dataclass
class Outcome:
    """What `check` saw: "ok", "refused" (a PartitionError), "rounding" (float32 differed,
    float64 agreed) or "xla" (jax.jit differed from the program run op by op, which the
    partitioned result matches: `_matches_eager`)."""

    status: str
    detail: str = ""
    sharded_axes: list[int] = field(default_factory=list)  # axes per tiled argument dim


def run_partitioned(fn: Callable, args: list, mesh: dict, schedule: list, conflicts: str):
    step, meta = partir.jit(fn, mesh, schedule, conflicts=conflicts,
                            uneven_outputs="replicate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = step(*args)
    return got, meta


def check(recipe: Recipe, schedule: list, conflicts: str = "redistribute", grad: bool = False,
          mesh: dict[str, int] | None = None) -> Outcome:
    """Partition the recipe (or its value and gradients) over `mesh` and compare with
    `jax.jit`. A PartitionError is a refusal; any other error raises; a difference beyond
    float32 tolerance is judged again in float64 (partitioned and jax.jit both), and only a
    difference there too fails."""
    mesh = mesh or WIDE
    fn = program(recipe, grad)
    args = example_args(recipe)
    try:
        got, meta = run_partitioned(fn, args, mesh, schedule, conflicts)
    except partir.PartitionError as e:
        return Outcome("refused", str(e).splitlines()[0])
    axes = [len(p) if isinstance(p, tuple) else 1
            for s in jax.tree.leaves(meta.in_shardings) for p in s.spec if p is not None]
    want = jax.jit(fn)(*args)
    diff = _close(got, want, grad)
    if diff is None:
        return Outcome("ok", sharded_axes=axes)
    with jax.enable_x64(True):
        args64 = example_args(recipe, dtype=np.float64)
        want64 = jax.jit(fn)(*args64)
        close_to_exact = _close(got, want64, grad, factor=10.0) is None
        if not close_to_exact:
            got64, _ = run_partitioned(fn, args64, mesh, schedule, conflicts)
            diff64 = _close(got64, want64, grad, factor=1e-3)
    if close_to_exact or diff64 is None:
        return Outcome("rounding", diff, axes)
    if _matches_eager(fn, args, got, grad):
        return Outcome("xla", diff, axes)
    raise AssertionError(f"partitioned != jax.jit: {diff}; in float64: {diff64}\n"
                         f"{meta.report()}")


def _matches_eager(fn: Callable, args: list, got, grad: bool) -> bool:
    """Does the partitioned result equal the program run op by op (`jax.disable_jit`)? XLA
    folds a `dynamic_slice` of a `dynamic_slice` into one and clamps only the folded start,
    so `jax.jit` itself is wrong where the second start needs clamping (`x[0, 0:2][2]` reads
    `x[0, 2]`); jax's eager execution runs each op alone, as StableHLO specifies."""
    with jax.disable_jit():
        eager = fn(*args)
    return _close(got, eager, grad) is None


class Stats:
    """Counts of programs per op kind and per outcome over a run (`PARTIR_PROPERTY_STATS`)."""

    def __init__(self):
        self.kinds: Counter = Counter()
        self.outcomes: Counter = Counter()
        self.meshes: Counter = Counter()
        self.axes_per_dim: Counter = Counter()
        self.refusals: Counter = Counter()
        self.programs = 0
        self.grad = 0

    def record(self, recipe: Recipe, mesh: dict, grad: bool, outcome: Outcome) -> None:
        self.programs += 1
        self.grad += grad
        self.kinds.update(recipe.kinds())
        self.outcomes[outcome.status] += 1
        self.meshes[",".join(f"{k}={v}" for k, v in mesh.items())] += 1
        self.axes_per_dim.update(outcome.sharded_axes)
        if outcome.status == "refused":
            self.refusals[outcome.detail[:80]] += 1

    def as_dict(self) -> dict:
        return {"programs": self.programs, "with_gradients": self.grad,
                "op_kinds": dict(sorted(self.kinds.items())),
                "outcomes": dict(self.outcomes), "meshes": dict(self.meshes),
                "mesh_axes_per_tiled_argument_dim": dict(sorted(self.axes_per_dim.items())),
                "refusals": dict(self.refusals.most_common(20))}
