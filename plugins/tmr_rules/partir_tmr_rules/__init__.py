"""Built-in hand-written TMR rules, for ops Shardy leaves without a rule or where the
partitioned op needs a lowering that Shardy's rule does not describe (DESIGN.md §2.2)."""

from __future__ import annotations

from partir_plugin.extend import (
    OWN_REDUCER,
    PADDED_SCATTER_OP,
    Op,
    Sum,
    TileMappingRegistry,
    TMREntry,
    entries_from_shardy,
    hookimpl,
    lookup_dim,
    padded_scatter_entries,
    splat_value,
)


def _result_tiles(op: Op) -> list[TMREntry]:
    """Every result dimension may be tiled: each tile is computed locally from nothing."""
    shape = op.results[0].type.shape
    return [TMREntry((), (d,), size) for d, size in enumerate(shape) if size > 1]


def constant_rule(op: Op) -> list[TMREntry]:
    # A splat constant is the same in every tile; a dense one stays replicated and its
    # consumers slice it locally (no communication).
    return _result_tiles(op) if splat_value(op) is not None else []


def iota_rule(op: Op) -> list[TMREntry]:
    # The lowering offsets a tiled iota dimension by the device's tile start.
    return _result_tiles(op)


# CHLO's elementwise ops (what jax emits for erf, lgamma, sinh, asin, ...). Shardy's
# `sdy-populate-op-sharding-rules` only knows StableHLO ops, so without this rule every one of
# them stayed replicated and cut propagation in two (an all_gather before, an all_slice after).
CHLO_ELEMENTWISE = (
    "chlo.acos", "chlo.acosh", "chlo.asin", "chlo.asinh", "chlo.atan", "chlo.atanh",
    "chlo.bessel_i1e", "chlo.conj", "chlo.cosh", "chlo.digamma", "chlo.erf", "chlo.erf_inv",
    "chlo.erfc", "chlo.is_inf", "chlo.is_neg_inf", "chlo.is_pos_inf", "chlo.lgamma",
    "chlo.mulhi", "chlo.next_after", "chlo.polygamma", "chlo.sinh", "chlo.square", "chlo.tan",
    "chlo.zeta",
)


def elementwise_rule(op: Op) -> list[TMREntry] | None:
    # Every dimension passes through every operand to every result. The `chlo.broadcast_*`
    # forms (operands of other shapes) are not elementwise in this sense: no rule.
    shape = op.results[0].type.shape
    if any(v.type.shape != shape for v in (*op.operands, *op.results)):
        return None
    n = len(op.operands)
    return [TMREntry((d,) * n, (d,) * len(op.results), size)
            for d, size in enumerate(shape) if size > 1]


def identity_rule(op: Op) -> list[TMREntry] | None:
    # A single-value identity (the importer splits multi-value optimization barriers).
    if len(op.operands) != 1 or not op.operands[0].type.is_tensor:
        return None
    return [TMREntry((d,), (d,), size) for d, size in enumerate(op.operands[0].type.shape)
            if size > 1]


def gather_rule(op: Op) -> list[TMREntry] | None:
    # Shardy's pass-through entries, plus for an embedding lookup the vocabulary entry: each
    # tile of the table answers the ids that fall in it (zeros elsewhere), the tiles add up.
    entries = entries_from_shardy(op)
    k = lookup_dim(op)
    if entries is None or k is None:
        return entries
    return [*entries, TMREntry((k, None), (Sum("add"),), op.operands[0].type.shape[k])]


def top_k_rule(op: Op) -> list[TMREntry]:
    # `chlo.top_k` over the last dimension (no Shardy rule for CHLO): the others pass through;
    # the last is reduced by top_k itself, per tile and again over the tiles' candidates.
    shape = op.operands[0].type.shape
    last = len(shape) - 1
    entries = [TMREntry((d,), (d, d), size) for d, size in enumerate(shape[:last]) if size > 1]
    if shape[last] > 1:
        entries.append(TMREntry((last,), (Sum(OWN_REDUCER), Sum(OWN_REDUCER)), shape[last]))
    return entries


def dynamic_update_slice_rule(op: Op) -> list[TMREntry]:
    # Only dimensions the update covers entirely: the start index is then clamped to 0.
    operand, update = op.operands[0].type.shape, op.operands[1].type.shape
    n_idx = len(op.operands) - 2
    return [TMREntry((d, d) + (None,) * n_idx, (d,), size)
            for d, size in enumerate(operand) if size > 1 and update[d] == size]


@hookimpl
def partir_add_tmr_rules(registry: TileMappingRegistry) -> None:
    registry.register("stablehlo.constant", constant_rule)
    registry.register("stablehlo.iota", iota_rule)
    registry.register("stablehlo.dynamic_update_slice", dynamic_update_slice_rule)
    registry.register("stablehlo.optimization_barrier", identity_rule)
    # partir_plugin.roll: every dimension passes through; the lowering rotates blocks where the
    # rolled dimension is tiled.
    registry.register("partir.roll", identity_rule)
    # partir_plugin.markers.interleave: likewise; the lowering moves chunks where dim 0 is tiled.
    registry.register("partir.interleave", identity_rule)
    registry.register("stablehlo.gather", gather_rule)
    registry.register("chlo.top_k", top_k_rule)
    # A max-pool's gradient (pad, select_and_scatter, slice; fused by the importer): batch and
    # channels pass through, a spatial dimension exchanges halos like the pool.
    registry.register(PADDED_SCATTER_OP, padded_scatter_entries)
    for name in CHLO_ELEMENTWISE:
        registry.register(name, elementwise_rule)
