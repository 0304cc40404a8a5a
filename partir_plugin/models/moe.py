"""MoE: a Mixtral/GShard-style decoder-only transformer whose MLPs are mixtures of experts.

The T blocks (``transformer.py``) with the MLP replaced by GShard's MoE layer (Lepikhin et al.
2020, §2.2; Mixtral's top-2 softmax gates, Jiang et al. 2024), written as the dense einsums
GShard partitions, so that expert parallelism is a matter of tiling, not of rewriting the model:

1. router logits ``[G, S, E]`` (one group G per sequence, S tokens, E experts), top-2 experts per
   token by two ``argmax`` es, gates = softmax over the two chosen logits;
2. each expert takes at most ``C = ceil(2 S capacity_factor / E)`` tokens of a group: a token's
   slot is its position among the group's tokens routed to that expert (a ``cumsum``, first
   choices before second ones); tokens past the capacity are dropped (the residual carries
   them);
3. one-hot dispatch ``[G, S, E, C]`` and gate-weighted combine tensors; dispatch einsum
   ``gsd,gsec->egcd``, the expert FFN ``egcd,edf->egcf`` -> gelu -> ``egcf,efd->egcd``, combine
   einsum ``gsec,egcd->gsd``;
4. the load-balancing loss ``E * sum_e(fraction of first choices on e * mean router prob of
   e)``, averaged over groups and layers, added to the loss with ``aux_loss_weight``.

Parameter tensors (``Config.scan=False``), paths relative to ``params``:

===========================================  ==============  ===========  ==========
path                                         shape           EP           Megatron
===========================================  ==============  ===========  ==========
``embed/embedding``                          ``[V, D]``      None         None
``Block_{i}/norm_attn/scale``                ``[D]``         None         None
``Block_{i}/attn/{query,key,value}/kernel``  ``[D, H, Dh]``  None         1 (heads)
``Block_{i}/attn/out/kernel``                ``[H, Dh, D]``  None         0 (heads)
``Block_{i}/norm_moe/scale``                 ``[D]``         None         None
``Block_{i}/moe/router/kernel``              ``[D, E]``      None         None
``Block_{i}/moe/up/kernel``                  ``[E, D, F]``   0 (experts)  2 (hidden)
``Block_{i}/moe/down/kernel``                ``[E, F, D]``   0 (experts)  1 (hidden)
``norm_final/scale``                         ``[D]``         None         None
``unembed/kernel``                           ``[D, V]``      None         None
===========================================  ==============  ===========  ==========

(EP: ``megatron.expert_rule``; Megatron: ``megatron.moe_rule``.) So P = 9 L + 3; with
``Config.scan=True`` the blocks are one ``nn.scan`` module ``blocks`` whose 9 tensors carry a
leading ``[L]`` dimension (P = 12 for any L), and :func:`~partir_plugin.models.transformer.
stack_blocks` converts unrolled params to that layout.

Batch: ``{"tokens": i32[B, S], "targets": i32[B, S]}`` as for T; B is GShard's group dimension,
so EP tiles it (the token batch) on the expert axis too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from partir_plugin.models import transformer
from partir_plugin.models.common import (
    Batch,
    MultiHeadAttention,
    PyTree,
    TrainStep,
    adam_train_step,
    causal_mask,
    init_for_training,
    init_params,
)

BLOCK_PARAMS = 9
"""Parameter tensors per block."""
GLOBAL_PARAMS = 3
"""Parameter tensors outside the blocks: embedding, final norm, unembedding."""
TOP_K = 2
"""Experts per token (GShard's and Mixtral's top-2)."""


@dataclass(frozen=True)
class Config(transformer.Config):
    """T's sizes (``transformer.Config``; ``ffw`` is each expert's hidden width F) plus the
    experts. The defaults are CPU-test sized: 8 sequences so the batch tiles over 8 devices, 4
    experts so the expert dimension tiles over an expert axis of 4 (or 2 with a model axis of
    2)."""

    batch: int = 8
    experts: int = 4
    capacity_factor: float = 1.25
    aux_loss_weight: float = 0.01

    @classmethod
    def paper(cls, scan: bool = False) -> Config:
        """T32 (``transformer.Config.paper``) with 8 experts per layer (Mixtral 8x7B's expert
        count; not a configuration of the PartIR paper), and batch 64 rather than 48 so that 32
        devices (batch x expert) divide the token batch."""
        return replace(super().paper(scan), batch=64, experts=8)

    @property
    def capacity(self) -> int:
        """C: token slots per expert and group, GShard's ``2 S / E`` times the capacity
        factor."""
        return max(1, math.ceil(TOP_K * self.seq_len * self.capacity_factor / self.experts))

    @property
    def num_param_tensors(self) -> int:
        """P: the number of parameter tensors (leaves of ``params``)."""
        return BLOCK_PARAMS * (1 if self.scan else self.layers) + GLOBAL_PARAMS


class ExpertDense(nn.Module):
    """E independent dense layers applied to their own tokens: ``x[E, G, C, in]`` with
    ``kernel[E, in, out]`` -> ``[E, G, C, out]``, one einsum with the experts as a batch
    dimension (what EP tiles)."""

    experts: int
    features: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
        kernel = self.param("kernel", init, (self.experts, x.shape[-1], self.features))
        return jnp.einsum("egcd,edf->egcf", x, kernel)


def route(logits: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """GShard top-2 routing of ``logits[G, S, E]``: the one-hot ``dispatch[G, S, E, C]``, the
    gate-weighted ``combine[G, S, E, C]`` and the load-balancing loss (a scalar).

    Slots come from ``cumsum`` over the group's tokens, first choices before second ones, as in
    GShard's Algorithm 1; a token whose slot is past ``capacity`` is dropped for that expert.
    The one-hots carry no gradient: the router learns through the gates and the auxiliary loss.
    """
    experts = logits.shape[-1]
    probs = jax.nn.softmax(logits, axis=-1)
    first = jax.nn.one_hot(jnp.argmax(logits, axis=-1), experts, dtype=logits.dtype)
    masked = jnp.where(first > 0, jnp.finfo(logits.dtype).min, logits)
    second = jax.nn.one_hot(jnp.argmax(masked, axis=-1), experts, dtype=logits.dtype)
    # Mixtral's gates: softmax over the two chosen logits (= the two probs renormalised).
    p1, p2 = (jnp.sum(probs * m, axis=-1) for m in (first, second))
    gate1, gate2 = p1 / (p1 + p2), p2 / (p1 + p2)
    # Slot of each token at its expert: first choices take 0, 1, ...; second choices follow.
    slot1 = jnp.cumsum(first, axis=1) - first
    slot2 = jnp.cumsum(second, axis=1) - second + jnp.sum(first, axis=1, keepdims=True)
    dispatch, combine = [], []
    for mask, slot, gate in ((first, slot1, gate1), (second, slot2, gate2)):
        mask = mask * (slot < capacity)
        onehot = jax.nn.one_hot(jnp.sum(slot * mask, axis=-1).astype(jnp.int32), capacity,
                                dtype=logits.dtype)  # [G, S, C]
        dispatch.append(mask[..., None] * onehot[:, :, None, :])
        combine.append(gate[..., None, None] * dispatch[-1])
    density = jnp.mean(first, axis=1)  # [G, E]: fraction of first choices per expert
    density_proxy = jnp.mean(probs, axis=1)
    aux = experts * jnp.mean(jnp.sum(density * density_proxy, axis=-1))
    return dispatch[0] + dispatch[1], combine[0] + combine[1], aux


class MoELayer(nn.Module):
    """Router, dispatch, expert FFN (``up`` -> gelu -> ``down``, E experts each), combine.

    Returns the layer's output ``[G, S, D]`` and its load-balancing loss.
    """

    config: Config

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        cfg = self.config
        logits = nn.Dense(cfg.experts, use_bias=False, name="router")(x)
        dispatch, combine, aux = route(logits, cfg.capacity)
        tokens = jnp.einsum("gsd,gsec->egcd", x, jax.lax.stop_gradient(dispatch))
        h = nn.gelu(ExpertDense(cfg.experts, cfg.ffw, name="up")(tokens))
        y = ExpertDense(cfg.experts, cfg.d_model, name="down")(h)
        return jnp.einsum("gsec,egcd->gsd", combine, y), aux


class Block(nn.Module):
    """One pre-norm decoder block: attention, then the MoE layer; returns ``(x, aux)``."""

    config: Config

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        cfg = self.config
        h = nn.RMSNorm(name="norm_attn")(x)
        x = x + MultiHeadAttention(cfg.heads, cfg.head_dim, name="attn")(
            h, causal_mask(x.shape[1]))
        y, aux = MoELayer(cfg, name="moe")(nn.RMSNorm(name="norm_moe")(x))
        return x + y, aux


class MoETransformer(nn.Module):
    """Returns the logits ``[B, S, V]`` and the mean load-balancing loss over layers."""

    config: Config

    @nn.compact
    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
        cfg = self.config
        x = nn.Embed(cfg.vocab, cfg.d_model, name="embed")(tokens)
        x, auxes = transformer.apply_blocks(lambda name: Block(cfg, name=name), cfg.layers,
                                            cfg.scan, x)
        x = nn.RMSNorm(name="norm_final")(x)
        return nn.Dense(cfg.vocab, use_bias=False, name="unembed")(x), jnp.mean(auxes)


def loss_fn(config: Config, params: PyTree, batch: Batch) -> jax.Array:
    """Mean next-token cross-entropy plus ``aux_loss_weight`` times the load-balancing loss."""
    logits, aux = MoETransformer(config).apply({"params": params}, batch["tokens"])
    xent = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
    return xent + config.aux_loss_weight * aux


def init(config: Config, rng: jax.Array) -> tuple[PyTree, PyTree, Batch]:
    """Parameters, Adam state and a random batch, in one jitted computation; the scan variant
    gets the unrolled variant's weights stacked (as ``transformer.init`` does)."""

    def params_for(key: jax.Array, batch: Batch) -> PyTree:
        params = init_params(MoETransformer(replace(config, scan=False)), key, batch["tokens"])
        return transformer.stack_blocks(params, config.layers) if config.scan else params

    return init_for_training(config, rng, transformer.make_batch, params_for)


def make_train_step(config: Config) -> TrainStep:
    return adam_train_step(config, loss_fn)
