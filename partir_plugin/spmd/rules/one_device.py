"""An op jax placed on one device runs there once: host callbacks (`jax.debug.print`,
`jax.debug.callback`, `pure_callback`, `io_callback`) carry Shardy's maximal sharding, and
under jax.jit they run once, on that device, on whole values.

No tile-mapping rule knows a custom call, so its operands arrive replicated (whole). The op is
emitted inside `stablehlo.if` on the device's partition id; its results, where it has any,
are zeros (false) on the other devices and reach every device by a sum (an or) over the
whole mesh (the callback still runs once). jax names the device (0 under jax.jit); the
mesh's first device runs it here. Emitted as it is on every device, it would run once per
device, and the Shardy attribute naming a mesh the program does not declare would not even
parse.
"""

from __future__ import annotations

from ...errors import PartitionError
from ...ir.dialect import ON_DEVICE_ATTR
from ...ir.graph import Block, Op, Region, Value, captures_of
from ...ir.opsets import Reduction
from ...ir.types import TensorType
from .base import LoweringRule, RuleContext


class OnOneDevice(LoweringRule):
    ops = frozenset({"stablehlo.custom_call"})

    def matches(self, op, nest, plan, mesh) -> bool:
        return ON_DEVICE_ATTR in op.attributes

    def emit(self, ctx: RuleContext, operands: list[Value], attrs: dict[str, str],
             regions: list[Region]) -> list[Value] | None:
        em, op = ctx.em, ctx.op
        del attrs[ON_DEVICE_ATTR]  # jax's device id: the mesh's first device runs it here
        result_types = ctx.plan.result_types
        unsupported = [t for t in result_types if t.opaque or t.element == "token"]
        if unsupported:
            raise PartitionError(f"{op.name} at {op.where} runs on one device and returns "
                                 f"{unsupported[0]}, which partir_plugin cannot send to the "
                                 "other devices; return a number array from the callback")
        here = em.compare(em.device(), em.scalar(0, "i32"), "EQ")
        run = Block()
        call = Op(op.name, operands, result_types, attrs, regions)
        call.mlir_location, call.origin = op.mlir_location, op
        run.ops += [call, Op("stablehlo.return", call.results, [])]
        skip = Block()
        zeros = [Op("stablehlo.constant", [], [t], {"value": f"dense<{_zero(t)}> : {t}"})
                 for t in result_types]
        skip.ops += [*zeros, Op("stablehlo.return", [z.results[0] for z in zeros], [])]
        branch = em.emit("stablehlo.if", [here], result_types, {},
                         [Region([run]), Region([skip])])
        branch.captures = captures_of(branch)  # the operands, used inside: live until it runs
        axes = ctx.mesh.names
        return [em.all_reduce(r, axes, Reduction.OR if r.type.element == "i1" else
                              Reduction.ADD) if axes else r for r in branch.results]


def _zero(t: TensorType) -> str:
    if t.element == "i1":
        return "false"
    if t.element.startswith("complex"):
        return "(0.000000e+00,0.000000e+00)"
    return "0.000000e+00" if t.element.startswith(("f", "bf")) else "0"
