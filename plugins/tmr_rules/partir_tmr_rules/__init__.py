"""Built-in hand-written TMR rules, for ops Shardy leaves without a rule and whose partitioned
form needs nothing of the kernel's own lowering (DESIGN.md §2.2). The rules of ops the kernel
creates or lowers in its own way are the kernel's (`core/rules/partir_ops.py`)."""

from __future__ import annotations

from partir_plugin.extend import Op, TileMappingRegistry, TMREntry, hookimpl

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


# The custom call of a move between memory kinds (jax's `device_put` to `pinned_host` and
# back, e.g. RM's offload): the same array elsewhere, so every dimension passes through.
PLACEMENT_TARGET = "annotate_device_placement"


def placement_rule(op: Op) -> list[TMREntry] | None:
    if PLACEMENT_TARGET not in op.attributes.get("call_target_name", ""):
        return None
    return elementwise_rule(op)


@hookimpl
def partir_add_tmr_rules(registry: TileMappingRegistry) -> None:
    for name in CHLO_ELEMENTWISE:
        registry.register(name, elementwise_rule)
    registry.register("stablehlo.custom_call", placement_rule)
