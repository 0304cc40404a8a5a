"""The pipelined layer loop (issue 22, design B-global of docs/pipeline_design.md).

`pipelined_scan` computes what `jax.lax.scan(body, carry, xs)` over a stack of L layers
computes, as a GPipe pipeline written in ordinary jax with an explicit stage dimension `[S]`:
the stacked per-layer inputs are reshaped `[L, ...] -> [S, L/S, ...]`, the batch (every carry
leaf's leading dimension) is split into M strided microbatches (microbatch m holds rows m,
m+M, ...), and `M + S - 1` iterations each run every stage's L/S layers on the microbatch it
holds (the stage body `vmap`ped over `[S]`), then shift the stage state by one stage along
`[S]` (`partir_plugin.roll`: a collective_permute once `[S]` is tiled). The program has
global semantics: it runs under plain `jax.jit` and gives the scan's numbers; partitioned
with `[S]` tiled over a mesh axis, each device holds one stage's layers and the shift is the
only traffic between stages. Because it is jax code, jax differentiates it: the backward
pipeline, the reverse shifts and the accumulation of the layer gradients over microbatches
all come from AD.

Bubble slots (stage s before its first or after its last microbatch) compute on zeros and
their results are never read, so nothing they produce, NaN included, reaches the results.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jex_core

from ...core.actions import TacticContext
from ...core.mesh import Mesh
from ...errors import PartitionError
from ...markers import interleave, roll, tag
from ..base import Tactic
from ..layer_loop import (
    LayerLoopHook,
    LoopRun,
    Remat,
    ScanCall,
    Unit,
    call_site,
    no_layer_loop,
    original_scan,
)
from .layer_program import KeptState, LayerOutput, LayerProgram, call_body, computed_from
from .weight_casts import cast_once, narrowed_inputs

LAYERS_TAG = "pp/layers"  # each stacked per-layer input of the pipelined loop
STATE_TAG = "pp/state"  # the stage state, `[S, microbatch, ...]`
BATCH_TAG = "pp/batch"  # the loop's carried input, `[B, ...]`
MICRO_TAG = "pp/micro"  # the same as microbatches, `[M, B/M, ...]`


def _tagged(x, name: str):
    """`x` tagged `name` where a tag can hold it (floating point)."""
    return tag(x, name) if jnp.issubdtype(x.dtype, jnp.floating) else x


@dataclass(frozen=True)
class PipelineShape:
    """What a pipelined loop looks like: S stages, M microbatches, L layers, R repeats (the
    circular schedule's passes through the stages; 1: GPipe)."""

    stages: int
    microbatches: int
    layers: int
    repeats: int = 1

    @property
    def iterations(self) -> int:
        """The trip count: every microbatch through every stage R times, M·R + S - 1."""
        return self.microbatches * self.repeats + self.stages - 1

    @property
    def bubble(self) -> float:
        """The idle fraction of each stage, (S - 1) / (M·R + S - 1), counted from the schedule
        table rather than assumed (`schedule_table`)."""
        table = schedule_table(self.stages, self.microbatches, self.repeats)
        idle = sum(1 for row in table for m in row if m is None)
        return idle / (len(table) * self.stages)


def schedule_table(stages: int, microbatches: int, repeats: int = 1
                   ) -> list[list[int | None]]:
    """Per iteration t, per stage s, the step k = t - s stage s works on (microbatch k mod M in
    pass k div M; with one pass, the microbatch), or None for a bubble."""
    work = microbatches * repeats
    return [[t - s if 0 <= t - s < work else None for s in range(stages)]
            for t in range(work + stages - 1)]


def _check(shape: PipelineShape, batch: int) -> None:
    S, M, L, R = shape.stages, shape.microbatches, shape.layers, shape.repeats
    if L % (S * R):
        raise PartitionError(f"PP: {L} stacked layers do not divide into {S} stages"
                             + (f" x {R} repeats" if R > 1 else ""))
    if batch % M:
        raise PartitionError(f"PP: a batch of {batch} does not split into {M} microbatches")
    if R > 1 and M < S:
        raise PartitionError(f"PP: the circular schedule needs at least as many microbatches "
                             f"as stages ({M} < {S}): a microbatch re-enters stage 0 S "
                             f"iterations after it left it")


def _batch_size(carry_leaves) -> int:
    """The batch: the leading dimension of the carry's largest leaf (the activations)."""
    arrays = [c for c in carry_leaves if getattr(c, "ndim", 0) >= 1]
    if not arrays:
        raise PartitionError("PP: the layer loop carries no array with a batch dimension")
    return max(arrays, key=lambda c: c.size).shape[0]


def pipelined_scan(body: Callable, carry, xs, *, stages: int, microbatches: int,
                   repeats: int = 1, scan: Callable = lax.scan, fill: float = 0.0,
                   layer: LayerTrace | None = None, reverse: bool = False,
                   site: str | None = None, kept: KeptState | None = None,
                   remat: Remat | None = None):
    """`lax.scan(body, carry, xs, reverse=reverse)` over stacked layers as a GPipe pipeline
    (`repeats` > 1: the circular schedule, stage s holding layer chunks s, s+S, ..., each
    microbatch passing through the stages R times); returns `(final carry, ys)` like the scan.

    Every leaf of `xs` has the L layers first. The carry's batch-major leaves (leading
    dimension the batch, that of its largest leaf) are split into microbatches; its other
    leaves, the per-example values the body reads, the body's random draws and its per-layer
    outputs `ys` are handled as `layer_program.LayerProgram` says (or refused, naming the
    scan's line `site` and the leaf). `scan` runs the loops (the real `lax.scan` while the PP
    tactic's trace hook replaces it). The stacked layer inputs are tagged `LAYERS_TAG`, the
    stage state `STATE_TAG` (for the tactic to find). `fill` is what the stage state and
    output buffer hold before anything is written (NaN proves that no bubble slot reaches the
    results). `reverse`: the layers run last to first (the pipeline's first stage holds the
    last layers; the stack stays where it is). `layer`: the body traced for the whole batch.
    `remat` is offered each iteration's stage body (every stage's layers on the microbatch
    it holds) and, inside it, each layer: the units RM may recompute
    (`layer_loop.LayerLoopHook.remat`).
    """
    carry = jax.tree.map(jnp.asarray, carry)  # Python scalars, as lax.scan takes them
    carry_leaves, carry_tree = jax.tree.flatten(carry)
    xs_leaves = jax.tree.leaves(xs)
    site = site or call_site()
    if not carry_leaves or not xs_leaves:
        raise PartitionError(f"PP: the layer loop at {site} must carry activations and scan "
                             f"stacked per-layer inputs (parameters)")
    batch, layers = _batch_size(carry_leaves), xs_leaves[0].shape[0]
    shape = PipelineShape(stages, microbatches, layers, repeats)
    _check(shape, batch)
    if reverse and repeats > 1:
        raise PartitionError(f"PP: the layer loop at {site} runs in reverse (reverse=True), "
                             f"which the circular schedule does not support; use "
                             f"schedule='gpipe'")
    kept = kept or KeptState()
    layer = layer or LayerTrace.of(body, carry, xs)
    # Stacked inputs the body only casts to a narrower float (mixed-precision weights) are
    # cast once here rather than in every microbatch's layers (`weight_casts`): the program
    # is traced with them narrow.
    narrow = narrowed_inputs(layer.jaxpr.jaxpr, len(carry_leaves))
    xs_avals = [jax.ShapeDtypeStruct(a.shape, d or a.dtype) for a, d in zip(xs_leaves, narrow)]
    program = LayerProgram.build(body, carry, jax.tree.unflatten(jax.tree.structure(xs),
                                                                 xs_avals),
                                 microbatches=microbatches, captured=layer.jaxpr.consts,
                                 site=site, kept=kept)
    if program.row_indices:
        warnings.warn(f"PP: the layer body of the scan at {site} counts the batch's rows "
                      f"(an iota, jnp.arange over the batch, at "
                      f"{', '.join(sorted(set(program.row_indices)))}): per microbatch it "
                      f"counts the microbatch's rows, so a body using those numbers as values "
                      f"(a mask by row number) computes other results than the unpipelined "
                      f"step", PipelineWarning, stacklevel=4)
    S, M, R = stages, microbatches, repeats
    mb = batch // M
    roles = program.roles
    batch_at = [i for i, r in enumerate(roles) if r == "batch"]
    seq_at = [i for i, r in enumerate(roles) if r == "sequence"]
    sum_at = [i for i, r in enumerate(roles) if r == "summed"]

    # Carried values computed without the activations: their value at each layer's input,
    # by a scan over the layers before the pipeline (they become per-layer inputs).
    seq_final, seq_inputs = [], []
    if seq_at:
        advance = program.sliced(seq_at)

        def seq_step(c, x):
            full = [None] * len(roles)
            for i, v in zip(seq_at, c):
                full[i] = v
            return advance(full, _narrowed(x, narrow))[0], c

        seq_final, seq_inputs = scan(seq_step, [carry_leaves[i] for i in seq_at],
                                     xs_leaves, reverse=reverse)

    def to_stages(a):  # [L, ...] -> [S, R, L/(S·R), ...]: stage s holds chunks s, s+S, ...
        a = interleave(a, R, S) if R > 1 else a
        return a.reshape(S, R, layers // (S * R), *a.shape[1:])

    stacked = [to_stages(_tagged(a, LAYERS_TAG)) for a in xs_leaves] + [
        to_stages(a) for a in seq_inputs]
    n_x, n_seq = len(xs_leaves), len(seq_inputs)
    stacked += [lax.stop_gradient(w.astype(d)) for w, d in zip(stacked, narrow) if d]

    def strided(c):  # [B, ...] -> [M, B/M, ...]: microbatch m is rows m, m+M, ...
        return jnp.swapaxes(c.reshape(mb, M, *c.shape[1:]), 0, 1)

    micro = [_tagged(strided(_tagged(carry_leaves[i], BATCH_TAG)), MICRO_TAG)
             for i in batch_at]
    micro_pe = [strided(v) for v in program.per_example]
    stage = jnp.arange(S)
    pos = S - 1 - stage if reverse else stage  # each stage's place in the pipeline
    plain_ys = _per_layer_outputs(program, stacked[:n_x + n_seq], n_x, seq_at, len(roles),
                                  scan, reverse, S, R, layers, narrow)
    # Per-layer outputs computed from the activations: each stage writes its layers' for the
    # microbatch it holds into its own block of a buffer (`_into_slots`), rows ones into slot
    # (pass, microbatch), sums added into slot (pass).
    made = [i for i, o in enumerate(program.ys_outputs) if o.from_activations]

    per = layers // (S * R)

    def run_stage(h, pe, m, sums, layer_inputs):
        def one(c, x):
            hs, acc = c
            full = [None] * len(roles)
            for i, v in zip(batch_at, hs):
                full[i] = v
            for i, v in zip(sum_at, acc):
                full[i] = v
            for i, v in zip(seq_at, x[n_x:]):
                full[i] = v
            cast = iter(x[n_x + n_seq:])
            weights = [cast_once(w.dtype, w, next(cast)) if d else w
                       for w, d in zip(x[:n_x], narrow)]
            out, ys = program.apply(m, pe, full, weights)
            return ([out[i] for i in batch_at], [out[i] for i in sum_at]), [ys[i] for i in made]

        if remat is not None:  # traced per stage (inside the vmap): S of them per layer
            one = remat(one, shape.iterations * per * S,
                        f"layer of a stage on a microbatch of {mb}", Unit.LAYER)
        return scan(one, (h, sums), layer_inputs, reverse=reverse)

    stage_body = jax.vmap(run_stage)
    if remat is not None:
        stage_body = remat(stage_body, shape.iterations,
                           f"stage body ({S} stages x {per} layer{'s' if per > 1 else ''} "
                           f"on a microbatch of {mb})", Unit.ITERATION)

    def where_stage(mask, a, b):
        return jnp.where(mask.reshape(-1, *([1] * (a.ndim - 1))), a, b)

    def chunk(t):
        """Each stage's layers for the pass it is in at iteration t."""
        r = jnp.clip((t - pos) // M, 0, R - 1)
        chosen = [w[:, 0] for w in stacked]
        for i in range(1, R):
            chosen = [where_stage(r == i, w[:, i], c) for c, w in zip(chosen, stacked)]
        return chosen

    def shift(y):
        return roll(y, -1 if reverse else 1, axis=0)

    def step(loop, xs):
        (state, pe_state), outs, circ, acc, made_ys = loop
        t, entering_now = xs
        k = t - pos  # the step each stage works on: microbatch k mod M, pass k div M
        valid = (k >= 0) & (k < M * R)
        m = jnp.clip(k, 0, M * R - 1) % M
        first = [x[None] for x in entering_now]
        if R > 1:  # later passes re-enter the first stage from the recirculation buffer
            again = [lax.dynamic_index_in_dim(c, t % M, 1, False) for c in circ]
            first = [jnp.where(t < M, f, a) for f, a in zip(first, again)]
        pe_first = [lax.dynamic_index_in_dim(x, t % M, 0, keepdims=True) for x in micro_pe]
        head = pos == 0

        def entering(f, s):
            return where_stage(head, jnp.broadcast_to(f, s.shape), s)

        inputs = [where_stage(valid, v, jnp.zeros_like(v))
                  for v in map(entering, first, state)]
        pe_in = list(map(entering, pe_first, pe_state))
        zero = [jnp.zeros((S, *v.shape), v.dtype) for v in (carry_leaves[i] for i in sum_at)]
        (out, sums), ys_now = stage_body(inputs, pe_in, m, zero, chunk(t))
        acc = [a + where_stage(valid, s, jnp.zeros_like(s)) for a, s in zip(acc, sums)]
        slot = jnp.clip(k, 0, M * R - 1)  # pass * M + microbatch
        made_ys = [_into_slots(b, y, slot if program.ys_outputs[i].rows is not None
                               else slot // M, valid, program.ys_outputs[i].scale is not None)
                   for b, y, i in zip(made_ys, ys_now, made)]
        shifted = [shift(y) for y in out]
        pe_shifted = [shift(y) for y in pe_in]
        # What the last stage finished: microbatch `done` (of some pass). Every iteration
        # writes it to slot `done` of the recirculation buffer (the first stage's block, read
        # by later passes) and of the output buffer, unmasked: slots are written in the order
        # of k_last, so the last write to a slot is its microbatch's last pass, a bubble's
        # write (k_last < 0, slot 0) comes before microbatch 0's, and a final pass's write to
        # the recirculation buffer is never read (its slot is read again only at t + M - S + 1
        # >= M·R). A masked write would select over the whole [S, M, ...] buffer each
        # iteration, and its gradient add a whole buffer: M² work in a step. Each stage
        # writes only its own (local) block of a buffer; only the first stage's block of the
        # recirculation buffer and the last stage's of the output buffer are read.
        done = jnp.clip(t - (S - 1), 0, M * R - 1) % M
        if R > 1:
            circ = [lax.dynamic_update_index_in_dim(c, y[:, None], done, 1)
                    for c, y in zip(circ, shifted)]
        outs = [lax.dynamic_update_index_in_dim(o, y[:, None], done, 1)
                for o, y in zip(outs, out)]
        return ((shifted, pe_shifted), outs, circ, acc, made_ys), None

    state0 = [_tagged(jnp.full((S, *m.shape[1:]), fill, m.dtype), STATE_TAG) for m in micro]
    pe0 = [jnp.zeros((S, *m.shape[1:]), m.dtype) for m in micro_pe]
    outs0 = [jnp.full((S, *m.shape), fill, m.dtype) for m in micro]
    circ0 = [jnp.full((S, *m.shape), fill, m.dtype) for m in micro] if R > 1 else []
    acc0 = [jnp.zeros((S, *jnp.shape(carry_leaves[i])), jnp.result_type(carry_leaves[i]))
            for i in sum_at]
    ys_avals = jax.tree.leaves(program.ys_shapes)
    made0 = [jnp.full((S, M * R, per, *ys_avals[i].shape), fill, ys_avals[i].dtype)
             if program.ys_outputs[i].rows is not None
             else jnp.zeros((S, R, per, *ys_avals[i].shape), ys_avals[i].dtype) for i in made]
    # Microbatch t enters the first stage at iteration t (zeros after the last, which no
    # stage uses): scanned over rather than indexed, since the gradient of an indexed loop
    # input adds a whole [M, ...] buffer every iteration (M² work in a step).
    entering = [jnp.concatenate([x, jnp.zeros((shape.iterations - M, *x.shape[1:]), x.dtype)])
                for x in micro]
    (_, outs, _, acc, made_ys), _ = scan(step, ((state0, pe0), outs0, circ0, acc0, made0),
                                         (jnp.arange(shape.iterations), entering))
    # The last stage's block, taken as a masked sum over stages (one reduction over the stage
    # axis once partitioned, rather than a gather of every stage's block).
    outs = [jnp.sum(where_stage(pos == S - 1, o, jnp.zeros_like(o)), axis=0) for o in outs]
    final = list(carry_leaves)
    for i, o in zip(batch_at, outs):
        final[i] = jnp.swapaxes(o, 0, 1).reshape(batch, *o.shape[2:])
    for i, v in zip(seq_at, seq_final):
        final[i] = v
    for i, a in zip(sum_at, acc):
        scale = program.summed_scale[i]
        total = jnp.sum(a, axis=0)
        final[i] = (carry_leaves[i] + (total if scale == 1 else total * scale)).astype(
            jnp.result_type(carry_leaves[i]))
    ys = list(plain_ys)
    for i, b in zip(made, made_ys):
        ys[i] = _assembled(b, program.ys_outputs[i], S, R, M, layers)
    return jax.tree.unflatten(carry_tree, final), jax.tree.unflatten(
        jax.tree.structure(program.ys_shapes), ys)


def _into_slots(buffers, ys, slots, valid, add: bool):
    """Each stage's `ys` (its layers' outputs on the microbatch it holds) written, or added,
    into slot `slots[s]` of its block of `buffers` where `valid[s]` (a bubble writes nothing):
    one slot per stage, local to it once the stage dimension is tiled."""
    def one(b, y, i, v):
        old = lax.dynamic_index_in_dim(b, i, 0, keepdims=False)
        new = old + jnp.where(v, y, jnp.zeros_like(y)) if add else jnp.where(v, y, old)
        return lax.dynamic_update_index_in_dim(b, new.astype(b.dtype), i, 0)

    return jax.vmap(one)(buffers, ys, slots, valid)


def _assembled(buffer, output: LayerOutput, S: int, R: int, M: int, layers: int):
    """The scan's `[L, ...]` per-layer output from the pipeline's buffer: `[S, M·R, L/(S·R),
    ...]` of microbatch rows (microbatch m is rows m, m+M, ... of the batch along
    `output.rows`), or `[S, R, L/(S·R), ...]` of sums over microbatches (times
    `output.scale`)."""
    per = layers // (S * R)
    if output.rows is None:
        a = buffer.reshape(layers, *buffer.shape[3:])
        a = interleave(a, R, S, inverse=True) if R > 1 else a
        return (a * output.scale).astype(buffer.dtype) if output.scale != 1 else a
    rest = buffer.shape[3:]
    a = buffer.reshape(S, R, M, per, *rest).swapaxes(2, 3).reshape(layers, M, *rest)
    a = interleave(a, R, S, inverse=True) if R > 1 else a
    d = output.rows
    a = jnp.moveaxis(a, 1, d + 2)  # [L, ..., rows of a microbatch, M, ...]
    return a.reshape(layers, *rest[:d], rest[d] * M, *rest[d + 1:])


def _narrowed(x: list, narrow: list) -> list:
    """The stacked inputs as the layer program reads them (`weight_casts`)."""
    return [a.astype(d) if d else a for a, d in zip(x, narrow)] + list(x[len(narrow):])


def _per_layer_outputs(program: LayerProgram, stacked: list, n_x: int, seq_at: list[int],
                       n_carry: int, scan: Callable, reverse: bool, S: int, R: int,
                       layers: int, narrow: list):
    """The leaves of the scan's per-layer outputs `ys` that do not depend on the activations
    (Flax `nn.scan`'s module state, `nnx.scan`'s), None for the others: each stage computes its
    own layers' from the layer inputs it holds, so no stacked input moves between stages."""
    leaves = jax.tree.leaves(program.ys_shapes)
    plain = [i for i, o in enumerate(program.ys_outputs) if not o.from_activations]
    if not plain:
        return [None] * len(leaves)
    compute = program.sliced([], ys=plain)

    def per_layer(_, x):
        full = [None] * n_carry
        for i, v in zip(seq_at, x[n_x:]):
            full[i] = v
        return None, compute(full, _narrowed(x[:n_x], narrow))[1]

    def per_stage(inputs):  # [R, L/(S·R), ...] -> per-layer outputs of the stage's chunks
        return jax.vmap(lambda chunk: scan(per_layer, None, chunk, reverse=reverse)[1])(inputs)

    out = jax.vmap(per_stage)(stacked)  # [S, R, L/(S·R), ...]
    out = [o.reshape(layers, *o.shape[3:]) for o in out]
    if R > 1:
        out = [interleave(o, R, S, inverse=True) for o in out]
    found: list = [None] * len(leaves)
    for i, o in zip(plain, out):
        found[i] = o
    return found


@dataclass(frozen=True)
class LayerTrace:
    """One layer of the loop body, traced once: its jaxpr, the output shapes `(carry, ys)`,
    and the jaxpr variables computed from the carried activations (an equation reading one
    taints all its outputs)."""

    jaxpr: jex_core.ClosedJaxpr
    shapes: tuple
    tainted: frozenset

    @classmethod
    def of(cls, body: Callable, carry, xs) -> LayerTrace:
        layer = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), xs)
        closed, shapes = jax.make_jaxpr(lambda c, x: body(c, x), return_shape=True)(
            carry, layer)
        seeds = closed.jaxpr.invars[:len(jax.tree.leaves(carry))]
        return cls(closed, shapes, frozenset(computed_from(closed.jaxpr, seeds)))

    def outputs_depend_on_carry(self) -> bool:
        n_carry = len(jax.tree.leaves(self.shapes[0]))
        return any(v in self.tainted for v in self.jaxpr.jaxpr.outvars[n_carry:])


# Schedules the literature names that PP does not build (docs/pipeline_design.md).
_UNBUILT_SCHEDULES = frozenset({"1f1b", "interleaved", "interleaved-1f1b", "zero-bubble",
                                "zb-h1", "zb-v", "dualpipe", "looped-bfs"})


class PipelineWarning(UserWarning):
    """Pipelining changes what the step computes (batch-coupled ops in the layer body) or what
    its host callbacks see."""


_BATCH_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
                               "reduce_and", "reduce_or", "argmax", "argmin", "cumsum",
                               "cumprod", "cummax", "cummin", "cumlogsumexp"})


def batch_coupled_ops(layer: LayerTrace, batch: int) -> list[str]:
    """The reductions in one layer whose reduced axes include a leading dimension of size
    `batch` of a value computed from the carry: rows of a microbatch would see only their
    microbatch (batch norm's statistics). Only what the batch-major carry is computed from
    counts: a reduction feeding a carried sum (an auxiliary loss) is summed exactly over
    microbatches (`row_sums`) or refused. A heuristic: a non-batch dimension of the same size
    counts too, so it warns, never refuses."""
    from jax._src.interpreters import partial_eval as pe

    found: list[str] = []
    jaxpr = layer.jaxpr.jaxpr
    n_carry = len(jax.tree.leaves(layer.shapes[0]))
    used = [i < n_carry and getattr(v.aval, "ndim", 0) >= 1 and v.aval.shape[0] == batch
            for i, v in enumerate(jaxpr.outvars)]
    needed = pe.dce_jaxpr(jaxpr, used, instantiate=False)[0]

    moved: dict = {}  # values whose batch is on a dimension other than 0 (`_batch_dims`)

    def visit(eqns, tainted) -> None:
        for eqn in eqns:
            if not any(v in tainted for v in eqn.outvars):
                continue
            axes = eqn.params.get("axes", (eqn.params.get("axis"),))
            # An equation may have no operand (iota, a constant inside a remat or a nested
            # jit): nothing of the batch to reduce.
            first = eqn.invars[0] if eqn.invars else None
            operand = first.aval if first is not None else None
            d = moved.get(first, 0) if not isinstance(first, jex_core.Literal) else 0
            if (eqn.primitive.name in _BATCH_REDUCTIONS and _holds_batch(operand, batch, d)
                    and d in tuple(axes or ())):
                found.append(eqn.primitive.name)
            elif not isinstance(tainted, _Everything) and _moves_rows(eqn, batch, tainted,
                                                                      moved):
                found.append(eqn.primitive.name)
            if not isinstance(tainted, _Everything):
                moved.update(_batch_dims(eqn, batch, tainted, moved))
            body = call_body(eqn)
            if body is not None:  # a nested jit or checkpoint: what it computes from the carry
                read = [body.invars[i] for i, v in enumerate(eqn.invars)
                        if not isinstance(v, jex_core.Literal) and v in tainted]
                moved.update({inner: moved[v] for inner, v in zip(body.invars, eqn.invars)
                              if not isinstance(v, jex_core.Literal) and v in moved})
                visit(body.eqns, computed_from(body, read))
                moved.update({v: moved[inner] for inner, v in zip(body.outvars, eqn.outvars)
                              if not isinstance(inner, jex_core.Literal) and inner in moved})
                continue
            for sub in jex_core.jaxprs_in_params(eqn.params):  # inside: every value counts
                visit(sub.eqns, _Everything())

    # The pruned equations: DCE rebuilds calls (a remat, a nested jit) without what only an
    # auxiliary carried sum needs, so a reduction feeding one inside them counts no more
    # than outside.
    visit(needed.eqns, layer.tainted)
    return sorted(set(found))


def _holds_batch(aval, batch: int, dim: int = 0) -> bool:
    """Does dimension `dim` of a value hold the batch: its size, or a multiple of it (the
    batch merged with the tokens, `h.reshape(B * T, D)`, as an MoE router or a dropless
    dispatch flattens them)? A heuristic, like the whole check: it warns, never refuses."""
    n = aval.shape[dim] if getattr(aval, "ndim", 0) > dim else 0
    return n >= batch > 0 and n % batch == 0


def _batch_dims(eqn, batch: int, tainted, moved: dict) -> dict:
    """Where the batch goes in `eqn`'s results, for those whose batch is not on dimension 0:
    a transpose or an einsum (`gsec,gsd->egcd`, GShard's dispatch) moves it without reading
    other rows, so the check follows it there rather than warning. Values the rules below do
    not cover keep the leading-dimension heuristic."""
    name, params, ins = eqn.primitive.name, eqn.params, eqn.invars

    def dim(v) -> int | None:
        if isinstance(v, jex_core.Literal) or v not in tainted:
            return None
        d = moved.get(v, 0)
        return d if _holds_batch(v.aval, batch, d) else None

    out = None
    if name == "transpose" and dim(ins[0]) is not None:
        out = list(params["permutation"]).index(dim(ins[0]))
    elif name == "dot_general":
        (lc, rc), (lb, rb) = params["dimension_numbers"]
        ranks = [len(v.aval.shape) for v in ins]
        free = [[d for d in range(r) if d not in c and d not in b]
                for r, c, b in zip(ranks, (lc, rc), (lb, rb))]
        for side, (v, b) in enumerate(zip(ins, (lb, rb))):
            d = dim(v)
            if d is not None and d in b:
                out = list(b).index(d)
            elif d is not None and d in free[side]:
                out = len(lb) + (len(free[0]) if side else 0) + free[side].index(d)
            if out is not None:
                break
    elif name == "broadcast_in_dim" and dim(ins[0]) is not None:
        out = params["broadcast_dimensions"][dim(ins[0])]
    elif name in ("reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin") and (
            dim(ins[0]) is not None):
        d = dim(ins[0])
        out = d - sum(a < d for a in params["axes"]) if d not in params["axes"] else None
    elif len(eqn.outvars) == 1 and all(
            getattr(v.aval, "shape", None) == eqn.outvars[0].aval.shape for v in ins
            if not isinstance(v, jex_core.Literal)):
        found = [moved[v] for v in ins if not isinstance(v, jex_core.Literal) and v in moved]
        out = found[0] if found else None  # elementwise: where its operands hold it
    if out is None or out == 0:
        return {}
    return {eqn.outvars[0]: out}


def _moves_rows(eqn, batch: int, tainted, moved: dict | None = None) -> bool:
    """Does `eqn` read rows of a batch-major operand at other rows (a shift, a reversal, a
    sort or a contraction over the batch)? Each row of a microbatch would then read rows of
    its microbatch only (`jnp.roll(h, 1, axis=0)` wraps around inside it). Batch-major means
    a dimension holding the batch (`_holds_batch`: of size `batch`, or the batch merged with
    the tokens) of a value computed from the carry (`tainted`): dimension 0, or where a
    transpose or an einsum moved it (`moved`, `_batch_dims`)."""
    name, params, ins = eqn.primitive.name, eqn.params, eqn.invars
    moved = moved or {}

    def batch_dim(v) -> int | None:
        if isinstance(v, jex_core.Literal) or v not in tainted:
            return None
        d = moved.get(v, 0)
        return d if _holds_batch(getattr(v, "aval", None), batch, d) else None

    if name == "dot_general":  # either operand contracted over its batch dimension
        return any(batch_dim(v) is not None and batch_dim(v) in contracting
                   for v, contracting in zip(ins, params["dimension_numbers"][0]))
    d = batch_dim(ins[0]) if ins else None
    if d is None:
        return False
    first = ins[0].aval
    rows = first.shape[d]
    if name == "slice":
        strides = params.get("strides") or (1,) * first.ndim
        return (params["start_indices"][d], params["limit_indices"][d], strides[d]) != (
            0, rows, 1)
    if name == "dynamic_slice":
        return params["slice_sizes"][d] != rows
    if name == "dynamic_update_slice":
        return ins[1].aval.shape[d] != rows
    if name in ("concatenate", "sort"):
        return params["dimension"] == d
    if name == "pad":
        return tuple(params["padding_config"][d]) != (0, 0, 0)
    if name == "rev":
        return d in params["dimensions"]
    if name == "transpose":
        return False  # followed (`_batch_dims`)
    if name == "gather":
        return d in params["dimension_numbers"].start_index_map
    if name.startswith("scatter"):
        return d in params["dimension_numbers"].scatter_dims_to_operand_dims
    if name.startswith("reduce_window") or name == "select_and_scatter_add":
        dims = params.get("window_dimensions", (1,) * first.ndim)
        strides = params.get("window_strides", (1,) * first.ndim)
        return dims[d] != 1 or strides[d] != 1
    if name == "top_k":
        return d == first.ndim - 1
    return False


class _Everything:
    """A set holding every value (the tainted values inside a tainted call)."""

    def __contains__(self, _) -> bool:
        return True


@dataclass
class _LayerLoop:
    """What one trace found: the pipeline's shape, the batch and the scan's line, or the
    scans passed over and why (for "no layer loop found")."""

    found: PipelineShape | None = None
    batch: int | None = None
    site: str | None = None
    passed_over: list[str] = field(default_factory=list)


class _PipelineHook(LayerLoopHook):
    """While the step is traced: the layer loop (`layer_loop`) becomes a pipelined loop.
    Entering gives the tactic that runs on this trace (`_PipelineRun`), which holds what the
    trace found."""

    substitutes = True

    def __init__(self, tactic: PipelineParallel, stages: int):
        super().__init__()
        self.tactic, self.stages = tactic, stages
        self.run = _PipelineRun(tactic, _LayerLoop(passed_over=self.passed_over))

    def entered(self) -> _PipelineRun:
        return self.run

    def substitute(self, call: ScanCall, remat: Remat):
        loop, tactic = self.run.loop, self.tactic
        f, xs, site = call.body, call.xs, call.site
        init = jax.tree.map(jnp.asarray, call.init)  # Python scalars, as lax.scan takes them
        layers = jax.tree.leaves(xs)[0].shape[0]
        batch = _batch_size(jax.tree.leaves(init))
        kept = KeptState()
        layer = LayerTrace.of(f, init, xs)
        coupled = batch_coupled_ops(layer, batch)
        if coupled:
            # stacklevel 3: the model's scan call (through `_dispatching_scan`).
            warnings.warn(f"{tactic.name}: the layer body of the scan at {site} reduces "
                          f"over the batch dimension or reads other rows of it "
                          f"({', '.join(coupled)}): microbatching computes those per "
                          f"microbatch of {batch // tactic.microbatches}, not over the batch "
                          f"of {batch} (batch norm's statistics, a roll along the batch), so "
                          f"results may differ from the unpipelined step. (PP takes the "
                          f"carry's leading dimension, {batch}, for the batch: a time-major "
                          f"carry [T, B, ...] is cut along time, which a body reading along "
                          f"time does not survive; make the carry batch-major.)",
                          PipelineWarning, stacklevel=3)
        if layer.jaxpr.effects:  # a host callback (jax.debug.print, io_callback, ...)
            warnings.warn(f"{tactic.name}: the layer body of the scan at {site} has host "
                          f"callbacks ({', '.join(sorted(map(str, layer.jaxpr.effects)))}): "
                          "pipelined, they run on the first device at every step of the "
                          "pipeline's loop (its stage's layers, on microbatches and on bubble "
                          "steps), not once per layer on the batch", PipelineWarning,
                          stacklevel=3)
        loop.found = PipelineShape(self.stages, tactic.microbatches, layers, tactic.repeats)
        loop.batch, loop.site = batch, site
        tactic.last_found = loop.found
        from jax._src import source_info_util

        # The pipeline's own ops (shifts, microbatch reads and writes, the masks) are the
        # user's scan call: their locations, hence the collectives' lines and phases in the
        # report, name the model's line rather than this module's.
        at_scan = source_info_util.user_context(source_info_util.current().traceback)
        with at_scan:
            return pipelined_scan(f, init, xs, stages=self.stages,
                                  microbatches=tactic.microbatches,
                                  repeats=tactic.repeats, scan=original_scan(),
                                  layer=layer, reverse=call.reverse, site=site, kept=kept,
                                  fill=float("nan") if tactic.poison_bubbles else 0.0,
                                  remat=remat)


@dataclass
class PipelineParallel(Tactic):
    """PP: pipeline the step's layer loop over the mesh axis `axis` (GPipe, or the circular
    schedule with `repeats` passes).

    While `partir_plugin.jit` traces the step, the loop over stacked layers (a `lax.scan`,
    as Flax `nn.scan` and `nnx.scan` write it) runs as `pipelined_scan` with S = the axis size
    stages and `microbatches` microbatches; the model code is unchanged and plain `jax.jit`
    of the step still runs the plain scan. The tactic then tiles the stacked layer inputs
    (the parameters, and by propagation their gradients and optimizer state) and the stage
    state on their stage dimension over `axis`; everything outside the loop is left to the
    other tactics (`axis` is free for them to use as data parallelism).
    """

    axis: str = "stage"
    microbatches: int = 4
    schedule: str = "gpipe"
    repeats: int = 1
    name: str = "PP"
    # Debugging: the pipeline's idle (bubble) slots start as NaN instead of zeros; results
    # must not change (tests/test_pipeline.py checks they do not).
    poison_bubbles: bool = False
    # The shape of the loop the last trace pipelined (`bubble`); for reading only: each
    # trace's run keeps its own (`_PipelineRun`), so nothing partitions from this.
    last_found: PipelineShape | None = field(default=None, init=False, repr=False,
                                             compare=False)

    def __post_init__(self):
        if self.schedule not in ("gpipe", "circular"):
            asked = str(self.schedule).lower()
            what = "is not built yet" if asked in _UNBUILT_SCHEDULES else "is unknown"
            hint = f" (did you mean {asked!r}?)" if asked in ("gpipe", "circular") else ""
            raise PartitionError(f"{self.name}: schedule {self.schedule!r} {what}{hint} "
                                 f"(available: 'gpipe', 'circular'; docs/pipeline_design.md "
                                 f"says what '1f1b' would take)")
        if self.schedule == "gpipe" and self.repeats != 1:
            raise PartitionError(f"{self.name}: repeats={self.repeats} needs "
                                 f"schedule='circular' (GPipe passes through the stages once)")
        if self.repeats < 1:
            raise PartitionError(f"{self.name}: repeats must be >= 1, got {self.repeats}")
        if self.microbatches < 1:
            raise PartitionError(f"{self.name}: microbatches must be >= 1, got "
                                 f"{self.microbatches}")

    def trace_hook(self, mesh) -> _PipelineHook:
        try:
            stages = Mesh.of(mesh).axis_size(self.axis)
        except PartitionError as e:
            raise PartitionError(f"{self.name}: {e}") from None
        return _PipelineHook(self, stages)

    def apply(self, ctx: TacticContext) -> None:
        """Untraced (a StableHLO file, or a step traced without this tactic's hook): there
        is no layer loop to pipeline."""
        _PipelineRun(self, _LayerLoop()).apply(ctx)

    @property
    def bubble(self) -> float | None:
        """The idle fraction of the pipeline found in the last trace."""
        return None if self.last_found is None else self.last_found.bubble


@dataclass(frozen=True, eq=False)
class _PipelineRun(LoopRun):
    """PP on one trace: the tactic's options with what that trace found (`_LayerLoop`)."""

    tactic: PipelineParallel
    loop: _LayerLoop

    def apply(self, ctx: TacticContext) -> None:
        pp, loop = self.tactic, self.loop
        ctx.mesh.check_axis(pp.axis)
        if loop.found is None or LAYERS_TAG not in ctx.state.tags:
            raise no_layer_loop(pp.name, "pipelines", loop.passed_over)
        if ctx.mesh.axis_size(pp.axis) == 1:
            # One stage: gradient accumulation over the microbatches, nothing to place on
            # stages (tiling on an axis of one device would only add no-op collectives).
            ctx.state.notes.append(self.describe())
            return
        leaves = {leaf.value: leaf for leaf in ctx.leaves}
        for v in ctx.state.tagged(LAYERS_TAG):
            source = v.producer.operands[0]
            target = leaves.get(source, v)  # the argument itself where the tag names one
            if ctx.state.dim_of(target.value if target is not v else v, pp.axis) is None:
                ctx.tile(target, 0, pp.axis)
        for v in ctx.state.tags.get(STATE_TAG, []):
            if ctx.state.dim_of(v, pp.axis) is None:
                ctx.tile(v, 0, pp.axis)
        ctx.state.notes.append(self.describe())

    def finish(self, state) -> None:
        """After the whole schedule: where the batch is tiled (data parallelism from BP on
        other axes), each microbatch must be tiled alike, else the pipeline would run every
        microbatch whole on each data-parallel device (right numbers, no data parallelism)."""
        pp, batch_size = self.tactic, self.loop.batch
        for batch, micro in zip(state.tags.get(BATCH_TAG, []), state.tags.get(MICRO_TAG, [])):
            # Axes of one device split nothing (a microbatch of one row is whole on them).
            data = [a for a, d in state.tiles_of(batch)
                    if d == 0 and a != pp.axis and state.mesh.axis_size(a) > 1]
            along = [a for a, d in state.tiles_of(micro) if d == 1]
            missing = [a for a in data if a not in along]
            if missing:
                n = state.mesh.product(data)
                raise PartitionError(
                    f"{pp.name}: the batch of {batch_size} is split {n} ways over {data} "
                    f"(data parallelism), but its {pp.microbatches} microbatches of "
                    f"{batch_size // pp.microbatches} are not: choose microbatches so that "
                    f"{batch_size} is divisible by microbatches x {n}")

    def describe(self) -> str:
        """The report's line: the pipeline's shape, its bubble and what each stage holds."""
        pp, shape = self.tactic, self.loop.found
        S, M, L, R = shape.stages, shape.microbatches, shape.layers, shape.repeats
        per = L // (S * R)
        layout = (f"{S} stages of {L // S} layer{'s' if L // S > 1 else ''}" if R == 1 else
                  f"{S} stages of {R} chunks of {per} layer{'s' if per > 1 else ''} "
                  f"(stage s: chunks s, s+{S}, ...)")
        formula = "(S-1)/(M+S-1)" if R == 1 else "(S-1)/(M·R+S-1)"
        if S == 1:
            return (f"gradient accumulation over {pp.axis!r} (one stage of {L} "
                    f"layer{'s' if L > 1 else ''}): {M} microbatches of {self.loop.batch // M}, "
                    f"run one after another; the activations of all {M} are kept until the "
                    f"backward pass")
        return (f"pipeline ({pp.schedule}) over {pp.axis!r}: {layout}, {M} microbatches "
                f"of {self.loop.batch // M}, {shape.iterations} iterations, bubble {formula} = "
                f"{shape.bubble:.1%}; each stage keeps the activations of all {M} "
                f"microbatches until the backward pass")
