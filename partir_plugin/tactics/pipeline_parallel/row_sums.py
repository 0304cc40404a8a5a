"""Is a carried value of a layer loop a sum over the batch's rows, and is a per-layer output
row-wise or such a sum? (issue 34)

A layer loop may carry, besides the batch-major activations, a value without the batch that
each layer adds to: an MoE auxiliary loss `aux + mean(router_prob ...)`. Pipelined, each
layer sees one microbatch at a time, so the pipeline can only add up per-microbatch
contributions; that is the unpipelined number exactly when each layer's contribution is a sum
over rows of row-wise values, times a factor that may depend on the batch size only as a
power of it (a mean divides by the rows: the microbatches' means add up to M times the batch's
mean). `sum_over_rows` decides that by abstract interpretation of the layer's jaxpr, walked in
lockstep with the same layer traced at another microbatch size, whose literals tell which
constants are the batch size (`4.0` here, `1009.0` there: the microbatch's rows).

Values are classed as:
- `("c", e)`: the same for every row (no batch data); `e`: the power of the row count it
  scales with, None where it depends on the batch size otherwise;
- `("r", d)`: row-wise, the batch along dimension d;
- `("s", p)`: a sum over rows of row-wise values, times rows**p;
- `("k", p)`: the carried value itself plus such sums (p None: no sum added yet);
- None: anything else.
"""

from __future__ import annotations

import math

from jax.extend import core as jex_core

from .microbatch_rng import CALLS

_ELEMENTWISE = frozenset("""
add sub mul div max min pow neg exp exp2 log log1p expm1 tanh logistic sin cos tan abs sign
sqrt rsqrt cbrt integer_pow square erf erfc erf_inv convert_element_type select_n and or not
xor eq ne lt le gt ge copy copy_p real imag floor ceil round is_finite nextafter rem atan2
clamp reduce_precision stop_gradient
""".split())
_LINEAR_UNARY = frozenset({"neg", "convert_element_type", "copy", "copy_p", "reduce_precision"})
_ROW_AXES = {"reduce_max": "axes", "reduce_min": "axes", "reduce_prod": "axes",
             "reduce_and": "axes", "reduce_or": "axes", "argmax": "axes", "argmin": "axes",
             "cumsum": "axis", "cumprod": "axis", "cummax": "axis", "cummin": "axis",
             "cumlogsumexp": "axis", "sort": "dimension"}
# Calls whose body is compared in place of the call: microbatch_rng's (inlined and remat'd)
# and the custom-derivative calls, whose primal body is what runs forward.
_CALLS = CALLS | {"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"}


class _Mismatch(Exception):
    pass


def _params(eqn) -> dict:
    return {k: v for k, v in eqn.params.items()
            if not isinstance(v, (jex_core.Jaxpr, jex_core.ClosedJaxpr)) and not callable(v)}


def _same_params(a, b) -> bool:
    try:
        return bool(_params(a) == _params(b))
    except Exception:  # noqa: BLE001 -- incomparable parameters count as different
        return False


class _Walk:
    def __init__(self, rows: int, sentinel_rows: int):
        self.ratio = rows / sentinel_rows

    def literal(self, a, b) -> tuple | None:
        try:
            va, vb = float(a.val), float(b.val)
        except (TypeError, ValueError):
            return ("c", 0)
        if va == vb:
            return ("c", 0)
        if va and vb:
            for e in (1, -1, 2, -2):
                if math.isclose(va / vb, self.ratio ** e, rel_tol=1e-6):
                    return ("c", e)
        return ("c", None)

    def run(self, jaxpr, other, classes: list) -> list:
        if len(jaxpr.eqns) != len(other.eqns):
            raise _Mismatch
        env = dict(zip(jaxpr.invars, classes))

        def read(v, w):
            if isinstance(v, jex_core.Literal):
                return self.literal(v, w) if isinstance(w, jex_core.Literal) else ("c", None)
            return env.get(v, ("c", 0))

        for eqn, oth in zip(jaxpr.eqns, other.eqns):
            if eqn.primitive is not oth.primitive:
                raise _Mismatch
            ins = [read(v, w) for v, w in zip(eqn.invars, oth.invars)]
            outs = self.eqn(eqn, oth, ins)
            for v, c in zip(eqn.outvars, outs):
                env[v] = c
        return [read(v, w) for v, w in zip(jaxpr.outvars, other.outvars)]

    def eqn(self, eqn, oth, ins: list) -> list:
        name, n_out = eqn.primitive.name, len(eqn.outvars)
        if name in _CALLS:
            subs = list(jex_core.jaxprs_in_params(eqn.params))
            osubs = list(jex_core.jaxprs_in_params(oth.params))
            if subs and len(subs) == len(osubs) and len(subs[0].invars) == len(ins):
                return self.run(subs[0], osubs[0], ins)[:n_out]
        if all(c is not None and c[0] == "c" for c in ins):
            e = 0 if all(c[1] == 0 for c in ins) and _same_params(eqn, oth) else None
            if name in ("mul", "div") and all(c[1] is not None for c in ins):
                e = ins[0][1] + (ins[1][1] if name == "mul" else -ins[1][1])
            return [("c", e)] * n_out
        if any(c is None for c in ins):
            return [None] * n_out
        found = self.row_rule(eqn, ins)
        if name in ("top_k", "sort") and found is not None and found[0] == "r":
            return [found] * n_out  # values and indices (a payload) row by row alike
        return [found] + [None] * (n_out - 1)

    def row_rule(self, eqn, ins: list):
        name, p = eqn.primitive.name, eqn.params
        kinds = [c[0] for c in ins]
        if name in _ELEMENTWISE:
            return _elementwise(name, ins)
        if any(k == "k" for k in kinds):
            return None
        (c, *_), kind = ins, kinds[0]
        if name == "broadcast_in_dim":
            return ("r", p["broadcast_dimensions"][c[1]]) if kind == "r" else c
        if name == "reshape":
            return _reshape(c, eqn.invars[0].aval.shape, p["new_sizes"])
        if name == "transpose":
            return ("r", list(p["permutation"]).index(c[1])) if kind == "r" else c
        if name == "squeeze":
            if kind != "r":
                return c
            dims = p["dimensions"]
            return None if c[1] in dims else ("r", c[1] - sum(d < c[1] for d in dims))
        if name == "reduce_sum":
            if kind == "s":
                return c
            axes = p["axes"]
            return ("s", 0) if c[1] in axes else ("r", c[1] - sum(a < c[1] for a in axes))
        if name in _ROW_AXES and kind == "r":
            axes = p[_ROW_AXES[name]]
            axes = axes if isinstance(axes, tuple) else (axes,)
            if c[1] in axes:
                return None
            keeps = name.startswith(("cum", "sort"))
            return ("r", c[1] if keeps else c[1] - sum(a < c[1] for a in axes))
        if name == "top_k" and kind == "r":
            return c if c[1] != len(eqn.invars[0].aval.shape) - 1 else None
        if name == "slice" and kind == "r":
            d, shape = c[1], eqn.invars[0].aval.shape
            whole = (p["start_indices"][d] == 0 and p["limit_indices"][d] == shape[d]
                     and (p["strides"] is None or p["strides"][d] == 1))
            return c if whole else None
        if name == "dot_general":
            return _dot(ins, p["dimension_numbers"], eqn)
        if name == "gather" and kinds[:2] == ["r", "r"]:
            return _gather(ins, p["dimension_numbers"], eqn)
        return None


def _elementwise(name: str, ins: list):
    kinds = {c[0] for c in ins}
    if kinds <= {"r", "c"}:
        dims = {c[1] for c in ins if c[0] == "r"}
        return ("r", dims.pop()) if len(dims) == 1 else None
    if len(ins) == 1:
        return ins[0] if name in _LINEAR_UNARY else None
    if len(ins) != 2:
        return None
    a, b = ins
    if name in ("add", "sub"):
        if {a[0], b[0]} == {"s"} and a[1] == b[1]:
            return a
        if a[0] == "k" and b[0] == "s" and a[1] in (None, b[1]):
            return ("k", b[1])
        if name == "add" and b[0] == "k" and a[0] == "s" and b[1] in (None, a[1]):
            return ("k", a[1])
        return None
    if name in ("mul", "div") and a[0] == "s" and b[0] == "c" and b[1] is not None:
        return ("s", a[1] + (b[1] if name == "mul" else -b[1]))
    if name == "mul" and b[0] == "s" and a[0] == "c" and a[1] is not None:
        return ("s", b[1] + a[1])
    return None


def _reshape(c, old, new):
    if c[0] != "r":
        return c if c[0] != "k" or math.prod(old) == 1 else None
    d = c[1]
    before = math.prod(old[:d])
    acc = 1
    for i, n in enumerate(new):
        if acc == before and (n % old[d] == 0 or old[d] % n == 0):
            return ("r", i)
        acc *= n
    return None


def _dot(ins, dimension_numbers, eqn):
    (lc, rc), (lb, rb) = dimension_numbers
    a, b = ins
    if a[0] == "s" and b[0] == "c" and b[1] == 0 or b[0] == "s" and a[0] == "c" and a[1] == 0:
        return a if a[0] == "s" else b
    lhs_rank = len(eqn.invars[0].aval.shape)
    rhs_rank = len(eqn.invars[1].aval.shape)
    lhs_free = [d for d in range(lhs_rank) if d not in lc and d not in lb]
    rhs_free = [d for d in range(rhs_rank) if d not in rc and d not in rb]
    if a[0] == "r" and b[0] == "c":
        d = a[1]
        if d in lc:
            return ("s", 0)
        return ("r", len(lb) + lhs_free.index(d)) if d in lhs_free else None
    if b[0] == "r" and a[0] == "c":
        d = b[1]
        if d in rc:
            return ("s", 0)
        return ("r", len(lb) + len(lhs_free) + rhs_free.index(d)) if d in rhs_free else None
    if a[0] == "r" and b[0] == "r":
        if a[1] in lb and b[1] in rb and list(lb).index(a[1]) == list(rb).index(b[1]):
            return ("r", list(lb).index(a[1]))
        if a[1] in lc and b[1] in rc and list(lc).index(a[1]) == list(rc).index(b[1]):
            return ("s", 0)
    return None


def _classes(jaxpr, sentinel, tainted: set, sentinel_rows: int, carried: int | None = None
             ) -> list | str:
    """The class of every output of the layer (module docstring), its batch inputs row-wise
    along dimension 0 and input `carried` the carried value ("k"); or why there are none."""
    rows = None
    classes: list = []
    for i, v in enumerate(jaxpr.invars):
        if i == carried:
            classes.append(("k", None))
        elif v in tainted:
            classes.append(("r", 0))
            rows = rows or v.aval.shape[0]
        else:
            classes.append(("c", 0))
    if rows is None:
        return "no batch input"
    try:
        return _Walk(rows, sentinel_rows).run(jaxpr, sentinel, classes)
    except _Mismatch:
        return "the layer body traces differently at another microbatch size"


def _gather(ins, numbers, eqn):
    """A gather whose operand and indices hold the batch along a paired batching dimension
    (`take_along_axis` along another dimension): each row gathers from its own row."""
    (_, d_op), (_, d_idx) = ins[0], ins[1]
    if d_op not in numbers.operand_batching_dims:
        return None
    pair = numbers.start_indices_batching_dims[numbers.operand_batching_dims.index(d_op)]
    if pair != d_idx:
        return None
    rank = len(eqn.outvars[0].aval.shape)
    index_dims = [d for d in range(len(eqn.invars[1].aval.shape)) if d != len(
        eqn.invars[1].aval.shape) - 1]  # jax puts the index vector last
    batch_positions = [d for d in range(rank) if d not in numbers.offset_dims]
    return ("r", batch_positions[index_dims.index(d_idx)]) if d_idx in index_dims else None


def sum_over_rows(jaxpr, sentinel, invar: int, outvar: int, tainted: set, microbatches: int,
                  sentinel_rows: int) -> tuple[float | None, str]:
    """For carried input `jaxpr.invars[invar]` and its output `jaxpr.outvars[outvar]`: the
    factor to apply to the sum over microbatches of (output - input) to get the unpipelined
    loop's (output - input), or None with the reason it has none."""
    classes = _classes(jaxpr, sentinel, tainted, sentinel_rows, carried=invar)
    if isinstance(classes, str):
        return None, classes
    out = classes[outvar]
    if out is None or out[0] != "k" or out[1] is None:
        return None, "it is not the carried value plus sums over the batch's rows"
    return float(microbatches) ** out[1], ""


def rows_or_sums(jaxpr, sentinel, outvars: list[int], tainted: set, microbatches: int,
                 sentinel_rows: int) -> list[tuple[int | None, float | None, str]]:
    """For each output in `outvars` (one computed from the batch): `(dim, None, "")` where it
    is row-wise with the batch along `dim` (each row computed from its own row: the
    microbatches' outputs are its rows), `(None, factor, "")` where it is a sum over the
    batch's rows (`factor` on the sum over microbatches gives the whole batch's), or
    `(None, None, why)`."""
    classes = _classes(jaxpr, sentinel, tainted, sentinel_rows)
    found = []
    for i in outvars:
        c = classes if isinstance(classes, str) else classes[i]
        if isinstance(c, str):
            found.append((None, None, c))
        elif c is not None and c[0] == "r":
            found.append((c[1], None, ""))
        elif c is not None and c[0] == "s":
            found.append((None, float(microbatches) ** c[1], ""))
        else:
            found.append((None, None, "it mixes the batch's rows other than by a sum"))
    return found
