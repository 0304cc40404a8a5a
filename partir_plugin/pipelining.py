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

from .core.actions import TacticContext
from .core.mesh import Mesh
from .errors import PartitionError
from .markers import interleave, roll, tag

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


def pipelined_scan(body: Callable, carry, xs, *, stages: int, microbatches: int,
                   repeats: int = 1, scan: Callable = lax.scan, fill: float = 0.0,
                   layer: LayerTrace | None = None):
    """`lax.scan(body, carry, xs)` over stacked layers as a GPipe pipeline (`repeats` > 1: the
    circular schedule, stage s holding layer chunks s, s+S, ..., each microbatch passing
    through the stages R times); returns
    `(final carry, ys)` like the scan, for a body whose per-layer outputs `ys` hold no arrays
    (None, or Flax's empty tuples).

    Every leaf of `carry` has the batch as its leading dimension; every leaf of `xs` the L
    layers. `body(carry, x) -> (carry, None)`. `scan` runs the loops (the real `lax.scan`
    while the PP tactic's trace hook replaces it). The stacked layer inputs are tagged
    `LAYERS_TAG`, the stage state `STATE_TAG` (for the tactic to find). `fill` is what the
    stage state and output buffer hold before anything is written (NaN proves that no bubble
    slot reaches the results). `layer`: the body already traced (`LayerTrace.of`).
    """
    carry_leaves = jax.tree.leaves(carry)
    xs_leaves = jax.tree.leaves(xs)
    if not carry_leaves or not xs_leaves:
        raise PartitionError("PP: the layer loop must carry activations and scan stacked "
                             "per-layer inputs (parameters)")
    batch, layers = carry_leaves[0].shape[0], xs_leaves[0].shape[0]
    if any(c.ndim == 0 or c.shape[0] != batch for c in carry_leaves):
        raise PartitionError("PP: every carried value of the layer loop needs the batch as "
                             "its leading dimension")
    shape = PipelineShape(stages, microbatches, layers, repeats)
    _check(shape, batch)
    S, M, R = stages, microbatches, repeats
    mb = batch // M
    # [L, ...] -> [S, R, L/(S·R), ...]: stage s holds chunks s, s+S, ... (R = 1: layers
    # s*L/S ... (s+1)*L/S - 1); `interleave` moves the chunks to their stages.
    stacked = jax.tree.map(
        lambda a: (interleave(_tagged(a, LAYERS_TAG), R, S) if R > 1
                   else _tagged(a, LAYERS_TAG)).reshape(S, R, layers // (S * R),
                                                        *a.shape[1:]), xs)
    # [B, ...] -> [M, B/M, ...], strided: microbatch m is rows m, m+M, ...
    micro = jax.tree.map(lambda c: _tagged(jnp.swapaxes(_tagged(c, BATCH_TAG).reshape(
        mb, M, *c.shape[1:]), 0, 1), MICRO_TAG), carry)
    stage = jnp.arange(S)

    outputs = _layer_outputs(body, carry, xs, scan, layer or LayerTrace.of(body, carry, xs))

    def run_stage(h, layer_inputs):
        def layer(h, x):
            return body(h, x)[0], None

        return scan(layer, h, layer_inputs)[0]

    def where_stage(mask, a, b):
        return jnp.where(mask.reshape(-1, *([1] * (a.ndim - 1))), a, b)

    def chunk(t):
        """Each stage's layers for the pass it is in at iteration t."""
        r = jnp.clip((t - stage) // M, 0, R - 1)
        chosen = jax.tree.map(lambda w: w[:, 0], stacked)
        for i in range(1, R):
            chosen = jax.tree.map(lambda c, w, i=i: where_stage(r == i, w[:, i], c),
                                  chosen, stacked)
        return chosen

    def step(loop, t):
        state, outs, circ = loop
        k = t - stage  # the step each stage works on: microbatch k mod M, pass k div M
        valid = (k >= 0) & (k < M * R)
        first = jax.tree.map(lambda m: lax.dynamic_index_in_dim(m, jnp.minimum(t, M - 1), 0,
                                                                keepdims=True), micro)
        if R > 1:  # later passes re-enter stage 0 from the recirculation buffer
            again = jax.tree.map(lambda c: lax.dynamic_index_in_dim(c, t % M, 1, False), circ)
            first = jax.tree.map(lambda f, a: jnp.where(t < M, f, a), first, again)
        inputs = jax.tree.map(lambda f, s: where_stage(stage == 0, jnp.broadcast_to(f, s.shape),
                                                       s), first, state)
        inputs = jax.tree.map(lambda s: where_stage(valid, s, jnp.zeros_like(s)), inputs)
        out = jax.vmap(run_stage)(inputs, chunk(t))
        shifted = jax.tree.map(lambda y: roll(y, 1, axis=0), out)
        # What the last stage finished: microbatch `done` of pass `last`.
        k_last = t - (S - 1)
        done = jnp.clip(k_last, 0, M * R - 1) % M
        last = jnp.clip(k_last, 0, M * R - 1) // M
        if R > 1:  # not its last pass: into stage 0's slot `done` of the buffer
            back = (stage == 0) & (k_last >= 0) & (last < R - 1)
            circ = jax.tree.map(
                lambda c, y: where_stage(back, lax.dynamic_update_index_in_dim(
                    c, y[:, None], done, 1), c), circ, shifted)
        # Its last pass goes to its slot of the output buffer. The buffer has a stage
        # dimension too, so each stage writes only its own (local) block and only the last
        # stage's block is kept: no stage reads another's block in the loop.
        keep = (stage == S - 1) & (k_last >= 0) & (last == R - 1)
        outs = jax.tree.map(
            lambda o, y: where_stage(keep, lax.dynamic_update_index_in_dim(o, y[:, None], done, 1),
                                     o),
            outs, out)
        return (shifted, outs, circ), None

    state0 = jax.tree.map(lambda m: _tagged(jnp.full((S, *m.shape[1:]), fill, m.dtype),
                                            STATE_TAG), micro)
    outs0 = jax.tree.map(lambda m: jnp.full((S, *m.shape), fill, m.dtype), micro)
    circ0 = jax.tree.map(lambda m: jnp.full((S, *m.shape), fill, m.dtype), micro) if R > 1 \
        else ()
    (_, outs, _), _ = scan(step, (state0, outs0, circ0), jnp.arange(shape.iterations))
    # The last stage's block, taken as a masked sum over stages (one reduction over the stage
    # axis once partitioned, rather than a gather of every stage's block).
    outs = jax.tree.map(lambda o: jnp.sum(where_stage(stage == S - 1, o, jnp.zeros_like(o)),
                                          axis=0), outs)
    final = jax.tree.map(lambda o: jnp.swapaxes(o, 0, 1).reshape(batch, *o.shape[2:]), outs)
    return final, outputs


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
        tainted = set(closed.jaxpr.invars[:len(jax.tree.leaves(carry))])
        for eqn in closed.jaxpr.eqns:
            if any(v in tainted for v in eqn.invars if not isinstance(v, jex_core.Literal)):
                tainted.update(eqn.outvars)
        return cls(closed, shapes, frozenset(tainted))

    def outputs_depend_on_carry(self) -> bool:
        n_carry = len(jax.tree.leaves(self.shapes[0]))
        return any(v in self.tainted for v in self.jaxpr.jaxpr.outvars[n_carry:])


def _layer_outputs(body: Callable, carry, xs, scan: Callable, layer: LayerTrace):
    """The scan's per-layer outputs `ys`, where the pipeline can give them: none (Flax
    `nn.scan`'s empty tuples come back as they are), or outputs that do not depend on the
    carried activations (`nnx.scan` returns each layer's module state), computed by a plain
    scan over the layers with the carry left at zeros, whose unused activations XLA drops.
    Outputs computed from the activations would have to be pipelined too: refused."""
    outs = layer.shapes[1]
    if not jax.tree.leaves(outs):
        return outs
    if layer.outputs_depend_on_carry():
        raise PartitionError("PP: the layer loop returns per-layer outputs computed from the "
                             "activations; a pipelined loop supports per-layer outputs that "
                             "depend only on the layers' own inputs (a module's state)")
    zeros = jax.tree.map(jnp.zeros_like, carry)
    return scan(lambda c, x: (c, body(zeros, x)[1]), (), xs)[1]


class PipelineWarning(UserWarning):
    """Pipelining changes what the step computes (batch-coupled ops in the layer body)."""


_BATCH_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
                               "reduce_and", "reduce_or", "argmax", "argmin", "cumsum",
                               "cumprod", "cummax", "cummin", "cumlogsumexp"})


def batch_coupled_ops(layer: LayerTrace, batch: int) -> list[str]:
    """The reductions in one layer whose reduced axes include a leading dimension of size
    `batch` of a value computed from the carry: rows of a microbatch would see only their
    microbatch (batch norm's statistics). A heuristic: a non-batch dimension of the same size
    counts too, so it warns, never refuses."""
    found: list[str] = []

    def visit(eqns, tainted) -> None:
        for eqn in eqns:
            if not any(v in tainted for v in eqn.outvars):
                continue
            axes = eqn.params.get("axes", (eqn.params.get("axis"),))
            operand = eqn.invars[0].aval
            if (eqn.primitive.name in _BATCH_REDUCTIONS and getattr(operand, "ndim", 0)
                    and operand.shape[0] == batch and 0 in tuple(axes or ())):
                found.append(eqn.primitive.name)
            for sub in jex_core.jaxprs_in_params(eqn.params):  # inside: every value counts
                visit(sub.eqns, _Everything())

    visit(layer.jaxpr.jaxpr.eqns, layer.tainted)
    return sorted(set(found))


class _Everything:
    """A set holding every value (the tainted values inside a tainted call)."""

    def __contains__(self, _) -> bool:
        return True


class _LayerLoopHook:
    """While the step is traced: the first `jax.lax.scan` over stacked layers (every `xs` leaf
    with the same leading length, every carried leaf batch-major) becomes a pipelined loop.
    Scans inside it, and every scan after it, are left alone."""

    def __init__(self, tactic: PipelineParallel, stages: int):
        self.tactic, self.stages = tactic, stages
        self.inside = False

    def __enter__(self):
        self.original = jax.lax.scan
        self.tactic.found = None
        jax.lax.scan = self.scan
        return self

    def __exit__(self, *exc):
        jax.lax.scan = self.original

    def qualifies(self, init, xs, reverse: bool) -> bool:
        xs_leaves, carry_leaves = jax.tree.leaves(xs), jax.tree.leaves(init)
        return (not reverse and bool(xs_leaves) and bool(carry_leaves)
                and all(getattr(x, "ndim", 0) >= 1 for x in xs_leaves + carry_leaves)
                and len({x.shape[0] for x in xs_leaves}) == 1
                and len({c.shape[0] for c in carry_leaves}) == 1)

    def scan(self, f, init, xs=None, length=None, reverse=False, unroll=1, **kwargs):
        if self.inside or self.tactic.found is not None or not self.qualifies(init, xs,
                                                                                reverse):
            return self.original(f, init, xs, length=length, reverse=reverse, unroll=unroll,
                                 **kwargs)
        layers = jax.tree.leaves(xs)[0].shape[0]
        batch = jax.tree.leaves(init)[0].shape[0]
        layer = LayerTrace.of(f, init, xs)
        coupled = batch_coupled_ops(layer, batch)
        if coupled:
            warnings.warn(f"{self.tactic.name}: the layer body reduces over the batch "
                          f"dimension ({', '.join(coupled)}): microbatching computes those "
                          f"statistics per microbatch of {batch // self.tactic.microbatches}, "
                          f"not over the batch of {batch} (e.g. batch norm), so results may "
                          f"differ from the unpipelined step", PipelineWarning, stacklevel=2)
        self.tactic.found = PipelineShape(self.stages, self.tactic.microbatches, layers,
                                          self.tactic.repeats)
        self.tactic.batch = batch
        self.inside = True
        try:
            return pipelined_scan(f, init, xs, stages=self.stages,
                                  microbatches=self.tactic.microbatches,
                                  repeats=self.tactic.repeats, scan=self.original,
                                  layer=layer,
                                  fill=float("nan") if self.tactic.poison_bubbles else 0.0)
        finally:
            self.inside = False


@dataclass
class PipelineParallel:
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
    found: PipelineShape | None = field(default=None, init=False, repr=False)
    batch: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.schedule not in ("gpipe", "circular"):
            raise PartitionError(f"{self.name}: schedule {self.schedule!r} is not built yet "
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

    def trace_hook(self, mesh) -> _LayerLoopHook:
        return _LayerLoopHook(self, Mesh.of(mesh).axis_size(self.axis))

    def apply(self, ctx: TacticContext) -> None:
        ctx.mesh.check_axis(self.axis)
        if self.found is None or LAYERS_TAG not in ctx.state.tags:
            raise PartitionError(
                f"{self.name}: no layer loop found: PP pipelines a `jax.lax.scan` over stacked "
                f"layers (parameters with a leading [L] dimension passed as the scan's xs, "
                f"a batch-major carry), as Flax nn.scan, nnx.scan or a plain lax.scan write "
                f"it; the traced step has none")
        leaves = {leaf.value: leaf for leaf in ctx.leaves}
        for v in ctx.state.tagged(LAYERS_TAG):
            source = v.producer.operands[0]
            target = leaves.get(source, v)  # the argument itself where the tag names one
            if ctx.state.dim_of(target.value if target is not v else v, self.axis) is None:
                ctx.tile(target, 0, self.axis)
        for v in ctx.state.tags.get(STATE_TAG, []):
            if ctx.state.dim_of(v, self.axis) is None:
                ctx.tile(v, 0, self.axis)
        ctx.state.notes.append(self.describe())

    def finish(self, state) -> None:
        """After the whole schedule: where the batch is tiled (data parallelism from BP on
        other axes), each microbatch must be tiled alike, else the pipeline would run every
        microbatch whole on each data-parallel device (right numbers, no data parallelism)."""
        for batch, micro in zip(state.tags.get(BATCH_TAG, []), state.tags.get(MICRO_TAG, [])):
            data = [a for a, d in state.tiles_of(batch) if d == 0 and a != self.axis]
            along = [a for a, d in state.tiles_of(micro) if d == 1]
            missing = [a for a in data if a not in along]
            if missing:
                n = state.mesh.product(data)
                raise PartitionError(
                    f"{self.name}: the batch of {self.batch} is split {n} ways over {data} "
                    f"(data parallelism), but its {self.microbatches} microbatches of "
                    f"{self.batch // self.microbatches} are not: choose microbatches so that "
                    f"{self.batch} is divisible by microbatches x {n}")

    def describe(self) -> str:
        """The report's line: the pipeline's shape, its bubble and what each stage holds."""
        shape = self.found
        S, M, L, R = shape.stages, shape.microbatches, shape.layers, shape.repeats
        per = L // (S * R)
        layout = (f"{S} stages of {L // S} layer{'s' if L // S > 1 else ''}" if R == 1 else
                  f"{S} stages of {R} chunks of {per} layer{'s' if per > 1 else ''} "
                  f"(stage s: chunks s, s+{S}, ...)")
        formula = "(S-1)/(M+S-1)" if R == 1 else "(S-1)/(M·R+S-1)"
        return (f"pipeline ({self.schedule}) over {self.axis!r}: {layout}, {M} microbatches "
                f"of {self.batch // M}, {shape.iterations} iterations, bubble {formula} = "
                f"{shape.bubble:.1%}; each stage keeps the activations of all {M} "
                f"microbatches until the backward pass")

    @property
    def bubble(self) -> float | None:
        """The idle fraction of the pipeline found in the last trace."""
        return None if self.found is None else self.found.bubble
