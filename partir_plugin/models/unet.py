"""UNet: the noise-prediction network of a DDPM diffusion model (paper appendix A.3).

Structure (Ho et al. 2020): ``conv_in``; per resolution level ``num_res`` residual blocks
(``down_{l}_res_{i}``) and, except at the last level, a stride-2 ``down_{l}_downsample`` conv;
a middle of ``mid_res_0``, one self-attention layer ``mid_attn`` and ``mid_res_1``; per level in
reverse ``num_res + 1`` blocks (``up_{l}_res_{i}``) each concatenating one skip connection, and
a nearest-neighbour ``up_{l}_upsample`` + conv; GroupNorm -> silu -> ``conv_out``. A sinusoidal
timestep embedding goes through ``time_mlp_0/1`` and is added to every residual block.

Residual block ``*_res_*``: ``norm_0`` (GroupNorm) -> silu -> ``conv_0`` (3x3, C_in -> 4 C_out)
-> ``+ time_proj(temb)`` -> ``norm_1`` -> silu -> ``conv_1`` (3x3, 4 C_out -> C_out) ->
``+ skip(x)`` (a 1x1 conv when C_in != C_out). The 4x hidden width of the conv pair is the
paper's, and is what makes Megatron-style channel sharding natural: ``conv_0`` kernels
``[3, 3, C_in, 4C]`` tile their output channels (dim 3), ``conv_1`` kernels ``[3, 3, 4C, C]``
their input channels (dim 2), so the pair needs one reduction.

Attention ``mid_attn``: ``norm`` (GroupNorm) then ``attn/{query,key,value,out}/kernel`` exactly as
in the transformer (heads on dim 1 of q/k/v, dim 0 of out), no rotary positions.

Paper sizes: 9 down residual blocks (3 levels x 3) and 12 up (3 x 4), 2 middle blocks and one
16-head attention layer, as appendix A.3 states. Batch: ``{"images": f32[B, H, W, C],
"noise": f32[B, H, W, C], "t": i32[B]}``; the loss is the MSE between predicted and true noise
of ``x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) noise`` (noise is in the batch so the train step
is deterministic and has no RNG).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from partir_plugin.models.common import (
    Batch,
    MultiHeadAttention,
    PyTree,
    TrainStep,
    adam_train_step,
    init_for_training,
    init_params,
)


@dataclass(frozen=True)
class Config:
    """UNet sizes; level ``l`` has ``channels * channel_mult[l]`` channels."""

    batch: int = 2
    image_size: int = 16
    in_channels: int = 3
    channels: int = 8
    channel_mult: tuple[int, ...] = (1, 2)
    num_res: int = 1
    hidden_mult: int = 4
    groups: int = 4
    attn_heads: int = 2
    timesteps: int = 1000
    learning_rate: float = 1e-3

    @classmethod
    def small(cls) -> Config:
        """16x16 images, 2 levels, one residual block per level."""
        return cls()

    @classmethod
    def paper(cls) -> Config:
        """3 levels x 3 residual blocks down (9) and x 4 up (12), 16-head middle attention.

        Image size, batch and base width are our choices (the paper does not list them).
        """
        return cls(
            batch=32,
            image_size=64,
            channels=128,
            channel_mult=(1, 2, 4),
            num_res=3,
            groups=32,
            attn_heads=16,
            learning_rate=1e-4,
        )


def timestep_embedding(t: jax.Array, dim: int) -> jax.Array:
    """Sinusoidal embedding ``[B, dim]`` of integer timesteps."""
    half = dim // 2
    freqs = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    args = t.astype(jnp.float32)[:, None] * freqs[None, :]
    return jnp.concatenate([jnp.sin(args), jnp.cos(args)], axis=-1)


class ResBlock(nn.Module):
    """Conv pair with a ``hidden_mult``-times wider middle (see module docstring)."""

    out_channels: int
    hidden_mult: int
    groups: int

    @nn.compact
    def __call__(self, x: jax.Array, temb: jax.Array) -> jax.Array:
        hidden = self.out_channels * self.hidden_mult
        h = nn.silu(nn.GroupNorm(self.groups, name="norm_0")(x))
        h = nn.Conv(hidden, (3, 3), name="conv_0")(h)
        h = h + nn.Dense(hidden, name="time_proj")(nn.silu(temb))[:, None, None, :]
        h = nn.silu(nn.GroupNorm(self.groups, name="norm_1")(h))
        h = nn.Conv(self.out_channels, (3, 3), name="conv_1")(h)
        if x.shape[-1] != self.out_channels:
            x = nn.Conv(self.out_channels, (1, 1), name="skip")(x)
        return x + h


class AttnBlock(nn.Module):
    """GroupNorm + multi-head self-attention over the ``H*W`` positions, residual."""

    heads: int
    groups: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b, hgt, wid, c = x.shape
        h = nn.GroupNorm(self.groups, name="norm")(x).reshape(b, hgt * wid, c)
        h = MultiHeadAttention(self.heads, c // self.heads, use_rope=False, name="attn")(h, None)
        return x + h.reshape(b, hgt, wid, c)


def upsample(x: jax.Array) -> jax.Array:
    """Nearest-neighbour 2x upsampling by broadcast + reshape (no gather)."""
    b, h, w, c = x.shape
    x = jnp.broadcast_to(x[:, :, None, :, None, :], (b, h, 2, w, 2, c))
    return x.reshape(b, 2 * h, 2 * w, c)


class UNet(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x: jax.Array, t: jax.Array) -> jax.Array:
        cfg = self.config
        temb_dim = 4 * cfg.channels
        temb = timestep_embedding(t, cfg.channels)
        temb = nn.Dense(temb_dim, name="time_mlp_0")(temb)
        temb = nn.Dense(temb_dim, name="time_mlp_1")(nn.silu(temb))

        def res(ch: int, name: str) -> ResBlock:
            return ResBlock(ch, cfg.hidden_mult, cfg.groups, name=name)

        h = nn.Conv(cfg.channels, (3, 3), name="conv_in")(x)
        skips = [h]
        levels = len(cfg.channel_mult)
        for lvl, mult in enumerate(cfg.channel_mult):
            for i in range(cfg.num_res):
                h = res(cfg.channels * mult, f"down_{lvl}_res_{i}")(h, temb)
                skips.append(h)
            if lvl != levels - 1:
                h = nn.Conv(h.shape[-1], (3, 3), strides=(2, 2), name=f"down_{lvl}_downsample")(h)
                skips.append(h)
        ch = h.shape[-1]
        h = res(ch, "mid_res_0")(h, temb)
        h = AttnBlock(cfg.attn_heads, cfg.groups, name="mid_attn")(h)
        h = res(ch, "mid_res_1")(h, temb)
        for lvl in reversed(range(levels)):
            for i in range(cfg.num_res + 1):
                h = jnp.concatenate([h, skips.pop()], axis=-1)
                h = res(cfg.channels * cfg.channel_mult[lvl], f"up_{lvl}_res_{i}")(h, temb)
            if lvl != 0:
                h = nn.Conv(h.shape[-1], (3, 3), name=f"up_{lvl}_upsample")(upsample(h))
        h = nn.silu(nn.GroupNorm(cfg.groups, name="norm_out")(h))
        return nn.Conv(cfg.in_channels, (3, 3), name="conv_out")(h)


def alpha_bars(config: Config) -> np.ndarray:
    """Cumulative products of the DDPM linear beta schedule (a compile-time constant)."""
    betas = np.linspace(1e-4, 0.02, config.timesteps, dtype=np.float64)
    return np.cumprod(1.0 - betas).astype(np.float32)


def loss_fn(config: Config, params: PyTree, batch: Batch) -> jax.Array:
    """DDPM epsilon-prediction MSE."""
    abar = jnp.asarray(alpha_bars(config))[batch["t"]][:, None, None, None]
    x_t = jnp.sqrt(abar) * batch["images"] + jnp.sqrt(1.0 - abar) * batch["noise"]
    pred = UNet(config).apply({"params": params}, x_t, batch["t"])
    return jnp.mean((pred - batch["noise"]) ** 2)


def make_batch(config: Config, rng: jax.Array) -> Batch:
    ki, kn, kt = jax.random.split(rng, 3)
    shape = (config.batch, config.image_size, config.image_size, config.in_channels)
    return {
        "images": jax.random.uniform(ki, shape, jnp.float32, -1.0, 1.0),
        "noise": jax.random.normal(kn, shape, jnp.float32),
        "t": jax.random.randint(kt, (config.batch,), 0, config.timesteps, jnp.int32),
    }


def init(config: Config, rng: jax.Array) -> tuple[PyTree, PyTree, Batch]:
    """Parameters (see :func:`~partir_plugin.models.common.fill_params`), Adam state, a random
    batch."""
    return init_for_training(
        config, rng, make_batch,
        lambda key, batch: init_params(UNet(config), key, batch["images"], batch["t"]))


def make_train_step(config: Config) -> TrainStep:
    return adam_train_step(config, loss_fn)
