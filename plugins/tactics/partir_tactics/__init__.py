"""Tactic presets of paper 1 appendix A.6, as factories over argument names and param paths.

    BP = batch_parallel(axis="batch", inputs=("batch",))
    MP = megatron(rule, axis="model")            # rule: (path, shape) -> dim | None
    Z3 = zero3(axis="batch")
    MQ = multi_query(axis="model")               # needs the model's attention tags
    EP = expert_parallel(rule, axis="expert")    # rule: (path, shape) -> expert dim | None
    PP = pipeline_parallel(axis="stage", microbatches=8)   # the layer loop, GPipe
    RM = rematerialization(policy="full")   # the layer loop's body, recomputed

Each returns a tactic (most a `ManualPartition`); compose them in a schedule list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from partir_plugin import FIRST_DIVISIBLE_DIM, REPLICATED, ManualPartition, hookimpl
from partir_plugin.extend import PipelineParallel, Regather, Rematerialization

Selector = Any  # an int dimension, a partir selector constant, or (path, shape) -> dim | None


def batch_parallel(axis: str = "batch", inputs: Sequence[str] = ("batch",), dim: int = 0,
                   name: str = "BP") -> ManualPartition:
    """BP: tile dimension `dim` (the batch) of every leaf of the `inputs` arguments."""
    return ManualPartition({arg: dim for arg in inputs}, axis=axis, name=name)


def model_parallel(rule: Callable[[str, tuple], int | None], axis: str = "model",
                   params: str = "params", name: str = "MP") -> ManualPartition:
    """MP: tile each parameter on the dimension `rule(path, shape)` returns (None: let
    propagation decide). With a Megatron rule, 2 all_reduces per layer forward, 2 backward."""
    return ManualPartition({params: rule}, axis=axis, name=name)


def _zero_dim(dim: Selector) -> Selector:
    """ZeRO's `dim` as a selector over whole states: an int picks that dimension of each
    leaf that has it, and leaves the others (Adam's scalar step count) replicated."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        return dim

    def rule(path: str, shape: tuple) -> int | None:
        d = dim + len(shape) if dim < 0 else dim
        return d if 0 <= d < len(shape) else None

    return rule


def zero2(axis: str = "batch", params: str = "params", opt_state: str = "opt_state",
          dim: Selector = FIRST_DIVISIBLE_DIM, name: str = "Z2") -> ManualPartition:
    """Z2: shard optimizer state (and so gradients) on `axis`; keep parameters replicated.
    `dim` picks each leaf's sharded dimension (as Z3's)."""
    return ManualPartition({params: REPLICATED, opt_state: _zero_dim(dim)}, axis=axis,
                           name=name)


def zero3(axis: str = "batch", params: str = "params", opt_state: str = "opt_state",
          regather: bool | str = "vectors", dim: Selector = FIRST_DIVISIBLE_DIM,
          name: str = "Z3") -> ManualPartition:
    """Z3 (FSDP): shard parameters and optimizer state on `axis`; parameters are gathered
    before use and their gradients reduce-scattered.

    `dim` picks each leaf's sharded dimension: `FIRST_DIVISIBLE_DIM` (the default: the most
    major dimension that still divides, so a gathered or scattered tile is one contiguous
    block; after MP, the next one; a scan's layer dimension last), an int (leaves without
    that dimension, scalars, stay replicated), or a rule `(path, shape) -> dim | None`.
    `regather` says which parameters are gathered afresh for each use, so the backward pass
    gathers them again instead of keeping the forward's copy alive: "vectors" (the default:
    norm scales and biases, as jax.jit's partitioner does; it saves XLA a `[batch, seq, d]`
    broadcast buffer per norm), True / "all" (FSDP's reshard-after-forward: one more
    all_gather per parameter), False / "none" (one gathered copy per step)."""
    policy = {True: Regather.ALL, False: Regather.NONE}.get(regather, regather)
    dim = _zero_dim(dim)
    return ManualPartition({params: dim, opt_state: dim}, axis=axis, name=name,
                           regather={params: Regather(policy)})


def embedding(axis: str = "model", params: str = "params", match: str = "embedding",
              dim: int = -1, name: str = "EMB") -> ManualPartition:
    """EMB: tile embedding tables (parameters with a path component equal to `match`; Flax's
    `nn.Embed` names its table "embedding") on dimension `dim`: -1, d_model, partitions the
    activations that flow from the lookup; 0, the vocabulary, makes each lookup a masked local
    gather whose partial results are summed."""

    def rule(path: str, shape: tuple) -> int | None:
        return dim % len(shape) if match in path.split("/") and len(shape) >= 2 else None

    return ManualPartition({params: rule}, axis=axis, name=name)


def multi_query(axis: str = "model", cache: str = "cache", batch_dim: int = 0,
                heads_dim: int = -2, query: str = "attention/query", key: str = "attention/key",
                value: str = "attention/value", output: str = "attention/output",
                name: str = "MQ") -> ManualPartition:
    """MQ: multi-query sharding (Pope et al. 2022) of decoding with a key-value cache.

    Multi-query attention has one key/value head, so Megatron cannot split the cache by heads
    and every model shard would hold all of it. MQ tiles the `cache` argument's leaves on
    their batch dimension along `axis` instead, and runs the attention core batch-sharded
    between head-sharded projections. It addresses the core through four tags the model puts
    on it (`partir_plugin.tag`): `query` (after the projection, before the scores) and `key`,
    `value` (before the cache update) are tiled on `batch_dim`, and `output` (before the
    output projection) on `heads_dim`. Each tag is a redistribution point: per layer, one
    all_to_all takes the head-sharded queries to batch shards, one takes the attention
    output back to heads; keys and values computed whole are just sliced.

    MQ composes after MP (the paper's BP+MP+MQ): its tags are reserved before the schedule
    runs, so Megatron's propagation stops at them and the core waits for MQ.
    """
    return ManualPartition({cache: batch_dim}, axis=axis, name=name,
                           tags={query: batch_dim, key: batch_dim, value: batch_dim,
                                 output: heads_dim})


def edge_sharding(axis: str = "batch", inputs: str = "batch",
                  edges: Sequence[str] = ("edges", "senders", "receivers"),
                  name: str = "ES") -> ManualPartition:
    """ES: tile the edge arrays of a graph on their edge dimension (0); node features stay
    replicated, so every aggregation over edges becomes an all_reduce."""
    return ManualPartition({inputs: {key: 0 for key in edges}}, axis=axis, name=name)


def expert_parallel(rule: Callable[[str, tuple], int | None], axis: str = "expert",
                    params: str = "params", batch: str = "batch", dim: int = 0,
                    strict: bool = False, name: str = "EP") -> ManualPartition:
    """EP: expert parallelism (GShard). Tile each expert parameter on the dimension
    `rule(path, shape)` returns (its expert dimension; None for the rest), and dimension `dim`
    (the tokens) of every leaf of the `batch` argument, both on `axis`.

    Tiling the tokens too is what makes it GShard's layout rather than "experts sharded,
    tokens replicated": every device routes its own tokens and holds its own experts, so the
    dispatched tokens, not the expert weights, have to move between the two. A `rule` that
    decides no parameter warns (`PartitionWarning`), or raises with `strict=True`.
    """
    return ManualPartition({batch: dim, params: rule}, axis=axis, name=name, strict=strict)


def pipeline_parallel(axis: str = "stage", microbatches: int = 4, schedule: str = "gpipe",
                      repeats: int = 1, poison_bubbles: bool = False,
                      name: str = "PP") -> PipelineParallel:
    """PP: pipeline the layer loop (a `lax.scan` over stacked layers, e.g. Flax `nn.scan`)
    over `axis`, one stage per device along it, the batch split into `microbatches` (GPipe:
    bubble (S-1)/(M+S-1); `schedule="circular"` with `repeats=R`: stage s holds layer chunks
    s, s+S, ..., bubble (S-1)/(M·R+S-1)). The stacked parameters stay on their stage; the
    stage state moves by one collective_permute per iteration (forward and backward). Compose
    with BP, MP and Z3 on the other axes."""
    return PipelineParallel(axis=axis, microbatches=microbatches, schedule=schedule,
                            repeats=repeats, poison_bubbles=poison_bubbles, name=name)


def rematerialization(policy: str = "full", names: Sequence[str] = (), offload: bool = False,
                      modules: str | Sequence[str] = (), unit: str = "iteration",
                      name: str = "RM") -> Rematerialization:
    """RM: recompute the layer loop's activations in the backward pass (the body of the
    `lax.scan` over stacked layers; with PP, each pipeline iteration) under `jax.checkpoint`:
    `policy` "full" keeps only each layer's input, "dots" also the matmul outputs without
    batch dimensions, "all_dots" every matmul output, "names" the values the model tags with
    `jax.ad_checkpoint.checkpoint_name` listed in `names`, "none" everything. `offload=True`
    keeps what "dots" or "names" saves in host memory (backends with memory kinds; the
    estimate charges the transfers on a spec with a `host_link`). `modules` (Flax linen class
    or module names, globs: "Block", "*Attention") recomputes each call of those modules
    instead of the layer loop's body (under PP: each layer of each iteration). `unit` is
    what is recomputed in the layer loop under PP: "iteration" (a pipeline iteration, keeping
    only its input) or "layer" (each layer of each iteration, keeping every layer's input;
    Megatron-LM's recomputation, with no module names needed); without PP both are the
    loop's body. No model edits."""
    modules = (modules,) if isinstance(modules, str) else tuple(modules)
    return Rematerialization(policy=policy, names=tuple(names), offload=offload,
                             modules=modules, unit=unit, name=name)


@hookimpl
def partir_add_tactics() -> dict[str, Callable[..., ManualPartition | PipelineParallel
                                              | Rematerialization]]:
    return {"BP": batch_parallel, "MP": model_parallel, "Z2": zero2, "Z3": zero3,
            "EMB": embedding, "MQ": multi_query, "ES": edge_sharding,
            "EP": expert_parallel, "PP": pipeline_parallel, "RM": rematerialization}
