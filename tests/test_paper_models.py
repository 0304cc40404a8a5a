"""The paper's models (partir_plugin/models) with every schedule of appendix A.6 that applies:
numbers equal `jax.jit`'s, and collective counts follow the paper's §7.3 reasoning."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oracle import assert_close, assert_matches_jax_jit

import partir_plugin as partir
from partir_plugin.core.mesh import Mesh
from partir_plugin.frontend.trace import trace
from partir_plugin.models import gns, inference_transformer, megatron, transformer, unet
from partir_plugin.options import PartitionOptions
from partir_plugin.stages import partition

pytestmark = pytest.mark.slow  # compiles every paper model under every schedule

MESH = {"batch": 4, "model": 2}
BP = partir.tactic("BP", axis="batch")
Z2 = partir.tactic("Z2", axis="batch")
# The paper gathers each ZeRO-3 parameter once per step (no `regather`).
Z3 = partir.tactic("Z3", axis="batch", regather=False)
EMB = partir.tactic("EMB", axis="model")
T_MP = partir.tactic("MP", rule=megatron.transformer_rule, axis="model")

T_SCHEDULES = {"BP": [BP], "MP": [T_MP], "BP+MP": [BP, T_MP], "BP+MP+Z2": [BP, T_MP, Z2],
               "BP+MP+Z3": [BP, T_MP, Z3], "BP+MP+Z3+EMB": [BP, T_MP, Z3, EMB]}


def _check(fn, args, schedule, rtol=None):
    # The paper's counts reduce-scatter ZeRO's gradients (on CPU `partir.jit` all-reduces
    # and slices them by default).
    return assert_matches_jax_jit(fn, args, MESH, schedule, rtol=rtol, scatter_sums=True).meta


def _counts(fn, args, schedule):
    traced = trace(fn, args)
    part = partition(traced, Mesh.of(MESH), schedule, PartitionOptions(scatter_sums=True))
    return [r.collectives for r in part.reports]


def _t(layers, scan=False):
    cfg = dataclasses.replace(transformer.Config.small(layers=layers, scan=scan), batch=8)
    return transformer.make_train_step(cfg), transformer.init(cfg, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def t1():
    return _t(1)


@pytest.mark.parametrize("name", list(T_SCHEDULES))
def test_transformer_schedules_match_jax_jit(t1, name):
    train_step, args = t1
    meta = _check(train_step, args, T_SCHEDULES[name])
    assert [t.name for t in meta.tactics] == name.split("+")
    assert meta.tactics[-1].unsupported_ops == {}


@pytest.mark.parametrize("layers", [1, 3])
def test_transformer_collective_formulas(layers):
    """P = 8L + 3 parameter tensors (partir_plugin/models/transformer.py).
    BP: one all_reduce per gradient plus the loss: P + 1.
    MP (Megatron): 2 all_reduces per layer forward (attention output, MLP output) and 2
    backward (the gradients flowing into each sharded block's input): 4L.
    BP+MP: P + 1 + 4L.
    Z2 / Z3 after BP+MP: every parameter gradient's all_reduce over batch becomes a
    reduce_scatter onto the sharded optimizer state (P of them) and each parameter is
    all_gathered once (Z2: the updated parameters; Z3: before use, shared by forward and
    backward), leaving the 4L Megatron all_reduces and the loss."""
    train_step, args = _t(layers)
    p = len(jax.tree.leaves(args[0]))
    assert p == 8 * layers + 3
    bp, mp, z2 = _counts(train_step, args, [BP, T_MP, Z2])
    only_mp = _counts(train_step, args, [T_MP])[0]
    z3 = _counts(train_step, args, [BP, T_MP, Z3])[2]
    zero = dict(all_gather=0, all_reduce=0, reduce_scatter=0, all_to_all=0, all_permute=0)
    assert bp == {**zero, "all_reduce": p + 1}
    assert only_mp == {**zero, "all_reduce": 4 * layers}
    assert mp == {**zero, "all_reduce": p + 1 + 4 * layers}
    for zeroed in (z2, z3):
        assert zeroed == {**zero, "all_reduce": 4 * layers + 1, "reduce_scatter": p,
                          "all_gather": p}


def test_scan_over_layers_transformer_bp_mp():
    train_step, args = _t(3, scan=True)
    # rtol 1e-4: MP splits the contractions, so sums run in another order than jax.jit's; with
    # the suite's -O0 dots (conftest) one of 1536 weight-gradient entries differs by 4.5e-5
    # relative (0.2452330 against 0.2452221): float reassociation, not a wrong value.
    meta = _check(train_step, args, [BP, T_MP], rtol=1e-4)
    p = len(jax.tree.leaves(args[0]))  # 11: the blocks are stacked on a leading [L] dim
    # The scanned body is partitioned once: its 4 Megatron all_reduces appear once.
    assert meta.tactics[0].collectives["all_reduce"] == p + 1
    assert meta.tactics[1].collectives["all_reduce"] == p + 1 + 4


@pytest.fixture(scope="module")
def unet_case():
    cfg = dataclasses.replace(unet.Config.small(), batch=8)
    return unet.make_train_step(cfg), unet.init(cfg, jax.random.PRNGKey(0))


UNET_MP = partir.tactic("MP", rule=megatron.unet_rule, axis="model")


@pytest.mark.parametrize("name,schedule", [
    pytest.param("BP", [BP], marks=pytest.mark.exhaustive),
    pytest.param("BP+Z2", [BP, Z2], marks=pytest.mark.exhaustive),
    pytest.param("BP+Z3", [BP, Z3], marks=pytest.mark.exhaustive), ("BP+MP", [BP, UNET_MP])])
def test_unet_schedules(unet_case, name, schedule):
    train_step, args = unet_case
    # Adam divides by the root of the second moment: the UNet's convolution-kernel gradients
    # have entries near zero whose rounding noise becomes steps of up to 9e-5 (measured).
    meta = _check(train_step, args, schedule, rtol=5e-4)
    p = len(jax.tree.leaves(args[0]))
    if name == "BP":
        assert meta.tactics[0].collectives["all_reduce"] == p + 1
    if name in ("BP+Z2", "BP+Z3"):
        c = meta.tactics[1].collectives
        # Every gradient whose optimizer state shards is reduce-scattered; the rest (and
        # the loss) stay all_reduces: together still one collective per gradient + 1.
        assert c["reduce_scatter"] + c["all_reduce"] == p + 1
        assert c["reduce_scatter"] >= p - 2


def _gns(steps):
    cfg = dataclasses.replace(gns.Config.small(), steps=steps)
    return gns.make_train_step(cfg), gns.init(cfg, jax.random.PRNGKey(0))


def test_gns_edge_sharding():
    """ES tiles the edges; node features stay replicated. Every edge-side parameter's
    gradient is partial over the edge shards (one all_reduce each: 6 in the edge encoder, 6
    per step's edge MLP), and each message-passing step adds one forward all_reduce (the
    segment_sum of messages into receivers) and two backward ones (the node-latent gradients
    scattered back from the sender and receiver gathers): AR = 6 + 9 * steps."""
    train_step, args = _gns(2)
    es = partir.tactic("ES", axis="batch")
    meta = assert_matches_jax_jit(train_step, args, {"batch": 8}, [es]).meta
    zero = dict(all_gather=0, all_reduce=0, reduce_scatter=0, all_to_all=0, all_permute=0)
    assert meta.tactics[0].collectives == {**zero, "all_reduce": 6 + 9 * 2}
    step3, args3 = _gns(3)
    traced = trace(step3, args3)
    part = partition(traced, Mesh.of({"batch": 8}), [es], PartitionOptions(scatter_sums=True))
    assert part.reports[0].collectives == {**zero, "all_reduce": 6 + 9 * 3}


IT_BP = partir.ManualPartition({"batch": 0, "cache": megatron.multi_query_rule}, axis="batch",
                               name="BP")
MQ = partir.tactic("MQ", axis="model")
IT_SCHEDULES = {"BP": [IT_BP], "MP": [T_MP], "BP+MP": [IT_BP, T_MP],
                "BP+MP+MQ": [IT_BP, T_MP, MQ], "BP+MQ+MP": [IT_BP, MQ, T_MP]}


def _it(layers):
    cfg = dataclasses.replace(inference_transformer.Config.small(), batch=8, layers=layers)
    params, cache, batch = inference_transformer.init(cfg, jax.random.PRNGKey(0))
    return inference_transformer.make_serve(cfg), (params, cache, batch)


@pytest.mark.parametrize("name", [
    n if n == "BP+MP+MQ" else pytest.param(n, marks=pytest.mark.exhaustive)
    for n in IT_SCHEDULES])
def test_inference_transformer_decode_loop(name):
    """IT's serving loop (prompt pass, then a fori_loop of decode steps) gives jax.jit's
    tokens and cache. Counts are static (the loop body once), per layer and pass:
    Megatron's 2 all_reduces; MQ adds 2 all_to_alls (queries to batch shards, attention
    output back to heads). MQ's tags are reserved from the start, so in the paper's order
    Megatron stops at the attention core and, until MQ decides it, its queries are gathered
    (one all_gather per layer and pass after MP); with MQ first, the attention all_reduce is
    MQ's. Both orders end with the same program."""
    serve, args = _it(2)
    meta = assert_matches_jax_jit(serve, args, MESH, IT_SCHEDULES[name]).meta  # tokens exact
    for layers in (2, 3):
        counts = _counts(*_it(layers), IT_SCHEDULES[name]) if layers == 3 else [
            t.collectives for t in meta.tactics]
        passes = 2 * layers  # the prompt pass and the decode-loop body
        final = counts[-1]
        assert final["all_gather"] == final["reduce_scatter"] == final["all_permute"] == 0
        if name == "BP":
            assert sum(final.values()) == 0  # inference: no gradient all_reduces
        elif name in ("MP", "BP+MP"):
            assert final["all_reduce"] == 2 * passes and final["all_to_all"] == 0
        else:
            if name == "BP+MP+MQ":
                assert counts[1] == {**final, "all_gather": passes, "all_to_all": 0}
            else:
                assert counts[1]["all_reduce"] == passes and counts[1]["all_to_all"] == passes
            assert final["all_reduce"] == 2 * passes and final["all_to_all"] == 2 * passes


def test_multi_query_shards_the_cache_over_both_axes():
    """MQ's point: the cache is split over all 8 devices (batch x model), not only the 4 batch
    shards, and the attention scores are computed on batch shards of 1 sequence each."""
    serve, args = _it(2)
    step, meta = partir.jit(serve, MESH, IT_SCHEDULES["BP+MP+MQ"])
    step.lower(*args)
    cache_specs = {s.spec for s in jax.tree.leaves(meta.in_shardings[1])}
    assert cache_specs == {jax.sharding.PartitionSpec(("batch", "model"))}
    # Local scores [b=1, h=2, s=1, t=8] in the decode loop: whole heads, one sequence.
    assert "tensor<1x2x1x8xf32>" in meta.device_local_stablehlo
    step_mp, meta_mp = partir.jit(serve, MESH, IT_SCHEDULES["BP+MP"])
    step_mp.lower(*args)
    assert {s.spec for s in jax.tree.leaves(meta_mp.in_shardings[1])} == {
        jax.sharding.PartitionSpec("batch")}


def test_deciding_a_tag_that_propagation_already_tiled_names_the_tag():
    """Decisions are never undone: a tactic that decides a tag without reserving it (a plain
    function here) after MP's propagation tiled it by heads stops with an error naming it."""
    serve, args = _it(2)

    def late_mq(ctx):
        ctx.tile("attention/query", 0, "model")

    with pytest.raises(partir.PartitionError, match=r"tag 'attention/query'.*dimension 2"):
        partir.jit(serve, MESH, [IT_BP, T_MP, late_mq])[0].lower(*args)


def test_non_flax_frontend_equinox_with_typed_keys():
    """An Equinox model (custom pytree nodes), a typed PRNG key in the batch."""
    import equinox as eqx
    import optax

    model = eqx.nn.MLP(16, 8, 32, 2, key=jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)
    opt = optax.sgd(0.1)

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            noise = 0.01 * jax.random.normal(jax.random.fold_in(batch["key"], 1),
                                             batch["x"].shape)
            logits = jax.vmap(eqx.combine(p, static))(batch["x"] + noise)
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss, jax.random.split(
            batch["key"])[0]

    batch = {"x": jax.random.normal(jax.random.key(1), (64, 16)), "y": jnp.arange(64) % 8,
             "key": jax.random.key(2)}
    bp = partir.ManualPartition({"batch": {"x": 0, "y": 0}}, axis="batch", name="BP")
    step, meta = partir.jit(train_step, {"batch": 8}, [bp])
    new_params, _, loss, key = step(params, opt.init(params), batch)
    ref_params, _, ref_loss, ref_key = jax.jit(train_step)(params, opt.init(params), batch)
    assert_close((new_params, loss), (ref_params, ref_loss))
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(ref_key))
    assert meta.tactics[0].collectives["all_reduce"] == len(jax.tree.leaves(params)) + 1


def test_vocabulary_sharded_embedding_is_a_masked_gather_plus_sum():
    """A table tiled on the vocabulary: each device looks up the ids in its rows (others give
    zeros, ids clamped first as the global gather clamps) and one all_reduce adds them."""
    table = jax.random.normal(jax.random.PRNGKey(0), (32, 8))
    ids = jax.random.randint(jax.random.PRNGKey(1), (4, 6), -40, 40)  # out of range too

    def lookup(table, ids):
        return table[ids] * 2.0

    step, meta = partir.jit(lookup, MESH, [partir.ManualPartition({"table": 0}, axis="batch")])
    np.testing.assert_array_equal(np.asarray(step(table, ids)),
                                  np.asarray(jax.jit(lookup)(table, ids)))
    assert meta.tactics[0].collectives == dict(all_gather=0, all_reduce=1, reduce_scatter=0,
                                               all_to_all=0, all_permute=0)
    assert meta.in_shardings[0].spec == jax.sharding.PartitionSpec("batch")


def test_transformer_embedding_sharded_on_vocabulary():
    """EMB on dim 0 after BP: the lookup adds exactly one all_reduce; the table's gradient
    (a scatter-add into zeros) is computed whole and sliced locally, no communication."""
    cfg = dataclasses.replace(transformer.Config.small(layers=2), batch=8)
    params, _, batch = transformer.init(cfg, jax.random.PRNGKey(0))

    def gradients(params, batch):
        return jax.grad(lambda p: transformer.loss_fn(cfg, p, batch))(params)

    emb = partir.tactic("EMB", axis="model", dim=0, name="EMB-vocab")
    meta = assert_matches_jax_jit(gradients, (params, batch), MESH, [BP, emb]).meta
    bp, vocab = (t.collectives for t in meta.tactics)
    assert vocab == {**bp, "all_reduce": bp["all_reduce"] + 1}
    assert meta.in_shardings[0]["embed"]["embedding"].spec == jax.sharding.PartitionSpec(
        "model")
    assert meta.in_shardings[0]["unembed"]["kernel"].spec == jax.sharding.PartitionSpec()
