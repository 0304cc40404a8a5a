"""TMR rules of the ops whose partitioned form only the kernel's own code makes right: ops the
kernel creates (the markers' roll and interleave, the importer's fused padded scatter and
split optimization barriers) or lowers in its own way (an iota offset by its tile, a
constant's shaped attribute, top_k's own reducer, a dynamic_update_slice's write into its
own tile: `masked_window`).

They answer before Shardy's rules (`core/rules/__init__.py`): a rule here that returns None
leaves the op to them. A plugin's rule for the same op name still overrides it.
"""

from __future__ import annotations

from collections.abc import Callable

from ...ir.dialect import INTERLEAVE_OP, PADDED_SCATTER_OP, ROLL_OP
from ...ir.graph import Op
from ..tmr import OWN_REDUCER, Sum, TMREntry
from .halo import padded_scatter_entries
from .masked_window import dynamic_update_slice_entries
from .reductions import splat_value


def _result_tiles(op: Op) -> list[TMREntry]:
    """Every result dimension may be tiled: each tile is computed locally from nothing."""
    shape = op.results[0].type.shape
    return [TMREntry((), (d,), size) for d, size in enumerate(shape) if size > 1]


def constant_entries(op: Op) -> list[TMREntry]:
    # A splat constant is the same in every tile; a dense one stays replicated and its
    # consumers slice it locally (no communication).
    return _result_tiles(op) if splat_value(op) is not None else []


def iota_entries(op: Op) -> list[TMREntry]:
    # The lowering offsets a tiled iota dimension by the device's tile start.
    return _result_tiles(op)


def identity_entries(op: Op) -> list[TMREntry] | None:
    # A single-value identity: every dimension passes through (the importer splits
    # multi-value optimization barriers; roll and interleave move blocks between devices
    # where the rolled dimension, or dim 0, is tiled).
    if len(op.operands) != 1 or not op.operands[0].type.is_tensor:
        return None
    return [TMREntry((d,), (d,), size) for d, size in enumerate(op.operands[0].type.shape)
            if size > 1]


def top_k_entries(op: Op) -> list[TMREntry]:
    # `chlo.top_k` over the last dimension (no Shardy rule for CHLO): the others pass through;
    # the last is reduced by top_k itself, per tile and again over the tiles' candidates.
    shape = op.operands[0].type.shape
    last = len(shape) - 1
    entries = [TMREntry((d,), (d, d), size) for d, size in enumerate(shape[:last]) if size > 1]
    if shape[last] > 1:
        entries.append(TMREntry((last,), (Sum(OWN_REDUCER), Sum(OWN_REDUCER)), shape[last]))
    return entries


RULES: dict[str, Callable[[Op], list[TMREntry] | None]] = {
    "stablehlo.constant": constant_entries,
    "stablehlo.iota": iota_entries,
    "stablehlo.dynamic_update_slice": dynamic_update_slice_entries,
    "stablehlo.optimization_barrier": identity_entries,
    ROLL_OP: identity_entries,
    INTERLEAVE_OP: identity_entries,
    "chlo.top_k": top_k_entries,
    # A max-pool's gradient: batch and channels pass through, a spatial dimension exchanges
    # halos like the pool.
    PADDED_SCATTER_OP: padded_scatter_entries,
}


def provide(op: Op, found: list[TMREntry] | None) -> list[TMREntry] | None:
    """The provider: the kernel's rule for `op`, if it has one that answers."""
    rule = RULES.get(op.name)
    return found if rule is None else rule(op)
