"""Exchanging an embedding gradient's updates instead of reducing its pending sum.

Under data parallelism the gradient of a lookup `table[ids]`, `zeros.at[ids].add(updates)`,
is a partial sum over the batch axis: each device scatters its own tokens into a full-size
zero table, and the partial tables are reduced where ZeRO shards the table on its vocabulary
(reduce_scatter, or all_reduce then slice). A scatter-add is linear in its updates, so a
device's tile of the sum is also its scatter of *every* device's updates into its own rows:
all-gather the ids and updates over the axis, shift the ids into the tile and zero the
updates of rows outside it (`core.rules.embedding`'s lookup form, transposed). That holds a
`[tokens, d]` buffer at the end of the backward pass instead of a `[vocab, d]` pending sum
for the whole step (XLA allocates the zeros early, being a constant, and keeps them until the
gradients are reduced: a step-long buffer at the step's peak). The lowering makes the exchange
where it moves no more bytes than the reduction it replaces (an all_gather of tokens x d
against a reduce_scatter of vocab x d, or an all_reduce, twice that, where `scatter_sums` is
off); jax.jit's partitioner keeps this gradient sharded too.
"""

from __future__ import annotations

from ..core.rules.embedding import scatter_dim
from ..core.rules.reductions import scatter_kind
from ..core.state import PartitionState
from ..core.tmr import Sum, TMREntry
from ..ir.graph import Op
from .layout import Layout


def exchange_axes(state: PartitionState, op: Op, nest: tuple[tuple[str, TMREntry], ...]
                  ) -> tuple[str, ...]:
    """The axes over which `op`'s pending sum is better made by exchanging its updates: those
    whose sum the result's own tiling then scatters on the indexed dimension. Empty when the
    op is not an embedding-gradient scatter, or the exchange would move more bytes."""
    k = scatter_dim(op)
    if k is None or scatter_kind(op) != "add":
        return ()
    result = op.results[0]
    axes = tuple(a for a, e in nest
                 if isinstance(e.results[0], Sum) and state.dim_of(result, a) == k)
    if not axes:
        return ()
    updates = op.operands[2]
    mesh = state.mesh
    gathered = Layout.from_tiles(updates.type.rank, [(a, e.operands[2]) for a, e in nest
                                                     if e.operands[2] is not None
                                                     and a not in axes], mesh=mesh)
    pending = Layout.from_tiles(result.type.rank, [(a, e.results[0]) for a, e in nest
                                                   if not isinstance(e.results[0], Sum)],
                                mesh=mesh)
    # A ring all_gather moves the gathered bytes once (the ids add one element per token to
    # the updates' d: left out), a reduce_scatter the pending sum's bytes once, an all_reduce
    # twice (then a slice).
    reduced = pending.local_type(result.type, mesh).nbytes * (1 if state.scatter_sums else 2)
    return axes if gathered.local_type(updates.type, mesh).nbytes <= reduced else ()
