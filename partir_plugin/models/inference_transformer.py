"""IT: an inference-only decoder with multi-query attention and a key-value cache (paper §7.1).

The model is T's block structure (``transformer.py``: RMSNorm, rotary positions, ``dense_up``/
``dense_down``, no biases) with *multi-query* attention (Shazeer 2019; Pope et al. 2022, the
paper's [43]): ``H`` query heads share one key/value head, which keeps the cache small.

Interface (no train step, since IT is an inference benchmark):

- ``init(config, rng) -> (params, cache, batch)``: ``cache`` is all zeros, ``batch`` is
  ``{"prompt": i32[B, prompt_len]}``.
- ``make_serve(config) -> serve(params, cache, batch) -> (tokens i32[B, gen_len], cache)``:
  prefill the prompt in one call, then greedy-decode ``gen_len - 1`` further tokens with
  ``jax.lax.fori_loop``; each iteration runs one position through every layer and writes its key
  and value into the cache with ``jax.lax.dynamic_update_slice``.
- ``make_decode_step(config) -> decode_step(params, cache, tokens i32[B], pos) ->
  (logits f32[B, V], cache)``: the loop body, exposed for benchmarking one step.
- ``make_forward(config) -> forward(params, cache, tokens i32[B, S], start) -> (logits f32[B, S,
  V], cache)``: ``S`` tokens at absolute positions ``start..start+S-1``; prefill and decode are
  this with ``start=0`` and ``S=1``.

Parameter paths (P = 8 L + 3, like T):
``embed/embedding [V, D]``, ``Block_{i}/norm_attn/scale [D]``,
``Block_{i}/attn/query/kernel [D, H, Dh]``, ``Block_{i}/attn/key/kernel [D, Dh]``,
``Block_{i}/attn/value/kernel [D, Dh]``, ``Block_{i}/attn/out/kernel [H, Dh, D]``,
``Block_{i}/norm_mlp/scale [D]``, ``Block_{i}/mlp/dense_up/kernel [D, F]``,
``Block_{i}/mlp/dense_down/kernel [F, D]``, ``norm_final/scale [D]``, ``unembed/kernel [D, V]``.

Tagged intermediates (``partir_plugin.tag``, one value per layer and pass under each name):
``attention/query [B, S, H, Dh]`` and ``attention/key|value [B, S, Dh]`` (after the
projections and rotary positions, before the cache update) and ``attention/output
[B, S, H, Dh]`` (before the output projection): the attention core lies between them.

Cache paths (batch on dim 0, ``T = prompt_len + gen_len``): ``Block_{i}/key [B, T, Dh]``,
``Block_{i}/value [B, T, Dh]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp

from partir_plugin import tag
from partir_plugin.models.common import Batch, PyTree, init_params, rope
from partir_plugin.models.transformer import MLPBlock

Cache = dict[str, dict[str, jax.Array]]


@dataclass(frozen=True)
class Config:
    """IT sizes; the cache holds ``prompt_len + gen_len`` positions."""

    layers: int = 2
    batch: int = 2
    prompt_len: int = 4
    gen_len: int = 4
    vocab: int = 32
    d_model: int = 16
    heads: int = 2
    head_dim: int = 8
    ffw: int = 32

    @classmethod
    def small(cls) -> Config:
        return cls()

    @classmethod
    def paper(cls) -> Config:
        """IT32: T32's sizes (32 layers, 32 heads, d_model 4096, 32k vocabulary).

        Batch 32 and 512 prompt + 1536 generated tokens are our choices; with Megatron's 2
        all-reduces per layer per generated token, 32 * 2 * 1536 = 98304 is Table 2's MP count.
        """
        return cls(
            layers=32,
            batch=32,
            prompt_len=512,
            gen_len=1536,
            vocab=32000,
            d_model=4096,
            heads=32,
            head_dim=128,
            ffw=10880,
        )

    @property
    def max_len(self) -> int:
        return self.prompt_len + self.gen_len


class MultiQueryAttention(nn.Module):
    """``H`` query heads over one shared key/value head read from (and written to) the cache."""

    heads: int
    head_dim: int

    @nn.compact
    def __call__(
        self, x: jax.Array, cache: dict[str, jax.Array], start: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        seq = x.shape[1]
        positions = start + jnp.arange(seq)
        q = nn.DenseGeneral((self.heads, self.head_dim), use_bias=False, name="query")(x)
        k = nn.Dense(self.head_dim, use_bias=False, name="key")(x)
        v = nn.Dense(self.head_dim, use_bias=False, name="value")(x)
        # Tags name the attention core's inputs and output for tactics (MQ reshards there);
        # they are identities for everything else.
        q = tag(rope(q, positions), "attention/query")
        k = tag(rope(k[:, :, None, :], positions)[:, :, 0, :], "attention/key")
        v = tag(v, "attention/value")
        zero = jnp.zeros((), jnp.int32)
        keys = jax.lax.dynamic_update_slice(cache["key"], k, (zero, start, zero))
        values = jax.lax.dynamic_update_slice(cache["value"], v, (zero, start, zero))
        logits = jnp.einsum("bshd,btd->bhst", q, keys) * self.head_dim**-0.5
        visible = jnp.arange(keys.shape[1])[None, :] <= positions[:, None]  # [S, T]
        logits = jnp.where(visible[None, None], logits, jnp.finfo(logits.dtype).min)
        weights = jax.nn.softmax(logits, axis=-1)
        y = tag(jnp.einsum("bhst,btd->bshd", weights, values), "attention/output")
        out = nn.DenseGeneral(x.shape[-1], axis=(-2, -1), use_bias=False, name="out")(y)
        return out, {"key": keys, "value": values}


class Block(nn.Module):
    config: Config

    @nn.compact
    def __call__(
        self, x: jax.Array, cache: dict[str, jax.Array], start: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        cfg = self.config
        h = nn.RMSNorm(name="norm_attn")(x)
        h, cache = MultiQueryAttention(cfg.heads, cfg.head_dim, name="attn")(h, cache, start)
        x = x + h
        h = nn.RMSNorm(name="norm_mlp")(x)
        return x + MLPBlock(cfg.d_model, cfg.ffw, name="mlp")(h), cache


class InferenceTransformer(nn.Module):
    config: Config

    @nn.compact
    def __call__(
        self, tokens: jax.Array, cache: Cache, start: jax.Array
    ) -> tuple[jax.Array, Cache]:
        cfg = self.config
        x = nn.Embed(cfg.vocab, cfg.d_model, name="embed")(tokens)
        new_cache: Cache = {}
        for i in range(cfg.layers):
            name = f"Block_{i}"
            x, new_cache[name] = Block(cfg, name=name)(x, cache[name], start)
        x = nn.RMSNorm(name="norm_final")(x)
        return nn.Dense(cfg.vocab, use_bias=False, name="unembed")(x), new_cache


def init_cache(config: Config) -> Cache:
    """An empty (all-zero) cache; unwritten positions are masked out by position."""
    shape = (config.batch, config.max_len, config.head_dim)
    return {
        f"Block_{i}": {"key": jnp.zeros(shape, jnp.float32), "value": jnp.zeros(shape, jnp.float32)}
        for i in range(config.layers)
    }


def make_batch(config: Config, rng: jax.Array) -> Batch:
    return {
        "prompt": jax.random.randint(
            rng, (config.batch, config.prompt_len), 0, config.vocab, jnp.int32
        )
    }


def init(config: Config, rng: jax.Array) -> tuple[PyTree, Cache, Batch]:
    """Parameters (see :func:`~partir_plugin.models.common.fill_params`), an empty cache, a random
    prompt; one jitted computation."""
    return jax.jit(partial(_init, config))(rng)


def _init(config: Config, rng: jax.Array) -> tuple[PyTree, Cache, Batch]:
    k_params, k_batch = jax.random.split(rng)
    batch = make_batch(config, k_batch)
    cache = init_cache(config)
    model = InferenceTransformer(config)
    params = init_params(model, k_params, batch["prompt"], cache, jnp.zeros((), jnp.int32))
    return params, cache, batch


def make_forward(
    config: Config,
) -> Callable[[PyTree, Cache, jax.Array, jax.Array], tuple[jax.Array, Cache]]:
    model = InferenceTransformer(config)

    def forward(
        params: PyTree, cache: Cache, tokens: jax.Array, start: jax.Array
    ) -> tuple[jax.Array, Cache]:
        return model.apply({"params": params}, tokens, cache, jnp.asarray(start, jnp.int32))

    return forward


def make_decode_step(
    config: Config,
) -> Callable[[PyTree, Cache, jax.Array, jax.Array], tuple[jax.Array, Cache]]:
    forward = make_forward(config)

    def decode_step(
        params: PyTree, cache: Cache, tokens: jax.Array, pos: jax.Array
    ) -> tuple[jax.Array, Cache]:
        logits, cache = forward(params, cache, tokens[:, None], pos)
        return logits[:, 0], cache

    return decode_step


def make_serve(config: Config) -> Callable[[PyTree, Cache, Batch], tuple[jax.Array, Cache]]:
    forward = make_forward(config)
    decode_step = make_decode_step(config)

    def serve(params: PyTree, cache: Cache, batch: Batch) -> tuple[jax.Array, Cache]:
        logits, cache = forward(params, cache, batch["prompt"], jnp.zeros((), jnp.int32))
        token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        out = jnp.zeros((config.batch, config.gen_len), jnp.int32).at[:, 0].set(token)

        def body(i: jax.Array, carry: tuple[Cache, jax.Array, jax.Array]):
            cache, token, out = carry
            logits, cache = decode_step(params, cache, token, config.prompt_len + i)
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            out = jax.lax.dynamic_update_slice(out, token[:, None], (0, i + 1))
            return cache, token, out

        cache, _, out = jax.lax.fori_loop(0, config.gen_len - 1, body, (cache, token, out))
        return out, cache

    return serve
