"""A two-layer MLP train step for the collective-record tests (tests/test_records.py).

Lines that a collective must be attributed to carry a `# DIAG:<name>` marker; the tests find
their numbers by reading this file, so moving code never breaks them.
"""

import jax
import jax.numpy as jnp

LAYERS = ("layer0", "layer1")
FEATURES, HIDDEN, BATCH = 16, 64, 16


def layer(p, x):
    h = x @ p["w_up"]  # DIAG:up
    h = jax.nn.relu(h + p["b_up"])  # DIAG:act
    return h @ p["w_down"]  # DIAG:down


def loss_fn(params, batch):
    x = batch["x"]
    x = layer(params["layer0"], x)  # DIAG:layer0
    x = layer(params["layer1"], x)  # DIAG:layer1
    return jnp.mean((x - batch["y"]) ** 2)  # DIAG:loss


def train_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)  # DIAG:grad
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)  # DIAG:sgd
    return params, loss


def scan_loss_fn(params, batch):
    def body(x, p):
        h = jax.nn.relu(x @ p["w_up"])  # DIAG:scan_up
        return h @ p["w_down"], None  # DIAG:scan_down

    x, _ = jax.lax.scan(body, batch["x"], params)
    return jnp.mean((x - batch["y"]) ** 2)


def scan_train_step(params, batch):
    loss, grads = jax.value_and_grad(scan_loss_fn)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def conflict_step(w, x):
    return jnp.tanh(x @ w)  # DIAG:conflict


def megatron_rule(path: str, shape) -> int | None:
    """Column-parallel up-projection (and its bias), row-parallel down-projection; dimensions
    counted from the end, so stacked (scanned) layers take the same rule."""
    if path.endswith(("w_up", "b_up")):
        return len(shape) - 1
    if path.endswith("w_down"):
        return len(shape) - 2
    return None


def scan_example():
    _, batch = example()
    stacked = {"w_up": jax.ShapeDtypeStruct((len(LAYERS), FEATURES, HIDDEN), jnp.float32),
               "w_down": jax.ShapeDtypeStruct((len(LAYERS), HIDDEN, FEATURES), jnp.float32)}
    return stacked, batch


def example():
    shapes = {"w_up": (FEATURES, HIDDEN), "b_up": (HIDDEN,), "w_down": (HIDDEN, FEATURES)}
    params = {name: {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()}
              for name in LAYERS}
    batch = {"x": jax.ShapeDtypeStruct((BATCH, FEATURES), jnp.float32),
             "y": jax.ShapeDtypeStruct((BATCH, FEATURES), jnp.float32)}
    return params, batch
