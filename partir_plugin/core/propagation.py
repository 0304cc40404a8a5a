"""Propagation (paper 1 §5.2.2): forward, backward and inference through the TMR, to a fixed
point. Where several entries fit, propagation stops at that op and records a conflict. Where
none fits all constraints while several fit part of them, the cheapest is taken and the
operands that do not fit it are redistributed (`resolution.py`); with the state's
`resolve_conflicts` off (PartIR's strict semantics) that is a conflict too."""

from __future__ import annotations

import heapq

from ..ir.dialect import MANUAL_COMPUTATION
from ..ir.graph import Op, Value, partitionable_ops
from ..ir.opsets import PARTITIONED_REGIONS, TERMINATORS
from .resolution import resolve
from .splitting import Piece, result_tiles, split_loops
from .state import PartitionState
from .tmr import Sum, TMREntry


def _constraints(state: PartitionState, op: Op, axis: str):
    """What the neighbours of `op` say about `axis`: input dims tiled on it (forward), result
    dims tiled on it (backward), and -- only when neither says anything, as they take
    precedence -- result dims consumers slice on it (backward, soft)."""
    dim_of = state.dim_of
    ins = [dim_of(v, axis) for v in op.inputs]
    outs = [dim_of(r, axis) for r in op.results]
    sliced: list[set[int]] = []
    if ins.count(None) < len(ins) or outs.count(None) < len(outs):
        return ins, outs, sliced
    for r in op.results:
        dims = set()
        for user, i in state.users.get(r, []):
            if user is None:
                continue
            for a, e in state.nest_of(user):
                if a == axis and e.operands[i] is not None:
                    dims.add(e.operands[i])
        sliced.append(dims)
    return ins, outs, sliced


def _fits(state: PartitionState, op: Op, axis: str, e: TMREntry) -> bool:
    """Can `op` be wrapped in a loop over `axis` with entry `e` (atomics, tilings, and
    divisibility unless the entry may run on padded tiles)?"""
    for v, d in zip(op.inputs, e.operands):
        if d is None:
            continue
        if state.dim_of(v, axis) == d:
            continue
        if state.can_tile(v, d, axis) is not None:
            return False
    for r, action in zip(op.results, e.results):
        if isinstance(action, Sum):
            continue
        if state.blocked(r, axis) is not None:
            return False
        existing = state.dim_of(r, axis)
        if existing is not None and existing != action:
            return False
    if state.mixes_windows(op, e):
        return False
    return not state.entry_pads(op, axis, e) or state.padding_allowed(op, e, axis)


def _step(state: PartitionState, op: Op, axis: str) -> list[Value]:
    """Try to loop `op` over `axis`; return the values whose tiling changed."""
    if state.in_loop(op, axis) or op.name in TERMINATORS or op.name in PARTITIONED_REGIONS:
        return []  # a while's or case's values are tied to its regions through aliases
    if state.decided(op, axis):
        return []  # a decided tag: each side keeps its own distribution
    ins, outs, sliced = _constraints(state, op, axis)
    hard = ins.count(None) < len(ins) or outs.count(None) < len(outs)
    soft = any(sliced)
    if not hard and not soft:
        return []
    entries = state.registry.entries(op)
    if not entries:
        if hard and op.name != MANUAL_COMPUTATION:  # a shard_map body: placed by its specs
            state.record_unsupported(op)
        return []

    if hard:
        # Only the inputs and results tiled on the axis constrain the entry (usually one).
        known_ins = [(i, d) for i, d in enumerate(ins) if d is not None]
        known_outs = [(j, d) for j, d in enumerate(outs) if d is not None]

        def matches(e: TMREntry) -> tuple[bool, bool]:
            ok_all, ok_any = True, False
            operands, results = e.operands, e.results
            for i, got in known_ins:
                if operands[i] == got:
                    ok_any = True
                else:
                    ok_all = False
            for j, got in known_outs:
                if results[j] == got:
                    ok_any = True
                else:
                    ok_all = False
            return ok_all, ok_any

        scored = [(e, *matches(e)) for e in entries]
        candidates = [e for e, ok_all, _ in scored if ok_all and _fits(state, op, axis, e)]
        partial = [e for e, ok_all, ok_any in scored if ok_any and not ok_all]
        if not candidates:
            pieces = split_loops(state, op, axis)
            if pieces is not None:
                return _split(state, op, pieces)
            if len(partial) <= 1:
                return []
            resolved = resolve(state, op, axis, partial)
            if resolved is None:
                state.record_conflict(op, axis, "entries " + " and ".join(
                    str(e) for e in partial[:3]) + " each match part of the operand tilings")
                return []
            candidates = [resolved]
    else:
        candidates = [e for e in entries
                      if any(not isinstance(a, Sum) and a in s for a, s in zip(e.results, sliced))
                      and _fits(state, op, axis, e)]
        if not candidates:
            return []
    if len(candidates) > 1:
        state.record_conflict(op, axis, "several entries match: "
                              + ", ".join(str(e) for e in candidates[:4]))
        return []
    entry = candidates[0]
    changed: list[Value] = []
    for v, d in zip(op.inputs, entry.operands):
        if d is not None and state.dim_of(v, axis) is None and not _reserved(state, v, axis):
            changed += state.tile_value(v, d, axis)  # inference: slice the missing operand
    changed += state.add_loop(op, axis, entry)
    # The producers of the inputs the loop slices now see that slicing (an input the loop
    # reads whole, e.g. a reduction's scalar init shared by every layer, tells them nothing).
    changed.extend(v for v, d in zip(op.inputs, entry.operands)
                   if d is not None and v not in changed)
    return changed


def _reserved(state: PartitionState, v: Value, axis: str) -> bool:
    """Is `v` a tag a later tactic decides on `axis` (a redistribution point)? A loop that
    reads it leaves it to that tactic and converts at the edge: tiling it here by inference
    would decide the tag for the tactic (the gradient's tag, read by a loop the forward
    tiling reaches, once refused the tactic's own decision)."""
    return v.producer is not None and state.decided(v.producer, axis)


def _split(state: PartitionState, op: Op, pieces: list[Piece]) -> list[Value]:
    """Loop `op` over the parts of an axis (`splitting.py`), slicing the inputs that lack them."""
    changed: list[Value] = []
    for p in pieces:
        for v, d in zip(op.inputs, p.entry.operands):
            if d is not None and not _reserved(state, v, p.axis):
                changed += state.tile_value(v, d, p.axis)
    if any(p.at is not None for p in pieces):  # the result tiled apart from the loops
        for axis, d in result_tiles(pieces):
            changed += state.tile_value(op.results[0], d, axis)
    for p in pieces:
        changed += state.add_loop(op, p.axis, p.entry)
    changed.extend(v for v, d in zip(op.inputs, pieces[0].entry.operands)
                   if d is not None and v not in changed)
    return changed


def propagate(state: PartitionState, seeds: list[Value] | None = None) -> None:
    """Run propagation to a fixed point over every mesh axis.

    The worklist holds (op, axis) pairs and hands them out in program order (the earliest op
    first), so a tiling reaches an op from the program's inputs, through the forward pass,
    before it reaches it backwards from a later use: a token tiling meets an expert tiling at
    the expert matmul, where the conflict is resolved by moving the tokens (GShard's
    all_to_all), not at the dispatch, where it would gather them.

    A step on an axis changes tilings on that axis only, so it wakes the neighbours on that
    axis. On another axis a neighbour can only come to fit fewer entries (its operands' local
    extents shrink), which matters only where it stopped at a conflict between several
    entries: those (op, axis) pairs are woken too.
    """
    mesh = state.mesh
    index = {a: i for i, a in enumerate(mesh.names)}
    ranks: dict[str, tuple[int, int, int]] = {}

    def rank(axis: str) -> tuple[int, int, int]:
        if axis not in ranks:  # a sub-axis right after its parent, major parts first
            sub = mesh.sub_axis(axis)
            ranks[axis] = (index[sub.parent], sub.pre, -sub.size)
        return ranks[axis]

    axes = [*mesh.names, *state.sub_axes()]
    position = state.position
    if seeds is None:
        ops = partitionable_ops(state.func.ops)
    else:
        ops = [n for v in seeds for n in state.neighbours(v)]
    # A pair whose op already loops over the axis (or a part of it) is never queued: its
    # step would do nothing, and loops are only ever added (two thirds of the pairs a
    # schedule wakes on the decoder and the MoE).
    in_loop, stopped_at, overlaps = state.in_loop, state.stopped_at, mesh.overlaps
    queued = {(op, axis) for op in ops for axis in axes if not in_loop(op, axis)}
    queue = [(position[op], rank(axis), op, axis) for op, axis in queued]
    heapq.heapify(queue)
    while queue:
        _, _, op, axis = heapq.heappop(queue)
        queued.discard((op, axis))
        changed = _step(state, op, axis)
        if len(axes) != len(mesh.names) + state.sub_axis_count:
            axes = [*mesh.names, *state.sub_axes()]  # a split made new sub-axes
        for v in changed:
            # The axis, or the parts of it a split tiled `v` on (or the axis they fold to).
            woken = {axis, *(a for a, _ in state.tiling.get(v, ()) if overlaps(a, axis))}
            for n in state.neighbours(v):
                for a in axes:
                    if ((a in woken or stopped_at(n, a)) and (n, a) not in queued
                            and not in_loop(n, a)):
                        queued.add((n, a))
                        heapq.heappush(queue, (position[n], rank(a), n, a))

