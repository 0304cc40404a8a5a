"""A pure-numpy executor of plans, collective by collective, as StableHLO would run them.

It starts from each replica's block of the source sharding computed with jax's own rule
(spec axes `(a, b)` on a dim: `|a|*|b|` blocks, device `(i_a, i_b)` holds block
`i_a*|b| + i_b`), independently of the planner's factor axes, so it checks the planner
rather than repeating it.
"""

from __future__ import annotations

import numpy as np

from ...core.mesh import Mesh
from .plan import RedistributionPlan
from .steps import AllGather, AllPermute, AllSlice, AllToAll, Step


def local_blocks(mesh: Mesh, x: np.ndarray, spec: tuple[tuple[str, ...], ...]) -> list[np.ndarray]:
    """Every replica's tile of `x` under the normalized `spec` (jax semantics)."""
    out = []
    for r in range(mesh.size):
        index = []
        for d, axes in enumerate(spec):
            n, b = 1, 0
            for a in axes:
                n *= mesh.axis_size(a)
                b = b * mesh.axis_size(a) + mesh.coord(r, a)
            size = x.shape[d] // n
            index.append(slice(b * size, (b + 1) * size))
        out.append(x[tuple(index)])
    return out


def _check_groups(groups: list[list[int]], n: int) -> None:
    members = sorted(r for g in groups for r in g)
    assert members == list(range(n)), f"groups {groups} do not partition {n} replicas"
    assert len({len(g) for g in groups}) == 1, f"groups of unequal sizes: {groups}"


def run_step(step: Step, tiles: list[np.ndarray]) -> list[np.ndarray]:
    """The tiles after `step`, replica by replica."""
    n = len(tiles)
    new: list[np.ndarray | None] = [None] * n
    if isinstance(step, AllGather):
        _check_groups(step.groups, n)
        for g in step.groups:
            cat = np.concatenate([tiles[m] for m in g], axis=step.dim)
            for m in g:
                new[m] = cat
    elif isinstance(step, AllToAll):
        _check_groups(step.groups, n)
        for g in step.groups:
            chunks = {m: np.split(tiles[m], len(g), axis=step.split_dim) for m in g}
            for p, m in enumerate(g):
                new[m] = np.concatenate([chunks[s][p] for s in g], axis=step.concat_dim)
    elif isinstance(step, AllSlice):
        for r in range(n):
            new[r] = np.split(tiles[r], step.num_blocks, axis=step.dim)[step.block_index[r]]
    else:
        assert isinstance(step, AllPermute)
        assert sorted(s for s, _ in step.pairs) == list(range(n)), "sources not a permutation"
        assert sorted(t for _, t in step.pairs) == list(range(n)), "targets not a permutation"
        for s, t in step.pairs:
            new[t] = tiles[s]
    assert all(t is not None for t in new)
    return [t for t in new if t is not None]


def execute(plan: RedistributionPlan, x: np.ndarray) -> list[np.ndarray]:
    """Run `plan` on the global array `x`: the tiles every replica ends with."""
    tiles = local_blocks(plan.mesh, x, plan.src_spec)
    for step in plan.steps:
        tiles = run_step(step, tiles)
        assert all(t.shape == tuple(step.out_local_shape) for t in tiles), step.kind
    return tiles


def verify(plan: RedistributionPlan, x: np.ndarray | None = None) -> None:
    """Raise AssertionError unless every replica ends with exactly its target tile."""
    if x is None:
        x = np.arange(np.prod(plan.global_shape), dtype=np.int64).reshape(plan.global_shape)
    got = execute(plan, x)
    want = local_blocks(plan.mesh, x, plan.dst_spec)
    for r, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and np.array_equal(g, w), f"replica {r} holds the wrong tile"
