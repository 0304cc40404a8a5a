"""One layer of a pipelined loop as the pipeline runs it: per microbatch (issue 34).

The PP trace hook gets the user's scan body `f(carry, x)` written for the whole batch. To run it
on a microbatch, the pipeline needs more than the carry's rows:

- **Per-example tensors the body reads but does not carry** (a padding mask, segment ids or
  positions closed over by a `lax.scan` body, or passed with Flax `nn.scan(...,
  in_axes=nn.broadcast)`, which closes over them too) must be cut to the microbatch's rows
  with the carry. They are the body's captured values whose leading dimension is the batch and
  without which the body does not trace at a microbatch size (`_per_example`: a captured value
  whose rows the body never lines up with the carry's, a weight whose first dimension happens
  to equal the batch, keeps its full shape). The body is re-traced at the microbatch size
  with those values read as explicit inputs (`_reading`: the captured tracer's aval is the
  microbatch's while jax traces the body, and its lifting into the body's jaxpr gives the
  input instead), so nested `jax.jit`, `jax.checkpoint` and Flax lifted transforms inside the
  body trace as they would for the user.
- **Random draws** give each microbatch its rows of the whole batch's draw
  (`microbatch_rng`).
- **Carried values without the batch** are sorted by what the body does with them: those
  computed without the activations (a carried PRNG key, a layer counter) form a sequence over
  the layers computed before the pipeline (`sequence`); those that add to themselves a sum over
  the microbatch's rows (an MoE auxiliary loss) are summed over microbatches (`summed`,
  `row_sums` decides when that is exact); anything else is refused, naming the scan's line and
  the carry leaf.
- **Per-layer outputs** (the scan's `ys`, e.g. Flax `sow`n intermediates) are sorted alike
  (`LayerOutput`): computed from the layer's inputs alone, row-wise in the activations
  (assembled from the microbatches' rows), or sums over the batch's rows; anything else is
  refused.

The program is the body's jaxpr at the microbatch size, inputs `(per-example..., carry...,
x...)`, outputs `(carry..., ys...)`, evaluated inside the pipeline (`apply`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import jax
import numpy as np
from jax.extend import core as jex_core

from ...errors import PartitionError
from . import microbatch_rng

SENTINELS = (1009, 1013, 1019, 1021)  # microbatch sizes for tracing that no real shape has


def leaf_names(tree, prefix: str) -> list[str]:
    """Each leaf of `tree` as `prefix` plus its key path (`carry[1]['aux']`)."""
    return [prefix + jax.tree_util.keystr(path)
            for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


@contextlib.contextmanager
def _reading(subs: dict[int, tuple]):
    """While jax traces: each captured value `outer` of `subs[id(outer)] = (outer, inner)`
    has `inner`'s shape, and the traced program reads `inner` where it reads `outer`."""
    from jax._src.interpreters import partial_eval as pe

    trace = pe.DynamicJaxprTrace
    original = trace.new_const

    def new_const(self, c, source_info, aval=None):
        sub = subs.get(id(c))
        if sub is not None:
            return self.to_jaxpr_tracer(sub[1], source_info)
        return original(self, c, source_info, aval)

    saved = {k: outer.aval for k, (outer, _) in subs.items()}
    try:
        for outer, inner in subs.values():
            outer.aval = outer.aval.update(shape=inner.aval.shape)
        trace.new_const = trace.pure = trace.lift = new_const
        yield
    finally:
        trace.new_const = trace.pure = trace.lift = original
        for k, (outer, _) in subs.items():
            outer.aval = saved[k]


class KeptState:
    """Python state a trace of a layer body changes, saved to be restored: Flax counts the
    random keys each module scope makes (`Scope.rng_counters`, shared with the lifted scan's
    body), so every trace of an `nn.scan` body advances the counters, and the keys of the
    next trace differ. The unpipelined step traces the body once; PP traces it a few times
    to learn its shape (for the whole batch, at a sentinel microbatch size), then restores
    the counters so that its last trace, the one it runs, draws with the keys the
    unpipelined step's single trace draws with, and leaves them as that trace does."""

    def __init__(self) -> None:
        import gc
        import sys

        scope = sys.modules.get("flax.core.scope")
        self.saved = [] if scope is None else [
            (o.rng_counters, _copy_dict(o.rng_counters)) for o in gc.get_objects()
            if isinstance(o, scope.Scope) and isinstance(getattr(o, "rng_counters", None), dict)]

    def restore(self) -> None:
        for live, saved in self.saved:
            _restore_dict(live, saved)


def _copy_dict(d: dict) -> dict:
    """A copy of nested dicts, keys kept as they are (Flax keys child scopes by sentinel
    objects, which a deep copy would replace)."""
    return {k: _copy_dict(v) if isinstance(v, dict) else v for k, v in d.items()}


def _restore_dict(live: dict, saved: dict) -> None:
    for k in [k for k in live if k not in saved]:
        del live[k]
    for k, v in saved.items():
        if isinstance(v, dict) and isinstance(live.get(k), dict):
            _restore_dict(live[k], v)
        else:
            live[k] = v


def call_body(eqn) -> jex_core.Jaxpr | None:
    """The jaxpr a call equation (a nested `jax.jit`, `jax.checkpoint`) runs on its operands,
    positionally; None for any other equation."""
    if eqn.primitive.name not in microbatch_rng.CALLS:
        return None
    inner = [j for j in jex_core.jaxprs_in_params(eqn.params)
             if len(j.invars) == len(eqn.invars) and len(j.outvars) == len(eqn.outvars)]
    return inner[0] if len(inner) == 1 else None


def computed_from(jaxpr: jex_core.Jaxpr, seeds) -> set:
    """The variables of `jaxpr` computed from `seeds`. Through a call, only the results its
    body computes from them (an `nnx.remat` around `nnx.scan`'s function returns the layer's
    state beside the activations); any other equation reading one gives all its results."""
    tainted = set(seeds)
    for eqn in jaxpr.eqns:
        read = [i for i, v in enumerate(eqn.invars)
                if not isinstance(v, jex_core.Literal) and v in tainted]
        if not read:
            continue
        body = call_body(eqn)
        if body is None:
            tainted.update(eqn.outvars)
            continue
        inside = computed_from(body, [body.invars[i] for i in read])
        tainted.update(o for o, v in zip(eqn.outvars, body.outvars)
                       if not isinstance(v, jex_core.Literal) and v in inside)
    return tainted


def _substitutable(c) -> bool:
    """A captured value `_reading` can stand in for: a jax tracer (a value of the step) or a
    jax array (a constant the step closes over), not a numpy array (jax converts it anew at
    each use, so no use can be recognised)."""
    return isinstance(c, (jax.core.Tracer, jax.Array)) and hasattr(c, "aval")


def _trace_at(f: Callable, carry_leaves, carry_tree, batch_mask: Sequence[bool], x_avals,
              per_example: Sequence, rows: int):
    """`f` traced with batch-major carry leaves and `per_example` values of `rows` rows:
    (closed jaxpr over (per_example..., carry..., x...), output shapes (carry, ys))."""
    def rows_of(a):
        return jax.ShapeDtypeStruct((rows, *a.shape[1:]), a.dtype)

    carry_avals = [rows_of(c) if b else jax.ShapeDtypeStruct(c.shape, c.dtype)
                   for c, b in zip(carry_leaves, batch_mask)]
    pe_avals = [rows_of(c) for c in per_example]

    def explicit(pe_vals, carry, x):
        subs = {id(o): (o, i) for o, i in zip(per_example, pe_vals)}
        with _reading(subs):
            return f(jax.tree.unflatten(carry_tree, carry), x)

    return jax.make_jaxpr(explicit, return_shape=True)(pe_avals, carry_avals, x_avals)


def _fits(shapes, carry_leaves, batch_mask, rows: int) -> bool:
    """The body's carry comes back with the shapes it went in with (rows where batch-major)."""
    out = jax.tree.leaves(shapes[0])
    return len(out) == len(carry_leaves) and all(
        tuple(o.shape) == ((rows, *c.shape[1:]) if b else tuple(c.shape))
        for o, c, b in zip(out, carry_leaves, batch_mask))


def _row_index_sites(real, sentinel) -> list[str]:
    """The lines of the iotas of `real` (the layer at the microbatch size) that count along
    a dimension whose size changes with the microbatch size (the same iota in `sentinel`,
    traced at another size, is longer there): the batch's row numbers."""
    found = []
    for a, b in zip(real.eqns, sentinel.eqns):
        if a.primitive is not b.primitive:
            break
        if a.primitive.name == "iota":
            d = a.params["dimension"]
            if tuple(a.params["shape"])[d] != tuple(b.params["shape"])[d]:
                found.append(microbatch_rng.where(a))
        for x, y in zip(jex_core.jaxprs_in_params(a.params),
                        jex_core.jaxprs_in_params(b.params)):
            found += _row_index_sites(x, y)
    return found


@dataclass(frozen=True)
class LayerOutput:
    """How the pipeline makes one leaf of the scan's per-layer outputs `ys`: from the layer's
    own inputs (both None: each stage computes its layers' outside the pipeline, e.g. Flax
    `nn.scan`'s module state); row-wise in the activations with the batch along dimension
    `rows` (an attention map, a sown activation: assembled from the microbatches' rows); or a
    sum over the batch's rows (a per-layer MoE auxiliary loss: the microbatches' outputs
    summed, times `scale`)."""

    rows: int | None = None
    scale: float | None = None

    @property
    def from_activations(self) -> bool:
        return self.rows is not None or self.scale is not None


@dataclass
class LayerProgram:
    """The layer body at the microbatch size (module docstring)."""

    jaxpr: jex_core.ClosedJaxpr
    per_example: list  # the step's full-batch values read per microbatch, in input order
    batch_mask: list[bool]  # per carry leaf: batch-major (True) or not
    roles: list[str]  # per carry leaf: "batch", "sequence" or "summed"
    carry_tree: object
    ys_shapes: object
    draws: dict
    microbatches: int
    n_x: int
    carry_names: list[str] = field(default_factory=list)
    summed_scale: dict = field(default_factory=dict)  # leaf index -> factor on the sum
    ys_outputs: list[LayerOutput] = field(default_factory=list)  # per ys leaf
    # Lines where the body counts the batch's rows (an iota along it, `jnp.arange(B)`):
    # per microbatch that counts the microbatch's rows instead, which changes a body using
    # the counts as values (a mask by row number); the pipeline warns.
    row_indices: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, f: Callable, init, xs, *, microbatches: int, captured: Sequence,
              site: str, kept: KeptState | None = None) -> LayerProgram:
        """Trace `f` (a scan body over stacked layers) for microbatches of a batch-major
        `init`; `captured`: the values the body captures when traced for the whole batch.
        `kept`: Python state saved before the first trace of `f`, restored before the last
        (the one the pipeline runs)."""
        carry_leaves, carry_tree = jax.tree.flatten(init)
        names = leaf_names(init, "carry")
        batch = next(c.shape[0] for c in carry_leaves if getattr(c, "ndim", 0) >= 1)
        batch_mask = [getattr(c, "ndim", 0) >= 1 and c.shape[0] == batch for c in carry_leaves]
        rows = batch // microbatches
        x_avals = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), xs)
        dims = {d for a in [*carry_leaves, *jax.tree.leaves(xs), *captured]
                for d in getattr(a, "shape", ())}
        sentinel = next(s for s in SENTINELS if s not in dims and s != rows)
        candidates = [c for c in captured if _substitutable(c) and c.ndim >= 1
                      and c.shape[0] == batch]
        per_example, (traced_s, shapes_s) = _per_example(
            f, carry_leaves, carry_tree, batch_mask, x_avals, candidates, sentinel, site)
        if kept is not None:
            kept.restore()
        closed, shapes = _trace_at(f, carry_leaves, carry_tree, batch_mask, x_avals,
                                   per_example, rows)
        if not _fits(shapes, carry_leaves, batch_mask, rows):
            raise PartitionError(f"PP: the layer loop at {site} does not return its carry "
                                 f"with the shapes it was given for a microbatch of {rows}")
        draws = microbatch_rng.find_draws(closed.jaxpr, traced_s.jaxpr, rows, sentinel)
        program = cls(closed, per_example, batch_mask, [], carry_tree, shapes[1], draws,
                      microbatches, len(jax.tree.leaves(x_avals)), names)
        program.row_indices = _row_index_sites(closed.jaxpr, traced_s.jaxpr)
        program.roles = program._roles(site, traced_s, sentinel)
        return program

    # -- what the body does with each carried value ------------------------------------------

    def _tainted(self) -> set:
        """Variables of the jaxpr computed from the batch (per-example inputs and batch-major
        carry leaves; `computed_from`)."""
        jaxpr = self.jaxpr.jaxpr
        n_pe = len(self.per_example)
        carry_in = jaxpr.invars[n_pe:n_pe + len(self.batch_mask)]
        return computed_from(jaxpr, [*jaxpr.invars[:n_pe],
                                     *(v for v, b in zip(carry_in, self.batch_mask) if b)])

    def _roles(self, site: str, sentinel_jaxpr, sentinel_rows: int) -> list[str]:
        from .row_sums import rows_or_sums, sum_over_rows

        jaxpr = self.jaxpr.jaxpr
        n_pe, n_c = len(self.per_example), len(self.batch_mask)
        tainted = self._tainted()
        outs = jaxpr.outvars
        computed = [n_c + i for i, v in enumerate(outs[n_c:]) if v in tainted]
        found = dict(zip(computed, rows_or_sums(jaxpr, sentinel_jaxpr.jaxpr, computed, tainted,
                                                self.microbatches, sentinel_rows)))
        self.ys_outputs = []
        for i in range(n_c, len(outs)):
            rows, scale, why = found.get(i, (None, None, ""))
            if why:
                raise PartitionError(
                    f"PP: the layer loop at {site} returns a per-layer output computed from "
                    f"the activations (leaf {i - n_c} of the scan's ys) in a way the pipeline "
                    f"cannot reproduce per microbatch: {why}. A pipelined loop's per-layer "
                    f"outputs are computed from the layer's own inputs, row by row from the "
                    f"activations (batch-major), or as sums over the batch's rows")
            self.ys_outputs.append(LayerOutput(rows, scale))
        roles = []
        for i, b in enumerate(self.batch_mask):
            if b:
                roles.append("batch")
            elif outs[i] not in tainted:
                roles.append("sequence")
            else:
                scale, why = sum_over_rows(self.jaxpr.jaxpr, sentinel_jaxpr.jaxpr,
                                           n_pe + i, i, tainted, self.microbatches,
                                           sentinel_rows)
                if scale is None:
                    leaf = self.carry_names[i]
                    shape = jax.tree.leaves(self.jaxpr.out_avals)[i].shape
                    raise PartitionError(
                        f"PP: the layer loop at {site} carries {leaf} (shape {tuple(shape)}), "
                        f"which has no batch dimension and is computed from the activations "
                        f"in a way the pipeline cannot reproduce per microbatch: {why}. A "
                        f"pipelined carry is batch-major, independent of the activations (a "
                        f"key, a counter), or adds a sum over the batch's rows to itself")
                self.summed_scale[i] = scale
                roles.append("summed")
        # A sequence leaf must not read a summed one (it would see a microbatch's partial sum).
        return roles

    # -- running it ----------------------------------------------------------------------------

    def apply(self, microbatch, per_example: Sequence, carry: Sequence, x: Sequence) -> tuple:
        """(carry leaves, ys leaves) of one layer on microbatch `microbatch`."""
        outs = microbatch_rng.evaluate(self.jaxpr.jaxpr, self.jaxpr.consts,
                                       [*per_example, *carry, *x], self.draws, microbatch,
                                       self.microbatches)
        n = len(self.batch_mask)
        return outs[:n], outs[n:]

    def sliced(self, carry_outputs: Sequence[int], ys: Sequence[int] = ()):
        """A function `(carry leaves, x leaves) -> (chosen carry outputs, chosen ys leaves)`:
        the layer restricted to what computes those (the activations' part dropped by DCE)."""
        from jax._src.interpreters import partial_eval as pe

        jaxpr = self.jaxpr.jaxpr
        n_c = len(self.batch_mask)
        used = [i in carry_outputs for i in range(n_c)] + [
            i in ys for i in range(len(jaxpr.outvars) - n_c)]
        dced, used_in = pe.dce_jaxpr(jaxpr, used, instantiate=True)
        n_pe = len(self.per_example)
        keep = [i for i, u in enumerate(used_in) if u]
        # What the chosen outputs do not depend on may still be read by an equation DCE
        # keeps (one with effects): it gets zeros of the microbatch's shape.
        activations = set(range(n_pe)) | {n_pe + i for i, b in enumerate(self.batch_mask) if b}
        avals = [v.aval for v in jaxpr.invars]
        consts = self.jaxpr.consts

        def run(carry, x):
            import jax.numpy as jnp

            args = [None] * n_pe + list(carry) + list(x)
            args = [jnp.zeros(avals[i].shape, avals[i].dtype) if i in activations else args[i]
                    for i in range(len(args))]
            outs = microbatch_rng.evaluate(dced, consts, [args[i] for i in keep], {}, 0,
                                           self.microbatches)
            k = len(carry_outputs)
            return outs[:k], outs[k:]

        return run


def _per_example(f, carry_leaves, carry_tree, batch_mask, x_avals, candidates: list,
                 sentinel: int, site: str):
    """The candidates the body lines up with the carry's rows: the smallest choice among
    none, all, and all but one, with which the body traces at the `sentinel` size and returns
    its carry's shapes. Returns it with that trace."""
    tries = [[], candidates] + [[c for c in candidates if c is not d] for d in candidates]
    errors = []
    seen = set()
    for chosen in tries:
        key = tuple(map(id, chosen))
        if key in seen:
            continue
        seen.add(key)
        try:
            traced = _trace_at(f, carry_leaves, carry_tree, batch_mask, x_avals, chosen,
                               sentinel)
        except (TypeError, ValueError) as e:
            errors.append(str(e).splitlines()[0])
            continue
        if _fits(traced[1], carry_leaves, batch_mask, sentinel):
            return chosen, traced
        errors.append("the carry comes back with other shapes")
    shapes = ", ".join(str(tuple(c.shape)) for c in candidates) or "none"
    raise PartitionError(
        f"PP: the layer loop at {site} does not run on a microbatch: traced with the "
        f"carry's rows cut to a probe microbatch of {sentinel} rows, and the batch-major "
        f"values it reads ({shapes}) cut alike, it fails "
        f"({errors[-1] if errors else 'no trace'}). The body must not depend on the batch's "
        f"size through a constant of that size (a numpy index array or mask of the batch's "
        f"length, as in `h[perm]`); indexing the batch by row reads rows a microbatch does "
        f"not hold")


def stacked_names(xs) -> list[str]:
    return leaf_names(xs, "xs")


def as_numpy_shape(a) -> tuple:
    return tuple(np.shape(a))
