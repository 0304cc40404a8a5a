"""RM, the rematerialization tactic (issue 37): the layer loop's body recomputed in the
backward pass, with no edit to the model.

Every partitioned step is compared with the unpartitioned `jax.jit` of the same step (its
loss and every gradient leaf: the steps return them); memory with XLA's own analysis of the
compiled partitioned step (`temp_size_in_bytes`, where activations kept for the backward
pass live). Models are small (a few layers, d 32) so each test takes seconds.
"""

from __future__ import annotations

import functools
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.ad_checkpoint import checkpoint_name
from oracle import assert_matches_jax_jit

import partir_plugin as partir
from partir_plugin.errors import PartitionError

LAYERS, B, T, D, F, VOCAB = 4, 16, 16, 32, 64, 32


def BP():
    return partir.tactic("BP", axis="batch")


def RM(policy: str = "full", **kwargs):
    return partir.tactic("RM", policy=policy, **kwargs)


def PP(microbatches: int = 4):
    return partir.tactic("PP", axis="stage", microbatches=microbatches)


# -- a plain-JAX scanned residual MLP, no remat in its code ---------------------------------

def _mlp_params(layers=LAYERS, d=D, f=F):
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {"w1": jax.random.normal(k1, (layers, d, f)) / np.sqrt(d),
            "w2": jax.random.normal(k2, (layers, f, d)) / np.sqrt(f)}


def _mlp_batch(b=B):
    k1, k2 = jax.random.split(jax.random.PRNGKey(1))
    return {"x": jax.random.normal(k1, (b, T, D)), "y": jax.random.normal(k2, (b, T, D))}


def mlp_step(params, batch):
    """Loss and gradients of a residual MLP whose layers run under `lax.scan`; the hidden
    activation is tagged "hidden" (for policy "names"), which changes nothing else."""

    def loss(params):
        def layer(h, p):
            hidden = checkpoint_name(jnp.tanh(h @ p["w1"]), "hidden")
            return h + jnp.tanh(hidden @ p["w2"]), None

        h, _ = jax.lax.scan(layer, batch["x"], params)
        return jnp.mean((h - batch["y"]) ** 2)

    return jax.value_and_grad(loss)(params)


def _temp_bytes(fn, args) -> int:
    return fn.lower(*args).compile().memory_analysis().temp_size_in_bytes


def _run(step, args, mesh, schedule, what):
    """partir.jit's numbers are jax.jit's; returns (XLA's temporaries, the report rows)."""
    matched = assert_matches_jax_jit(step, args, mesh, schedule, what=what)
    return _temp_bytes(matched.step, args), matched.meta.tactics


_MLP_SCHEDULES = {"BP": lambda: [BP()], "BP,RM": lambda: [BP(), RM("full")],
                  "BP,RM(layer)": lambda: [BP(), RM("full", unit="layer")],
                  "RM,BP": lambda: [RM("full"), BP()], "BP,RM(dots)": lambda: [BP(), RM("dots")],
                  "BP,RM(names)": lambda: [BP(), RM("names", names=["hidden"])],
                  "BP,RM(none)": lambda: [BP(), RM("none")]}


@functools.cache
def _mlp(schedule: str):
    """The MLP step under `schedule` on {batch: 4}, checked against jax.jit (once per module:
    several tests read the same compiled step)."""
    return _run(mlp_step, (_mlp_params(), _mlp_batch()), {"batch": 4},
                _MLP_SCHEDULES[schedule](), f"MLP [{schedule}]")


@pytest.mark.slow  # compiles the scanned MLP under four schedules
def test_rm_full_gives_jax_jit_numbers_and_halves_temporaries_dots_in_between():
    (bp, _), (full, rows), (dots, dots_rows) = map(_mlp, ("BP", "BP,RM", "BP,RM(dots)"))
    assert full <= bp / 2, f"RM('full') temporaries {full} B, [BP]'s {bp} B: not halved"
    assert full < dots < bp, f"RM('dots') {dots} B not between full {full} B and [BP] {bp} B"
    figures = rows[-1].rematerialization
    assert rows[-1].name == "RM" and figures is not None, rows[-1]
    assert figures.activation_bytes_saved > 0 and figures.recompute_flops > 0, figures
    assert figures.trips == LAYERS and figures.unit == "layer body", figures
    dots_figures = dots_rows[-1].rematerialization
    assert 0 < dots_figures.recompute_flops < figures.recompute_flops, (dots_figures, figures)
    assert 0 < dots_figures.activation_bytes_saved < figures.activation_bytes_saved
    assert any("rematerialized (policy 'full')" in n and "GFLOP" in n
               for n in rows[-1].notes), rows[-1].notes


def test_rm_anywhere_in_the_schedule_gives_the_same_program():
    """RM decides no tiling (it acts while the step is traced): before or after BP, the
    partitioned step computes jax.jit's numbers with the same temporaries."""
    (after, _), (before, rows) = _mlp("BP,RM"), _mlp("RM,BP")
    assert before == after
    assert [r.name for r in rows] == ["RM", "BP"]


def test_rm_names_saves_the_tagged_values():
    (full, _), (names, rows) = _mlp("BP,RM"), _mlp("BP,RM(names)")
    assert names > full, f"saving 'hidden' ({names} B) keeps no more than full remat ({full} B)"
    assert rows[-1].rematerialization.recompute_flops > 0


def test_pp_bp_rm_gives_jax_jit_numbers_recomputing_each_pipeline_iteration():
    args = (_mlp_params(), _mlp_batch())
    _, rows = _run(mlp_step, args, {"stage": 2, "batch": 2}, [PP(4), BP(), RM("full")],
                   "MLP [PP(4), BP, RM(full)]")
    figures = rows[-1].rematerialization
    assert figures.unit.startswith("stage body (2 stages x 2 layers"), figures
    assert figures.trips == 4 + 2 - 1, figures  # M + S - 1 iterations


def test_pp_bp_rm_unit_layer_recomputes_each_layer_of_each_iteration():
    """`unit="layer"` under PP: each layer of each pipeline iteration recomputed (Megatron's
    recomputation, no module names needed), jax.jit's numbers; it keeps every layer's input
    of every microbatch, so it saves less than recomputing whole iterations."""
    args, mesh = (_mlp_params(), _mlp_batch()), {"stage": 2, "batch": 2}
    _, rows = _run(mlp_step, args, mesh, [PP(4), BP(), RM("full", unit="layer")],
                   "MLP [PP(4), BP, RM(full, unit=layer)]")
    layer = rows[-1].rematerialization
    assert layer.unit.startswith("layer of a stage"), layer
    assert layer.trips == (4 + 2 - 1) * 2 * 2, layer  # iterations x layers a stage x stages
    _, rows = _run(mlp_step, args, mesh, [PP(4), BP(), RM("full")], "MLP [PP(4), BP, RM]")
    iteration = rows[-1].rematerialization
    assert 0 < layer.activation_bytes_saved < iteration.activation_bytes_saved, (
        layer, iteration)


def test_without_pp_unit_layer_is_the_loop_body():
    """Without PP a layer is an iteration of the loop: the same program either way."""
    (full, rows), (layer, layer_rows) = _mlp("BP,RM"), _mlp("BP,RM(layer)")
    assert layer == full and layer_rows[-1].rematerialization == rows[-1].rematerialization


# -- the Flax nn.scan LM recipe (as tests/test_pp_recipes.py), no nn.remat -----------------

class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        h = nn.LayerNorm(name="ln1")(x)
        h = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=D, name="attn")(
            h, h, mask=nn.make_causal_mask(jnp.ones(x.shape[:2])))
        x = x + h
        h = nn.Dense(F, name="up")(nn.LayerNorm(name="ln2")(x))
        return x + nn.Dense(D, name="down")(nn.gelu(h)), None


class Decoder(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, D, name="embed")(tokens)
        blocks = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                         in_axes=nn.broadcast, length=LAYERS)(name="blocks")
        x, _ = blocks(x, None)
        return nn.Dense(VOCAB, name="head")(nn.LayerNorm(name="ln_f")(x))


def _lm():
    tokens = jax.random.randint(jax.random.PRNGKey(2), (B, T), 0, VOCAB)
    params = Decoder().init(jax.random.PRNGKey(0), tokens)["params"]

    def step(params, tokens):
        def loss(params):
            logits = Decoder().apply({"params": params}, tokens)
            return optax.softmax_cross_entropy_with_integer_labels(
                logits[:, :-1], tokens[:, 1:]).mean()

        return jax.value_and_grad(loss)(params)

    return step, (params, tokens)


def _tokens_bp():
    return partir.tactic("BP", axis="batch", inputs=("tokens",))


@pytest.mark.slow  # compiles the Flax LM step three times (about 35 s)
def test_flax_nn_scan_lm_under_bp_rm():
    step, args = _lm()
    bp = _temp_bytes(partir.jit(step, {"batch": 4}, [_tokens_bp()])[0], args)
    full, _ = _run(step, args, {"batch": 4}, [_tokens_bp(), RM("full")],
                   "nn.scan LM [BP, RM]")
    assert full <= bp / 2, f"RM('full') temporaries {full} B, [BP]'s {bp} B: not halved"
    # The scanned Block selected by name: each layer recomputed, as the layer loop's body is.
    block, _ = _run(step, args, {"batch": 4}, [_tokens_bp(), RM("full", modules="Block")],
                    "nn.scan LM [BP, RM(modules='Block')]")
    assert block <= bp / 2, f"RM(modules) temporaries {block} B, [BP]'s {bp} B: not halved"


class DropoutBlock(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        h = nn.Dropout(0.1, deterministic=False)(nn.gelu(nn.Dense(F, name="up")(x)))
        return x + nn.Dense(D, name="down")(h), None


class DropoutStack(nn.Module):
    @nn.compact
    def __call__(self, x):
        blocks = nn.scan(DropoutBlock, variable_axes={"params": 0},
                         split_rngs={"params": True, "dropout": True}, in_axes=nn.broadcast,
                         length=LAYERS)(name="blocks")
        return blocks(x, None)[0]


@pytest.mark.slow  # compiles a Flax step with dropout, partitioned and not
def test_flax_dropout_in_the_scanned_body_keeps_jax_jit_keys():
    """RM traces the layer body more than once (its figures, the names it checks): Flax
    counts the keys its scopes draw per trace, so those traces must leave the counters as
    they found them, or the dropout masks would differ from jax.jit's."""
    x = _mlp_batch()["x"]
    params = DropoutStack().init({"params": jax.random.PRNGKey(0),
                                  "dropout": jax.random.PRNGKey(1)}, x)["params"]

    def step(params, batch, rng):
        return jax.value_and_grad(lambda p: jnp.mean(DropoutStack().apply(
            {"params": p}, batch["x"], rngs={"dropout": rng}) ** 2))(params)

    _run(step, (params, {"x": x}, jax.random.PRNGKey(7)), {"batch": 4}, [BP(), RM("full")],
         "nn.scan with Dropout [BP, RM]")


@pytest.mark.slow  # compiles a pipelined LM step; [PP, BP, RM] is also checked on the MLP
def test_flax_nn_scan_lm_under_pp_bp_rm():
    step, args = _lm()
    _run(step, args, {"stage": 2, "batch": 2}, [PP(4), _tokens_bp(), RM("full")],
         "nn.scan LM [PP(4), BP, RM]")


# -- estimates --------------------------------------------------------------------------------

def test_estimated_runtime_rises_with_recomputation():
    """On a compute-bound layer (d 4096, f 16384) the simulator charges the recomputed
    matmuls: the estimate with RM('full') is slower and does more FLOPs. Traced abstractly
    (no arrays, nothing run)."""
    S = jax.ShapeDtypeStruct
    params = {"w1": S((2, 4096, 16384), jnp.float32), "w2": S((2, 16384, 4096), jnp.float32)}
    batch = {"x": S((8, 128, 4096), jnp.float32), "y": S((8, 128, 4096), jnp.float32)}
    rows = {}
    for name, schedule in (("BP", [BP()]), ("RM", [BP(), RM("full")])):
        step, meta = partir.jit(mlp_step, {"batch": 4}, schedule, hardware="h100")
        step.lower(params, batch)
        rows[name] = meta.tactics[-1]
    assert rows["RM"].estimated_flops > 1.2 * rows["BP"].estimated_flops
    assert rows["RM"].estimated_runtime_s > rows["BP"].estimated_runtime_s
    assert rows["RM"].estimated_peak_memory_bytes < rows["BP"].estimated_peak_memory_bytes


# -- bad input ----------------------------------------------------------------------------------

def test_unknown_policy_and_misused_options_are_refused():
    with pytest.raises(PartitionError, match=r"unknown policy 'everything'.*'full', 'dots'"):
        RM("everything")
    with pytest.raises(PartitionError, match="list them in names"):
        RM("names")
    with pytest.raises(PartitionError, match="go with policy='names'"):
        RM("full", names=["hidden"])
    with pytest.raises(PartitionError, match="needs policy 'dots' or 'names'"):
        RM("full", offload=True)
    with pytest.raises(PartitionError, match=r"unknown unit 'stage'.*'iteration', 'layer'"):
        RM("full", unit="stage")
    with pytest.raises(PartitionError, match="unit='layer' does not apply"):
        RM("full", modules="Block", unit="layer")


def test_names_that_tag_nothing_are_refused():
    step, _ = partir.jit(mlp_step, {"batch": 4}, [BP(), RM("names", names=["hiden"])])
    with pytest.raises(PartitionError, match=r"names \['hiden'\] are not tagged.*hidden"):
        step(_mlp_params(), _mlp_batch())


def test_no_layer_loop_is_refused():
    def step(w, batch):
        return jax.grad(lambda w: jnp.sum(jnp.tanh(batch["x"] @ w)))(w)

    fn, _ = partir.jit(step, {"batch": 4}, [BP(), RM()])
    with pytest.raises(PartitionError, match="RM: no layer loop found"):
        fn(jnp.ones((D, D)), _mlp_batch())


def test_policy_none_changes_nothing():
    (bp, _), (none, rows) = _mlp("BP"), _mlp("BP,RM(none)")
    assert none == bp and rows[-1].rematerialization is None


# -- offload ------------------------------------------------------------------------------------

def test_offload_on_cpu_is_refused_without_a_host_link():
    """jax 0.10 lowers moves to host memory on TPU and GPU only; on XLA:CPU they vanish, so
    offload would silently keep everything on the device."""
    assert jax.default_backend() == "cpu"
    step, _ = partir.jit(mlp_step, {"batch": 4}, [BP(), RM("dots", offload=True)])
    with pytest.raises(PartitionError, match=r"offload=True needs a backend with host memory "
                                             r"kinds.*XLA:CPU.*host_link"):
        step(_mlp_params(), _mlp_batch())


def test_offload_estimated_for_a_spec_with_a_host_link():
    """For hardware with a host link (h100: PCIe Gen5) the program keeps jax's moves to host
    memory (`annotate_device_placement`), partitions them like the values they move, and the
    estimate charges their transfers; run on CPU it computes jax.jit's numbers (and warns
    that nothing is offloaded there)."""
    args, mesh = (_mlp_params(), _mlp_batch()), {"batch": 4}
    rows = {}
    for name, rm in (("dots", RM("dots")), ("offload", RM("dots", offload=True))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            matched = assert_matches_jax_jit(mlp_step, args, mesh, [BP(), rm], hardware="h100",
                                             what=f"MLP [BP, RM({name})]")
            rows[name] = matched.meta.tactics[-1]
        warned = [w for w in caught if "keeps its residuals on the device" in str(w.message)]
        assert bool(warned) == (name == "offload"), [str(w.message) for w in caught]
    hlo = matched.meta.device_local_stablehlo
    assert hlo.count("annotate_device_placement") >= 2, "no moves to host memory and back"
    assert not rows["offload"].unsupported_ops, rows["offload"].unsupported_ops
    assert rows["offload"].rematerialization.offloaded_bytes > 0
    assert rows["dots"].rematerialization.offloaded_bytes == 0
    assert rows["offload"].estimated_runtime_s > rows["dots"].estimated_runtime_s
    # The offloaded residual stacks live in host memory: not in the device's peak.
    assert (rows["offload"].estimated_peak_memory_bytes
            < rows["dots"].estimated_peak_memory_bytes), (
        rows["offload"].estimated_peak_memory_bytes, rows["dots"].estimated_peak_memory_bytes)


# -- modules=: the calls of Flax modules selected by name --------------------------------------

class DropoutMLPBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dropout(0.1, deterministic=False)(nn.gelu(nn.Dense(4 * F, name="up")(x)))
        return x + nn.Dense(D, name="down")(h)


class UnrolledMLP(nn.Module):
    """Blocks called one by one (no scan: no layer loop for RM to find), with dropout."""

    @nn.compact
    def __call__(self, x):
        for i in range(LAYERS):
            x = DropoutMLPBlock(name=f"block_{i}")(x)
        return nn.Dense(D, name="head")(x)


def _x_bp():
    return partir.tactic("BP", axis="batch", inputs=("x",))


def _unrolled():
    x = jax.random.normal(jax.random.PRNGKey(3), (B, T, D))
    params = UnrolledMLP().init(jax.random.PRNGKey(0), x)["params"]

    def step(params, x, rng):
        def loss(params):
            out = UnrolledMLP().apply({"params": params}, x, rngs={"dropout": rng})
            return jnp.mean(out ** 2)

        return jax.value_and_grad(loss)(params)

    return step, (params, x, jax.random.PRNGKey(4))


def test_module_patterns_match_class_or_module_names():
    from partir_plugin.tactics.module_calls import matches

    block = DropoutMLPBlock(name="block_2")
    assert matches(block, ("DropoutMLPBlock",)) and matches(block, ("block_*",))
    assert matches(block, ("*MLP*", "nothing")) and not matches(block, ("block_1", "Dense"))


@pytest.mark.parametrize("pattern", ["DropoutMLPBlock",
                                     pytest.param("block_*", marks=pytest.mark.exhaustive)])
def test_rm_modules_recomputes_the_selected_flax_modules(pattern, monkeypatch):
    """An unscanned model (RM without modules= finds no layer loop): the blocks, selected by
    class or by module name, recomputed (the step's FLOPs grow by the figures' recompute);
    jax.jit's numbers, dropout masks included. (Temporaries: XLA:CPU keeps an unrolled
    model's recomputation next to its forward pass, as with jax.checkpoint written in the
    model; the scanned LM below shows the memory.) The identical blocks' figures are traced
    once and counted once per call."""
    from partir_plugin.tactics import rematerialization

    traced = []
    figures_of = rematerialization._module_figures
    monkeypatch.setattr(rematerialization, "_module_figures",
                        lambda *a: traced.append(a[-1]) or figures_of(*a))
    step, args = _unrolled()
    with pytest.raises(PartitionError, match="no layer loop found"):
        partir.jit(step, {"batch": 4}, [_x_bp(), RM("full")])[0].lower(*args)
    bp_step, bp_meta = partir.jit(step, {"batch": 4}, [_x_bp()])
    bp_step.lower(*args)
    bp = bp_meta.tactics[-1].estimated_flops
    _, rows = _run(step, args, {"batch": 4}, [_x_bp(), RM("full", modules=pattern)],
                   f"unrolled MLP [BP, RM(modules={pattern!r})]")
    assert rows[-1].estimated_flops > bp, (rows[-1].estimated_flops, bp)
    figures = rows[-1].rematerialization
    assert figures is not None and figures.trips == LAYERS, figures
    assert figures.activation_bytes_saved > 0 and figures.recompute_flops > 0, figures
    assert any(f"{LAYERS} call(s) of DropoutMLPBlock rematerialized" in n
               for n in rows[-1].notes), rows[-1].notes
    assert traced == ["DropoutMLPBlock"], traced  # 4 identical calls, traced apart once


def test_rm_modules_that_match_nothing_name_what_the_step_calls():
    step, args = _unrolled()
    with pytest.raises(PartitionError, match=r"matched no Flax module.*DropoutMLPBlock "
                                             r"\(block_0\)"):
        partir.jit(step, {"batch": 4}, [_x_bp(), RM("full", modules="Attention")])[0].lower(*args)
    with pytest.raises(PartitionError, match="modules="):
        RM("full", modules=[""])
    # Policy "names" saves tagged values: a name the selected calls do not tag is an error.
    with pytest.raises(PartitionError, match=r"names \['hidden'\] are not tagged.*tag none"):
        partir.jit(step, {"batch": 4}, [_x_bp(), RM("names", names=["hidden"],
                                                    modules="DropoutMLPBlock")])[0].lower(*args)


def _nnx_mlp(scan: bool):
    """An NNX residual GELU MLP of 4 blocks, as NNX users write one: stacked with `nnx.vmap`
    and run by `nnx.scan`, or a list of blocks in a Python loop; the step is `value_and_grad`
    of a mean square over `nnx.split`'s parameters."""
    from flax import nnx

    class NnxBlock(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(16, 64, rngs=rngs)
            self.down = nnx.Linear(64, 16, rngs=rngs)

        def __call__(self, x):
            return x + self.down(nnx.gelu(self.up(x)))

    class NnxMLP(nnx.Module):
        def __init__(self, rngs):
            if scan:
                @nnx.split_rngs(splits=4)
                @nnx.vmap(in_axes=(0,), out_axes=0)
                def blocks(rngs):
                    return NnxBlock(rngs)

                self.blocks = blocks(rngs)
            else:
                self.blocks = nnx.List([NnxBlock(rngs) for _ in range(4)])

        def __call__(self, x):
            if scan:
                @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
                def run(block, h):
                    return block(h)

                return run(self.blocks, x)
            for block in self.blocks:
                x = block(x)
            return x

    graphdef, params = nnx.split(NnxMLP(nnx.Rngs(0)), nnx.Param)

    def step(params, x):
        return jax.value_and_grad(lambda p: jnp.mean(nnx.merge(graphdef, p)(x) ** 2))(params)

    return step, (params, jax.random.normal(jax.random.PRNGKey(1), (32, 16))), NnxBlock


@pytest.mark.parametrize("scan", [True, pytest.param(False, marks=pytest.mark.exhaustive)])
def test_rm_modules_recomputes_nnx_modules_by_class(scan):
    """NNX has no method interceptor: RM(modules=) replaces the selected classes' `__call__`
    while the step is traced (and puts it back). Each call of the NNX block, under `nnx.scan`
    or in a Python loop, recomputed: jax.jit's numbers, the report counts the calls and its
    figures, and the scanned step keeps fewer temporaries than [BP]."""
    step, args, block = _nnx_mlp(scan)
    call = block.__call__
    x_bp = partir.ManualPartition({"x": 0}, axis="batch", name="BP")
    base, _ = _run(step, args, {"batch": 4}, [x_bp], f"NNX MLP (scan={scan}) [BP]")
    temps, rows = _run(step, args, {"batch": 4}, [x_bp, RM("full", modules="NnxBlock")],
                       f"NNX MLP (scan={scan}) [BP, RM(modules='NnxBlock')]")
    assert block.__call__ is call  # the class as it was
    calls = 1 if scan else 4  # nnx.scan traces its body once
    assert any(f"{calls} call(s) of NnxBlock rematerialized" in n for n in rows[-1].notes), (
        rows[-1].notes)
    figures = rows[-1].rematerialization
    assert figures is not None and figures.activation_bytes_saved > 0, figures
    if scan:
        assert temps < base, (temps, base)


@pytest.mark.slow  # the scanned LM, pipelined
def test_pp_bp_rm_modules_recomputes_each_layer_of_each_iteration():
    """Megatron's recomputation under PP: each layer (the scanned `Block`), not the whole
    stage body, recomputed in each pipeline iteration; jax.jit's numbers."""
    step, args = _lm()
    _, rows = _run(step, args, {"stage": 2, "batch": 2},
                   [PP(4), _tokens_bp(), RM("full", modules="Block")],
                   "nn.scan LM [PP(4), BP, RM(modules='Block')]")
    assert any("call(s) of Block rematerialized" in n for n in rows[-1].notes), rows[-1].notes
