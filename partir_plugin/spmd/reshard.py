"""The device-local program of a redistribution plan (paper 2): one argument with the source
tile, the plan's collectives, one result with the target tile. `runtime.reshard` runs it."""

from __future__ import annotations

from ..core.mesh import Mesh
from ..ir.graph import Block, Func
from ..ir.printer import print_func
from ..ir.types import TensorType, element_type_of
from .convert import emit_plan
from .emitter import Emitter
from .lowering import spmd_module_attrs
from .redistribution import RedistributionPlan


def module_text(plan: RedistributionPlan, dtype=None) -> str:
    """The device-local module applying `plan`: `main(src tile) -> dst tile`."""
    mesh = Mesh.of(plan.mesh)
    body = Block()
    em = Emitter(mesh, body)
    element = element_type_of(plan.dtype if dtype is None else dtype)
    x = body.add_arg(TensorType(tuple(plan.src_local_shape), element))
    y = emit_plan(em, x, plan)
    func = Func("main", body, [y], ["x"])
    return print_func(func, module_attrs=spmd_module_attrs(mesh))
