"""ZeRO-3 against jax.jit with the same shardings (issue 24): the norm scales and biases are
gathered afresh for each use (`Regather.VECTORS`), an embedding gradient is made from every
device's updates instead of a full-size pending sum (`spmd/scatter_exchange.py`), and the
compiled program is no larger than jax.jit's. Numbers against the unpartitioned jax.jit."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import partir_plugin as partir
from partir_plugin.models import megatron, transformer

BP = partir.tactic("BP", axis="batch")


def _close(a, b, atol=2e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=atol)


def _mem(compiled) -> int:
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes)


@pytest.fixture(scope="module")
def small_transformer():
    cfg = dataclasses.replace(transformer.Config.small(layers=2), batch=16, seq_len=32,
                              vocab=512, d_model=128, heads=4, head_dim=32, ffw=512)
    return cfg, transformer.init(cfg, jax.random.PRNGKey(0))


@pytest.mark.slow  # compiles a transformer step twice
def test_z3_regathers_vectors_and_is_no_larger_than_jax_jit(small_transformer):
    cfg, args = small_transformer
    params = args[0]
    vectors = [x for x in jax.tree.leaves(params) if x.ndim == 1]
    mesh = jax.make_mesh((4, 2), ("batch", "model"), devices=jax.devices()[:8],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    counts, memory, estimate = {}, {}, {}
    for regather in ("vectors", False):
        step, meta = partir.jit(transformer.make_train_step(cfg), mesh,
                                [BP, partir.tactic("Z3", axis="batch", regather=regather)],
                                hardware="host-cpu")
        compiled = step.lower(*args).compile()
        memory[regather] = _mem(compiled)
        estimate[regather] = meta.tactics[-1].estimated_peak_memory_bytes
        counts[regather] = meta.tactics[-1].collectives["all_gather"]
        if regather == "vectors":
            peer = jax.jit(transformer.make_train_step(cfg), in_shardings=meta.in_shardings,
                           out_shardings=meta.out_shardings).lower(*args).compile()
    # Each norm scale is used in the forward and the backward pass: gathered once for each.
    assert counts["vectors"] == counts[False] + len(vectors)
    # Per use, each broadcast of a scale fuses into its consumer instead of one [b, s, d]
    # buffer per norm living from the forward to the backward pass.
    assert memory["vectors"] < memory[False]
    # The simulator sees the same saving (it simulates the lowered program: XLA's merge of
    # the broadcasts of one gathered value), so the report and AutomaticPartition agree.
    saved, estimated = memory[False] - memory["vectors"], estimate[False] - estimate["vectors"]
    assert abs(estimated - saved) <= 0.05 * saved
    # XLA's memory analysis is deterministic: ours within 0.1% of jax.jit's (the ids of the
    # exchanged embedding gradient are gathered early, 1.5 KiB; docs/BENCHMARKS.md).
    assert memory["vectors"] <= 1.001 * _mem(peer)


def _gradients(loss_fn, optimizer):
    """A train step that also returns its gradients (an optimizer's update alone would hide
    a wrong gradient behind its normalisation)."""
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads
    return step


@pytest.mark.slow  # compiles a transformer's gradients
def test_z3_gradients_match_jax_jit(small_transformer):
    cfg, args = small_transformer
    step = _gradients(lambda params, batch: transformer.loss_fn(cfg, params, batch),
                      optax.adam(cfg.learning_rate))
    ours, _ = partir.jit(step, {"batch": 4, "model": 2},
                         [BP, partir.tactic("MP", rule=megatron.transformer_rule, axis="model"),
                          partir.tactic("Z3", axis="batch")])
    got, want = ours(*args), jax.jit(step)(*args)
    _close(got[2:], want[2:], atol=1e-5)  # the loss and every gradient


def _embedding_step(vocab: int, d: int = 16):
    optimizer = optax.adam(1e-2)
    def loss_fn(params, batch):
        h = params["emb"][batch["ids"]]  # [b, s, d]
        logits = h @ params["out"]
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
    params = {"emb": jax.random.normal(k1, (vocab, d)), "out": jax.random.normal(k2, (d, 8))}

    def batch(b: int, s: int):
        return {"ids": jax.random.randint(k3, (b, s), 0, vocab)}

    return _gradients(loss_fn, optimizer), params, optimizer.init(params), batch


def _gathers(text: str) -> list[str]:
    return re.findall(r"stablehlo\.all_gather.*?-> (tensor<[^>]*>)", text)


@pytest.mark.parametrize("tokens, exchanged", [((8, 4), True), ((8, 16), False)])
def test_embedding_gradient_exchanges_updates_when_it_moves_fewer_bytes(tokens, exchanged):
    """vocab 32, d 16 on {batch: 4}: 32 tokens (the updates, 2 KiB, against an all_reduce of
    the [32, 16] pending sum, 4 KiB) are gathered and scattered into each device's 8 rows;
    128 tokens (8 KiB) are not, and the pending sum is reduced as before."""
    train_step, params, opt_state, batch = _embedding_step(vocab=32)
    data = batch(*tokens)
    step, meta = partir.jit(train_step, {"batch": 4}, [BP, partir.tactic("Z3", axis="batch")])
    _close(step(params, opt_state, data)[2:], jax.jit(train_step)(params, opt_state, data)[2:])
    gathered = _gathers(step.lower(params, opt_state, data).as_text())
    b, s = tokens
    assert (f"tensor<{b}x{s}x16xf32>" in gathered) == exchanged
    assert (f"tensor<{b}x{s}x1xi32>" in gathered or f"tensor<{b}x{s}xi32>" in gathered
            ) == exchanged


def _last(path: str, shape: tuple) -> int | None:
    return len(shape) - 1 if shape else None  # the optimizer's step count stays replicated


@pytest.mark.parametrize("dim", [partir.FIRST_DIVISIBLE_DIM, _last, 0, -1],
                         ids=["first", "last", "int 0", "int -1"])
def test_z3_dimension_choice(dim):
    """Z3 shards each leaf on its most major dimension that divides (one contiguous block per
    device for its all_gather); `dim` picks another, as a rule or an int (the optimizer's
    scalar step count, which has no such dimension, stays replicated: an int was refused
    with Adam). Either way jax.jit's numbers, one all_gather per matrix and one per use of a
    vector, and no reduce_scatter on CPU."""
    last = dim is _last or (isinstance(dim, int) and dim == -1)
    train_step, params, opt_state, batch = _embedding_step(vocab=32)
    data = batch(8, 4)
    step, meta = partir.jit(train_step, {"batch": 4},
                            [BP, partir.tactic("Z3", axis="batch", dim=dim)])
    _close(step(params, opt_state, data)[2:], jax.jit(train_step)(params, opt_state, data)[2:])
    specs = jax.tree.map(lambda s: tuple(s.spec), meta.in_shardings[0],
                         is_leaf=lambda s: hasattr(s, "spec"))
    assert specs == ({"emb": ("batch",), "out": ("batch",)} if not last else
                     {"emb": (None, "batch"), "out": (None, "batch")})
    collectives = meta.tactics[-1].collectives
    assert collectives["reduce_scatter"] == 0
    # The table's gradient: 2 all_gathers (ids and updates) where dimension 0 is sharded (the
    # exchange); the table and the projection gathered once each.
    assert collectives["all_gather"] == (4 if not last else 2)


@pytest.mark.parametrize("zero", ["Z2", "Z3"])
def test_zero_on_scanned_layers_shards_a_dimension_the_loop_does_not_index(zero):
    """A scan over stacked layers reads layer i of each stacked parameter and writes layer i
    of its gradient in every iteration. ZeRO sharding the layer dimension made each of those
    accesses gather the whole stack, per iteration (the stacked gradient in the backward
    loop: 8 gathers of up to 1 MiB, 8 times a step, on bench-plan's transformer). ZeRO now
    shards another dimension of the stacked leaves, so nothing it adds inside the loop moves
    more than one layer, and the step still computes jax.jit's loss and gradients."""
    layers = 4
    cfg = dataclasses.replace(transformer.Config.small(layers=layers, scan=True), batch=8,
                              seq_len=16, vocab=64, d_model=32, heads=4, head_dim=8, ffw=64)
    params, opt_state, batch = transformer.init(cfg, jax.random.PRNGKey(0))
    step = _gradients(lambda p, b: transformer.loss_fn(cfg, p, b), optax.adam(1e-3))
    ours, meta = partir.jit(step, {"batch": 4}, [BP, partir.tactic(zero, axis="batch")])
    _close(ours(params, opt_state, batch)[2:], jax.jit(step)(params, opt_state, batch)[2:])

    stacked = {"/".join(str(getattr(k, "key", k)) for k in path): x.shape
               for path, x in jax.tree_util.tree_leaves_with_path(params["blocks"])}
    sharded = meta.in_shardings[1 if zero == "Z2" else 0]
    if zero == "Z2":
        sharded = sharded[0].mu  # Adam's first moment, shaped like the parameters
    specs = jax.tree.map(lambda s: tuple(s.spec), sharded["blocks"],
                         is_leaf=lambda s: hasattr(s, "spec"))
    for path, spec in jax.tree_util.tree_leaves_with_path(
            specs, is_leaf=lambda s: isinstance(s, tuple)):
        assert "batch" in spec and spec[0] is None, (path, spec)  # sharded, not on layers
    layer_bytes = max(4 * np.prod(shape[1:]) for shape in stacked.values())
    in_loop = [r for r in meta.tactics[-1].records if r.tactic == zero and r.count == layers]
    assert all(r.bytes <= layer_bytes for r in in_loop), [(r.kind, r.bytes) for r in in_loop]
    if zero == "Z2":
        assert not in_loop  # the gradient of a layer is reduced as BP's, and written locally
