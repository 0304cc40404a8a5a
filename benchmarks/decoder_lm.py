"""A decoder-only language model written as a user of plain JAX + optax would write it.

Not the project's own transformer (`partir_plugin/models/transformer.py`, Flax): parameters are
a nested dict built by hand, layers unrolled in a Python loop or stacked and run by
`lax.scan`, pre-norm attention with a causal mask, a GELU MLP, tied-free unembedding, softmax
cross-entropy and `optax.adamw`. Parameter paths follow the Megatron rule's names
(`attn/{query,key,value,out}/kernel`, `mlp/dense_{up,down}/kernel`), so the MP preset applies
unchanged. Benchmarks use it as a model none of our code was tuned on (issue 23).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int = 8
    d_model: int = 256
    heads: int = 8
    ffw: int = 1024
    vocab: int = 1024
    batch: int = 16
    seq_len: int = 128
    scan: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


def _layer(cfg: Config, key) -> dict:
    d, h, dh, f = cfg.d_model, cfg.heads, cfg.head_dim, cfg.ffw
    k = jax.random.split(key, 6)
    normal = lambda key, shape, fan_in: jax.random.normal(key, shape) / math.sqrt(fan_in)
    return {
        "ln_attn": {"scale": jnp.ones((d,))},
        "attn": {"query": {"kernel": normal(k[0], (d, h, dh), d)},
                 "key": {"kernel": normal(k[1], (d, h, dh), d)},
                 "value": {"kernel": normal(k[2], (d, h, dh), d)},
                 "out": {"kernel": normal(k[3], (h, dh, d), d)}},
        "ln_mlp": {"scale": jnp.ones((d,))},
        "mlp": {"dense_up": {"kernel": normal(k[4], (d, f), d)},
                "dense_down": {"kernel": normal(k[5], (f, d), f)}},
    }


def init(cfg: Config, key, opt: optax.GradientTransformation | None = None
         ) -> tuple[dict, optax.OptState, dict]:
    """(params, opt_state, batch) for `cfg` (`opt`: `optimizer()` unless given)."""
    keys = jax.random.split(key, cfg.layers + 3)
    layers = [_layer(cfg, k) for k in keys[: cfg.layers]]
    params = {"embed": jax.random.normal(keys[-3], (cfg.vocab, cfg.d_model)) * 0.02,
              "ln_final": {"scale": jnp.ones((cfg.d_model,))},
              "unembed": jax.random.normal(keys[-2], (cfg.d_model, cfg.vocab))
              / math.sqrt(cfg.d_model)}
    if cfg.scan:
        params["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    else:
        params.update({f"layer_{i}": p for i, p in enumerate(layers)})
    tokens = jax.random.randint(keys[-1], (cfg.batch, cfg.seq_len + 1), 0, cfg.vocab)
    return params, (opt or optimizer()).init(params), {"tokens": tokens}


def optimizer() -> optax.GradientTransformation:
    return optax.adamw(1e-3, weight_decay=0.01)


def _rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _block(cfg: Config, p: dict, x):
    h = _rms_norm(x, p["ln_attn"]["scale"])
    q = jnp.einsum("bsd,dhk->bshk", h, p["attn"]["query"]["kernel"])
    k = jnp.einsum("bsd,dhk->bshk", h, p["attn"]["key"]["kernel"])
    v = jnp.einsum("bsd,dhk->bshk", h, p["attn"]["value"]["kernel"])
    logits = jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(cfg.head_dim)
    causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
    weights = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1)
    attn = jnp.einsum("bhqs,bshk->bqhk", weights, v)
    x = x + jnp.einsum("bqhk,hkd->bqd", attn, p["attn"]["out"]["kernel"])
    h = _rms_norm(x, p["ln_mlp"]["scale"])
    h = jax.nn.gelu(h @ p["mlp"]["dense_up"]["kernel"])
    return x + h @ p["mlp"]["dense_down"]["kernel"]


def loss_fn(cfg: Config, params: dict, batch: dict):
    inputs, targets = batch["tokens"][:, :-1], batch["tokens"][:, 1:]
    x = params["embed"][inputs]
    if cfg.scan:
        x, _ = jax.lax.scan(lambda x, p: (_block(cfg, p, x), None), x, params["layers"])
    else:
        for i in range(cfg.layers):
            x = _block(cfg, params[f"layer_{i}"], x)
    logits = _rms_norm(x, params["ln_final"]["scale"]) @ params["unembed"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def make_train_step(cfg: Config, opt: optax.GradientTransformation | None = None):
    """A fresh `(params, opt_state, batch) -> (params, opt_state, loss)` function (`opt`:
    `optimizer()` unless given; its state must match the one `init` made)."""
    opt = opt or optimizer()

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(cfg, p, batch))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step
