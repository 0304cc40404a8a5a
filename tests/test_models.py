"""The paper's models (partir_plugin/models): small configs train/decode on CPU, parameter counts,
scan == unrolled, and the Megatron / MQ / ES rules pick exactly the documented tensors."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from partir_plugin.models import (
    gns,
    inference_transformer,
    megatron,
    mlp,
    transformer,
    unet,
)
from partir_plugin.models.common import param_paths

pytestmark = pytest.mark.slow  # trains every model for three steps


def _abstract_init(module, config):
    """Shapes of ``module.init(config, key)`` without compiling or allocating."""
    return jax.eval_shape(lambda: module.init(config, jax.random.key(0)))


@functools.cache
def _init(module, config, seed: int = 0):
    """Shared across tests so each small model is initialised (compiled) once."""
    return module.init(config, jax.random.key(seed))


@functools.cache
def _jitted_step(module, config):
    """One ``jax.jit`` object per (model, config), so tests reuse its compilation."""
    return jax.jit(module.make_train_step(config))


def _train(module, config, steps: int) -> list[float]:
    params, opt_state, batch = _init(module, config)
    step = _jitted_step(module, config)
    losses = []
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(float(loss))
    assert jax.tree.structure(params) == jax.tree.structure(_abstract_init(module, config)[0])
    return losses


@pytest.mark.parametrize("module", [mlp, transformer], ids=["mlp", "transformer"])
def test_loss_decreases_over_three_adam_steps(module) -> None:
    losses = _train(module, module.Config.small(), steps=3)
    assert all(math.isfinite(x) for x in losses)
    assert losses[0] > losses[1] > losses[2]


@pytest.mark.parametrize("module", [unet, gns], ids=["unet", "gns"])
def test_one_train_step_runs(module) -> None:
    (loss,) = _train(module, module.Config.small(), steps=1)
    assert math.isfinite(loss) and loss > 0


@pytest.mark.parametrize("layers", [1, 3])
def test_transformer_parameter_tensor_count(layers: int) -> None:
    """P = 8 L + 3 unrolled; 11 under nn.scan, whose 8 block tensors gain a leading [L]."""
    cfg = transformer.Config.small(layers=layers)
    paths = param_paths(_abstract_init(transformer, cfg)[0])
    assert len(paths) == 8 * layers + 3 == cfg.num_param_tensors
    block = {p.split("/", 1)[1] for p in paths if p.startswith("Block_")}
    assert block == {
        "norm_attn/scale",
        "attn/query/kernel",
        "attn/key/kernel",
        "attn/value/kernel",
        "attn/out/kernel",
        "norm_mlp/scale",
        "mlp/dense_up/kernel",
        "mlp/dense_down/kernel",
    }
    scan_cfg = replace(cfg, scan=True)
    scan_paths = param_paths(_abstract_init(transformer, scan_cfg)[0])
    assert len(scan_paths) == 11 == scan_cfg.num_param_tensors
    for name in block:
        assert scan_paths[f"blocks/{name}"] == (layers, *paths[f"Block_0/{name}"])


def test_scan_variant_matches_unrolled() -> None:
    """Same rng -> identical weights (stacked); one train step gives the same loss and update."""
    cfg = transformer.Config.small(layers=2)
    scan_cfg = replace(cfg, scan=True)
    params, opt, batch = _init(transformer, cfg)
    scan_params, scan_opt, scan_batch = _init(transformer, scan_cfg)
    stacked = transformer.stack_blocks(params, cfg.layers)
    jax.tree.map(np.testing.assert_array_equal, stacked, scan_params)
    jax.tree.map(np.testing.assert_array_equal, batch, scan_batch)
    new, _, loss = _jitted_step(transformer, cfg)(params, opt, batch)
    scan_new, _, scan_loss = _jitted_step(transformer, scan_cfg)(scan_params, scan_opt, scan_batch)
    np.testing.assert_allclose(loss, scan_loss, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
        transformer.stack_blocks(new, cfg.layers),
        scan_new,
    )


def test_inference_transformer_decode_matches_prefill() -> None:
    """serve() runs; cached one-token decode steps reproduce a full causal forward's logits."""
    cfg = inference_transformer.Config.small()
    params, cache, batch = inference_transformer.init(cfg, jax.random.key(0))
    tokens, _ = jax.jit(inference_transformer.make_serve(cfg))(params, cache, batch)
    assert tokens.shape == (cfg.batch, cfg.gen_len) and tokens.dtype == jnp.int32
    seq = jnp.concatenate([batch["prompt"], tokens], axis=1)[:, :-1]
    full, _ = jax.jit(inference_transformer.make_forward(cfg))(params, cache, seq, 0)
    np.testing.assert_array_equal(jnp.argmax(full[:, cfg.prompt_len - 1 :], -1), tokens)
    decode = jax.jit(inference_transformer.make_decode_step(cfg))
    for pos in range(seq.shape[1]):
        logits, cache = decode(params, cache, seq[:, pos], pos)
        np.testing.assert_allclose(logits, full[:, pos], rtol=1e-4, atol=1e-5)


_T_BLOCK_RULE = {
    "attn/query/kernel": 1,
    "attn/key/kernel": 1,
    "attn/value/kernel": 1,
    "attn/out/kernel": 0,
    "mlp/dense_up/kernel": 1,
    "mlp/dense_down/kernel": 0,
}


def _check_divisible(tree, dims: dict[str, int]) -> None:
    shapes = param_paths(tree)
    for path, dim in dims.items():
        assert shapes[path][dim] % 2 == 0, (path, shapes[path], dim)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scan"])
def test_megatron_transformer_rule(scan: bool) -> None:
    cfg = transformer.Config.small(layers=2, scan=scan)
    params = _abstract_init(transformer, cfg)[0]
    dims = megatron.sharded_dims(megatron.transformer_rule, params)
    if scan:
        expected = {f"blocks/{k}": d + 1 for k, d in _T_BLOCK_RULE.items()}
    else:
        expected = {f"Block_{i}/{k}": d for i in range(2) for k, d in _T_BLOCK_RULE.items()}
    assert dims == expected  # 6 per layer; norms, embedding, unembedding are left to propagation
    _check_divisible(params, dims)


def test_megatron_inference_transformer_and_multi_query_rules() -> None:
    cfg = inference_transformer.Config.small()
    params, cache, _ = _abstract_init(inference_transformer, cfg)
    dims = megatron.sharded_dims(megatron.transformer_rule, params)
    single_head = ("attn/key/kernel", "attn/value/kernel")  # multi-query: one shared k/v head
    expected = {
        f"Block_{i}/{k}": d
        for i in range(cfg.layers)
        for k, d in _T_BLOCK_RULE.items()
        if k not in single_head
    }
    assert dims == expected
    _check_divisible(params, dims)
    cache_dims = megatron.sharded_dims(megatron.multi_query_rule, cache)
    assert cache_dims == {
        f"Block_{i}/{kv}": 0 for i in range(cfg.layers) for kv in ("key", "value")
    }
    _check_divisible(cache, cache_dims)


def test_megatron_unet_rule() -> None:
    cfg = unet.Config.small()
    params = _abstract_init(unet, cfg)[0]
    dims = megatron.sharded_dims(megatron.unet_rule, params)
    blocks = {p.rsplit("/", 2)[0] for p in param_paths(params) if re.search(r"_res_\d+/", p)}
    assert len(blocks) == len(cfg.channel_mult) * (2 * cfg.num_res + 1) + 2
    expected = {f"{b}/conv_0/kernel": 3 for b in blocks} | {f"{b}/conv_1/kernel": 2 for b in blocks}
    expected |= {f"mid_attn/attn/{n}/kernel": 1 for n in ("query", "key", "value")}
    expected["mid_attn/attn/out/kernel"] = 0
    assert dims == expected
    _check_divisible(params, dims)


def test_edge_sharding_rule_tiles_edge_inputs() -> None:
    cfg = gns.Config.small()
    batch = _abstract_init(gns, cfg)[2]
    dims = megatron.sharded_dims(megatron.edge_sharding_rule, batch)
    assert dims == {"edges": 0, "senders": 0, "receivers": 0}
    assert {batch[k].shape[0] for k in dims} == {cfg.edges}
