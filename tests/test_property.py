"""Property test (issue 2 acceptance): random programs under random `tile` schedules on the
mesh {"a": 4, "b": 2} give `jax.jit`'s numbers.

A program is a `Recipe`: argument shapes and a list of op specs (elementwise unary and binary
ops, dot_general with or without a batch dimension, reduce add/max/min/argmax/argmin, transpose,
broadcast_in_dim, reshape split/merge (often of an argument, with a major factor smaller than
an axis that may tile the dimension: the axis is split into sub-axes); less often iota, slice,
pad, concatenate, reverse; and ops that index, window or loop: gather and scatter at constant
indices (add with repeats, set), 1-D convolution (stride, SAME/VALID, window dilation),
reduce_window pooling, cumsum, `partir_plugin.roll`, a while loop reading an outer value and a
scan over a stacked weight).
Dimensions are powers of two, one in five uneven (12 or 37: no axis, or not every axis,
divides them), which are tiled with padding (issue 21: padded tiles, masked where read;
outputs tiled unevenly are gathered and trimmed, `uneven_outputs="replicate"`). Result
shapes come from jax's own shape rules (`result_shape`). `build` turns a recipe into a
Python function, so hypothesis shrinks a failure to a small recipe. One example in four
checks the value and the gradients (every argument) of the sum of the outputs' mean sines
instead, so backward passes are partitioned too. A schedule is 1-3 tactics, each tiling
random argument dimensions on one mesh axis, under either conflict policy (resolved by
redistribution, or stopped); choices that the current state cannot take (already tiled on
that axis) are skipped.

Examples: `PARTIR_PROPERTY_EXAMPLES` (default 400, derandomized so CI runs are
reproducible); `PARTIR_NIGHTLY=1` runs 2000 random ones.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

import partir_plugin as partir

MESH = {"a": 4, "b": 2}
NIGHTLY = os.environ.get("PARTIR_NIGHTLY") == "1"
EXAMPLES = int(os.environ.get("PARTIR_PROPERTY_EXAMPLES", "2000" if NIGHTLY else "400"))
DIMS = (8, 16, 32)
UNEVEN = (12, 37)  # 12 splits 4 ways but not then 2 more; 37 splits on no axis
MAX_RANK = 3

UNARY = {"sin": lax.sin, "tanh": lax.tanh, "neg": lax.neg, "abs": lax.abs, "erf": lax.erf,
         "logistic": lax.logistic, "atan": lax.atan, "half": lambda x: x * 0.5}
BINARY = {"add": lax.add, "sub": lax.sub, "mul": lax.mul, "max": lax.max, "min": lax.min}
REDUCE = {"sum": lax.add, "max": lax.max, "min": lax.min}
REDUCE_INIT = {"sum": 0.0, "max": -np.inf, "min": np.inf}
ARG_REDUCE = {"argmax": jnp.argmax, "argmin": jnp.argmin}


@dataclass(frozen=True)
class Recipe:
    """`args`: argument shapes. `ops`: op specs whose operands are refs ("a", i) (argument i)
    or ("v", j) (result of op j). `outputs`: refs returned."""

    args: tuple[tuple[int, ...], ...]
    ops: tuple[tuple, ...]
    outputs: tuple[tuple[str, int], ...]


def apply_op(spec: tuple, get):
    """The result of op `spec`, its operands read through `get(ref)`."""
    op = spec[0]
    if op == "unary":
        return UNARY[spec[1]](get(spec[2]))
    if op == "binary":
        return BINARY[spec[1]](get(spec[2]), get(spec[3]))
    if op == "dot":
        _, x, w, (cx, cw), batch = spec
        bx, bw = ((batch[0],), (batch[1],)) if batch else ((), ())
        return lax.dot_general(get(x), get(w), (((cx,), (cw,)), (bx, bw)))
    if op == "reduce":
        _, kind, x, dim = spec
        if kind in ARG_REDUCE:  # the index, as a float (a value and its index reduced)
            return ARG_REDUCE[kind](get(x), axis=dim).astype(np.float32) * 0.1
        return lax.reduce(get(x), np.float32(REDUCE_INIT[kind]), REDUCE[kind], (dim,))
    if op == "transpose":
        return lax.transpose(get(spec[1]), spec[2])
    if op == "broadcast":
        _, x, shape, dims = spec
        return lax.broadcast_in_dim(get(x), shape, dims)
    if op == "reshape":
        return lax.reshape(get(spec[1]), spec[2])
    if op == "iota":
        _, x, dim = spec
        v = get(x)
        return v + lax.broadcasted_iota(v.dtype, v.shape, dim) * 0.01
    if op == "slice":
        _, x, dim, start, stride = spec
        v = get(x)
        return lax.slice_in_dim(v, start, v.shape[dim], stride, dim)
    if op == "pad":  # a zero pad before a convolution folds into its padding (and the crop)
        _, x, dim, value = spec
        v = get(x)
        cfg = [(0, 0, 0)] * v.ndim
        cfg[dim] = (v.shape[dim] // 2, v.shape[dim] // 2, 0)
        return lax.pad(v, np.float32(value), cfg)
    if op == "concatenate":
        _, x, y, dim = spec
        return lax.concatenate([get(x), get(y)], dim)
    if op == "reverse":
        return lax.rev(get(spec[1]), (spec[2],))
    if op == "gather":  # rows picked by constant indices (an embedding lookup's shape)
        _, x, dim, index = spec
        return jnp.take(get(x), np.asarray(index, np.int32), axis=dim)
    if op == "scatter":  # rows updated at constant indices: add (repeats allowed) or set
        _, mode, x, u, dim, index = spec
        at = get(x).at[(slice(None),) * dim + (np.asarray(index, np.int32),)]
        return at.add(get(u)) if mode == "add" else at.set(get(u))
    if op == "conv":  # 1-D convolution, NWC x WIO -> NWC
        _, x, w, stride, padding, dilation = spec
        return lax.conv_general_dilated(get(x), get(w), (stride,), padding,
                                        rhs_dilation=(dilation,),
                                        dimension_numbers=("NWC", "WIO", "NWC"))
    if op == "window":  # pooling along one dimension
        _, kind, x, dim, window, stride, padding = spec
        v = get(x)
        dims, strides = [1] * v.ndim, [1] * v.ndim
        dims[dim], strides[dim] = window, stride
        return lax.reduce_window(v, np.float32(REDUCE_INIT[kind]), REDUCE[kind], dims,
                                 strides, padding)
    if op == "cumsum":
        _, x, dim, reverse = spec
        return lax.cumsum(get(x), dim, reverse=reverse)
    if op == "roll":  # partir_plugin.roll: block rotations between devices where tiled
        _, x, dim, shift = spec
        return partir.roll(get(x), shift, dim)
    if op == "scan":  # a layer loop: x [..., D] through L layers of a stacked w [L, D, D]
        _, x, w = spec
        # Scaled like a real layer, so its contraction's rounding stays at the output's scale.
        scale = get(x).shape[-1] ** -0.5
        return lax.scan(lambda h, wl: (jnp.tanh((h @ wl) * scale), None), get(x), get(w))[0]
    if op == "while":  # a loop carrying x, reading y from outside
        _, x, y = spec
        v, c = get(x), get(y)
        return lax.fori_loop(0, 3, lambda i, acc: jnp.sin(acc) * 0.5 + c, v)
    raise AssertionError(spec)


def build(recipe: Recipe):
    def fn(*args):
        values = []

        def get(ref):
            kind, i = ref
            return args[i] if kind == "a" else values[i]

        for spec in recipe.ops:
            values.append(apply_op(spec, get))
        return tuple(get(r) for r in recipe.outputs)

    return fn


def result_shape(spec: tuple, shapes: dict) -> tuple[int, ...]:
    """The shape of op `spec`'s result, from jax's own shape rules."""
    refs = sorted({r for r in spec if isinstance(r, tuple) and r in shapes})
    structs = [jax.ShapeDtypeStruct(shapes[r], np.float32) for r in refs]
    out = jax.eval_shape(lambda *xs: apply_op(spec, dict(zip(refs, xs)).__getitem__), *structs)
    return tuple(out.shape)


@st.composite
def recipes(draw) -> Recipe:
    args: list[tuple[int, ...]] = []
    ops: list[tuple] = []
    shapes: dict[tuple[str, int], tuple[int, ...]] = {}

    def new_arg(shape):
        args.append(tuple(shape))
        ref = ("a", len(args) - 1)
        shapes[ref] = tuple(shape)
        return ref

    def size() -> int:
        """A dimension: a power of two, one time in five one that no axis divides evenly."""
        return draw(st.sampled_from(UNEVEN if draw(st.integers(0, 4)) == 0 else DIMS))

    def any_shape(rank_min=1, rank_max=MAX_RANK):
        rank = draw(st.integers(rank_min, rank_max))
        return tuple(size() for _ in range(rank))

    def indices(n: int, count: int, unique: bool = False) -> tuple[int, ...]:
        elements = st.integers(0, n - 1)
        return tuple(draw(st.lists(elements, min_size=count, max_size=count, unique=unique)))

    def pick(pred=lambda s: True):
        refs = [r for r, s in shapes.items() if pred(s)]
        return draw(st.sampled_from(refs)) if refs else None

    def operand_like(shape):
        """An existing value of `shape`, or a new argument of it."""
        same = [r for r, s in shapes.items() if s == shape]
        if same and draw(st.booleans()):
            return draw(st.sampled_from(same))
        return new_arg(shape)

    def draw_indexed(kind: str) -> tuple | None:
        """The spec of an op that indexes, windows or loops, or None if no value suits it."""
        if kind == "conv":
            x = pick(lambda s: len(s) == 3)
            if x is None:
                return None
            _, width, channels = shapes[x]
            k = draw(st.sampled_from([1, 3]))
            w = operand_like((k, channels, size()))
            return ("conv", x, w, draw(st.sampled_from([1, 2])),
                    draw(st.sampled_from(["SAME", "VALID"])), draw(st.sampled_from([1, 2])))
        x = pick()
        xs = shapes[x]
        dim = draw(st.integers(0, len(xs) - 1))
        if kind == "gather":
            return ("gather", x, dim, indices(xs[dim], draw(st.sampled_from([4, 8]))))
        if kind == "scatter":
            mode = draw(st.sampled_from(["add", "set"]))
            count = min(xs[dim], draw(st.sampled_from([4, 8])))
            u = operand_like(xs[:dim] + (count,) + xs[dim + 1:])
            return ("scatter", mode, x, u, dim, indices(xs[dim], count, unique=mode == "set"))
        if kind == "window":
            return ("window", draw(st.sampled_from(sorted(REDUCE))), x, dim,
                    draw(st.sampled_from([2, 3])), draw(st.sampled_from([1, 2])),
                    draw(st.sampled_from(["SAME", "VALID"])))
        if kind == "cumsum":
            return ("cumsum", x, dim, draw(st.booleans()))
        if kind == "scan":
            layers = draw(st.sampled_from([2, 4, 8]))
            return ("scan", x, operand_like((layers, xs[-1], xs[-1])))
        if kind == "roll":
            return ("roll", x, dim, draw(st.integers(-xs[dim], 2 * xs[dim])))
        return ("while", x, operand_like(xs))

    new_arg(any_shape())
    n_ops = draw(st.integers(1, 6))
    for _ in range(n_ops):
        kind = draw(st.sampled_from(["unary", "binary", "dot", "reduce", "transpose",
                                     "broadcast", "reshape", "reshape", "reshape", "other",
                                     "indexed"]))
        spec, out_shape = None, None
        if kind == "indexed":  # gather, scatter, convolution, pooling, cumsum, while loop
            spec = draw_indexed(draw(st.sampled_from(
                ["gather", "scatter", "conv", "window", "cumsum", "while", "roll", "scan"])))
            if spec is None:
                continue
            shape = result_shape(spec, shapes)
            if 0 in shape:  # a VALID window wider than the dimension
                continue
            ops.append(spec)
            shapes[("v", len(ops) - 1)] = shape
            continue
        if kind == "other":  # iota, slice, pad, concatenate, reverse: lighter weight
            kind = draw(st.sampled_from(["iota", "slice", "pad", "concatenate", "reverse"]))
            x = pick()
            xs = shapes[x]
            dim = draw(st.integers(0, len(xs) - 1))
            out = list(xs)
            if kind == "iota":
                spec = ("iota", x, dim)
            elif kind == "slice":  # the upper half, or every other element
                if xs[dim] < 4:
                    continue
                start, stride = draw(st.sampled_from([(xs[dim] // 2, 1), (0, 2), (1, 2)]))
                spec, out[dim] = ("slice", x, dim, start, stride), xs[dim] // 2
            elif kind == "pad":
                value = draw(st.sampled_from([0.0, 0.25]))
                spec, out[dim] = ("pad", x, dim, value), xs[dim] * 2
            elif kind == "concatenate":
                spec, out[dim] = ("concatenate", x, operand_like(xs), dim), xs[dim] * 2
            else:
                spec = ("reverse", x, dim)
            shape = result_shape(spec, shapes)  # odd sizes too
            if 0 in shape:
                continue
            ops.append(spec)
            shapes[("v", len(ops) - 1)] = shape
            continue
        if kind == "unary":
            x = pick()
            spec, out_shape = ("unary", draw(st.sampled_from(sorted(UNARY))), x), shapes[x]
        elif kind == "binary":
            x = pick()
            y = operand_like(shapes[x])
            spec = ("binary", draw(st.sampled_from(sorted(BINARY))), x, y)
            out_shape = shapes[x]
        elif kind == "dot":
            x = pick()
            xs = shapes[x]
            cx = draw(st.integers(0, len(xs) - 1))
            batch_dims = [d for d in range(len(xs)) if d != cx]
            batched = bool(batch_dims) and draw(st.booleans())
            bx = draw(st.sampled_from(batch_dims)) if batched else None
            # The rhs: contracting dimension first, then the batch one, then free dimensions,
            # as many as keep the result's rank within bounds, permuted.
            free_x = len(xs) - 1 - batched
            max_free = MAX_RANK - free_x - batched
            n_free = draw(st.integers(0 if free_x + batched else 1, max(0, min(2, max_free))))
            if free_x + batched + n_free == 0 or n_free > max_free:
                continue
            rhs = [xs[cx]] + ([xs[bx]] if batched else [])
            rhs += [draw(st.sampled_from(DIMS)) for _ in range(n_free)]
            perm = draw(st.permutations(range(len(rhs))))
            w_shape = tuple(rhs[p] for p in perm)
            cw, bw = perm.index(0), perm.index(1) if batched else None
            w = operand_like(w_shape)
            spec = ("dot", x, w, (cx, cw), (bx, bw) if batched else None)
            batch_out = [xs[bx]] if batched else []
            out_shape = tuple(batch_out + [s for d, s in enumerate(xs) if d not in (cx, bx)]
                              + [s for d, s in enumerate(w_shape) if d not in (cw, bw)])
        elif kind == "reduce":
            x = pick(lambda s: len(s) >= 2)
            if x is None:
                continue
            dim = draw(st.integers(0, len(shapes[x]) - 1))
            spec = ("reduce", draw(st.sampled_from(sorted(REDUCE) + sorted(ARG_REDUCE))), x, dim)
            out_shape = tuple(s for d, s in enumerate(shapes[x]) if d != dim)
        elif kind == "transpose":
            x = pick(lambda s: len(s) >= 2)
            if x is None:
                continue
            perm = tuple(draw(st.permutations(range(len(shapes[x])))))
            spec, out_shape = ("transpose", x, perm), tuple(shapes[x][p] for p in perm)
        elif kind == "broadcast":
            x = pick(lambda s: len(s) < MAX_RANK)
            if x is None:
                continue
            xs = shapes[x]
            rank = draw(st.integers(len(xs) + 1, MAX_RANK))
            dims = tuple(sorted(draw(st.permutations(range(rank)))[: len(xs)]))
            out = [draw(st.sampled_from(DIMS)) for _ in range(rank)]
            for d, s in zip(dims, xs):
                out[d] = s
            spec, out_shape = ("broadcast", x, tuple(out), dims), tuple(out)
        else:  # reshape: split one dimension in two, or merge two neighbours
            # Half the time an argument, which the schedule may tile: a reshape across a
            # tiled dimension.
            args_refs = [r for r in shapes if r[0] == "a"]
            x = pick() if draw(st.booleans()) else draw(st.sampled_from(args_refs))
            xs = list(shapes[x])
            splittable = [d for d, s in enumerate(xs) if s >= 4 and s % 2 == 0]
            if len(xs) < MAX_RANK and splittable and (len(xs) == 1 or draw(st.booleans())):
                d = draw(st.sampled_from(splittable))
                # A major factor of 2 under an axis of 4 splits the axis into sub-axes.
                majors = [f for f in (2, 2, 4, 8) if xs[d] % f == 0 and xs[d] // f >= 2]
                if not majors:
                    continue
                major = draw(st.sampled_from(majors))
                xs[d: d + 1] = [major, xs[d] // major]
            elif len(xs) >= 2:
                d = draw(st.integers(0, len(xs) - 2))
                xs[d: d + 2] = [xs[d] * xs[d + 1]]
            else:
                continue
            spec, out_shape = ("reshape", x, tuple(xs)), tuple(xs)
        ops.append(spec)
        shapes[("v", len(ops) - 1)] = out_shape
    if not ops:
        ops.append(("unary", "sin", ("a", 0)))
        shapes[("v", 0)] = args[0]
    outputs = [("v", len(ops) - 1)]
    if len(ops) > 1 and draw(st.booleans()):
        outputs.append(("v", draw(st.integers(0, len(ops) - 2))))
    return Recipe(tuple(args), tuple(ops), tuple(outputs))


class TileIfPossible:
    """A tactic tiling `(arg index, dim)` pairs on `axis`, skipping those the current state
    cannot take (the value is already tiled on it; uneven sizes are padded)."""

    def __init__(self, axis: str, tiles: tuple[tuple[int, int], ...]):
        self.axis = axis
        self.tiles = tiles
        self.name = f"tile{tiles}@{axis}"

    def apply(self, ctx) -> None:
        for arg, dim in self.tiles:
            (leaf,) = ctx.leaves_of(f"arg{arg}")
            if ctx.state.can_tile(leaf.value, dim, self.axis) is None:
                ctx.tile(leaf, dim, self.axis)

    def __repr__(self) -> str:
        return self.name


@st.composite
def programs_and_schedules(draw):
    recipe = draw(recipes())
    schedule = []
    for _ in range(draw(st.integers(1, 3))):
        axis = draw(st.sampled_from(sorted(MESH)))
        n = draw(st.integers(1, 2))
        tiles = []
        for _ in range(n):
            arg = draw(st.integers(0, len(recipe.args) - 1))
            tiles.append((arg, draw(st.integers(0, len(recipe.args[arg]) - 1))))
        schedule.append(TileIfPossible(axis, tuple(tiles)))
    return (recipe, schedule, draw(st.sampled_from(["redistribute", "stop"])),
            draw(st.integers(0, 3)) == 0)


def check(recipe: Recipe, schedule, conflicts: str = "redistribute", grad: bool = False
          ) -> None:
    """`grad`: the program is the value and the gradients (every argument) of the sum of its
    outputs, so backward passes (transposed loops, accumulated gradients, scatter-adds) are
    partitioned too."""
    fn = build(recipe)
    if grad:
        forward = fn

        def fn(*args):
            total = lambda *a: sum(jnp.mean(jnp.sin(o)) for o in forward(*a))  # noqa: E731
            return jax.value_and_grad(total, argnums=tuple(range(len(args))))(*args)
    rng = np.random.default_rng(0)
    args = [rng.uniform(-1, 1, s).astype(np.float32) for s in recipe.args]
    step, meta = partir.jit(fn, MESH, schedule, conflicts=conflicts,
                            uneven_outputs="replicate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", partir.UnevenOutputWarning)
        got = step(*args)
    want = jax.jit(fn)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.shape == w.shape, (g.shape, w.shape)
        w = np.asarray(w)
        # Sums of partial sums are reassociated: tolerance relative to the output's scale
        # (with gradients, a mean and its derivatives: small, so their own scale, floored
        # where a mean cancels to about zero).
        scale = float(np.abs(w).max())
        scale = max(scale, 1e-3) if grad else max(scale, 1.0)
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4 if grad else 1e-5,
                                   atol=(1e-4 if grad else 1e-5) * scale,
                                   err_msg=meta.report())


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not NIGHTLY,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs_and_schedules())
def test_partitioned_programs_match_jax_jit(case):
    check(*case)


def test_dot_reshape_reduce_example():
    """One hand-picked recipe that goes through every kind of op, as a smoke test."""
    recipe = Recipe(
        args=((32, 16), (16, 8), (4, 8, 8)),
        ops=(("dot", ("a", 0), ("a", 1), (1, 0), None),            # v0: 32x8
             ("unary", "tanh", ("v", 0)),                          # v1: 32x8
             ("reshape", ("v", 1), (4, 8, 8)),                     # v2: 4x8x8
             ("binary", "mul", ("v", 2), ("a", 2)),                # v3: 4x8x8
             ("dot", ("v", 3), ("a", 2), (2, 1), (0, 0)),          # v4: 4x8x8
             ("transpose", ("v", 4), (2, 0, 1)),                   # v5: 8x4x8
             ("reduce", "max", ("v", 5), 2),                       # v6: 8x4
             ("broadcast", ("v", 6), (8, 16, 4), (0, 2))),         # v7: 8x16x4
        outputs=(("v", 7), ("v", 3)))
    check(recipe, [TileIfPossible("a", ((0, 0),)), TileIfPossible("b", ((1, 1), (2, 2))),
                   TileIfPossible("b", ((0, 1),))])


def test_uneven_example():
    """A hand-picked recipe on uneven sizes, with and without gradients: 37 (no axis divides
    it) tiled on 'a' through a max and a cumsum; 12 tiled on 'b' then 'a', or on 'a' (4
    divides it) then 'b' (2 does not divide the 3 left), a contraction padded level by
    level."""
    recipe = Recipe(
        args=((37, 12), (12, 8)),
        ops=(("dot", ("a", 0), ("a", 1), (1, 0), None),            # v0: 37x8, contracts 12
             ("unary", "tanh", ("v", 0)),                          # v1: 37x8
             ("reduce", "max", ("v", 1), 0),                       # v2: 8
             ("cumsum", ("v", 1), 0, False),                       # v3: 37x8
             ("binary", "mul", ("v", 3), ("v", 1))),               # v4: 37x8
        outputs=(("v", 4), ("v", 2)))
    rows = [TileIfPossible("a", ((0, 0),)), TileIfPossible("b", ((1, 0),)),
            TileIfPossible("a", ((1, 0),))]
    contraction = [TileIfPossible("a", ((1, 0),)), TileIfPossible("b", ((1, 0),))]
    for schedule in (rows, contraction):
        for grad in (False, True):
            check(recipe, schedule, grad=grad)


def test_windows_on_padded_tiles_example():
    """Windows over 37 rows tiled on two axes: a VALID convolution, a SAME max-pool and a
    dilated SAME convolution. 'a' then 'b' cuts 37 into 10 then 5 rows, padding only after
    the last valid row: halos on padded tiles; 'b' then 'a' cuts each half of 19 rows into
    tiles of 5, padding between valid rows: gathered. Values and gradients."""
    recipe = Recipe(
        args=((2, 37, 4), (3, 4, 8)),
        ops=(("conv", ("a", 0), ("a", 1), 1, "VALID", 1),         # v0: 2x35x8
             ("unary", "tanh", ("v", 0)),                          # v1: 2x35x8
             ("window", "max", ("v", 1), 1, 3, 1, "SAME"),         # v2: 2x35x8
             ("conv", ("a", 0), ("a", 1), 1, "SAME", 2),           # v3: 2x37x8
             ("reduce", "sum", ("v", 2), 1),                       # v4: 2x8
             ("reduce", "sum", ("v", 3), 1)),                      # v5: 2x8
        outputs=(("v", 4), ("v", 5)))
    for axes in (("a", "b"), ("b", "a")):
        for grad in (False, True):
            check(recipe, [TileIfPossible(axis, ((0, 1),)) for axis in axes], grad=grad)
