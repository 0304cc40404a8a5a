"""Redistribution as a shortest path over weak types (paper §7.2).

Nodes are local shapes (a weak type is determined by its local shape once the global shape is
fixed) whose local size is within the memory bound `max(localsize(src), localsize(dst))`, and
whose partition counts use no more prime factor axes than the mesh has. Edges are the weak
multi-axis collectives: allgather and alltoall of any sub-multiset of the primes partitioning
a dimension, dynslice of any sub-multiset of the unused primes. Weights are Fig. 11's costs
in elements; ties go to fewer steps. Since no node exceeds the bound, neither does the path.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from itertools import product
from math import prod

from ...errors import PartitionError

Shape = tuple[int, ...]


@dataclass(frozen=True)
class WeakStep:
    """One weak collective: `primes` (factor axis sizes) leave `dim` (all_gather, all_to_all)
    or enter it (all_slice); an all_to_all moves them into `to_dim`."""

    kind: str
    dim: int
    to_dim: int | None
    primes: tuple[int, ...]
    before: Shape
    after: Shape
    cost: int  # Fig. 11, elements per device


def _prime_counts(n: int, primes: tuple[int, ...]) -> Counter | None:
    """Factor `n` over `primes`; None if anything else divides it."""
    c: Counter = Counter()
    for p in primes:
        while n % p == 0:
            c[p] += 1
            n //= p
    return c if n == 1 else None


def _submultisets(c: Counter) -> list[tuple[int, ...]]:
    """Non-empty sub-multisets of `c`, as sorted tuples."""
    keys = sorted(c)
    out = []
    for counts in product(*(range(c[k] + 1) for k in keys)):
        sub = tuple(k for k, n in zip(keys, counts) for _ in range(n))
        if sub:
            out.append(sub)
    return out


def shortest_paths(
    global_shape: Shape, mesh_primes: Counter, src: Shape, dst: Shape, limit: int = 8
) -> list[list[WeakStep]]:
    """Cheapest sequences of weak collectives from local shape `src` to `dst` that never holds
    more than `max(prod(src), prod(dst))` elements per device."""
    bound = max(prod(src), prod(dst))
    primes = tuple(sorted(mesh_primes))
    rank = len(global_shape)

    def counts(local: Shape) -> list[Counter] | None:
        per_dim = []
        for g, c in zip(global_shape, local):
            if g % c:
                return None
            pc = _prime_counts(g // c, primes)
            if pc is None:
                return None
            per_dim.append(pc)
        total = sum(per_dim, Counter())
        return per_dim if all(total[p] <= mesh_primes[p] for p in total) else None

    def edges(local: Shape):
        per_dim = counts(local)
        assert per_dim is not None
        size = prod(local)
        free = mesh_primes - sum(per_dim, Counter())
        for i in range(rank):
            for sub in _submultisets(per_dim[i]):
                n = prod(sub)
                grown = local[:i] + (local[i] * n,) + local[i + 1 :]
                if size * n <= bound:
                    yield WeakStep("all_gather", i, None, sub, local, grown, size * n)
                for j in range(rank):
                    if j != i and local[j] % n == 0:
                        moved = list(grown)
                        moved[j] //= n
                        yield WeakStep("all_to_all", i, j, sub, local, tuple(moved), size)
            for sub in _submultisets(free):
                n = prod(sub)
                if local[i] % n == 0:
                    cut = local[:i] + (local[i] // n,) + local[i + 1 :]
                    yield WeakStep("all_slice", i, None, sub, local, cut, 0)

    for name, t in (("source", src), ("target", dst)):
        if counts(t) is None:
            raise PartitionError(f"{name} local shape {t} does not fit global shape {global_shape}")
    # Dijkstra on cost; every edge that reaches a node at its best cost is kept, so all the
    # cheapest paths can be enumerated (their lowerings differ: some need a final permute).
    best: dict[Shape, int] = {src: 0}
    preds: dict[Shape, list[WeakStep]] = {src: []}
    done: set[Shape] = set()
    heap = [(0, 0, src)]
    tick = 0
    while heap:
        cost, _, node = heapq.heappop(heap)
        if node in done or cost > best[node]:
            continue
        if dst in best and cost > best[dst]:
            break
        done.add(node)
        for e in edges(node):
            c = cost + e.cost
            if e.after not in best or c < best[e.after]:
                best[e.after] = c
                preds[e.after] = [e]
                tick += 1
                heapq.heappush(heap, (c, tick, e.after))
            elif c == best[e.after] and e.after not in done:
                preds[e.after].append(e)
    if dst not in best:  # pragma: no cover - the graph always connects src and dst
        raise PartitionError(f"no redistribution from local shape {src} to {dst}")
    # Enumerate cheapest paths, fewest steps first.
    paths: list[list[WeakStep]] = []
    frontier: list[tuple[Shape, list[WeakStep]]] = [(dst, [])]
    while frontier and len(paths) < limit:
        next_frontier = []
        for node, suffix in frontier:
            if node == src:
                paths.append(suffix)
                if len(paths) >= limit:
                    break
                continue
            next_frontier += [(e.before, [e, *suffix]) for e in preds[node]]
        frontier = next_frontier[: 64 * limit]
    return paths


def shortest_path(global_shape: Shape, mesh_primes: Counter, src: Shape, dst: Shape
                  ) -> list[WeakStep]:
    """One cheapest path (fewest steps among the cheapest)."""
    return shortest_paths(global_shape, mesh_primes, src, dst, limit=1)[0]
