"""T: a Chinchilla-style decoder-only transformer (paper §7.1, appendix A.3).

Architecture: ``nn.Embed`` token lookup (a gather, so EMB sharding can tile the table), L
pre-norm blocks (RMSNorm -> causal multi-head attention with rotary positions -> residual;
RMSNorm -> ``dense_up`` -> gelu -> ``dense_down`` -> residual), a final RMSNorm and an untied
unembedding; mean next-token softmax cross-entropy. No biases anywhere (as in Chinchilla), so
every block has exactly the weight matrices Megatron shards plus two norm scales.

Parameter tensors (``Config.scan=False``), paths relative to ``params``:

=====================================  ====================  ===========================
path                                   shape                 Megatron (``megatron.py``)
=====================================  ====================  ===========================
``embed/embedding``                    ``[V, D]``            None
``Block_{i}/norm_attn/scale``          ``[D]``               None
``Block_{i}/attn/query/kernel``        ``[D, H, Dh]``        1 (heads)
``Block_{i}/attn/key/kernel``          ``[D, H, Dh]``        1 (heads)
``Block_{i}/attn/value/kernel``        ``[D, H, Dh]``        1 (heads)
``Block_{i}/attn/out/kernel``          ``[H, Dh, D]``        0 (heads)
``Block_{i}/norm_mlp/scale``           ``[D]``               None
``Block_{i}/mlp/dense_up/kernel``      ``[D, F]``            1 (output)
``Block_{i}/mlp/dense_down/kernel``    ``[F, D]``            0 (input)
``norm_final/scale``                   ``[D]``               None
``unembed/kernel``                     ``[D, V]``            None
=====================================  ====================  ===========================

So **P = 8 L + 3** parameter tensors (the paper's T32 has 9 per block + embeddings = 289; ours
has no extra per-block normalisation and an untied unembedding plus a final norm), of which 6 L
are Megatron-sharded. With ``Config.scan=True`` the L blocks are one ``nn.scan`` module named
``blocks`` whose 8 tensors carry a leading ``[L]`` dimension (``blocks/attn/query/kernel:
[L, D, H, Dh]``), so P = 11 for any L; :func:`stack_blocks` converts unrolled params to that
layout.

Batch: ``{"tokens": i32[B, S], "targets": i32[B, S]}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

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

BLOCK_PARAMS = 8
"""Parameter tensors per block."""
GLOBAL_PARAMS = 3
"""Parameter tensors outside the blocks: embedding, final norm, unembedding."""


@dataclass(frozen=True)
class Config:
    """T sizes. ``ffw`` is the MLP hidden width F; ``scan`` selects the ``nn.scan`` variant."""

    layers: int = 2
    batch: int = 2
    seq_len: int = 8
    vocab: int = 32
    d_model: int = 16
    heads: int = 2
    head_dim: int = 8
    ffw: int = 32
    learning_rate: float = 1e-2
    scan: bool = False
    # The computation dtype (Flax's `dtype`): "bfloat16" computes the layers, their matmuls
    # and activations in bf16 from f32 parameters (f32 master weights and Adam state), as
    # large runs train; the loss is taken in f32. None: every value has its parameter's type.
    dtype: Any = None

    @classmethod
    def small(cls, layers: int = 2, scan: bool = False) -> Config:
        return cls(layers=layers, scan=scan)

    @classmethod
    def paper(cls, scan: bool = False) -> Config:
        """T32: 32 layers, batch 48, 32 heads, d_model 4096, 32k vocabulary (appendix A.3).

        ``ffw = 8/3 d_model`` (rounded to 128) and sequence length 2048 are our choices; they give
        ≈5.3B parameters (paper: 5B).
        """
        return cls(
            layers=32,
            batch=48,
            seq_len=2048,
            vocab=32000,
            d_model=4096,
            heads=32,
            head_dim=128,
            ffw=10880,
            learning_rate=1e-4,
            scan=scan,
        )

    @classmethod
    def paper_t48(cls, scan: bool = False) -> Config:
        """T48: 48 layers, batch 64, 64 heads, d_model 8192 (≈31B parameters; paper: 32B)."""
        return cls(
            layers=48,
            batch=64,
            seq_len=2048,
            vocab=32000,
            d_model=8192,
            heads=64,
            head_dim=128,
            ffw=21888,
            learning_rate=1e-4,
            scan=scan,
        )

    @property
    def num_param_tensors(self) -> int:
        """P: the number of parameter tensors (leaves of ``params``)."""
        return BLOCK_PARAMS * (1 if self.scan else self.layers) + GLOBAL_PARAMS


class MLPBlock(nn.Module):
    """``dense_up`` (column-parallel under Megatron) -> gelu -> ``dense_down`` (row-parallel)."""

    d_model: int
    ffw: int
    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.gelu(nn.Dense(self.ffw, use_bias=False, dtype=self.dtype, name="dense_up")(x))
        return nn.Dense(self.d_model, use_bias=False, dtype=self.dtype, name="dense_down")(h)


class Block(nn.Module):
    """One pre-norm decoder block; returns ``(x, None)`` (no per-layer output, see
    :func:`apply_blocks`)."""

    config: Config

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, None]:
        cfg = self.config
        mask = causal_mask(x.shape[1])
        h = nn.RMSNorm(dtype=cfg.dtype, name="norm_attn")(x)
        x = x + MultiHeadAttention(cfg.heads, cfg.head_dim, dtype=cfg.dtype, name="attn")(h, mask)
        h = nn.RMSNorm(dtype=cfg.dtype, name="norm_mlp")(x)
        return x + MLPBlock(cfg.d_model, cfg.ffw, cfg.dtype, name="mlp")(h), None


def _scan_body(block: nn.Module, x: jax.Array, _: Any) -> tuple[jax.Array, Any]:
    return block(x)


def apply_blocks(make_block: Callable[[str], nn.Module], layers: int, scan: bool,
                 x: jax.Array) -> tuple[jax.Array, Any]:
    """Run ``layers`` blocks ``x -> (x, out)`` in either layout :func:`stack_blocks` converts
    between: unrolled, block i named ``Block_{i}``, or one ``nn.scan`` module ``blocks`` whose
    parameters carry a leading ``[L]`` dimension. ``make_block(name)`` builds a block; call this
    from a compact method (the blocks become that module's children). Returns the last ``x``
    and the blocks' outs stacked on a leading ``[L]`` axis (MoE: each layer's auxiliary loss).
    """
    if scan:
        scanned = nn.scan(
            _scan_body,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            length=layers,
        )
        return scanned(make_block("blocks"), x, None)
    outs = []
    for i in range(layers):
        x, out = make_block(f"Block_{i}")(x)
        outs.append(out)
    return x, jax.tree.map(lambda *o: jnp.stack(o), *outs)


class Transformer(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.config
        x = nn.Embed(cfg.vocab, cfg.d_model, dtype=cfg.dtype, name="embed")(tokens)
        x, _ = apply_blocks(lambda name: Block(cfg, name=name), cfg.layers, cfg.scan, x)
        x = nn.RMSNorm(dtype=cfg.dtype, name="norm_final")(x)
        return nn.Dense(cfg.vocab, use_bias=False, dtype=cfg.dtype, name="unembed")(x)


def loss_fn(config: Config, params: PyTree, batch: Batch) -> jax.Array:
    """Mean next-token cross-entropy (in f32 when the layers compute in a narrower type)."""
    logits = Transformer(config).apply({"params": params}, batch["tokens"])
    if config.dtype is not None:
        logits = logits.astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()


def make_batch(config: Config, rng: jax.Array) -> Batch:
    """Random tokens; targets are the tokens shifted left (a language-modelling batch)."""
    seq = jax.random.randint(rng, (config.batch, config.seq_len + 1), 0, config.vocab, jnp.int32)
    return {"tokens": seq[:, :-1], "targets": seq[:, 1:]}


def init(config: Config, rng: jax.Array) -> tuple[PyTree, PyTree, Batch]:
    """Parameters, Adam state and a random batch, in one jitted computation.

    Weights are drawn for the unrolled layout and stacked for ``scan=True``, so both variants
    get *identical* weights from the same ``rng`` (see
    :func:`~partir_plugin.models.common.fill_params` for the initialiser).
    """
    def params_for(key: jax.Array, batch: Batch) -> PyTree:
        params = init_params(Transformer(replace(config, scan=False)), key, batch["tokens"])
        return stack_blocks(params, config.layers) if config.scan else params

    return init_for_training(config, rng, make_batch, params_for)


def make_train_step(config: Config) -> TrainStep:
    return adam_train_step(config, loss_fn)


def stack_blocks(params: PyTree, layers: int) -> PyTree:
    """Convert unrolled params (``Block_{i}/...``) to the scan layout (``blocks/...`` with a
    leading ``[L]`` dimension), so both variants can be run on identical weights."""
    blocks = [params[f"Block_{i}"] for i in range(layers)]
    out = {k: v for k, v in params.items() if not k.startswith("Block_")}
    out["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)
    return out
