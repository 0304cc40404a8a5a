"""GNS: an encode-process-decode message-passing graph network (paper §7.3, appendix A.3).

Nodes and edges are encoded by MLPs to ``latent`` features; each of ``steps`` processor steps
``step_{k}`` updates every edge from its own latent and its sender's and receiver's node latents
(gathered with the integer index arrays ``senders``/``receivers``), sums the new edge latents into
their receivers with ``jax.ops.segment_sum`` and updates every node from its latent and that sum;
both updates are residual and use separate (unshared) weights per step. A decoder MLP maps node
latents to per-node outputs (the simulator's accelerations); the loss is their MSE to targets.

Edge sharding (ES) therefore is tiling dim 0 of the edge inputs (``edges``, ``senders``,
``receivers``): gathers become local, and each ``segment_sum`` produces partial node sums that
need one reduction per step.

Parameter paths: ``{node_encoder, edge_encoder, decoder}/dense_{i}/{kernel,bias}``,
``step_{k}/{edge_mlp, node_mlp}/dense_{i}/{kernel,bias}``, and ``.../norm/{scale,bias}`` on every
MLP but the decoder. Each MLP has ``mlp_layers`` Dense layers (``mlp_layers - 1`` of width
``mlp_hidden`` then one of width ``latent``, or ``out_dim`` for the decoder).

Batch (nodes or edges on dim 0): ``{"nodes": f32[N, node_features], "edges": f32[E,
edge_features], "senders": i32[E], "receivers": i32[E], "targets": f32[N, out_dim]}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp

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
    """GNS sizes."""

    nodes: int = 16
    edges: int = 32
    node_features: int = 4
    edge_features: int = 2
    out_dim: int = 2
    latent: int = 8
    mlp_hidden: int = 16
    mlp_layers: int = 2
    steps: int = 2
    learning_rate: float = 1e-3

    @classmethod
    def small(cls) -> Config:
        return cls()

    @classmethod
    def paper(cls, edges: int = 8192) -> Config:
        """2048 nodes, 8192..65536 edges, 24 steps, 5-layer MLPs of width 1024, latent 512.

        Feature and output widths are our choices (the paper does not list them).
        """
        return cls(
            nodes=2048,
            edges=edges,
            node_features=16,
            edge_features=4,
            out_dim=3,
            latent=512,
            mlp_hidden=1024,
            mlp_layers=5,
            steps=24,
            learning_rate=1e-4,
        )


class MLP(nn.Module):
    """``layers`` Dense layers with relu between them, optionally LayerNorm on the output."""

    hidden: int
    out: int
    layers: int
    norm: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for i in range(self.layers - 1):
            x = nn.relu(nn.Dense(self.hidden, name=f"dense_{i}")(x))
        x = nn.Dense(self.out, name=f"dense_{self.layers - 1}")(x)
        return nn.LayerNorm(name="norm")(x) if self.norm else x


class GNS(nn.Module):
    config: Config

    @nn.compact
    def __call__(
        self, nodes: jax.Array, edges: jax.Array, senders: jax.Array, receivers: jax.Array
    ) -> jax.Array:
        cfg = self.config
        mlp = partial(MLP, cfg.mlp_hidden, cfg.latent, cfg.mlp_layers)
        v = mlp(name="node_encoder")(nodes)
        e = mlp(name="edge_encoder")(edges)
        for k in range(cfg.steps):
            e, v = EdgeNodeStep(cfg, name=f"step_{k}")(e, v, senders, receivers)
        return MLP(cfg.mlp_hidden, cfg.out_dim, cfg.mlp_layers, norm=False, name="decoder")(v)


class EdgeNodeStep(nn.Module):
    """One message-passing step: residual edge update, ``segment_sum`` into receivers, residual
    node update."""

    config: Config

    @nn.compact
    def __call__(
        self, e: jax.Array, v: jax.Array, senders: jax.Array, receivers: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        cfg = self.config
        mlp = partial(MLP, cfg.mlp_hidden, cfg.latent, cfg.mlp_layers)
        e_new = mlp(name="edge_mlp")(jnp.concatenate([e, v[senders], v[receivers]], axis=-1))
        agg = jax.ops.segment_sum(e_new, receivers, num_segments=cfg.nodes)
        v_new = mlp(name="node_mlp")(jnp.concatenate([v, agg], axis=-1))
        return e + e_new, v + v_new


def loss_fn(config: Config, params: PyTree, batch: Batch) -> jax.Array:
    """MSE of the per-node predictions."""
    pred = GNS(config).apply(
        {"params": params}, batch["nodes"], batch["edges"], batch["senders"], batch["receivers"]
    )
    return jnp.mean((pred - batch["targets"]) ** 2)


def make_batch(config: Config, rng: jax.Array) -> Batch:
    """A random graph: Gaussian features and uniformly random sender/receiver indices."""
    kn, ke, ks, kr, kt = jax.random.split(rng, 5)
    n, m = config.nodes, config.edges
    return {
        "nodes": jax.random.normal(kn, (n, config.node_features), jnp.float32),
        "edges": jax.random.normal(ke, (m, config.edge_features), jnp.float32),
        "senders": jax.random.randint(ks, (m,), 0, n, jnp.int32),
        "receivers": jax.random.randint(kr, (m,), 0, n, jnp.int32),
        "targets": jax.random.normal(kt, (n, config.out_dim), jnp.float32),
    }


def init(config: Config, rng: jax.Array) -> tuple[PyTree, PyTree, Batch]:
    """Parameters (see :func:`~partir_plugin.models.common.fill_params`), Adam state, a random
    graph."""
    return init_for_training(config, rng, make_batch, lambda key, b: init_params(
        GNS(config), key, b["nodes"], b["edges"], b["senders"], b["receivers"]))


def make_train_step(config: Config) -> TrainStep:
    return adam_train_step(config, loss_fn)
