"""The analytical simulator: roofline kernels, ring collectives, live-range memory.

The device-local program is cut into kernels the way a fusing backend would: an elementwise or
data-movement op whose every user can absorb it (another such op or a reduction) is fused into
its users, so its result is never materialised; every other op is a kernel root. A kernel takes
max(flops / peak, bytes / memory bandwidth) (+ the spec's per-kernel overhead); a collective takes
its ring time on the link of its mesh axes. Kernels run in program order on a compute stream and
a communication stream; without overlap the two are one stream.

Peak memory follows XLA's accounting: arguments and outputs are held for the whole program
(the runtime allocates outputs before it starts), temporaries from the kernel defining them to
their last reader, fused intermediates never. An elementwise kernel reuses the buffer of a
temporary input it reads elementwise for the last time, an in-place update or a while loop its
operand's (XLA's buffer sharing); a temporary that dies before an output is written lives in
that output's buffer (XLA's buffer assignment fills live-out allocations first); a
reduce_scatter over an inner dimension first copies its operand (XLA's layout assignment).
A `while` costs its body and condition times the trip count when the loop is a counted loop
(`i = c0; i < c1; i += c2`, as `fori_loop`/`scan` emit), else once; a `case`/`if` costs its most
expensive branch.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...core.mesh import Mesh
from ...ir.graph import Block, Func, Op, Value
from ...simulation import CollectiveCost, SimulationResult
from . import opcost
from .comm import collective_cost, communication_kind
from .opcost import short_name

TERMINATORS = frozenset({"return"})
SIDE_EFFECTS = frozenset({"custom_call", "outfeed", "send", "recv", "infeed"})
_ELEMENTWISE = opcost.ELEMENTWISE | opcost.TRANSCENDENTAL


def _nbytes(v: Value) -> int:
    return v.type.nbytes if v.type.is_tensor else 0


@dataclass
class _Kernel:
    root: Op
    inputs: list[Value]
    outputs: list[Value]
    stream: str  # "compute", "comm" or "both" (a loop or branch: a barrier on both)
    duration: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    transient: int = 0
    # Inputs whose buffer the result may take over when read for the last time.
    shareable: tuple[Value, ...] = ()


@dataclass
class _BlockCost:
    runtime: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    flops: float = 0.0
    transcendentals: float = 0.0
    bytes: float = 0.0
    collectives: list[CollectiveCost] = field(default_factory=list)
    kernels: int = 0
    temp_peak: int = 0
    unknown_ops: set[str] = field(default_factory=set)
    unknown_trips: int = 0
    # Top level only: returned buffers that are not temporaries (arguments or constants).
    output_bytes: int = 0


def _live_ops(ops: list[Op], returns: Sequence[Value]) -> list[Op]:
    """Ops whose results are needed (XLA removes the rest)."""
    needed: set[Value] = set(returns)
    live: list[Op] = []
    for op in reversed(ops):
        name = short_name(op)
        if (not op.results or name in SIDE_EFFECTS or any(r in needed for r in op.results)):
            live.append(op)
            needed.update(op.inputs)
    live.reverse()
    return live


def _const_int(v: Value) -> int | None:
    op = v.producer
    if op is None or short_name(op) != "constant":
        return None
    m = re.match(r"\s*dense<(-?\d+)>", op.attributes.get("value", ""))
    return int(m.group(1)) if m else None


def trip_count(op: Op) -> int | None:
    """Iterations of a counted `while` (`i = c0; i <op> c1; i += c2`), None if not one."""
    if len(op.regions) < 2:
        return None
    cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
    if not cond.ops or not cond.ops[-1].operands:
        return None
    cmp = cond.ops[-1].operands[0].producer
    if cmp is None or short_name(cmp) != "compare":
        return None
    m = re.search(r"comparison_direction\s+(\w+)", cmp.attributes.get("comparison_direction", ""))
    if not m:
        return None
    direction = m.group(1)
    a, b = cmp.operands
    if b in cond.args and _const_int(a) is not None:
        a, b = b, a
        direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction, direction)
    if a not in cond.args or _const_int(b) is None:
        return None
    i = cond.args.index(a)
    limit, init = _const_int(b), _const_int(op.operands[i])
    if init is None or not body.ops or i >= len(body.ops[-1].operands):
        return None
    upd = body.ops[-1].operands[i].producer
    if upd is None or short_name(upd) not in ("add", "subtract"):
        return None
    x, c = upd.operands
    if short_name(upd) == "add" and x is not body.args[i]:
        x, c = c, x
    step = _const_int(c)
    if x is not body.args[i] or not step:
        return None
    step = -step if short_name(upd) == "subtract" else step
    span = limit - init
    if direction == "LT" and step > 0:
        n = math.ceil(span / step)
    elif direction == "LE" and step > 0:
        n = span // step + 1
    elif direction == "GT" and step < 0:
        n = math.ceil(span / step)
    elif direction == "GE" and step < 0:
        n = span // step + 1
    elif direction == "NE" and span % step == 0 and span / step >= 0:
        n = span // step
    else:
        return None
    return max(int(n), 0)


class _Analyser:
    def __init__(self, mesh: Mesh, hardware, overlap: bool, fusion: bool,
                 memo: dict | None = None):
        self.mesh = mesh
        # Per-op work, kept across simulations of programs that share ops (the lowering after
        # each tactic reuses the device-local ops of what the tactic did not change).
        self.memo = memo if memo is not None else {}
        self.hw = hardware
        self.overlap = overlap
        self.fusion = fusion

    # -- one block -------------------------------------------------------------------------
    def block(self, block: Block, returns: Sequence[Value], *, top: bool = False) -> _BlockCost:
        ops = [op for op in block.ops if short_name(op) not in TERMINATORS]
        ops = _live_ops(ops, returns)
        cost = _BlockCost()
        returned = set(returns)
        users: dict[Value, list[Op]] = {}
        for op in ops:
            for v in op.inputs:
                users.setdefault(v, []).append(op)

        fused: set[Value] = set()
        for op in reversed(ops):  # users before producers: a user's fate is known
            name = short_name(op)
            if (not self.fusion or len(op.results) != 1 or name not in opcost.FUSIBLE
                    or op.regions):
                continue
            v = op.results[0]
            us = users.get(v, [])
            if v in returned or not us:
                continue
            if all(short_name(u) in opcost.FUSION_CONSUMERS and communication_kind(u) is None
                   and u.results and (len(u.results) == 1 or short_name(u) == "reduce")
                   for u in us):
                fused.add(v)

        owner: dict[Value, Value] = {}  # value -> the value owning its buffer
        kinds: dict[Value, str] = {a: "arg" for a in block.args}  # owner -> arg/temp/const
        kernels: list[_Kernel] = []
        claimed: set[Op] = set()
        for op in ops:
            name = short_name(op)
            if op.results and all(r in fused for r in op.results):
                continue
            if name in opcost.FREE:
                for r in op.results:
                    owner[r] = r
                    kinds[r] = "const"
                continue
            if name == "constant":
                owner[op.results[0]] = op.results[0]
                kinds[op.results[0]] = "const"
                continue
            if name in opcost.VIEWS and communication_kind(op) is None and all(
                    _nbytes(r) == _nbytes(v) and v not in fused
                    for r, v in zip(op.results, op.operands)):
                for r, v in zip(op.results, op.operands):
                    owner[r] = owner.get(v, v)
                continue
            copy = _layout_copy(op)
            if copy is not None:  # XLA's layout assignment: a transposing copy of the operand
                kernels.append(self._kernel(copy, fused, claimed, cost))
                owner[copy.results[0]] = copy.results[0]
                kinds[copy.results[0]] = "temp"
            kernels.append(self._kernel(op, fused, claimed, cost))
            if copy is not None:
                kernels[-1].inputs = [copy.results[0]]
            for r in op.results:
                owner[r] = r
                kinds[r] = "temp"

        self._timeline(kernels, owner, cost)
        self._memory(kernels, owner, kinds, returns, cost, top)
        return cost

    # -- kernels ---------------------------------------------------------------------------
    def _kernel(self, root: Op, fused: set[Value], claimed: set[Op], cost: _BlockCost) -> _Kernel:
        name = short_name(root)
        if communication_kind(root) is not None:
            c = collective_cost(root, self.mesh, self.hw)
            cost.collectives.append(c)
            cost.comm_s += c.time_s
            return _Kernel(root, list(root.inputs), list(root.results), "comm", c.time_s,
                           comm_s=c.time_s)
        if name in ("while", "case", "if"):
            return self._compound(root, cost)

        # The fused closure: root plus every fused producer reachable through fused values.
        members: list[Op] = []
        reads: dict[Value, int] = {}
        stack, seen = [root], {root}
        while stack:
            op = stack.pop()
            members.append(op)
            op_name = short_name(op)
            for i, v in enumerate(op.inputs):
                if v in fused and v.producer is not None:
                    if v.producer not in seen:
                        seen.add(v.producer)
                        stack.append(v.producer)
                    continue
                n = _nbytes(v)
                if i == 0 and op_name in opcost.PARTIAL_READS:
                    n = min(n, _nbytes(op.results[0]))
                elif i == 0 and op_name in opcost.IN_PLACE:
                    n = 0
                reads[v] = max(reads.get(v, 0), n)
        if name in opcost.IN_PLACE:
            written = _nbytes(root.operands[-1]) if name == "scatter" else _nbytes(root.operands[1])
        else:
            written = sum(_nbytes(r) for r in root.results)
        nbytes = sum(reads.values()) + written

        compute = 0.0
        for op in members:
            if op in claimed:  # a producer duplicated into several kernels is charged once
                continue
            claimed.add(op)
            work = self.memo.get(op)
            if work is None:
                work = self.memo[op] = (*opcost.op_work(op), opcost.compute_element(op),
                                        opcost.is_matrix_op(op))
            flops, trans, known, element, matrix = work
            if not known:
                cost.unknown_ops.add(op.name)
            cost.flops += flops
            cost.transcendentals += trans
            if matrix:
                compute += flops / self.hw.matrix_flops_for(element)
            else:
                work = flops + (opcost.TRANSCENDENTAL_FLOPS - 1.0) * trans
                compute += work / self.hw.vector_flops_for(element)
        memory = nbytes / self.hw.memory_bandwidth_bytes_per_s
        duration = max(compute, memory) + self.hw.kernel_overhead_s
        cost.bytes += nbytes
        cost.kernels += 1
        cost.compute_s += duration
        return _Kernel(root, list(reads), list(root.results), "compute", duration,
                       compute_s=duration, shareable=_shareable_inputs(root, members, reads))

    def _compound(self, op: Op, cost: _BlockCost) -> _Kernel:
        """A while loop (body + condition, times the trip count) or the costliest branch."""
        if short_name(op) == "while":
            trips = trip_count(op)
            if trips is None:
                trips = 1
                cost.unknown_trips += 1
            parts = [self.block(r.blocks[0], r.blocks[0].ops[-1].operands if r.blocks[0].ops
                                else []) for r in op.regions]
            chosen, times = parts, trips
        else:
            branches = [self.block(r.blocks[0], r.blocks[0].ops[-1].operands if r.blocks[0].ops
                                   else []) for r in op.regions]
            chosen, times = [max(branches, key=lambda b: b.runtime)], 1
            parts = branches
        k = _Kernel(op, list(op.inputs), list(op.results), "both",
                    shareable=tuple(op.inputs) if short_name(op) == "while" else ())
        for part in chosen:
            k.duration += times * part.runtime
            k.compute_s += times * part.compute_s
            k.comm_s += times * part.comm_s
            cost.flops += times * part.flops
            cost.transcendentals += times * part.transcendentals
            cost.bytes += times * part.bytes
            cost.kernels += times * part.kernels
            cost.collectives.extend(dataclasses.replace(c, count=c.count * times)
                                    for c in part.collectives)
        for part in parts:
            cost.unknown_ops |= part.unknown_ops
            cost.unknown_trips += part.unknown_trips
        k.transient = max((p.temp_peak for p in parts), default=0)
        cost.compute_s += k.compute_s
        cost.comm_s += k.comm_s
        return k

    # -- time ------------------------------------------------------------------------------
    def _timeline(self, kernels: list[_Kernel], owner: dict[Value, Value],
                  cost: _BlockCost) -> None:
        """List-schedule kernels in program order on a compute and a communication stream."""
        ready: dict[Value, float] = {}
        free = {"compute": 0.0, "comm": 0.0}
        for k in kernels:
            start = max((ready.get(owner.get(v, v), 0.0) for v in k.inputs), default=0.0)
            if k.stream == "both" or not self.overlap:
                start = max(start, free["compute"], free["comm"])
                end = start + k.duration
                free["compute"] = free["comm"] = end
            else:
                start = max(start, free[k.stream])
                end = start + k.duration
                free[k.stream] = end
            for r in k.outputs:
                ready[r] = end
        cost.runtime = max(free.values())

    # -- memory ----------------------------------------------------------------------------
    def _memory(self, kernels: list[_Kernel], owner: dict[Value, Value], kinds: dict[Value, str],
                returns: Sequence[Value], cost: _BlockCost, top: bool) -> None:
        """Temporaries' live ranges over a memory-aware kernel order; returned buffers live to
        the end. At top level returned temporaries count as outputs (held for the whole
        program)."""
        n = len(kernels)
        produced = {r: i for i, k in enumerate(kernels) for r in k.outputs}
        reads = [list(dict.fromkeys(owner.get(v, v) for v in k.inputs)) for k in kernels]
        reads = [[o for o in rs if o in produced] for rs in reads]
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
                    cost.output_bytes += _nbytes(key)
                    seen.add(key)

        order = _memory_order(kernels, reads, produced, held, kinds)
        pos = {j: p for p, j in enumerate(order)}
        last: dict[Value, int] = {o: pos[i] for o, i in produced.items()}
        for j, rs in enumerate(reads):
            for o in rs:
                last[o] = max(last[o], pos[j])
        for o in held:
            last[o] = n
        counted = (lambda o: kinds.get(o) == "temp" and o not in held) if top else (
            lambda o: kinds.get(o) == "temp")

        # Physical buffers, with in-place reuse of same-sized temporaries read for the last time.
        phys: dict[Value, list[int]] = {}  # owner -> [size, start, end] (shared when reused)
        outputs: list[list[int]] = []  # top level: [size, first use] of returned temporaries
        for p, j in enumerate(order):
            k = kernels[j]
            dying = [o for o in reads[j] if o in phys and last[o] == p and o not in held]
            for r in k.outputs:
                donor = None
                if k.shareable:
                    share = {owner.get(v, v) for v in k.shareable}
                    donor = next((o for o in dying if o in share and phys[o][0] == _nbytes(r)),
                                 None)
                if not counted(r):
                    start = p
                    if donor is not None and r in held:
                        # XLA places the donor in the output's buffer: never a temporary.
                        dying.remove(donor)
                        start = phys[donor][1]
                        phys[donor][0] = 0
                    if top and r in held and kinds.get(r) == "temp":
                        outputs.append([_nbytes(r), start])
                    continue
                if donor is not None:
                    dying.remove(donor)
                    phys[r] = phys[donor]
                    phys[r][2] = max(phys[r][2], last[r])
                else:
                    phys[r] = [_nbytes(r), p, last[r]]
        buffers = [b for b in {id(b): b for b in phys.values()}.values() if b[0]]
        if top:
            buffers = _share_output_allocations(buffers, outputs, n)
        delta = [0] * (n + 2)
        for size, start, stop in buffers:
            delta[start] += size
            delta[stop + 1] -= size
        live = 0
        for p in range(n + 1):
            live += delta[p]
            extra = kernels[order[p]].transient if p < n else 0
            cost.temp_peak = max(cost.temp_peak, live + extra)


def _layout_copy(op: Op) -> Op | None:
    """The copy XLA inserts before a `reduce_scatter` over a dimension that is not the
    outermost: the collective works on contiguous chunks, so layout assignment gives its operand
    a layout with the scattered dimension major, and the producer's row-major result is copied
    into it (the operand and the copy are live together). A transpose of the result back is a
    free bitcast. None when no copy is needed (every dimension before it has size 1)."""
    if communication_kind(op) != "reduce_scatter" or len(op.operands) != 1:
        return None
    m = re.match(r"\s*(\d+)", op.attributes.get("scatter_dimension", "0"))
    dim = int(m.group(1)) if m else 0
    operand = op.operands[0]
    if not operand.type.is_tensor or math.prod(operand.type.shape[:dim]) <= 1:
        return None
    return Op("stablehlo.copy", [operand], [operand.type])


def _shareable_inputs(root: Op, members: list[Op], reads: dict[Value, int]) -> tuple[Value, ...]:
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
    inside = set(members)
    users: dict[Op, list[Op]] = {}
    for m in members:
        for v in m.inputs:
            if v.producer in inside:
                users.setdefault(v.producer, []).append(m)
    ok: dict[Op, bool] = {}

    def elementwise_path(m: Op) -> bool:  # m's result reaches the root only elementwise
        if m not in ok:
            ok[m] = m is root or (
                short_name(m) in _ELEMENTWISE and len(m.results) == 1
                and m.results[0].type.shape == shape
                and all(elementwise_path(u) for u in users.get(m, [])))
        return ok[m]

    return tuple(v for v in reads if v.type.is_tensor and v.type.shape == shape and all(
        elementwise_path(m) for m in members if v in m.inputs))


def _share_output_allocations(buffers: list[list[int]], outputs: list[list[int]],
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


def _memory_order(kernels: list[_Kernel], reads: list[list[Value]], produced: dict[Value, int],
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
    alloc = [sum(_nbytes(r) for r in k.outputs if kinds.get(r) == "temp" and r not in held)
             for k in kernels]

    def gain(j: int) -> int:
        freed = sum(_nbytes(o) for o in reads[j] if remaining[o] == 1 and o not in held)
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


def simulate(func: Func, mesh: Mesh, hardware, *, overlap: bool = False,
             donated_args: Sequence[int] = (), fusion: bool = True,
             memo: dict | None = None) -> SimulationResult:
    """Estimate one device's runtime, flops and peak memory for the device-local `func`.

    `hardware` is a `HardwareSpec` (or an object with its methods). `donated_args` are argument
    indices whose buffers outputs may reuse (each donated argument aliases the first unaliased
    output of the same byte size), subtracted as XLA's alias bytes. `memo` (a dict the
    caller keeps) carries per-op work from one simulation to the next.
    """
    mesh = Mesh.of(mesh)
    cost = _Analyser(mesh, hardware, overlap, fusion, memo).block(func.body, func.returns,
                                                                  top=True)
    argument_bytes = sum(_nbytes(a) for a in func.args)
    alias = 0
    free_outputs = [_nbytes(v) for v in dict.fromkeys(func.returns)]
    for i in donated_args:
        size = _nbytes(func.args[i])
        if size in free_outputs:
            free_outputs.remove(size)
            alias += size
    peak = argument_bytes + cost.output_bytes - alias + cost.temp_peak
    return SimulationResult(
        runtime_s=cost.runtime, compute_s=cost.compute_s, communication_s=cost.comm_s,
        flops=cost.flops, bytes_accessed=cost.bytes, peak_memory_bytes=int(peak),
        per_collective=cost.collectives, transcendentals=cost.transcendentals,
        argument_bytes=argument_bytes, output_bytes=cost.output_bytes, alias_bytes=alias,
        temp_peak_bytes=cost.temp_peak,
        communication_bytes=sum(c.sent_bytes * c.count for c in cost.collectives),
        kernels=cost.kernels, unknown_ops=sorted(cost.unknown_ops),
        unknown_trip_counts=cost.unknown_trips, hardware=getattr(hardware, "name", ""),
        simulator="analytical", overlap=overlap,
        memory_limit_bytes=int(getattr(hardware, "memory_bytes", 0)))
