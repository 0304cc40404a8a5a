"""Which of XLA's partitioners compiles the jax program that embeds a device-local module.

That program is one fully manual `shard_map`: XLA has nothing to propagate or partition in it,
but it runs a partitioner over every module with `num_partitions > 1` (XLA:CPU refuses such a
module without one, and a `partition_id` outside a manual region). With Shardy (jax's default)
the `shardy-xla` pass converts the whole module to MLIR and back around its propagation and
costs more than on jax's own sharded program; GSPMD's sharding propagation and partitioner
find every instruction already manual and pass over it. On the decoder LM at L=8 the
partitioner pipeline takes 0.11-0.13 s instead of 0.24-0.27 s, and the compiled HLO is the same
instruction for instruction (docs/architecture.md, "Runtime"). So `PartitionedFunction` lowers
and compiles its own `jax.jit` with GSPMD (`embedding`; its warm call switches inline, see
`api.PartitionedFunction.__call__`), and lowers the user's step for the importer with Shardy
(`shardy`): the importer reads Shardy's dialect. Inside a user's `jax.jit` the user's program
is lowered and compiled as the user configured it (the switch only keys the inner trace).
Where jax no longer has the option, `STATE` is None and nothing is switched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from jax._src import config as _config

# jax's `jax_use_shardy_partitioner` (a C++-backed config state: `swap_local`/`set_local`
# run no Python frame, so a warm call stays in jax's C++ dispatch).
STATE = getattr(_config, "use_shardy_partitioner", None)


@contextlib.contextmanager
def embedding() -> Iterator[None]:
    """Lower and compile the embedding jax program with GSPMD."""
    if STATE is None:
        yield
        return
    saved = STATE.swap_local(False)
    try:
        yield
    finally:
        STATE.set_local(saved)


@contextlib.contextmanager
def shardy() -> Iterator[None]:
    """Lower the user's step with Shardy, what the importer reads (also under `embedding`)."""
    if STATE is None:
        yield
        return
    saved = STATE.swap_local(True)
    try:
        yield
    finally:
        STATE.set_local(saved)
