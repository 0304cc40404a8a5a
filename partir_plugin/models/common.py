"""Pieces shared by the benchmark models: path naming, the Adam train step, attention, RoPE."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

PyTree = Any
Batch = dict[str, jax.Array]
TrainStep = Callable[[PyTree, PyTree, Batch], tuple[PyTree, PyTree, jax.Array]]


def param_paths(tree: Mapping[str, Any], prefix: str = "") -> dict[str, tuple[int, ...]]:
    """Map every leaf of a nested dict to its shape, keyed by its keys joined with ``"/"``.

    This is the path convention the sharding rules (``megatron.py``) are written against.
    """
    out: dict[str, tuple[int, ...]] = {}
    for key, value in tree.items():
        path = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(param_paths(value, path))
        else:
            out[path] = tuple(value.shape)
    return out


def _fan_in(path: str, shape: tuple[int, ...]) -> int:
    """Fan-in of a kernel as Flax's ``lecun_normal`` counts it: every dim but the output one for
    convolutions, the two heads dims of an attention output projection, the input dim of an
    expert kernel ``[E, in, out]`` (``moe.py``: E is a batch dim), else the first dim."""
    if len(shape) == 4 or path.endswith("attn/out/kernel"):
        return math.prod(shape[:-1])
    if path.endswith(("moe/up/kernel", "moe/down/kernel")):
        return shape[-2]
    return shape[0]


def fill_params(abstract: PyTree, rng: jax.Array) -> PyTree:
    """Concrete parameters for an abstract Flax parameter tree (``jax.ShapeDtypeStruct`` leaves).

    Values follow Flax's default initialisers by leaf name (``bias`` -> 0, ``scale`` -> 1,
    ``kernel`` -> normal with std ``1/sqrt(fan_in)``, ``embedding`` -> normal with std
    ``1/sqrt(D)``) but come from *one* ``jax.random.normal`` draw sliced into leaves. Why: Flax's
    ``Module.init`` issues one threefry PRNG call per tensor, and XLA:CPU compiles each one
    separately (≈20 s for the 110-tensor small UNet on 2 cores); one draw compiles in well under
    a second. For the paper's sizes use ``jax.eval_shape`` on a model's ``init`` instead of
    materialising weights: partitioning needs only shapes.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    paths = ["/".join(str(k.key) for k in key_path) for key_path, _ in flat]
    random_sizes = [
        leaf.size if path.rsplit("/", 1)[-1] in ("kernel", "embedding") else 0
        for path, (_, leaf) in zip(paths, flat)
    ]
    noise = jax.random.normal(rng, (max(sum(random_sizes), 1),), jnp.float32)
    leaves, offset = [], 0
    for path, (_, leaf), size in zip(paths, flat, random_sizes):
        name = path.rsplit("/", 1)[-1]
        if name == "scale":
            leaves.append(jnp.ones(leaf.shape, leaf.dtype))
        elif size == 0:
            leaves.append(jnp.zeros(leaf.shape, leaf.dtype))
        else:
            fan = leaf.shape[-1] if name == "embedding" else _fan_in(path, leaf.shape)
            chunk = noise[offset : offset + size].reshape(leaf.shape) / math.sqrt(fan)
            leaves.append(chunk.astype(leaf.dtype))
            offset += size
    return jax.tree_util.tree_unflatten(treedef, leaves)


def init_params(module: nn.Module, rng: jax.Array, *example_args: Any) -> PyTree:
    """Flax's parameter tree (``params`` collection) for ``module``, filled by
    :func:`fill_params`."""
    abstract = jax.eval_shape(module.init, jax.random.key(0), *example_args)["params"]
    return fill_params(abstract, rng)


def adam_train_step(
    config: Any, loss_fn: Callable[[Any, PyTree, Batch], jax.Array]
) -> TrainStep:
    """A plain (un-jitted) train step over ``loss_fn(config, params, batch)`` with Adam at
    ``config.learning_rate``.

    All models share this so their HLO differs only in the model body: one forward, one backward,
    one Adam update (the paper trains every benchmark with Adam, appendix A.3).
    """
    tx = optax.adam(config.learning_rate)

    def train_step(params: PyTree, opt_state: PyTree, batch: Batch):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(config, p, batch))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def init_for_training(
    config: Any,
    rng: jax.Array,
    make_batch: Callable[[Any, jax.Array], Batch],
    params_for: Callable[[jax.Array, Batch], PyTree],
) -> tuple[PyTree, PyTree, Batch]:
    """Parameters (``params_for(rng, batch)``, usually :func:`init_params`), Adam state and a
    random batch (``make_batch(config, rng)``), in one jitted computation so that CPU tests
    compile once."""

    def build(rng: jax.Array) -> tuple[PyTree, PyTree, Batch]:
        k_params, k_batch = jax.random.split(rng)
        batch = make_batch(config, k_batch)
        params = params_for(k_params, batch)
        return params, optax.adam(config.learning_rate).init(params), batch

    return jax.jit(build)(rng)


def rope(x: jax.Array, positions: jax.Array, base: float = 10000.0) -> jax.Array:
    """Rotary position embedding on ``x[..., S, H, Dh]`` at integer ``positions[S]``.

    Parameter-free, so positions add no tensors to the parameter count P.
    """
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * freqs[None, :]  # [S, half]
    sin = jnp.sin(angles)[:, None, :]
    cos = jnp.cos(angles)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def dot_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Softmax attention: ``q[B,S,H,Dh]``, ``k,v[B,T,H,Dh]``, boolean ``mask`` broadcastable to
    ``[B,H,S,T]``; returns ``[B,S,H,Dh]``."""
    scale = q.shape[-1] ** -0.5
    logits = jnp.einsum("bshd,bthd->bhst", q, k) * scale
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(v.dtype)
    return jnp.einsum("bhst,bthd->bshd", weights, v)


class MultiHeadAttention(nn.Module):
    """Self-attention with separate ``query``/``key``/``value``/``out`` projections, no biases.

    Kernels: ``query|key|value: [D, H, Dh]`` (heads on dim 1), ``out: [H, Dh, D]`` (heads on
    dim 0), which is what the Megatron rule shards. Separate tensors (rather than a fused qkv)
    keep the heads dimension explicit in every kernel.
    """

    num_heads: int
    head_dim: int
    use_rope: bool = True
    dtype: Any = None  # the computation dtype of the projections (Flax's `dtype`)

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array | None) -> jax.Array:
        proj = {
            name: nn.DenseGeneral((self.num_heads, self.head_dim), use_bias=False,
                                  dtype=self.dtype, name=name)(x)
            for name in ("query", "key", "value")
        }
        q, k, v = proj["query"], proj["key"], proj["value"]
        if self.use_rope:
            positions = jnp.arange(x.shape[1])
            q, k = rope(q, positions), rope(k, positions)
        y = dot_attention(q, k, v, mask)
        return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), use_bias=False, dtype=self.dtype,
                               name="out")(y)


def causal_mask(seq_len: int) -> jax.Array:
    """Boolean ``[1, 1, S, S]`` lower-triangular mask (query i sees keys <= i)."""
    return jnp.tril(jnp.ones((seq_len, seq_len), dtype=bool))[None, None]
