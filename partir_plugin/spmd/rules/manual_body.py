"""A `jax.shard_map` in the step: its body is already device-local code, so it is inlined as
it is, its operands converted to the layouts its in_specs name and its results in the layouts
its out_specs name.

jax lowers a shard_map to Shardy's `sdy.manual_computation`: operands and results global,
the body on one device's shards, with collectives whose replica groups number the devices of
the shard_map's mesh. Those groups are right in the partitioned program when that mesh is the
program's: the same axes, in the same order, of the same sizes, on devices in mesh order.
Anything else (another mesh, a body manual over some axes only, Shardy's open or sub-axis
shardings) is refused with the reason. Propagation knows no rule for the op (its results
start replicated for the consumers, which convert from the layouts made here), and nothing
inside the body is partitioned again.
"""

from __future__ import annotations

import re

from ...core.mesh import Mesh
from ...core.state import PartitionState
from ...errors import PartitionError
from ...ir.dialect import MANUAL_COMPUTATION, MESH_ATTR
from ...ir.graph import Op, Value, clone_region, walk
from ..layout import Layout
from ..op_plan import Nest
from .base import LoweringRule, RuleContext

_VALUE = re.compile(r"<@[\w.$-]+, \[(.*?)\](?: replicated=\{[^}]*\})?>")
_DIM = re.compile(r"\{([^}]*)\}")
_MESH_AXIS = re.compile(r'"([^"]+)"=(\d+)')


class ManualBody(LoweringRule):
    ops = frozenset({MANUAL_COMPUTATION})
    changes_layouts = True

    def layouts(self, state: PartitionState, op: Op, nest: Nest) -> list[Layout]:
        return sharding_layouts(op, "out_shardings", state.mesh) if op.results else []

    def replace(self, ctx: RuleContext) -> list[tuple[Value, Layout]]:
        op, em = ctx.op, ctx.em
        if not op.operands and not op.results:
            return []  # what jax's transpose leaves of a body: nothing in, nothing out
        ins = sharding_layouts(op, "in_shardings", ctx.mesh)
        outs = sharding_layouts(op, "out_shardings", ctx.mesh)
        body = op.regions[0].blocks[0]
        env: dict[Value, Value] = {a: ctx.use(v, lay)
                                   for a, v, lay in zip(body.args, op.operands, ins)}
        for inner in body.ops[:-1]:
            copy = em.emit(inner.name, [env.get(v, v) for v in inner.operands],
                           [r.type for r in inner.results], dict(inner.attributes),
                           [clone_region(r, env) for r in inner.regions])
            copy.mlir_location = inner.mlir_location  # the user's line, not the shard_map's
            if inner.captures:
                copy.captures = [env.get(v, v) for v in inner.captures]
            env.update(zip(inner.results, copy.results))
        returned = [env.get(v, v) for v in body.ops[-1].operands]
        return list(zip(returned, outs))


def sharding_layouts(op: Op, key: str, mesh: Mesh) -> list[Layout]:
    """The layouts a manual computation's `in_shardings` or `out_shardings` name, after
    checking that its mesh and manual axes are the partitioned program's."""
    _check_mesh(op, mesh)
    text = op.attributes.get(key, "")
    values = _VALUE.findall(text)
    if "?" in text or ":(" in text or len(values) != _count(op, key):
        raise PartitionError(f"jax.shard_map at {op.where}: {key} {text} are not dimensions "
                             "tiled over whole mesh axes (open or sub-axis shardings)")
    layouts = []
    for dims in values:
        axes = tuple(tuple(a.strip().strip('"') for a in d.split(",") if a.strip())
                     for d in _DIM.findall(dims))
        layouts.append(Layout(axes))
    return layouts


def _count(op: Op, key: str) -> int:
    return len(op.operands) if key == "in_shardings" else len(op.results)


def _check_mesh(op: Op, mesh: Mesh) -> None:
    declared = op.attributes.get(MESH_ATTR, "")
    axes = tuple((name, int(size)) for name, size in _MESH_AXIS.findall(declared))
    manual = set(re.findall(r'"([^"]+)"', op.attributes.get("manual_axes", "")))
    if axes != tuple(mesh.axes) or "device_ids" in declared:
        raise PartitionError(
            f"jax.shard_map at {op.where} runs on the mesh {declared or '(unknown)'}, not the "
            f"partitioned step's {dict(mesh.axes)} in device order: its collectives number "
            "other devices. Give shard_map a mesh of the same axes, sizes and order "
            "(partir_plugin's `meta.mesh` or jax.make_mesh with them)")
    if manual != set(mesh.names):
        raise PartitionError(
            f"jax.shard_map at {op.where} is manual over {sorted(manual)} only: partir_plugin "
            f"inlines bodies manual over every axis of the mesh {list(mesh.names)}")


def seed_manual_results(state: PartitionState) -> list[Value]:
    """Tile every shard_map's results as its out_specs say, before any tactic, so propagation
    carries those tilings to their consumers (without, they would start replicated and
    gather the results); the values whose tiling changed."""
    changed: list[Value] = []
    for op in walk(state.func.ops):
        if op.name != MANUAL_COMPUTATION or not op.results:
            continue
        for r, layout in zip(op.results, sharding_layouts(op, "out_shardings", state.mesh)):
            for d, axes in enumerate(layout.dims):
                for axis in axes:
                    changed += state.tile_value(r, d, axis)
    return changed
