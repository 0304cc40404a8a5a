"""Edge conversions: the collectives taking a local value from the layout its producer made it
in to the layout its consumer reads (paper 1 §6.1; fused: never all_slice(all_gather))."""

from __future__ import annotations

from ..core.mesh import Mesh
from ..core.padding import ceil_div, is_padded, local_extent
from ..ir.graph import Value
from ..ir.opsets import Reduction
from ..ir.types import TensorType
from .collectives import Collective
from .emitter import Emitter
from .layout import Layout


class ConversionSharing:
    """Which values' conversions the lowering's walk shares between consumers: one per value
    and target layout, emitted once and cached across lowerings. All, unless a tactic asks
    otherwise (ZeRO-3's regather, `rules/regather.py`); chosen once per program."""

    def shared(self, v: Value) -> bool:
        return True


def emit_plan(em: Emitter, x: Value, plan) -> Value:
    """Apply the steps of a `RedistributionPlan` to the local value `x` (its source tile)."""
    from .redistribution import AllGather, AllPermute, AllSlice, AllToAll

    for step in plan.steps:
        if isinstance(step, AllGather):
            x = em.all_gather_groups(x, step.dim, step.groups, step.axes)
        elif isinstance(step, AllToAll):
            x = em.all_to_all_groups(x, step.split_dim, step.concat_dim, step.groups, step.axes)
        elif isinstance(step, AllSlice):
            x = em.all_slice_blocks(x, step.dim, step.num_blocks, step.block_index, step.axes)
        else:
            assert isinstance(step, AllPermute), step
            x = em.collective_permute(x, step.pairs, step.axes)
        assert x.type.shape == tuple(step.out_local_shape), (step, x.type)
    return x


def convert(em: Emitter, x: Value, src: Layout, dst: Layout, scatter_sums: bool = True,
            shape: tuple[int, ...] | None = None) -> Value:
    """Collectives taking local `x` from layout `src` to `dst`.

    A `dst` with pending sums (a loop's accumulator, `accumulation.py`) is reached from the
    full value kept on one device of each group and zeros elsewhere (the sum is the value).
    `scatter_sums=False` all-reduces a pending sum the target tiles further and slices it locally
    (`PartitionState.scatter_sums`). `shape` is the value's global shape: where either layout
    pads a dimension, the conversion goes one axis at a time (`_convert_padded`)."""
    if src == dst or not x.type.is_tensor:
        return x
    if dst.partial:
        assert not dst.axes() & {a for a, _ in dst.partial}, dst  # tiled and summed: no value
        x = convert(em, x, src, Layout(dst.dims), scatter_sums, shape)
        return em.keep_on_first(x, tuple(a for a, _ in dst.partial))
    rank = len(src.dims)
    dims = list(src.dims)
    padded = shape is not None and bool(src.padded(shape, em.mesh) or dst.padded(shape, em.mesh))
    # 1. Pending sums: reduce_scatter where the target tiles a dimension further with
    # some of the summed axes, all_reduce for the rest.
    kinds: dict[str, list[str]] = {}
    for axis, kind in src.partial:
        kinds.setdefault(kind, []).append(axis)
    for kind, axes in kinds.items():
        scatter = None
        scatterable = scatter_sums and not padded and Reduction(kind).all_reducible(
            x.type.element)
        for d in range(rank if scatterable else 0):
            have, want = dims[d], dst.dims[d]
            if len(want) > len(have) and want[: len(have)] == have:
                extra = want[len(have):]
                if all(a in axes for a in extra):
                    scatter = (d, extra)
                    break
        rest = [a for a in axes if scatter is None or a not in scatter[1]]
        if rest:
            x = em.all_reduce(x, rest, kind)
        if scatter is not None:
            x = em.reduce_scatter(x, scatter[0], scatter[1], kind)
            dims[scatter[0]] = dims[scatter[0]] + scatter[1]
    # 2.-4. One collective per dimension with a prefix relation (all_to_all, all_gather,
    # all_slice); anything else (axes reordered within a dimension, several axes moving,
    # an axis entering a non-minor position, or a sequence exceeding the memory bound) is a
    # redistribution problem for the planner (DESIGN.md §2.3-2.4).
    if padded:
        return _convert_padded(em, x, dims, dst.dims, shape)
    simple = _simple_steps(dims, dst.dims)
    if not _is_simple(em.mesh, dims, dst.dims, simple):
        plan = _plan_edge(em.mesh, x.type, dims, dst.dims)
        if plan is not None:
            em.plans.append(plan)
            return emit_plan(em, x, plan)
    for step in simple:
        if step[0] == Collective.ALL_TO_ALL:
            x = em.all_to_all(x, split_dim=step[1], concat_dim=step[2], axes=step[3])
        elif step[0] == Collective.ALL_GATHER:
            x = em.all_gather(x, step[1], step[2])
        else:
            x = em.all_slice(x, step[1])
    return x


def _convert_padded(em: Emitter, x: Value, dims: list[tuple[str, ...]], want, shape
                    ) -> Value:
    """The direct conversion where a dimension is padded, one axis at a time: a gathered
    axis concatenates its padded tiles into the parent tile's extent plus padding, trimmed
    back; a sliced axis first pads its dimension to a multiple of the axis. (The planner's
    plans assume even tiles: not used here.)"""
    dims = list(dims)

    def extent(d: int) -> int:
        return local_extent(shape[d], [em.mesh.axis_size(a) for a in dims[d]])

    def split(x: Value, d: int, axis: str) -> Value:
        k = em.mesh.axis_size(axis)
        return em.pad_to(x, d, ceil_div(x.type.shape[d], k) * k)

    for step in _simple_steps(dims, want):
        if step[0] == Collective.ALL_TO_ALL:
            split_dim, concat_dim, (axis,) = step[1], step[2], step[3]
            x = em.all_to_all(split(x, split_dim, axis), split_dim, concat_dim, (axis,))
            dims[concat_dim], dims[split_dim] = dims[concat_dim][:-1], dims[split_dim] + (axis,)
            x = em.trim_to(x, concat_dim, extent(concat_dim))
        elif step[0] == Collective.ALL_GATHER:
            d, axes = step[1], step[2]
            if not is_padded(shape[d], [em.mesh.axis_size(a) for a in dims[d]]):
                x = em.all_gather(x, d, axes)
                dims[d] = dims[d][: len(dims[d]) - len(axes)]
                continue
            for axis in reversed(axes):  # minor first: each gather yields the parent tile
                x = em.all_gather(x, d, (axis,))
                dims[d] = dims[d][:-1]
                x = em.trim_to(x, d, extent(d))
        else:
            for d, axes in sorted(step[1].items()):
                for axis in axes:
                    x = em.all_slice(split(x, d, axis), {d: (axis,)})
                    dims[d] = dims[d] + (axis,)
    return x


def _simple_steps(dims, want) -> list[tuple]:
    """The direct conversion of tilings `dims` to `want` (no partial sums), as steps
    ("all_to_all", split_dim, concat_dim, axes) / ("all_gather", dim, axes) /
    ("all_slice", {dim: axes})."""
    rank = len(dims)
    dims = list(dims)
    steps: list[tuple] = []
    # An axis leaving the minor end of one dimension for the minor end of another: all_to_all.
    moved = True
    while moved:
        moved = False
        for d1 in range(rank):
            if not dims[d1] or want[d1][: len(dims[d1])] == dims[d1]:
                continue
            axis = dims[d1][-1]
            for d2 in range(rank):
                if d2 != d1 and want[d2][: len(dims[d2]) + 1] == dims[d2] + (axis,):
                    steps.append((Collective.ALL_TO_ALL, d2, d1, (axis,)))
                    dims[d1], dims[d2] = dims[d1][:-1], dims[d2] + (axis,)
                    moved = True
                    break
            if moved:
                break
    # Gather what the target does not keep, minor axes first.
    for d in range(rank):
        keep = 0
        while keep < len(dims[d]) and keep < len(want[d]) and dims[d][keep] == want[d][keep]:
            keep += 1
        if keep < len(dims[d]):
            steps.append((Collective.ALL_GATHER, d, dims[d][keep:]))
            dims[d] = dims[d][:keep]
    # Slice what the target adds.
    new_axes = {d: want[d][len(dims[d]):] for d in range(rank) if len(want[d]) > len(dims[d])}
    if new_axes:
        steps.append((Collective.ALL_SLICE, new_axes))
    return steps


def _is_simple(mesh: Mesh, dims, want, steps) -> bool:
    """At most one all_to_all, no dimension both gathered and sliced, and never more per
    device than max(source tile, target tile)."""
    if sum(s[0] == Collective.ALL_TO_ALL for s in steps) > 1:
        return False
    gathered = {s[1] for s in steps if s[0] == Collective.ALL_GATHER}
    sliced = {d for s in steps if s[0] == Collective.ALL_SLICE for d in s[1]}
    if gathered & sliced:
        return False

    def parts(layout) -> int:
        return mesh.product([a for d in layout for a in d])

    lowest, current = parts(dims), parts(dims)
    for s in steps:
        if s[0] == Collective.ALL_GATHER:
            current //= mesh.product(s[2])
        elif s[0] == Collective.ALL_SLICE:
            current *= mesh.product([a for axes in s[1].values() for a in axes])
        lowest = min(lowest, current)
    return lowest >= min(parts(dims), parts(want))


def _plan_edge(mesh: Mesh, local: TensorType, dims, want):
    """The planner's memory-bounded plan for one edge, or None where it cannot plan it
    (an element type it has no size for): the direct conversion is used then."""
    from ..errors import PartitionError
    from .redistribution import plan_redistribution

    shape = tuple(s * mesh.product(d) for s, d in zip(local.shape, dims))
    try:
        return plan_redistribution(mesh, shape, local.element.replace("ui", "u"),
                                   Layout(tuple(dims)).spec(), Layout(tuple(want)).spec())
    except PartitionError:
        return None

