"""Splitting an axis across the factors of a reshaped dimension (PartIR paper 1 §8, Shardy's
reshape rule).

A reshape `[256] -> [4, 64]` has the Shardy rule `([ij])->([i, j]) {i=4, j=64}`: dimension 0
of the operand is the compound of factor `i` (major) and `j` (minor). An axis of 8 devices
tiling it covers all of `i` and a factor 2 of `j`, so the loop over it becomes two loops: over
the sub-axis `model:(1)4` with the entry of `i` and over `model:(4)2` with the entry of `j`.
Each tile of the operand is then exactly a tile of the result and the reshape runs locally,
where the TMR's whole-axis entries (a factor must be a multiple of the axis size, and only a
dimension's major factor has an entry) would stop propagation and gather.

Axes already tiling the dimension (more major than the new one) have used up its major
factors first: the new axis starts where they stop, as Shardy assigns axes to factors.

A later op may read the result in slices along a major factor's dimension: a scan over
microbatches, `x.reshape(2, 8, d)` with the batch over 8 devices, reads one `[8, d]` per
step. Tiled on `batch:(1)2` there, every slice is held by half the devices, and the scan would
gather it at each step and compute each row twice. The result is then tiled with that part on
the next factor's dimension instead, in its place among the parts of the axis
(`[2, 8{batch}, d]`): the reshape still runs on its tiles and the lowering redistributes its
result once, after it, so each slice is read locally.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from ..ir.graph import Op, Value
from .rules.halo import grouped_dim
from .rules.shardy import ShardyRule, parse_rule
from .state import PartitionState
from .subaxis import SubAxis
from .tmr import TMREntry

Tensor = tuple[tuple[str, ...], ...]  # per dimension, factors major to minor


@dataclass(frozen=True)
class Piece:
    """A part of the axis (a sub-axis, or the whole axis) and the factor it tiles. `at`: the
    dimension of the result it tiles, where that is not the factor's (`_placed`)."""

    axis: str
    factor: str
    entry: TMREntry
    at: int | None = None


@functools.lru_cache(maxsize=4096)
def _rule(text: str) -> ShardyRule | None:
    return parse_rule(text)


def compound_dims(op: Op) -> list[tuple[int, int]]:
    """(value index, dimension) of `op`'s operands then results where its rule makes a
    dimension of several factors: where propagation may split an axis."""
    rule = _rule(op.rule) if op.rule else None
    if rule is None:
        return []
    return [(k, d) for k, t in enumerate((*rule.operands, *rule.results))
            for d, dim in enumerate(t) if sum(rule.sizes.get(f, 1) > 1 for f in dim) > 1]


def split_loops(state: PartitionState, op: Op, axis: str) -> list[Piece] | None:
    """The loops over parts of `axis` that let `op` run on the tiles its neighbours have on
    `axis`, when a dimension tiled on `axis` is a compound of factors; None when there is
    no such dimension or the factors do not divide the axis consistently."""
    if op.rule is None or op.captures or len(op.results) != 1 or grouped_dim(op) is not None:
        return None  # a grouped convolution's compound feature dims hold its groups
    rule = _rule(op.rule)
    if rule is None or not compound_dims(op) or len(rule.operands) != len(op.operands):
        return None
    values = [*op.operands, *op.results]
    tensors: list[Tensor] = [*rule.operands, *rule.results]
    tiled = [(k, d) for k, v in enumerate(values)
             if (d := state.dim_of(v, axis)) is not None]
    if not tiled or any(state.overlapping(v, axis) for v in values):
        return None
    k, d = tiled[0]
    factors = [f for f in tensors[k][d] if rule.sizes.get(f, 1) > 1]
    before = _axes_before(state, values[k], d, axis)
    if any(not state.in_loop(op, a) for a in before):
        return None  # the more major axes must be assigned to factors first
    sizes = _assign(rule, factors, state.mesh.product(before), state.mesh.axis_size(axis))
    if sizes is None:
        return None
    sub = state.mesh.sub_axis(axis)
    pieces, pre = [], sub.pre
    for factor, size in sizes:
        name = state.mesh.spelling(SubAxis(sub.parent, pre, size))
        pre *= size
        entry = _entry(rule, tensors, factor, len(op.operands))
        if entry.results[0] is None or all(d is None for d in entry.operands):
            return None  # a factor of one side only: no loop runs the op on tiles of both
        pieces.append(Piece(name, factor, entry))
    if not _consistent(state, op, axis, pieces, values, tensors, rule):
        return None
    return _placed(state, op, pieces)


def _placed(state: PartitionState, op: Op, pieces: list[Piece]) -> list[Piece]:
    """`pieces`, those whose result dimension every later op reads in slices moved to the
    dimension of the next piece that is not (module docstring), where it divides."""
    result = op.results[0]
    sliced = sliced_dims(state, result)
    dims = [p.entry.results[0] for p in pieces]
    if None in dims or not sliced & set(dims) or any(
            state.dim_of(result, p.axis) is not None for p in pieces):
        return pieces
    out = list(pieces)
    for i, p in enumerate(pieces):
        target = next((d for d in dims[i + 1:] if d not in sliced), None)
        if dims[i] not in sliced or target is None:
            continue
        on_target = [*state.axes_on(result, target), p.axis,
                     *(a for a, d in result_tiles(out) if d == target)]
        if result.type.shape[target] % state.mesh.product(on_target) == 0:
            out[i] = replace(p, at=target)
    return out


def result_tiles(pieces: list[Piece]) -> list[tuple[str, int]]:
    """How the pieces tile the result, (axis, dim), major first: a moved piece keeps its place
    among the parts of the axis, so `batch:(1)2` moved onto the dimension of `batch:(2)4`
    tiles it with it as `batch` again."""
    return [(p.axis, p.entry.results[0] if p.at is None else p.at) for p in pieces]


def sliced_dims(state: PartitionState, v: Value, passed: tuple[Op, int] | None = None
                ) -> set[int]:
    """The dimensions along which every later op reads `v` only in slices (`slice`,
    `dynamic_slice`, or a `while` that passes it through its body unchanged, reading it there
    in slices: a scan's `xs`); empty where some op reads it otherwise. `passed`: the use that
    passes `v` on unchanged (a body's terminator)."""
    dims: set[int] | None = None
    for user, i in state.users.get(v, ()):
        if passed is not None and user is passed[0] and i == passed[1]:
            continue
        if user is None:
            return set()
        if user.name in ("stablehlo.slice", "stablehlo.dynamic_slice") and i == 0:
            here = {d for d, (a, b) in enumerate(zip(v.type.shape, user.results[0].type.shape))
                    if b < a}
        elif user.name == "stablehlo.while":
            cond, body = (r.blocks[0] for r in user.regions)
            arg = body.args[i]
            if state.users.get(cond.args[i]) or body.ops[-1].operands[i] is not arg:
                return set()
            here = sliced_dims(state, arg, passed=(body.ops[-1], i))
        else:
            return set()
        dims = here if dims is None else dims & here
        if not dims:
            return set()
    return dims or set()


def _axes_before(state: PartitionState, v, dim: int, axis: str) -> list[str]:
    on_dim = [a for a, d in state.tiles_of(v) if d == dim]
    return on_dim[: on_dim.index(axis)]


def _assign(rule: ShardyRule, factors: list[str], covered: int, n: int
            ) -> list[tuple[str, int]] | None:
    """Parts of an axis of size `n` per factor, after `covered` devices already tile the
    dimension: (factor, part size), major first."""
    caps = []
    for f in factors:
        cap = rule.sizes[f]
        if covered >= cap:
            if covered % cap:
                return None
            covered //= cap
            continue
        if cap % covered:
            return None
        caps.append((f, cap // covered))
        covered = 1
    out = []
    for f, cap in caps:
        if n == 1:
            break
        part = n if n <= cap else cap
        if cap % part or n % part:
            return None
        out.append((f, part))
        n //= part
    return out if n == 1 and out else None


def _entry(rule: ShardyRule, tensors: list[Tensor], factor: str, n_operands: int
           ) -> TMREntry:
    dims = [next((d for d, fs in enumerate(t) if factor in fs), None) for t in tensors]
    return TMREntry(tuple(dims[:n_operands]), tuple(dims[n_operands:]), rule.sizes[factor])


def _consistent(state: PartitionState, op: Op, axis: str, pieces: list[Piece], values,
                tensors: list[Tensor], rule: ShardyRule) -> bool:
    """Every tensor sees the same parts: a tensor dimension holding a piece's factor has its
    more major factors tiled exactly as far as the piece starts, no reduction or blocked
    factor is involved, and a tensor already tiled on `axis` is tiled where the pieces go."""
    mesh = state.mesh
    nest = state.nest_of(op)
    n_ops = len(op.operands)
    for p in pieces:
        if p.factor in rule.reduction or p.factor in rule.blocked:
            return False
    for k, (v, t) in enumerate(zip(values, tensors)):
        dims = {_dim_of(p.entry, k, n_ops) for p in pieces}
        dims.discard(None)
        have = state.dim_of(v, axis)
        if have is not None and dims != {have}:
            return False
        if have is None:
            for p in pieces:
                d = _dim_of(p.entry, k, n_ops)
                if d is not None and state.can_tile(v, d, p.axis) is not None:
                    return False
        covered_in_nest = {}
        for a, e in nest:
            d = _dim_of(e, k, n_ops)
            if d is not None:
                covered_in_nest[d] = covered_in_nest.get(d, 1) * mesh.axis_size(a)
        # Each piece's factor must start where the tiling of its dimension stops.
        done = dict(covered_in_nest)
        for p in pieces:
            d = _dim_of(p.entry, k, n_ops)
            if d is None:
                continue
            major = 1
            for f in t[d]:
                if f == p.factor:
                    break
                major *= rule.sizes.get(f, 1)
            have_d = done.get(d, 1)
            if have_d % major or rule.sizes[p.factor] % (have_d // major * mesh.axis_size(
                    p.axis)):
                return False
            done[d] = have_d * mesh.axis_size(p.axis)
    return True


def _dim_of(entry: TMREntry, k: int, n_operands: int) -> int | None:
    return entry.operands[k] if k < n_operands else entry.results[k - n_operands]
