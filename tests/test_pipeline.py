"""Issue 22: pipeline parallelism (the PP tactic, GPipe) and the rotation it is built on
(`partir_plugin.roll`). Every partitioned result is compared with the unpartitioned
`jax.jit` of the same step: loss, parameters and optimizer state."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from oracle import assert_close, assert_matches_jax_jit, hlo_collective_counts

import partir_plugin as partir
from partir_plugin.models import megatron, transformer
from partir_plugin.tactics.pipeline_parallel import PipelineShape, pipelined_scan, schedule_table

pytestmark = pytest.mark.slow  # compiles pipelined train steps

# -- roll: a rotation of a tiled dimension is a rotation of blocks ----------------------------

@pytest.mark.parametrize("shift", [1, 3, 4, -1, 15])
@pytest.mark.parametrize("mesh,axes", [({"m": 4}, ("m",)), ({"a": 2, "b": 4}, ("a", "b"))])
def test_roll_of_a_tiled_dimension_permutes_blocks(shift, mesh, axes):
    w = jnp.arange(16.0)[:, None] * jnp.ones((1, 6))

    def f(x):
        return (partir.roll(jnp.sin(x), shift, 0) * w).sum()

    step = jax.value_and_grad(f)
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 6))
    schedule = [partir.ManualPartition({"x": 0}, axis=a) for a in axes]
    fn, meta = partir.jit(step, mesh, schedule)
    assert_close(fn(x), jax.jit(step)(x))
    counts = meta.tactics[-1].collectives
    assert counts.get("all_gather", 0) == 0
    # Device p gets block p-q (unless q is a multiple of the n blocks) and, for a shift that
    # is not whole blocks, a piece of block p-q-1; the backward pass rolls back the same way.
    n = 4 if len(axes) == 1 else 8
    q, r = divmod(shift % 16, 16 // n)
    assert counts["all_permute"] == 2 * ((q % n != 0) + (r != 0 and (q + 1) % n != 0))
    compiled = hlo_collective_counts(fn.lower(x).compile().as_text())
    assert compiled["all_permute"] >= 1 and not compiled["all_gather"]


def test_roll_is_jnp_roll_under_jax_jit():
    x = jnp.arange(24.0).reshape(6, 4)
    np.testing.assert_array_equal(jax.jit(lambda x: partir.roll(x, 2, 1))(x), jnp.roll(x, 2, 1))
    g = jax.grad(lambda x: (partir.roll(x, -1, 0) * jnp.arange(6.0)[:, None]).sum())(x)
    np.testing.assert_array_equal(g, jnp.roll(jnp.broadcast_to(jnp.arange(6.0)[:, None],
                                                               (6, 4)), 1, 0))


# -- the pipelined loop under plain jax.jit -------------------------------------------------

def _stack(seed=0, layers=8, d=16, f=32, batch=32):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    params = {"w1": jax.random.normal(k[0], (layers, d, f)) / 4,
              "w2": jax.random.normal(k[1], (layers, f, d)) / 6}
    return params, jax.random.normal(k[2], (batch, d)), jax.random.normal(k[3], (batch, d))


def _layer(h, p):
    return h + jnp.tanh(h @ p["w1"]) @ p["w2"], None


@pytest.mark.parametrize("stages,microbatches", [
    (4, 4), (4, 8), pytest.param(2, 4, marks=pytest.mark.exhaustive),
    pytest.param(8, 8, marks=pytest.mark.exhaustive)])
def test_pipelined_scan_equals_the_scan(stages, microbatches):
    params, x, y = _stack()

    def loss(params, x, scan):
        return jnp.mean((scan(_layer, x, params)[0] - y) ** 2)

    pipelined = lambda f, c, xs: pipelined_scan(f, c, xs, stages=stages,
                                                microbatches=microbatches)
    assert_close(jax.jit(jax.value_and_grad(lambda p, x: loss(p, x, pipelined)))(params, x),
                  jax.jit(jax.value_and_grad(lambda p, x: loss(p, x, lax.scan)))(params, x))


@pytest.mark.parametrize("stages,microbatches", [(4, 4), (4, 8), (2, 4), (8, 3)])
def test_bubble_is_the_closed_form(stages, microbatches):
    shape = PipelineShape(stages, microbatches, layers=8)
    table = schedule_table(stages, microbatches)
    assert len(table) == shape.iterations == microbatches + stages - 1
    # Every stage sees every microbatch once, in order.
    for s in range(stages):
        assert [row[s] for row in table if row[s] is not None] == list(range(microbatches))
    assert shape.bubble == pytest.approx((stages - 1) / (microbatches + stages - 1))


# -- the PP tactic on the paper's transformer (scan variant, 8 layers) -----------------------

CONFIG = dataclasses.replace(transformer.Config.small(layers=8, scan=True), batch=16)


@pytest.fixture(scope="module")
def model():
    params, opt_state, batch = transformer.init(CONFIG, jax.random.PRNGKey(0))
    want = jax.jit(transformer.make_train_step(CONFIG))(params, opt_state, batch)
    return (params, opt_state, batch), want


def _pipelined(model, mesh, schedule):
    args, want = model
    fn, meta = partir.jit(transformer.make_train_step(CONFIG), mesh, schedule)
    assert_close(fn(*args), want)
    return fn, meta


def _stage_sharded(meta, axis="stage"):
    """Every stacked block parameter and its Adam moments are tiled on their layer dim over
    `axis` first (Z3 may tile the stage's layers further)."""
    params, opt_state = meta.in_shardings[0], meta.in_shardings[1]

    def on_stage(sharding):
        first = sharding.spec[0] if sharding.spec else None
        return first == axis or (isinstance(first, tuple) and first[0] == axis)

    blocks = jax.tree.leaves(params["blocks"])
    moments = [s for s in jax.tree.leaves(opt_state) if on_stage(s)]
    return (all(on_stage(s) for s in blocks)
            and len(moments) >= 2 * len(blocks))  # mu and nu of every stacked parameter


@pytest.mark.parametrize("microbatches", [4, pytest.param(8, marks=pytest.mark.exhaustive)])
def test_pp_bp_gives_jax_jit_numbers_with_stages_holding_their_layers(model, microbatches):
    pp = partir.tactic("PP", axis="stage", microbatches=microbatches)
    fn, meta = _pipelined(model, {"stage": 4, "batch": 2},
                          [pp, partir.tactic("BP", axis="batch")])
    assert _stage_sharded(meta)
    assert pp.bubble == pytest.approx(3 / (microbatches + 3))
    assert f"bubble (S-1)/(M+S-1) = {3 / (microbatches + 3):.1%}" in meta.report()
    row = meta.tactics[0]
    assert row.collectives.get("all_gather", 0) == 0 and row.collectives["all_permute"] == 2
    compiled = fn.lower(*model[0]).compile()
    counts = hlo_collective_counts(compiled.as_text())
    assert counts["all_permute"] >= 2 and not counts["all_gather"]
    # Each device holds a quarter of the stacked layers (not all of them).
    stack = sum(x.nbytes for x in jax.tree.leaves(model[0][0]["blocks"]))
    assert compiled.memory_analysis().argument_size_in_bytes < 3 * stack / 4 + (
        sum(x.nbytes for x in jax.tree.leaves(model[0])) - 3 * stack)


def test_circular_schedule_gives_jax_jit_numbers_with_interleaved_stages(model):
    """Circular with R = 2: stage s holds layer chunks s and s+4 (the stack's chunks move to
    their stages by collective_permutes inside the step, never gathered), each microbatch
    passes through the stages twice, the bubble is (S-1)/(M·R+S-1)."""
    pp = partir.tactic("PP", axis="stage", microbatches=4, schedule="circular", repeats=2)
    fn, meta = _pipelined(model, {"stage": 4, "batch": 2},
                          [pp, partir.tactic("BP", axis="batch")])
    assert _stage_sharded(meta)
    assert pp.bubble == pytest.approx(3 / (4 * 2 + 3))
    assert "bubble (S-1)/(M·R+S-1) = 27.3%" in meta.report()
    row = meta.tactics[0]
    assert row.collectives.get("all_gather", 0) == 0 and row.collectives["all_permute"] > 2
    counts = hlo_collective_counts(fn.lower(*model[0]).compile().as_text())
    assert counts["all_permute"] >= 2 and not counts["all_gather"]


@pytest.mark.parametrize("stages,microbatches,repeats", [
    (4, 4, 2), pytest.param(4, 8, 2, marks=pytest.mark.exhaustive), (2, 2, 4)])
def test_circular_pipelined_scan_equals_the_scan(stages, microbatches, repeats):
    params, x, y = _stack()

    def loss(params, x, scan):
        return jnp.mean((scan(_layer, x, params)[0] - y) ** 2)

    pipelined = lambda f, c, xs: pipelined_scan(f, c, xs, stages=stages,
                                                microbatches=microbatches, repeats=repeats)
    assert_close(jax.jit(jax.value_and_grad(lambda p, x: loss(p, x, pipelined)))(params, x),
                  jax.jit(jax.value_and_grad(lambda p, x: loss(p, x, lax.scan)))(params, x))
    assert PipelineShape(stages, microbatches, 8, repeats).bubble == pytest.approx(
        (stages - 1) / (microbatches * repeats + stages - 1))


def test_interleave_moves_chunks_between_devices():
    """`interleave` on a stack tiled over its stages: jax.jit's numbers, forward and inverse
    with their gradients, by collective_permutes; a tiling that is not one block per stage
    gathers, reorders and slices back."""
    from partir_plugin.markers import interleave

    x = jax.random.normal(jax.random.PRNGKey(0), (16, 3))
    w = jnp.arange(48.0).reshape(16, 3)
    for repeats, stages, mesh, permutes in [(2, 4, {"s": 4}, True), (4, 2, {"s": 2}, True),
                                            (2, 2, {"s": 4}, False)]:
        for inverse in (False, True):
            def f(x, r=repeats, s=stages, inv=inverse):
                y = interleave(x, r, s, inv)
                return jax.value_and_grad(lambda x: (jnp.sin(
                    interleave(x, r, s, inv)) * w).sum())(x), y

            fn, meta = partir.jit(f, mesh, [partir.ManualPartition({"x": 0}, axis="s")])
            assert_close(fn(x), jax.jit(f)(x))
            counts = meta.tactics[-1].collectives
            assert bool(counts["all_permute"]) == permutes
            assert bool(counts["all_gather"]) != permutes


def test_pp_bp_mp_and_pp_bp_z3_compose(model):
    mp = partir.tactic("MP", rule=megatron.transformer_rule, axis="model")
    _, meta = _pipelined(model, {"stage": 2, "batch": 2, "model": 2},
                         [partir.tactic("PP", axis="stage", microbatches=4),
                          partir.tactic("BP", axis="batch"), mp])
    assert _stage_sharded(meta)
    assert meta.tactics[0].collectives.get("all_gather", 0) == 0
    _, meta = _pipelined(model, {"stage": 4, "batch": 2},
                         [partir.tactic("PP", axis="stage", microbatches=4),
                          partir.tactic("BP", axis="batch"), partir.tactic("Z3", axis="batch")])
    assert _stage_sharded(meta)


def test_pp_composes_with_automatic_partition(model):
    _, meta = _pipelined(model, {"stage": 4, "batch": 2},
                         [partir.tactic("PP", axis="stage", microbatches=4),
                          partir.AutomaticPartition(["batch"], iterations=20)])
    assert _stage_sharded(meta)


def test_nnx_scan_layers_are_pipelined():
    """Flax NNX: blocks made with `nnx.vmap`, run with `nnx.scan`, whose per-layer outputs (each
    block's state) the pipelined loop returns as the scan does; jax.jit's numbers after an
    SGD step, the stacked kernels on their stages."""
    import benchmark_module

    program = benchmark_module.load("external_models").flax_nnx_scan()  # 3 blocks, batch 16
    args = (program.params, program.opt_state, program.batch)
    fn, meta = partir.jit(program.train_step, {"stage": 3},
                          [partir.tactic("PP", axis="stage", microbatches=4)])
    assert_close(fn(*args), jax.jit(program.train_step)(*args))
    kernels = [s for s in jax.tree.leaves(meta.in_shardings[0]["blocks"]) if s.spec]
    assert kernels and all(s.spec[0] == "stage" for s in kernels)


def test_a_stage_axis_of_one_device_is_gradient_accumulation(model):
    """PP on a stage axis of size 1: the layers run once per microbatch (no stages, nothing
    tiled on the axis, so no collective over it), jax.jit's numbers, each microbatch of 8 rows
    split over the 8 data-parallel devices."""
    _, meta = _pipelined(model, {"stage": 1, "batch": 8},
                         [partir.tactic("PP", axis="stage", microbatches=2),
                          partir.tactic("BP", axis="batch")])
    assert "gradient accumulation over 'stage' (one stage of 8 layers): 2 microbatches of 8" \
        in meta.report()
    assert meta.tactics[0].collectives.get("all_gather", 0) == 0
    assert meta.tactics[-1].collectives.get("all_gather", 0) == 0


def test_microbatches_of_one_row(model):
    """16 microbatches of one row each, with a data axis of one device (the configuration
    Megatron-LM's largest runs use): jax.jit's numbers."""
    mp = partir.tactic("MP", rule=megatron.transformer_rule, axis="model")
    _, meta = _pipelined(model, {"stage": 4, "data": 1, "model": 2},
                         [partir.tactic("PP", axis="stage", microbatches=16),
                          partir.tactic("BP", axis="data"), mp])
    assert "16 microbatches of 1," in meta.report()
    assert _stage_sharded(meta)


def test_microbatches_of_one_row_at_the_papers_scale_are_estimated():
    """[PP(stage, microbatches=32), BP(data), MP(model)] on {stage: 8, data: 1, model: 8} with
    a batch of 32 (Megatron-LM's 1T configuration, at small widths): partitioned and simulated
    from abstract arguments, nothing run; it used to be refused ("choose microbatches so that
    32 is divisible by microbatches x 1")."""
    from partir_plugin.core.mesh import Mesh
    from partir_plugin.frontend.trace import trace
    from partir_plugin.plugin.resolve import simulate
    from partir_plugin.stages import partition

    cfg = dataclasses.replace(CONFIG, batch=32, heads=8)
    args = jax.eval_shape(lambda key: transformer.init(cfg, key), jax.random.PRNGKey(0))
    mesh = Mesh.of({"stage": 8, "data": 1, "model": 8})
    schedule = [partir.tactic("PP", axis="stage", microbatches=32),
                partir.tactic("BP", axis="data"),
                partir.tactic("MP", rule=megatron.transformer_rule, axis="model")]
    part = partition(trace(transformer.make_train_step(cfg), args, schedule, mesh), mesh,
                     schedule)
    assert any("32 microbatches of 1," in note for note in part.state.notes)
    result = simulate(part.program.func, mesh, "a100-80gb")
    assert result.runtime_s > 0 and result.collective_counts["all_permute"] > 0


def test_poisoned_bubbles_change_nothing(model):
    _pipelined(model, {"stage": 4, "batch": 2},
               [partir.tactic("PP", axis="stage", microbatches=4, poison_bubbles=True),
                partir.tactic("BP", axis="batch")])


# -- gradients accumulated in loops are reduced once ---------------------------------------

def _reductions_in_loops(fn, args, axis: str) -> tuple[int, int]:
    """(all_reduces over `axis` inside while bodies, outside them) in our device-local
    program."""
    from partir_plugin.extend import collective_axes, collective_kind

    program = fn.partition(args).partitioned.program

    def count(ops, inside):
        n = [0, 0]
        for op in ops:
            if collective_kind(op) == "all_reduce" and axis in collective_axes(op):
                n[inside] += 1
            for region in op.regions:
                for block in region.blocks:
                    sub = count(block.ops, inside or op.name == "stablehlo.while")
                    n = [n[0] + sub[0], n[1] + sub[1]]
        return n

    outside, inside = count(program.func.body.ops, False)
    return inside, outside


def test_data_parallel_gradients_of_a_layer_scan_are_reduced_after_the_loop(model):
    """BP alone on the scanned transformer: each stacked weight gradient is a partial sum over
    the batch axis accumulated by the backward loop; it stays pending through the loop and is
    all-reduced once after it, not once per layer."""
    args, want = model
    fn, meta = partir.jit(transformer.make_train_step(CONFIG), {"batch": 8},
                          [partir.tactic("BP", axis="batch")])
    assert_close(fn(*args), want)
    inside, outside = _reductions_in_loops(fn, args, "batch")
    assert inside == 0 and outside >= len(jax.tree.leaves(args[0]["blocks"]))


def test_pipelined_gradients_are_reduced_over_the_data_axis_once(model):
    args, _ = model
    fn, _ = _pipelined(model, {"stage": 4, "batch": 2},
                       [partir.tactic("PP", axis="stage", microbatches=4),
                        partir.tactic("BP", axis="batch")])
    inside, _ = _reductions_in_loops(fn, args, "batch")
    assert inside == 0
    # XLA combines the reductions after the loop; over the batch groups ({0,1}, {2,3}, ...)
    # no all-reduce is left in a loop body of the compiled program either.
    text = fn.lower(*args).compile().as_text()
    bodies = set(re.findall(r"body=%([\w.\-]+)", text))
    assert bodies
    computations = {m.group(1): m.group(0) for m in
                    re.finditer(r"(?ms)^%([\w.\-]+) .*?^}", text)}
    in_bodies = [computations[b] for b in bodies if b in computations]
    assert len(in_bodies) == len(bodies)
    assert not any(re.search(r"all-reduce(-start)?\(.*replica_groups=\{\{0,1\}", c)
                   for c in in_bodies)


# -- errors ----------------------------------------------------------------------------------

def test_pp_errors_name_the_tactic(model):
    args, _ = model
    step = transformer.make_train_step(CONFIG)
    with pytest.raises(partir.PartitionError, match="PP: 8 stacked layers do not divide "
                                                    "into 3 stages"):
        partir.jit(step, {"stage": 3}, [partir.tactic("PP", axis="stage")])[0].lower(*args)
    with pytest.raises(partir.PartitionError, match="PP: a batch of 16 does not split into "
                                                    "5 microbatches"):
        partir.jit(step, {"stage": 4}, [partir.tactic("PP", microbatches=5)])[0].lower(*args)
    unrolled = dataclasses.replace(CONFIG, scan=False)
    uargs = transformer.init(unrolled, jax.random.PRNGKey(0))
    with pytest.raises(partir.PartitionError, match="PP: no layer loop found"):
        partir.jit(transformer.make_train_step(unrolled), {"stage": 4},
                   [partir.tactic("PP")])[0].lower(*uargs)
    with pytest.raises(partir.PartitionError, match="schedule 'zero-bubble' is not built"):
        partir.tactic("PP", schedule="zero-bubble")
    with pytest.raises(partir.PartitionError, match="'GPipe' is unknown .did you mean 'gpipe'"):
        partir.tactic("PP", schedule="GPipe")
    with pytest.raises(partir.PartitionError, match="8 stacked layers do not divide into 4 "
                                                    "stages x 3 repeats"):
        partir.jit(step, {"stage": 4}, [partir.tactic(
            "PP", schedule="circular", repeats=3, microbatches=4)])[0].lower(*args)
    with pytest.raises(partir.PartitionError, match="at least as many microbatches as stages"):
        partir.jit(step, {"stage": 4}, [partir.tactic(
            "PP", schedule="circular", repeats=2, microbatches=2)])[0].lower(*args)
    with pytest.raises(partir.PartitionError, match="repeats=2 needs schedule='circular'"):
        partir.tactic("PP", repeats=2)
    # 16 rows over 4 data-parallel devices: 8 microbatches of 2 cannot each be split 4 ways.
    with pytest.raises(partir.PartitionError, match="16 is divisible by microbatches x 4"):
        partir.jit(step, {"stage": 2, "batch": 4}, [
            partir.tactic("PP", microbatches=8), partir.tactic("BP", axis="batch")]
        )[0].lower(*args)
    with pytest.raises(partir.PartitionError, match=r"^PP: axis 'stage' is not in the mesh"):
        partir.jit(step, {"batch": 4}, [partir.tactic("PP", microbatches=4)])[0].lower(*args)
    # Two PP tactics: the second used to say it found no layer loop (the first took it).
    with pytest.raises(partir.PartitionError, match=r"PP \(axis 'stage'\) and PP2 \(axis "
                                                    r"'more'\) each pipeline the layer loop"):
        partir.jit(step, {"stage": 2, "more": 2}, [
            partir.tactic("PP", microbatches=4),
            partir.tactic("PP", axis="more", microbatches=4, name="PP2")])[0].lower(*args)


def test_batch_coupled_layer_bodies_warn():
    """A layer normalising over the batch (batch norm's statistics), or reading other rows
    (a roll or a sort along the batch), computes per microbatch once pipelined: PP warns (a
    roll warned nothing and changed the numbers); a body that reduces over features does
    not, checkpointed or not, whatever the size of its weights' dimensions."""
    from partir_plugin.tactics.pipeline_parallel import PipelineWarning

    w = jax.random.normal(jax.random.PRNGKey(0), (8, 8, 8))
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 8))

    def batch_norm(h, w):
        h = h @ w
        return (h - h.mean(axis=0)) / (h.std(axis=0) + 1e-3), None

    def layer_norm(h, w):
        h = jnp.tanh(h @ w)
        return h - h.mean(axis=-1, keepdims=True), None

    def lowered(body):
        step = lambda w, x: jax.value_and_grad(lambda w: (lax.scan(body, x, w)[0] ** 2).sum())(w)
        fn, _ = partir.jit(step, {"stage": 4}, [partir.tactic("PP", microbatches=4)])
        fn.lower(w, x)

    def rolled(h, w):  # each row reads the row before it: a microbatch wraps around itself
        h = jnp.tanh(h @ w)
        return h + 0.5 * jnp.roll(h, 1, axis=0), None

    def sorted_rows(h, w):
        return jnp.sort(jnp.tanh(h @ w), axis=0), None

    with pytest.warns(PipelineWarning, match="reduces over the batch dimension"):
        lowered(batch_norm)
    for body in (rolled, sorted_rows):
        with pytest.warns(PipelineWarning, match="reads other rows of it"):
            lowered(body)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", PipelineWarning)
        lowered(layer_norm)
        lowered(jax.checkpoint(layer_norm))
        x = x[:8]  # the weights' first dimension (8), contracted, now has the batch's size
        lowered(jax.checkpoint(layer_norm))

    # The batch merged with the tokens, as an MoE router flattens them: a capacity count
    # over tokens (a cumsum) routes each microbatch on its own; a per-token layer does not.
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 4, 8))

    def capacity(h, w):
        tokens = jnp.tanh(h.reshape(-1, 8) @ w)
        position = jnp.cumsum(tokens > 0, axis=0)
        return jnp.where(position < 20, tokens, 0.0).reshape(h.shape), None

    def per_token(h, w):
        return jnp.tanh(h.reshape(-1, 8) @ w).reshape(h.shape), None

    with pytest.warns(PipelineWarning, match="cumsum"):
        lowered(capacity)

    def row_numbers(h, w):  # a mask by row number: per microbatch it counts from 0 again
        row = jnp.arange(h.shape[0], dtype=h.dtype)[:, None, None]
        return jnp.tanh((h + 0.5 * h * row).reshape(-1, 8) @ w).reshape(h.shape), None

    with pytest.warns(PipelineWarning, match="counts the batch's rows"):
        lowered(row_numbers)

    # The batch moved off dimension 0 is followed there: GShard's dispatch and combine
    # einsums (group = example) read no other rows; a roll along the moved batch does.
    def dispatch(h, w):
        probs = jax.nn.softmax(h @ w[:, :2], axis=-1)  # [G, S, 2 experts]
        disp = probs[..., None] * jax.nn.one_hot(jnp.arange(4), 4)[None, :, None, :]
        expert = jnp.tanh(jnp.einsum("gsec,gsd->egcd", disp, h))
        return h + jnp.einsum("gsec,egcd->gsd", disp, expert), None

    def rolled_moved(h, w):
        t = jnp.swapaxes(jnp.tanh(h @ w), 0, 1)  # [S, G, D]
        return h + jnp.swapaxes(jnp.roll(t, 1, axis=1), 0, 1), None

    with pytest.warns(PipelineWarning, match="reads other rows of it"):
        lowered(rolled_moved)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PipelineWarning)
        lowered(dispatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PipelineWarning)
        lowered(per_token)


def test_a_body_indexing_the_batch_with_a_numpy_array_is_refused_clearly():
    """`h[perm]` with a numpy permutation of the batch's length cannot run per microbatch;
    the error named a broadcast of the probe size (1009) the user never wrote."""
    perm = np.arange(16)[::-1]

    def step(w, x):
        return (lax.scan(lambda h, wl: (jnp.tanh(h[perm] @ wl) + h, None), x, w)[0]).sum()

    from partir_plugin.tactics.pipeline_parallel import PipelineWarning

    fn, _ = partir.jit(step, {"stage": 4}, [partir.tactic("PP", microbatches=4)])
    with pytest.warns(PipelineWarning, match="gather"), pytest.raises(
            partir.PartitionError, match=r"probe microbatch of \d+ rows.*numpy index array"):
        fn.lower(jnp.ones((8, 8, 8)), jnp.ones((16, 8)))


def test_an_auxiliary_sum_in_a_checkpointed_layer_does_not_warn():
    """A reduction over the batch that feeds only a carried sum (an auxiliary loss) is
    summed exactly over microbatches; inside `jax.checkpoint` it warned as batch-coupled."""
    from partir_plugin.tactics.pipeline_parallel import PipelineWarning

    w = jax.random.normal(jax.random.PRNGKey(0), (4, 8, 8)) / 3
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 8))

    @jax.checkpoint
    def layer(c, wl):
        h, aux = c
        y = jnp.tanh(h @ wl)
        return (y, aux + jnp.mean(y ** 2)), None

    def loss(w, x):
        (h, aux), _ = lax.scan(layer, (x, jnp.float32(0)), w)
        return jnp.sum(h ** 2) + aux

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", PipelineWarning)
        assert_matches_jax_jit(jax.value_and_grad(loss), [w, x], {"stage": 2, "batch": 4},
                               [partir.tactic("PP", microbatches=2),
                                partir.tactic("BP", inputs=("x",))])


# -- issue 34: the layer body as users write it ----------------------------------------------

@pytest.mark.parametrize("shape,dim,inner,bits", [((12, 5), 0, 1, 32), ((12, 5), 0, 1, 8),
                                                   ((3, 12, 2), 1, 1, 32), ((60,), 0, 5, 16)])
def test_microbatch_bits_are_the_rows_of_the_whole_batch_draw(shape, dim, inner, bits):
    """Microbatch m of M draws bit for bit rows m, m+M, ... of the whole batch's draw (for a
    dimension folding the batch with `inner` elements per row: those rows' elements)."""
    from partir_plugin.tactics.pipeline_parallel.microbatch_rng import Draw, microbatch_bits

    M = 4
    key = jax.random.key(7)
    whole = np.asarray(jax.random.bits(key, shape, jnp.dtype(f"uint{bits}")))
    rows = shape[dim] // inner
    local = list(shape)
    local[dim] = rows // M * inner
    for m in range(M):
        got = jax.jit(lambda k, m: microbatch_bits(
            k, bit_width=bits, shape=tuple(local), draw=Draw(dim, inner), microbatch=m,
            microbatches=M))(key, m)
        mine = np.arange(rows)[m::M]
        index = (mine[:, None] * inner + np.arange(inner)).reshape(-1)
        np.testing.assert_array_equal(np.asarray(got), np.take(whole, index, axis=dim))


def _dropout_scan(x, w, keys, *, impl_key=lambda k: k):
    def body(h, p):
        wl, k = p
        keep = jax.random.bernoulli(impl_key(k), 0.5, h.shape)
        return jnp.where(keep, jnp.tanh(h @ wl), 0.0), None

    return lax.scan(body, x, (w, keys))[0]


def test_pipelined_dropout_draws_the_unpipelined_masks_and_refuses_what_it_cannot_match():
    params, x, _ = _stack(layers=4, batch=16)
    w = params["w1"][..., :16]
    keys = jax.random.split(jax.random.key(3), 4)
    pipelined = lambda f, c, xs: pipelined_scan(f, c, xs, stages=2, microbatches=4)

    def run(scan, **kw):
        orig = lax.scan
        jax.lax.scan = scan
        try:
            return jax.jit(lambda x, w, k: _dropout_scan(x, w, k, **kw))(x, w, keys)
        finally:
            jax.lax.scan = orig

    want = run(lax.scan)
    np.testing.assert_array_equal(run(pipelined), want)
    rbg = lambda k: jax.random.key(jax.random.key_data(k)[0], impl="rbg")
    with pytest.raises(partir.PartitionError, match="rbg.*threefry2x32"):
        run(pipelined, impl_key=rbg)
    with jax.threefry_partitionable(False), pytest.raises(partir.PartitionError,
                                                          match="jax_threefry_partitionable"):
        run(pipelined)


def test_a_captured_weight_whose_first_dimension_is_the_batch_is_not_microbatched():
    """A closed-over `[B, D]` matrix the body multiplies by (B == D here) is a weight, not a
    per-example tensor; a closed-over `[B, D]` the body adds row by row is per-example."""
    params, x, _ = _stack(layers=4, d=16, batch=16)
    shared = jax.random.normal(jax.random.PRNGKey(5), (16, 16)) / 4
    bias = jax.random.normal(jax.random.PRNGKey(6), (16, 16))

    def f(params, x, shared, bias):
        def body(h, p):
            return jnp.tanh(h @ shared + bias) @ p["w1"] @ p["w2"] / 8, None

        return lax.scan(body, x, params)[0]

    def g(*args):
        return jax.value_and_grad(lambda *a: (f(*a) ** 2).sum(), argnums=(0, 2, 3))(*args)

    fn, _ = partir.jit(g, {"stage": 2}, [partir.tactic("PP", microbatches=4)])
    assert_close(fn(params, x, shared, bias), jax.jit(g)(params, x, shared, bias))


def test_a_non_batch_carry_that_is_not_a_sum_over_rows_is_refused_by_line_and_leaf():
    params, x, _ = _stack(layers=4, batch=16)

    def f(params, x):
        def body(c, p):
            h, scale = c
            h = _layer(h, p)[0]
            return (h, scale * jnp.mean(h)), None

        return lax.scan(body, (x, jnp.ones(())), params)[0]  # the refused scan

    fn, _ = partir.jit(f, {"stage": 2}, [partir.tactic("PP", microbatches=4)])
    with pytest.raises(partir.PartitionError, match=r"test_pipeline\.py:\d+ carries "
                                                    r"carry\[1\] \(shape \(\)\)"):
        fn.lower(params, x)
