"""A Flax MLP classifier and its Optax Adam train step: the smallest real training program."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


class MLP(nn.Module):
    hidden: int = 64
    layers: int = 3
    classes: int = 16

    @nn.compact
    def __call__(self, x):
        for _ in range(self.layers - 1):
            x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(self.classes)(x)


def make_train_step(model: MLP, optimizer: optax.GradientTransformation):
    def train_step(params, opt_state, batch):
        def loss_fn(p):
            logits = model.apply({"params": p}, batch["x"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def init(model: MLP, optimizer, batch_size: int = 64, features: int = 32, seed: int = 0):
    kx, ky, kp = jax.random.split(jax.random.PRNGKey(seed), 3)
    batch = {"x": jax.random.normal(kx, (batch_size, features)),
             "y": jax.random.randint(ky, (batch_size,), 0, model.classes)}
    params = model.init(kp, jnp.zeros((1, features)))["params"]
    return params, optimizer.init(params), batch


def megatron_rule(path: str, shape: tuple) -> int | None:
    """Megatron MP for an MLP: odd layers split their outputs, even layers their inputs, so
    each pair needs one all_reduce forward and one backward."""
    if not path.endswith("kernel"):
        return None
    layer = int(path.split("/")[0].split("_")[-1])
    return 1 if layer % 2 == 0 else 0
