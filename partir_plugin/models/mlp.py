"""A small MLP classifier: the simplest model exercising dot, relu, softmax cross-entropy, Adam.

Parameter paths: ``hidden_{i}/kernel [in, h_i]``, ``hidden_{i}/bias [h_i]``, ``logits/kernel``,
``logits/bias``; P = 2 * (len(hidden) + 1). Batch: ``{"x": f32[B, in_dim], "labels": i32[B]}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from partir_plugin.models.common import (
    Batch,
    PyTree,
    TrainStep,
    adam_train_step,
    init_for_training,
    init_params,
)


@dataclass(frozen=True)
class Config:
    """MLP sizes; ``hidden`` lists the widths of the relu layers."""

    batch: int = 8
    in_dim: int = 16
    hidden: tuple[int, ...] = (32, 32)
    num_classes: int = 10
    learning_rate: float = 1e-2

    @classmethod
    def small(cls) -> Config:
        return cls()

    @classmethod
    def paper(cls) -> Config:
        """Not a paper model; a mid-size MLP for quick benchmark sanity runs."""
        return cls(
            batch=256, in_dim=1024, hidden=(4096, 4096, 4096), num_classes=1000, learning_rate=1e-3
        )


class MLP(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for i, width in enumerate(self.config.hidden):
            x = nn.relu(nn.Dense(width, name=f"hidden_{i}")(x))
        return nn.Dense(self.config.num_classes, name="logits")(x)


def loss_fn(config: Config, params: PyTree, batch: Batch) -> jax.Array:
    """Mean softmax cross-entropy of the integer labels."""
    logits = MLP(config).apply({"params": params}, batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()


def make_batch(config: Config, rng: jax.Array) -> Batch:
    kx, ky = jax.random.split(rng)
    return {
        "x": jax.random.normal(kx, (config.batch, config.in_dim), jnp.float32),
        "labels": jax.random.randint(ky, (config.batch,), 0, config.num_classes, jnp.int32),
    }


def init(config: Config, rng: jax.Array) -> tuple[PyTree, PyTree, Batch]:
    """Parameters (see :func:`~partir_plugin.models.common.fill_params`), Adam state, a random
    batch."""
    return init_for_training(config, rng, make_batch,
                             lambda key, batch: init_params(MLP(config), key, batch["x"]))


def make_train_step(config: Config) -> TrainStep:
    return adam_train_step(config, loss_fn)
