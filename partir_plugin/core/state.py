"""PartIR:Core state: loop nests per op and distributed types per value (paper 1 §5, app. B).

Loops are not literal IR ops here. Each op records its loop nest, an ordered tuple of
`(axis, TMR entry)` (outer loop first); each value records its tiling, an ordered tuple of
`(axis, dim)` (the value-tiling loops around it, outer first, so within a dimension the
earlier axis is the major one). Actions only ever append: nothing undoes an earlier tactic.
Nests and tilings are immutable tuples, replaced when a loop is added, so a copy of the state
shares them (`copy`: the schedule keeps one after every tactic) and Python's cyclic GC skips
the tilings (tuples of strings and ints) after its first look.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field

from ..errors import PartitionError
from ..ir.graph import Func, Op, Value, partitionable_ops, users_of
from ..options import ConflictPolicy, PaddingPolicy, PartitionOptions
from .mesh import Mesh
from .padding import PaddedDim, entry_allows_padding, is_padded, local_extent
from .rules.halo import HaloEntry
from .scanned_dims import Shape, scanned_dims
from .subaxis import is_sub_axis, parent_of
from .tmr import Sum, TileMappingRegistry, TMREntry


@dataclass(frozen=True)
class Conflict:
    """Propagation stopped at `op` on `axis`: several TMR entries (or none) fit what its
    neighbours ask for. Nothing was decided there; a later tactic may decide."""

    op_name: str
    axis: str
    reason: str
    location: str | None = None

    def __str__(self) -> str:
        return f"{self.op_name} on axis {self.axis!r}: {self.reason}"


@dataclass
class PartitionState:
    func: Func
    mesh: Mesh
    registry: TileMappingRegistry
    tiling: dict[Value, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    nests: dict[Op, tuple[tuple[str, TMREntry], ...]] = field(default_factory=dict)
    atomic: set[tuple[Value, str]] = field(default_factory=set)
    conflicts: list[Conflict] = field(default_factory=list)
    unsupported: dict[str, int] = field(default_factory=dict)
    tags: dict[str, list[Value]] = field(default_factory=dict)
    # (tag op, axis): a tactic decided the tagged value on the axis, so the tag is a
    # redistribution point there: propagation does not cross it, the lowering converts.
    boundaries: set[tuple[Op, str]] = field(default_factory=set)
    # The options the program is partitioned under (conflicts, padding, scatter_sums: read
    # through the properties below), the driver's (`schedule.apply_schedule`).
    options: PartitionOptions = field(default_factory=PartitionOptions)
    resolutions: list = field(default_factory=list)  # resolution.Resolution, in order
    resolved: set[tuple[Op, str]] = field(default_factory=set)  # (op, axis) of each
    # What tactics want the report to say about the program they made (PP: the pipeline's
    # shape and bubble), in order: how any tactic speaks to the report.
    notes: list[str] = field(default_factory=list)
    # Values gathered again for each consumer instead of once for all (ZeRO-3's parameters:
    # the backward pass gathers them afresh rather than keeping the forward's copy alive).
    # A per-value directive from a tactic to the lowering, which reads it through one
    # policy (`spmd/rules/regather.py`); the state is what both see.
    regather: set[Value] = field(default_factory=set)
    # The (op, axis) pairs propagation stopped at, with the conflict each one records:
    # `conflicts` lists those still standing (a later loop of the op on the axis drops one).
    _reported: dict[tuple[Op, str], Conflict] = field(default_factory=dict, init=False,
                                                      repr=False)
    _unsupported_ops: set[Op] = field(default_factory=set, init=False, repr=False)
    _sub_axes: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self):
        self.users = users_of(self.func)
        # Value -> the ops reading it and its producer: propagation wakes them after every
        # change of the value's tiling. Derived from `users` on first use, shared by copies.
        self._neighbours: dict[Value, list[Op]] = {}
        # Program order, regions included: propagation's worklist hands ops out in it.
        self.position = {op: i for i, op in enumerate(partitionable_ops(self.func.ops))}
        self.tags = {**self.func.tags, **self.tags}
        self.aliases = _loop_carried_aliases(self.func)
        # Has any tiling padded a dimension? Most programs pad nothing, and the report asks
        # every value for its padded dimensions.
        self.pads_any = any(self._pads(v, d) for v, tiles in self.tiling.items()
                            for _, d in tiles)

    def copy(self) -> PartitionState:
        """An independent copy for trying actions (searchers): every container field is
        copied (found from the dataclass's fields, so a new one cannot be forgotten; the
        tuples inside are immutable, so shared, and so are the lists of `tags`, which only
        `__post_init__` builds); the function, mesh, registry and derived maps are shared."""
        new = copy.copy(self)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (dict, set, list)):
                setattr(new, f.name, value.copy())
        return new

    @functools.cached_property
    def scanned_dims(self) -> frozenset[tuple[Shape, int]]:
        """(shape, dim) pairs the program slices at computed starts (`scanned_dims`): a
        tactic choosing a dimension for itself avoids them."""
        return scanned_dims(self.func)

    # -- options ------------------------------------------------------------------------
    @property
    def resolve_conflicts(self) -> bool:
        """Are conflicts resolved by redistributing operands (`resolution.py`)? False keeps
        PartIR's strict semantics (stop at the op, which then gathers its operands)."""
        return self.options.conflicts is ConflictPolicy.REDISTRIBUTE

    @property
    def allow_padding(self) -> bool:
        """May a tiling pad a dimension its axes do not divide (`core/padding.py`)? False:
        never inferred by propagation, a PartitionError where a tactic asks for it."""
        return self.options.padding is PaddingPolicy.ALLOW

    @property
    def scatter_sums(self) -> bool:
        """Does a pending sum reach a consumer that tiles the summed dimension by
        reduce_scatter (half the bytes of an all_reduce), or all_reduce then the local slice?
        XLA:CPU runs reduce-scatter slower than all-reduce, which it combines into a few ops,
        and adds layout copies around it; XLA:GPU rewrites all-reduce + slice into
        reduce-scatter itself. The driver picks by platform (`PartitionOptions.for_platform`;
        undecided: reduce_scatter)."""
        return self.options.scatter_sums is not False

    # -- queries ------------------------------------------------------------------------
    def tiles_of(self, v: Value) -> tuple[tuple[str, int], ...]:
        return self.tiling.get(v, ())

    def dim_of(self, v: Value, axis: str) -> int | None:
        for a, d in self.tiling.get(v, ()):
            if a == axis:
                return d
        return None

    def neighbours(self, v: Value) -> list[Op]:
        """The ops reading `v` (among `partitionable_ops`) and the op producing it."""
        ops = self._neighbours.get(v)
        if ops is None:
            ops = [u for u, _ in self.users.get(v, ()) if u is not None]
            if v.producer is not None:
                ops.append(v.producer)
            self._neighbours[v] = ops
        return ops

    def nest_of(self, op: Op) -> tuple[tuple[str, TMREntry], ...]:
        return self.nests.get(op, ())

    def op_axes(self, op: Op) -> set[str]:
        return {a for a, _ in self.nest_of(op)}

    def in_loop(self, op: Op, axis: str) -> bool:
        """Is `op` already inside a loop over `axis`, or over a part of it or an axis it is a
        part of (sub-axes, `core/subaxis.py`)? (A plain loop: propagation asks this at every
        step.)"""
        overlaps = self.mesh.overlaps
        for a, _ in self.nests.get(op, ()):
            if overlaps(a, axis):
                return True
        return False

    def overlapping(self, v: Value, axis: str) -> str | None:
        """Another axis tiling `v` that shares devices with `axis` (`model` and
        `model:(1)4`): `v` cannot be tiled on `axis` too."""
        for a, _ in self.tiles_of(v):
            if a != axis and self.mesh.overlaps(a, axis):
                return a
        return None

    def sub_axes(self) -> list[str]:
        """The sub-axes some value or loop uses, in the order they appeared."""
        return list(self._sub_axes)

    @property
    def sub_axis_count(self) -> int:
        return len(self._sub_axes)

    def axes_on(self, v: Value, dim: int) -> tuple[str, ...]:
        """The axes tiling `dim` of `v`, outer first."""
        return tuple(a for a, d in self.tiles_of(v) if d == dim)

    def local_extent(self, v: Value, dim: int) -> int:
        """Size of `dim` of `v` after its current tiling (padded where the axes do not
        divide it: `core/padding.py`)."""
        return local_extent(v.type.shape[dim], [self.mesh.axis_size(a)
                                                for a in self.axes_on(v, dim)])

    def _pads(self, v: Value, dim: int) -> bool:
        return v.type.shape[dim] % self.mesh.product(self.axes_on(v, dim)) != 0

    def padded_dims(self, v: Value) -> dict[int, PaddedDim]:
        """The dimensions of `v` its tiling pads, by dimension."""
        if not self.pads_any:
            return {}
        out = {}
        for d in sorted({d for _, d in self.tiles_of(v)}):
            axes = self.axes_on(v, d)
            sizes = tuple(self.mesh.axis_size(a) for a in axes)
            if is_padded(v.type.shape[d], sizes):
                out[d] = PaddedDim(v.type.shape[d], axes, sizes)
        return out

    def entry_pads(self, op: Op, axis: str, entry: TMREntry) -> bool:
        """Would looping `op` over `axis` with `entry` leave a dimension it tiles padded (or
        split a factor unevenly)?

        Propagation asks this of every entry it tries, so it is plain loops over products:
        tiling `n` level by level over sizes pads somewhere exactly when their product does
        not divide `n` (`padding.is_padded`)."""
        size_of = self.mesh.axis_size
        factor = entry.factor_size
        for v, d in zip(op.inputs, entry.operands):
            if d is None:
                continue
            tiles, has_axis = 1, False
            for a, e in self.tiling.get(v, ()):
                if e == d:
                    tiles *= size_of(a)
                    has_axis = has_axis or a == axis
            if not has_axis:
                tiles *= size_of(axis)
            if v.type.shape[d] % tiles or factor % tiles:
                return True
        nest = self.nests.get(op, ())
        for r, action in zip(op.results, entry.results):
            if isinstance(action, Sum):
                continue
            tiles = size_of(axis)
            for a, e in nest:
                if e.results[r.index] == action:
                    tiles *= size_of(a)
            if r.type.shape[action] % tiles or factor % tiles:
                return True
        return False

    def mixes_windows(self, op: Op, entry: TMREntry) -> bool:
        """Would `entry` tile a dimension of `op` that its nest tiles with another window
        geometry: two different halo entries, or a halo entry and a plain one, on one operand
        or result dimension? The lowering extends each halo's operands on their own
        (`spmd/rules/halo.py`), so such a nest has no local program. (A weight-gradient
        convolution has both a forward halo, image to kernel, and a weight-gradient halo,
        image and output gradient to a partial kernel, on the image's padded tiles.)"""
        halo = entry.halo if isinstance(entry, HaloEntry) else None
        for _, e in self.nests.get(op, ()):
            if (e.halo if isinstance(e, HaloEntry) else None) == halo:
                continue
            if any(d is not None and d == o for d, o in zip(entry.operands, e.operands)):
                return True
            if any(not isinstance(d, Sum) and d == o for d, o in zip(entry.results, e.results)):
                return True
        return False

    def padding_allowed(self, op: Op, entry: TMREntry, axis: str) -> bool:
        """May `op` loop over `axis` with `entry` on padded tiles (padding on, and an entry
        that keeps padding in padding or whose reads of it the lowering masks; a halo entry
        whose padded tiles, over the axes of its nest and `axis`, keep its window geometry)?"""
        if not self.allow_padding:
            return False
        if isinstance(entry, HaloEntry):
            sizes = [self.mesh.axis_size(a) for a, e in self.nests.get(op, ())
                     if isinstance(e, HaloEntry) and e.halo == entry.halo]
            return entry.halo.fits([*sizes, self.mesh.axis_size(axis)])
        return entry_allows_padding(op, entry)

    def tagged(self, name: str) -> list[Value]:
        """Every value tagged `name`, in program order."""
        if name not in self.tags:
            raise PartitionError(f"no tagged value named {name!r} (tags: {sorted(self.tags)})")
        return self.tags[name]

    # -- actions ------------------------------------------------------------------------
    def blocked(self, v: Value, axis: str) -> str | None:
        """Why `v` may not be tiled on `axis` on any dimension, or None: it or a value that
        shares its distribution (`aliases`: a while's operand, body argument and result) is
        atomic on `axis`, on the axis `axis` is a part of, or on a part of `axis` in use; or
        `v` is already tiled on another axis that overlaps `axis`. The one admissibility check
        that `can_tile`, propagation (`_fits`) and conflict resolution (`_moves`) share."""
        if self.atomic:
            kept = self._overlapping_axes(axis)
            for m in self.aliases.get(v, (v,)):
                for a in kept:
                    if (m, a) in self.atomic:
                        return f"it is atomic (kept replicated) on axis {a!r}"
        other = self.overlapping(v, axis)
        if other is not None:
            return f"it is already tiled on axis {other!r}, which overlaps {axis!r}"
        return None

    def _overlapping_axes(self, axis: str) -> tuple[str, ...]:
        """`axis`, the axis it is a part of, and the parts of it some value or loop uses."""
        if not self._sub_axes and ":" not in axis:
            return (axis,)  # no sub-axes in play (what propagation asks nearly always)
        parent = parent_of(axis)
        parts = tuple(s for s in self._sub_axes if s != axis and self.mesh.overlaps(s, axis))
        return (axis, *((parent,) if parent != axis else ()), *parts)

    def decided(self, op: Op, axis: str) -> bool:
        """Is `op` a tag a tactic decided on `axis` or an axis overlapping it (a
        redistribution point there: propagation does not cross it, the lowering converts)?"""
        if not self.boundaries:
            return False
        return any((op, a) in self.boundaries for a in self._overlapping_axes(axis))

    def can_tile(self, v: Value, dim: int, axis: str, padding: bool | None = None
                 ) -> str | None:
        """Why `v` cannot be tiled on (dim, axis), or None if it can. `padding`: may the tile
        pad the dimension (None: the state's `allow_padding`; False: only even tiles, what
        a tactic that looks for divisible dimensions asks)."""
        reason = self.blocked(v, axis)
        if reason is not None:
            return reason
        if not v.type.is_tensor or dim >= v.type.rank or dim < 0:
            return f"it has no dimension {dim} (type {v.type})"
        if dim >= self.func.element_rank.get(v, dim + 1):
            return (f"dimension {dim} of {v.type} holds each element's words (an array of "
                    f"PRNG keys of rank {self.func.element_rank[v]}), not an array dimension")
        current = self.dim_of(v, axis)
        if current is not None:
            if len(self.aliases.get(v, (v,))) > 1:
                return (f"it is already tiled on axis {axis!r} (dimension {current}): it "
                        f"enters a loop (a while's operand: a carry, or a scan's stacked "
                        f"inputs), whose values inside share one distribution with it, and "
                        f"an earlier tiling of those decided it (an earlier tactic's "
                        f"propagation, a shard_map's in_specs or a tag in the loop)")
            return f"it is already tiled on axis {axis!r} (dimension {current})"
        if v.type.shape[dim] == 0:
            return f"dimension {dim} is empty"  # nothing to split; no collective takes it
        extent = self.local_extent(v, dim)
        size = self.mesh.axis_size(axis)
        if extent % size and not (self.allow_padding if padding is None else padding):
            policy = "" if self.allow_padding else " (padding='error')"
            return (f"dimension {dim} has local size {extent} (global {v.type.shape[dim]}), "
                    f"not divisible by axis {axis!r} of size {size}, and padding is "
                    f"off{policy}")
        return None

    def tile_value(self, v: Value, dim: int, axis: str) -> list[Value]:
        """Tile `v` and every value that must share its distribution (a loop-carried value's
        while operand, body and condition arguments, body result and while result).

        A value already tiled on a part of `axis` (or on an axis it is part of) keeps its
        tiling. Adjacent parts of one axis on a dimension are folded (`Mesh.fold`): a value
        tiled on `model:(1)4` then `model:(4)2` is tiled on `model`."""
        changed = []
        if is_sub_axis(axis) and axis not in self._sub_axes:
            self._sub_axes.append(axis)
        for member in self.aliases.get(v, (v,)):
            if self.dim_of(member, axis) is None and self.overlapping(member, axis) is None:
                tiles = (*self.tiling.get(member, ()), (axis, dim))
                if is_sub_axis(axis):
                    tiles = _fold(tiles, dim, self.mesh)
                self.tiling[member] = tiles
                self.pads_any = self.pads_any or self._pads(member, dim)
                changed.append(member)
        return changed

    def add_loop(self, op: Op, axis: str, entry: TMREntry) -> list[Value]:
        self.nests[op] = (*self.nests.get(op, ()), (axis, entry))
        stale = self._reported.pop((op, axis), None)
        if stale is not None:  # a later step looped it: the conflict no longer stands
            self.conflicts = [c for c in self.conflicts if c is not stale]
        changed = []
        for r, action in zip(op.results, entry.results):
            if not isinstance(action, Sum) and self.dim_of(r, axis) is None:
                changed += self.tile_value(r, action, axis)
        return changed

    def record_conflict(self, op: Op, axis: str, reason: str) -> None:
        if (op, axis) in self._reported:
            return
        conflict = self._reported[op, axis] = Conflict(op.name, axis, reason, op.location)
        self.conflicts.append(conflict)

    def stopped_at(self, op: Op, axis: str) -> bool:
        """Does propagation stand stopped at `op` on `axis` with a conflict?"""
        return (op, axis) in self._reported

    def record_unsupported(self, op: Op) -> None:
        """Count `op` (once, whatever the axes it was asked to loop over) as one no TMR rule
        knows."""
        if op in self._unsupported_ops:
            return
        self._unsupported_ops.add(op)
        key = op.name
        if op.name == "stablehlo.custom_call":
            key += f"[{op.attributes.get('call_target_name', '?')}]"
        self.unsupported[key] = self.unsupported.get(key, 0) + 1

    def check_divisible(self, v: Value, dim: int, axis: str, what: str) -> None:
        reason = self.can_tile(v, dim, axis)
        if reason is not None:
            raise PartitionError(f"cannot tile {what} on dimension {dim} along axis {axis!r}: "
                                 f"{reason}")


def _fold(tiles: tuple[tuple[str, int], ...], dim: int, mesh: Mesh
          ) -> tuple[tuple[str, int], ...]:
    """`tiles` with the parts of one axis that now tile `dim` side by side merged."""
    on_dim = [i for i, (_, d) in enumerate(tiles) if d == dim]
    axes = tuple(tiles[i][0] for i in on_dim)
    folded = mesh.fold(axes)
    if folded == axes:
        return tiles
    kept = [(a, d) for a, d in tiles if d != dim]
    return (*kept[: on_dim[0]], *((a, dim) for a in folded), *kept[on_dim[0]:])


def _loop_carried_aliases(func: Func) -> dict[Value, tuple[Value, ...]]:
    """For every `while`, the k-th operand, condition argument, body argument, body result and
    op result are one loop-carried value: they keep one distribution (the body is
    partitioned once). For every `case`, its k-th result and each branch's k-th returned value
    are one value."""
    aliases: dict[Value, tuple[Value, ...]] = {}
    groups: list[tuple[Value, ...]] = []
    for op in partitionable_ops(func.ops):
        if op.name == "stablehlo.while":
            cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
            body_returns = body.ops[-1].operands
            groups += [(operand, cond.args[k], body.args[k], body_returns[k], op.results[k])
                       for k, operand in enumerate(op.operands)]
        elif op.name == "stablehlo.case":
            # Every branch's k-th result is the case's k-th result.
            groups += [(result, *(r.blocks[0].ops[-1].operands[k] for r in op.regions))
                       for k, result in enumerate(op.results)]
    for group in groups:
        merged: list[Value] = []
        for v in group:
            for m in aliases.get(v, (v,)):
                if m not in merged:
                    merged.append(m)
        for m in merged:
            aliases[m] = tuple(merged)
    return aliases
