"""Lowering a weak path to concrete collectives with device maps (paper §6, Fig. 10, §7.3).

The state is a concrete type over factor axes plus a device map, stored as its inverse: the
logical coordinate of every factor axis for every replica. A collective on axes that are not
minor-most in their dimension first re-labels the device map (Fig. 10: `b' o phi'^-1 =
b o phi^-1`, no data moves) so that they become minor-most; the groups are then the replicas
that differ only in those logical coordinates, and the tiles they hold are contiguous.

Weak steps only fix how many primes move; which factor axes (and in which order) is chosen
here. Following §7.3 the candidates are ordered by how well they build the target's axes,
and a small depth-first search looks for a choice that ends on exactly the target device
assignment. If none is found within the budget, the heuristic's first choice is kept and one
allpermute goes in before the trailing allgathers, where tiles are smallest, to a type that
those allgathers turn into the target under the identity device map.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import combinations, permutations
from math import prod

from .factors import FactorMesh
from .search import WeakStep
from .steps import AllGather, AllPermute, AllSlice, AllToAll, Step
from .types import DistType

Coords = tuple[int, ...]
BUDGET = 256  # collectives tried by the search for a permutation-free lowering


def _radix(ids: tuple[int, ...], coord: Coords, sizes: tuple[int, ...]) -> int:
    b = 0
    for f in ids:
        b = b * sizes[f] + coord[f]
    return b


@dataclass(frozen=True)
class _State:
    ty: DistType
    coords: tuple[Coords, ...]  # replica -> logical coordinate of every factor axis

    def tiles(self) -> list[tuple[int, ...]]:
        sizes = self.ty.fmesh.sizes()
        return [tuple(_radix(d, c, sizes) for d in self.ty.dims) for c in self.coords]


def _relabel(state: _State, dim: int, order: tuple[int, ...]) -> tuple[Coords, ...]:
    """Device-map change making `order` the factor order of `dim`, same tiles everywhere."""
    old = state.ty.dims[dim]
    if old == order:
        return state.coords
    sizes = state.ty.fmesh.sizes()
    out = []
    for c in state.coords:
        b = _radix(old, c, sizes)
        new = list(c)
        for f in reversed(order):
            new[f] = b % sizes[f]
            b //= sizes[f]
        out.append(tuple(new))
    return tuple(out)


def _groups(coords: tuple[Coords, ...], axes: tuple[int, ...], sizes) -> list[list[int]]:
    """Replicas equal in every logical coordinate but `axes`, ordered by those (major first)."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    others = [f for f in range(len(sizes)) if f not in axes]
    for r, c in enumerate(coords):
        groups.setdefault(tuple(c[f] for f in others), []).append((_radix(axes, c, sizes), r))
    return sorted([r for _, r in sorted(members)] for members in groups.values())


def _apply(
    state: _State, ws: WeakStep, axes: tuple[int, ...], itemsize: int
) -> tuple[_State, Step]:
    fm, ty, sizes = state.ty.fmesh, state.ty, state.ty.fmesh.sizes()
    common = dict(
        axes=fm.axes_of(axes),
        factor_axes=tuple(fm.label(f) for f in axes),
        bytes_per_device=ws.cost * itemsize,
        in_local_shape=ws.before,
        out_local_shape=ws.after,
        in_type=ty,
    )
    if ws.kind == "all_slice":
        out = ty.dynslice(ws.dim, axes)
        idx = [_radix(axes, c, sizes) for c in state.coords]
        step: Step = AllSlice(
            dims=(ws.dim,),
            out_type=out,
            dim=ws.dim,
            num_blocks=prod(sizes[f] for f in axes),
            block_index=idx,
            **common,
        )
        return _State(out, state.coords), step
    rest = tuple(f for f in ty.dims[ws.dim] if f not in axes)
    coords = _relabel(state, ws.dim, rest + axes)
    groups = _groups(coords, axes, sizes)
    if ws.kind == "all_gather":
        out = ty.allgather(ws.dim, axes)
        step = AllGather(dims=(ws.dim,), out_type=out, dim=ws.dim, groups=groups, **common)
    else:
        assert ws.to_dim is not None
        out = ty.alltoall(ws.dim, ws.to_dim, axes)
        step = AllToAll(
            dims=(ws.dim, ws.to_dim),
            out_type=out,
            split_dim=ws.to_dim,
            concat_dim=ws.dim,
            groups=groups,
            **common,
        )
    return _State(out, coords), step


def _prefix_len(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _candidates(state: _State, ws: WeakStep, dst: DistType) -> list[tuple[int, ...]]:
    """Ordered factor-axis tuples realising `ws`, best first by the §7.3 heuristic: build
    the target's axes in its order, take axes from where the target does not want them, and
    prefer the minor-most ones (no re-labelling, so logical axes stay physical ones)."""
    ty, sizes = state.ty, state.ty.fmesh.sizes()
    want = Counter(ws.primes)
    if ws.kind == "all_slice":
        pool: tuple[int, ...] = tuple(f for f in range(len(sizes)) if f not in ty.axes)
    else:
        pool = ty.dims[ws.dim]
    into = ws.dim if ws.kind == "all_slice" else ws.to_dim
    keep = _prefix_len(ty.dims[ws.dim], dst.dims[ws.dim])
    scored = []
    for combo in combinations(pool, len(ws.primes)):
        if Counter(sizes[f] for f in combo) != want:
            continue
        orders = permutations(combo) if len(combo) <= 3 else [combo, tuple(sorted(combo))]
        for axes in dict.fromkeys(orders):
            score = 0
            if into is not None:
                grown = ty.dims[into] + axes
                target = dst.dims[into]
                base = len(ty.dims[into])
                score -= 4 * sum(
                    p < len(target) and grown[p] == target[p] for p in range(base, len(grown))
                )
                score += sum(f in dst.axes and f not in target for f in axes)
            if ws.kind != "all_slice":
                src = ty.dims[ws.dim]
                score += 4 * sum(src.index(f) < keep for f in axes)
                score += axes != src[len(src) - len(axes) :]
            scored.append((score, axes))
    scored.sort(key=lambda t: t[0])
    return [a for _, a in scored]


def _permute(state: _State, target: _State, itemsize: int) -> AllPermute | None:
    """One collective_permute giving every replica its `target` tile; None if nothing moves."""
    have, goal = state.tiles(), target.tiles()
    if have == goal:
        return None
    holders: dict[tuple[int, ...], list[int]] = {}
    for r, t in enumerate(have):
        if t != goal[r]:
            holders.setdefault(t, []).append(r)
    pairs = []
    for r, t in enumerate(goal):
        pairs.append((r, r) if have[r] == t else (holders[t].pop(0), r))
    ty = state.ty
    return AllPermute(
        axes=ty.fmesh.mesh.names,
        factor_axes=(),
        dims=(),
        bytes_per_device=ty.localsize * itemsize,
        in_local_shape=ty.local_shape,
        out_local_shape=ty.local_shape,
        in_type=ty,
        out_type=target.ty,
        pairs=sorted(pairs),
    )


def lower(path: list[WeakStep], src: DistType, dst: DistType, itemsize: int) -> list[Step]:
    """Concrete collectives taking every replica from its `src` tile to its `dst` tile."""
    fm: FactorMesh = src.fmesh
    start = _State(src, fm.replica_coords)
    goal = _State(dst, fm.replica_coords).tiles()
    budget = [BUDGET]
    first: list[tuple[_State, list[Step], list[_State]]] = []

    def search(k: int, state: _State, steps: list[Step], states: list[_State]) -> list[Step] | None:
        if k == len(path):
            if state.tiles() == goal:
                return steps
            if not first:
                first.append((state, steps, states))
            return None
        for axes in _candidates(state, path[k], dst):
            if budget[0] <= 0 and first:
                return None
            budget[0] -= 1
            nxt, step = _apply(state, path[k], axes, itemsize)
            found = search(k + 1, nxt, steps + [step], states + [nxt])
            if found is not None:
                return found
        return None

    found = search(0, start, [], [start])
    if found is not None:
        return found
    _, steps, states = first[0]
    # §7.3: move the permutation before the trailing allgathers.
    t = len(path)
    while t > 0 and path[t - 1].kind == "all_gather":
        t -= 1
    dims = [list(d) for d in dst.dims]
    used = set(dst.axes)
    at_t = states[t].ty
    for ws in reversed(path[t:]):  # the last gather removes the most major extra axes
        pool = [f for f in at_t.dims[ws.dim] if f not in used]
        pool += [f for f in range(len(fm.factors)) if f not in used and f not in pool]
        extra: list[int] = []
        need = Counter(ws.primes)
        for f in pool:
            if need[fm.factors[f].size] > 0:
                need[fm.factors[f].size] -= 1
                extra.append(f)
        used.update(extra)
        dims[ws.dim] = dims[ws.dim] + extra
    ws_axes = []
    staged = [tuple(d) for d in dims]
    for ws in path[t:]:  # gather the minor-most extras first: identity device map throughout
        n = len(ws.primes)
        ws_axes.append(tuple(staged[ws.dim][-n:]))
        staged[ws.dim] = staged[ws.dim][:-n]
    mid = _State(DistType(dst.global_shape, tuple(tuple(d) for d in dims), fm), fm.replica_coords)
    out = steps[:t]
    perm = _permute(states[t], mid, itemsize)
    if perm is not None:
        out.append(perm)
    state = mid
    for ws, axes in zip(path[t:], ws_axes):
        state, step = _apply(state, ws, axes, itemsize)
        out.append(step)
    assert state.tiles() == goal
    return out
