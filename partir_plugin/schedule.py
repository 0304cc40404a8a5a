"""Running a schedule: reserve, then each tactic's actions and `propagate`, then each tactic's
`finish`, the outputs' check, and the final state lowered to the device-local program.

It keeps the state after each tactic (`AfterTactic`) for the report's rows and builds none:
rows are made when first read (`report.rows.TacticReports`, assembled by `stages`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .core.actions import Leaf, TacticContext
from .core.mesh import Mesh
from .core.propagation import propagate
from .core.state import PartitionState
from .core.tmr import TileMappingRegistry
from .errors import PartitionError, UnevenOutputWarning
from .ir.graph import Func
from .options import PartitionOptions, UnevenOutputs
from .spmd.lowering import SpmdProgram, lower_to_spmd
from .spmd.rules.manual_body import seed_manual_results
from .tactics.base import Tactic


@dataclass(frozen=True)
class AfterTactic:
    """What one tactic left: its name, its actions, search and rematerialization figures,
    and a copy of the state."""

    name: str
    state: PartitionState
    actions: list[str]
    search: Any
    rematerialization: Any = None


@dataclass
class Scheduled:
    """A schedule's result: the final state, its device-local program, and the state after
    each tactic (the last is the final state itself)."""

    state: PartitionState
    program: SpmdProgram
    after: list[AfterTactic]


@dataclass(frozen=True)
class OutputPolicy:
    """How a schedule treats the outputs it tiles unevenly; `out_names` name them."""

    uneven_outputs: UnevenOutputs
    out_names: list[str] | None

    def check_outputs(self, state: PartitionState, after: list[AfterTactic]) -> None:
        """Outputs tiled unevenly: a PartitionError naming each (path, dimension, sizes and
        the tactic that first tiled it so), or with `UnevenOutputs.REPLICATE` a warning (the
        lowering gathers them to their largest divisible layout and trims)."""
        found = []
        for i, v in enumerate(state.func.returns):
            if not v.type.is_tensor:
                continue
            for d, p in state.padded_dims(v).items():
                name = self.out_names[i] if self.out_names else f"output {i}"
                tactic = next((t.name for t in after if d in t.state.padded_dims(v)), "?")
                sizes = " x ".join(str(k) for k in p.sizes)
                found.append(f"{name} of shape {v.type.shape}: dimension {d} of size {p.n} "
                             f"is tiled {sizes} ways over {', '.join(map(repr, p.axes))} by "
                             f"tactic {tactic!r}, which does not divide it")
        if not found:
            return
        if self.uneven_outputs is UnevenOutputs.ERROR:
            raise PartitionError(
                "program outputs must be tiled evenly (jax shards only divisible "
                "dimensions): " + "; ".join(found) + ". Pass uneven_outputs='replicate' to "
                "gather and trim them, or tile the output on an axis that divides it")
        warnings.warn("outputs tiled unevenly are gathered and trimmed: " + "; ".join(found),
                      UnevenOutputWarning, stacklevel=6)


def apply_schedule(func: Func, leaves: list[Leaf], mesh: Mesh, schedule: Sequence[Tactic],
                   options: PartitionOptions, registry: TileMappingRegistry,
                   arg_names: list[str] | None = None,
                   out_names: list[str] | None = None) -> Scheduled:
    """Apply each tactic then `propagate`, and lower the final state; a shard_map's results
    are tiled as its out_specs say before the first tactic. `options` has its hardware
    resolved and `scatter_sums` decided (`stages.partition` does both)."""
    state = PartitionState(func, mesh, registry, options=options)
    after = []
    for tactic in schedule:
        tactic.reserve(state)
    seeded = seed_manual_results(state)
    if seeded:  # shard_map results come out tiled: their consumers start from that
        propagate(state, seeds=seeded)
    for i, tactic in enumerate(schedule):
        ctx = TacticContext(state, leaves, arg_names, options.hardware)
        tactic.apply(ctx)
        ctx.propagate()
        # The last tactic's state is the final one, which nothing changes any more.
        kept = state if i == len(schedule) - 1 else state.copy()
        after.append(AfterTactic(tactic.name, kept, ctx.actions, ctx.search,
                                 ctx.rematerialization))
    if not schedule:  # an empty schedule: the replicated program
        propagate(state)
    for tactic in schedule:  # checks that need the whole schedule's decisions (PP)
        tactic.finish(state)
    OutputPolicy(options.uneven_outputs, out_names).check_outputs(state, after)
    # `after[-1].state` is `state` itself (and `finish` changed it in place), so the final
    # program is also the last row's.
    return Scheduled(state, lower_to_spmd(state), after)
