"""Buffer assignment: temporaries' live ranges over a memory-aware kernel order, in-place
reuse of dying inputs, and temporaries placed in output allocations, as XLA's buffer
assignment does (docs/simulator.md)."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

from partir_plugin.extend import Op, Value

from . import opcost
from .costs import BlockCost, Kernel, nbytes
from .opcost import short_name

_ELEMENTWISE = opcost.ELEMENTWISE | opcost.TRANSCENDENTAL


def assign_buffers(kernels: list[Kernel], owner: dict[Value, Value], kinds: dict[Value, str],
                   returns: Sequence[Value], cost: BlockCost, top: bool,
                   carried: Sequence[Value] = ()) -> None:
    """Temporaries' live ranges over a memory-aware kernel order; returned buffers live to
    the end. At top level returned temporaries count as outputs (held for the whole
    program). In a loop body, `carried` are the body's arguments that `returns` replace
    (index by index): a returned value written after its argument's last read lives in the
    loop's buffer (counted outside the body), not in a temporary."""
    n = len(kernels)
    produced = {r: i for i, k in enumerate(kernels) for r in k.outputs}
    get = owner.get
    reads = [[o for o in dict.fromkeys([get(v, v) for v in k.inputs]) if o in produced]
             for k in kernels]
    held: set[Value] = set()  # buffers never freed inside this block
    for v in returns:
        o = owner.get(v, v)
        if kinds.get(o) == "temp":
            held.add(o)
    if top:
        seen: set[Value] = set()
        for v in returns:
            o = owner.get(v, v)
            key = o if o in held else v  # an argument or constant returned is copied
            if key not in seen:
                cost.output_bytes += nbytes(key)
                seen.add(key)

    order = memory_order(kernels, reads, produced, held, kinds)
    pos = [0] * n  # kernel -> its position in `order`
    for p, j in enumerate(order):
        pos[j] = p
    last: dict[Value, int] = {o: pos[i] for o, i in produced.items()}
    for j, rs in enumerate(reads):
        p = pos[j]
        for o in rs:
            if last[o] < p:
                last[o] = p
    for o in held:
        last[o] = n
    in_carry = carry_placed(kernels, order, pos, owner, kinds, produced, returns, carried)

    # Physical buffers, with in-place reuse of same-sized temporaries read for the last time.
    phys: dict[Value, list[int]] = {}  # owner -> [size, start, end] (shared when reused)
    outputs: list[list[int]] = []  # top level: [size, first use] of returned temporaries
    for p, j in enumerate(order):
        k = kernels[j]
        dying = [o for o in reads[j] if last[o] == p and o in phys and o not in held]
        for r in k.outputs:
            size = nbytes(r)
            donor = None
            if dying:
                if k.shareable is None and any(phys[o][0] == size for o in dying):
                    k.shareable = shareable_inputs(k.root, k.ops, k.inputs)
                if k.shareable:
                    share = {owner.get(v, v) for v in k.shareable}
                    donor = next((o for o in dying if o in share and phys[o][0] == size), None)
            temp = kinds.get(r) == "temp"
            if r in in_carry:
                continue  # written into the loop's own buffer
            if not temp or (top and r in held):  # not a temporary counted here
                start = p
                if donor is not None and r in held:
                    # XLA places the donor in the output's buffer: never a temporary.
                    dying.remove(donor)
                    start = phys[donor][1]
                    phys[donor][0] = 0
                if top and r in held and temp:
                    outputs.append([size, start])
                continue
            if donor is not None:
                dying.remove(donor)
                phys[r] = phys[donor]
                phys[r][2] = max(phys[r][2], last[r])
            else:
                phys[r] = [size, p, last[r]]
    buffers = [b for b in {id(b): b for b in phys.values()}.values() if b[0]]
    if top:
        buffers = share_output_allocations(buffers, outputs, n)
    delta = [0] * (n + 2)
    for size, start, stop in buffers:
        delta[start] += size
        delta[stop + 1] -= size
    live, peak = 0, cost.temp_peak
    for p in range(n + 1):
        live += delta[p]
        extra = kernels[order[p]].transient if p < n else 0
        if live + extra > peak:
            peak = live + extra
    cost.temp_peak = peak


def carry_placed(kernels: list[Kernel], order: list[int], pos: list[int],
                 owner: dict[Value, Value], kinds: dict[Value, str], produced: dict[Value, int],
                 returns: Sequence[Value], carried: Sequence[Value]) -> set[Value]:
    """The returned temporaries of a loop body that XLA writes straight into the loop's
    buffers: a `while`'s operand, its body's argument and result, and its result share one
    allocation per carried value (XLA's buffer assignment), so the new value of carry i is
    no temporary of the body when it is written after the body's last read of argument i,
    or by the kernel reading it last when that kernel may overwrite it (an in-place update
    of a scan's output stack, the residual add of a carried activation). Otherwise XLA's
    copy insertion keeps the new value in a temporary and copies it at the end."""
    if not carried:
        return set()
    get = owner.get
    arg_last: dict[Value, int] = {}
    for p, j in enumerate(order):
        for v in kernels[j].inputs:
            o = get(v, v)
            if kinds.get(o) == "arg":
                arg_last[o] = p
    placed: set[Value] = set()
    for r, a in zip(returns, carried):
        o = get(r, r)
        if o in placed or kinds.get(o) != "temp" or o not in produced:
            continue
        j = produced[o]
        read = arg_last.get(a, -1)
        if read > pos[j]:
            continue
        if read == pos[j]:
            k = kernels[j]
            if k.shareable is None:
                k.shareable = shareable_inputs(k.root, k.ops, k.inputs)
            if a not in {get(v, v) for v in k.shareable}:
                continue
        placed.add(o)
    return placed


def shareable_inputs(root: Op, members: list[Op], reads: Sequence[Value]) -> tuple[Value, ...]:
    """Inputs a kernel may overwrite in place, as XLA's CanShareOperandBufferWithUser allows:
    the updated operand of `dynamic_update_slice`/`scatter`, and for an elementwise kernel the
    inputs of the result's shape that every fused op reading them uses elementwise on the way
    to the root (an input read through a transpose, broadcast, slice or reduction is not)."""
    name = short_name(root)
    if name in opcost.IN_PLACE:
        return (root.operands[0],)
    if name not in _ELEMENTWISE or len(root.results) != 1:
        return ()
    shape = root.results[0].type.shape
    if not any(v.type.is_tensor and v.type.shape == shape for v in reads):
        return ()  # no input of the result's shape (as for most reductions' and dots' users)
    inside = set(members)
    users: dict[Op, list[Op]] = {}
    # The members reading each value, in member order (one pass, not a scan of every
    # member's inputs per read value: kernels of a few hundred fused ops read many values).
    readers: dict[Value, list[Op]] = {}
    for m in members:
        for v in m.inputs:
            if v.producer in inside:
                users.setdefault(v.producer, []).append(m)
            mine = readers.setdefault(v, [])
            if not mine or mine[-1] is not m:
                mine.append(m)
    ok: dict[Op, bool] = {}

    def elementwise_path(m: Op) -> bool:  # m's result reaches the root only elementwise
        if m not in ok:
            ok[m] = m is root or (
                short_name(m) in _ELEMENTWISE and len(m.results) == 1
                and m.results[0].type.shape == shape
                and all(elementwise_path(u) for u in users.get(m, [])))
        return ok[m]

    return tuple(v for v in reads if v.type.is_tensor and v.type.shape == shape and all(
        elementwise_path(m) for m in readers.get(v, ())))


def share_output_allocations(buffers: list[list[int]], outputs: list[list[int]],
                              end: int) -> list[list[int]]:
    """Place temporaries in output buffers before the outputs are written; return the rest.

    XLA's buffer assignment gives every live-out value an allocation of its own, then assigns
    the other buffers, largest first (earlier definition breaking ties), to an existing
    allocation at least as large whose occupants' live ranges do not overlap theirs, trying the
    smallest such allocation first; only what finds no place goes to the temp heap. An output
    is occupied only from its first write to the end, so e.g. activations that die before the
    optimizer writes the new parameters live in the parameters' output buffers.
    `buffers` are [size, first, last] positions in the kernel order (inclusive), `outputs`
    [size, first write].
    """
    allocs = sorted(((size, start) for size, start in outputs), key=lambda a: (-a[0], a[1]))
    # Each allocation's occupants: disjoint live ranges, kept sorted (starts, ends), so whether
    # a buffer overlaps one is a binary search (checking every occupant of every allocation
    # for every buffer grew with the square of a train step's parameters). Only allocations
    # at least as large (a prefix of `allocs`) whose output is first written after the buffer
    # dies (the output occupies its allocation from then to the end) can take it.
    occupied = [([start], [end]) for _, start in allocs]
    sizes = [-size for size, _ in allocs]
    rest = []
    for b in sorted(buffers, key=lambda b: (-b[0], b[1])):
        size, first, last = b
        for i in range(bisect.bisect_right(sizes, -size) - 1, -1, -1):  # smallest first
            if last >= allocs[i][1]:
                continue  # the output is written before b dies
            starts, ends = occupied[i]
            j = bisect.bisect_right(starts, last)  # occupants starting before b ends
            if j == 0 or ends[j - 1] < first:  # ... and the last of them ends before b starts
                starts.insert(j, first)
                ends.insert(j, last)
                break
        else:
            rest.append(b)
    return rest


def memory_order(kernels: list[Kernel], reads: list[list[Value]], produced: dict[Value, int],
                  held: set[Value], kinds: dict[Value, str]) -> list[int]:
    """A topological order of `kernels` that greedily runs the ready kernel freeing the most
    bytes (freed inputs minus new temporaries), program order breaking ties, as XLA's list
    scheduler does; program order alone would keep e.g. every gradient alive until the
    optimizer updates that JAX emits at the end."""
    n = len(kernels)
    readers: dict[Value, list[int]] = {}
    deps = [0] * n
    children: list[list[int]] = [[] for _ in range(n)]
    for j, rs in enumerate(reads):
        for o in rs:
            readers.setdefault(o, []).append(j)
            i = produced[o]
            if i != j:
                deps[j] += 1
                children[i].append(j)
    remaining = {o: len(js) for o, js in readers.items()}
    done = [False] * n
    alloc = [sum(nbytes(r) for r in k.outputs if kinds.get(r) == "temp" and r not in held)
             for k in kernels]

    def gain(j: int) -> int:
        freed = sum(nbytes(o) for o in reads[j] if remaining[o] == 1 and o not in held)
        return freed - alloc[j]

    heap = [(-gain(j), j) for j in range(n) if deps[j] == 0]
    heapq.heapify(heap)
    queued = {j: -g for g, j in heap}
    order: list[int] = []
    while heap:
        key, j = heapq.heappop(heap)
        if done[j] or queued.get(j) != -key:
            continue  # a stale entry
        done[j] = True
        order.append(j)
        for o in reads[j]:
            remaining[o] -= 1
            if remaining[o] == 1:
                last_reader = next(m for m in readers[o] if not done[m])
                if last_reader in queued:
                    queued[last_reader] = gain(last_reader)
                    heapq.heappush(heap, (-queued[last_reader], last_reader))
        for c in children[j]:
            deps[c] -= 1
            if deps[c] == 0:
                queued[c] = gain(c)
                heapq.heappush(heap, (-queued[c], c))
    return order
