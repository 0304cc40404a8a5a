"""The analytical simulator: roofline kernels, ring collectives, live-range memory.

The device-local program is cut into kernels the way a fusing backend would: an elementwise or
data-movement op whose every user can absorb it (another such op or a reduction) is fused into
its users, so its result is never materialised; every other op is a kernel root (repeats are
merged first, as XLA's CSE does, and a spec for XLA:CPU keeps some values read by several
kernels: `fusion.py`). A kernel takes
max(compute, memory) + the spec's per-kernel overhead, with matmuls at the rate a GEMM of their
size reaches and memory at the achievable bandwidth (`HardwareSpec.matmul_seconds`,
`memory_seconds`); a collective takes
its ring time on the link of its mesh axes, and independent collectives the backend combines
run as one (`combiner.py`). Kernels run in program order on a compute stream and
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

This module costs kernels; the other concepts have a module each: `fusion.py` (which values
are fused), `timeline.py` (the two streams), `buffers.py` (buffer assignment and the memory-
aware order), `loops.py` (trip counts), `comm.py` (collectives), `combiner.py` (XLA's
collective combiners), `rendezvous.py` (waits of devices sharing cores), `opcost.py` (per-op
work),
`costs.py` (the records they exchange).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

from partir_plugin.extend import Block, Collective, Func, Mesh, Op, SimulationResult, Value

from . import opcost
from .buffers import assign_buffers
from .combiner import combine_collectives
from .comm import collective_cost, communication_kind
from .costs import BlockCost, Kernel, nbytes
from .fusion import common_subexpressions, fused_values, splats
from .loops import host_carries, passed_through, trip_count, unread_carries
from .opcost import SHORT_NAMES, short_name
from .rendezvous import charge_rendezvous_waits
from .timeline import list_schedule, timeline_events

__all__ = ["simulate", "trip_count"]

TERMINATORS = frozenset({"return"})
SIDE_EFFECTS = frozenset({"custom_call", "outfeed", "send", "recv", "infeed"})
_PART_READ = opcost.PARTIAL_READS | opcost.IN_PLACE  # ops reading operand 0 in part


def _live_ops(ops: list[Op], returns: Sequence[Value],
              dropped: dict[Op, set[int]]) -> list[Op]:
    """Ops whose results are needed (XLA removes the rest). A `while` whose carried values
    XLA removes (`unread_carries`) needs not their operands; their indices go to `dropped`."""
    needed: set[Value] = set(returns)
    live: list[Op] = []
    names = SHORT_NAMES
    for op in reversed(ops):
        results = op.results
        if (not results or results[0] in needed or names[op.name] in SIDE_EFFECTS
                or (len(results) > 1 and any(r in needed for r in results))):
            live.append(op)
            inputs = op.inputs
            if names[op.name] == "while":
                dead = unread_carries(op, {i for i, r in enumerate(results) if r not in needed})
                if dead:
                    dropped[op] = dead
                    inputs = [v for i, v in enumerate(op.operands) if i not in dead] + list(
                        op.captures or ())
            needed.update(inputs)
    live.reverse()
    return live


class _Analyser:
    def __init__(self, mesh: Mesh, hardware, overlap: bool, fusion: bool,
                 memo: dict | None = None, timeline: bool = False):
        self.mesh = mesh
        self.timeline = timeline
        # Per-op work, kept across simulations of programs that share ops (the lowering after
        # each tactic reuses the device-local ops of what the tactic did not change) or op
        # signatures (`opcost.work`).
        self.memo = memo if memo is not None else {}
        self.hw = hardware
        self.overlap = overlap
        self.fusion = fusion
        self.vector_rates: dict[str, float] = {}  # element type -> hw.vector_flops_for

    # -- one block -------------------------------------------------------------------------
    def block(self, block: Block, returns: Sequence[Value], *, top: bool = False,
              carried: Sequence[Value] = ()) -> BlockCost:
        names = SHORT_NAMES
        ops = [op for op in block.ops if names[op.name] not in TERMINATORS]
        dropped: dict[Op, set[int]] = {}  # a while -> the carried values XLA removes
        ops = _live_ops(ops, returns, dropped)
        # The block's communicating ops, asked once each (every phase below asks again).
        collectives = {op: kind for op in ops
                       if (kind := communication_kind(op)) is not None}
        cost = BlockCost()
        returned = set(returns)
        same = common_subexpressions(ops, returned) if self.fusion else {}
        users: dict[Value, list[Op]] = {}
        for op in ops:
            for v in op.inputs:
                v = same.get(v, v)
                readers = users.get(v)
                if readers is None:
                    users[v] = [op]
                else:
                    readers.append(op)

        fused = fused_values(
            ops, returned, users, collectives, self.hw.duplicates_expensive_ops,
            self.hw.library_reductions, same) if self.fusion else set()
        # Splats a fusing consumer recomputes rather than reads (`splats`).
        recomputed = splats(ops, fused, returned) if self.fusion else set()

        owner: dict[Value, Value] = {}  # value -> the value owning its buffer
        kinds: dict[Value, str] = {a: "arg" for a in block.args}  # owner -> arg/temp/const
        kernels: list[Kernel] = []
        # An all_gather's copy back to row-major, by its result: placed before the first
        # kernel that reads the result, so gathers issued together stay together (combined).
        copies_back: dict[Value, Kernel] = {}
        claimed: set[Op] = set()
        for op in ops:
            name = names[op.name]
            results = op.results
            if results:
                if results[0] in fused and (len(results) == 1
                                            or all(r in fused for r in results)):
                    continue
                if results[0] in same:  # a repeat: the original's buffer
                    original = same[results[0]]
                    owner[results[0]] = owner.get(original, original)
                    continue
            if name in opcost.FREE:
                for r in results:
                    owner[r] = r
                    kinds[r] = "const"
                continue
            if name == "constant":
                owner[results[0]] = results[0]
                kinds[results[0]] = "const"
                continue
            kind = collectives.get(op)
            if (name in opcost.VIEWS or unit_broadcast(op) or unit_transpose(op)) and (
                    kind is None) and all(
                    nbytes(r) == nbytes(v) and v not in fused
                    for r, v in zip(results, op.operands)):
                for r, v in zip(results, op.operands):
                    owner[r] = owner.get(v, v)
                continue
            copy, back = layout_copies(op, kind)
            if copy is not None:  # XLA's layout assignment: a transposing copy of the operand
                kernels.append(self._kernel(copy, None, fused, recomputed, claimed, cost))
                owner[copy.results[0]] = copy.results[0]
                kinds[copy.results[0]] = "temp"
            kernels.append(self._kernel(op, kind, fused, recomputed, claimed, cost,
                                        dropped.get(op)))
            if copy is not None:
                kernels[-1].inputs = [copy.results[0]]
            if back is not None:  # the collective writes `back`'s operand; it writes the result
                gathered = back.operands[0]
                kernels[-1].outputs = [gathered]
                owner[gathered] = gathered
                kinds[gathered] = "temp"
                copy_back = self._kernel(back, None, fused, recomputed, claimed, cost)
                copy_back.outputs = list(results)
                copies_back[results[0]] = copy_back
            for r in results:
                owner[r] = r
                kinds[r] = "host" if opcost.placement(op) == "pinned_host" else "temp"
            if name == "while":  # a loop invariant's result is its operand's buffer
                for i in passed_through(op):
                    v = op.operands[i]
                    owner[results[i]] = owner.get(v, v)
                for i in host_carries(op):  # a stack of offloaded values, and its start
                    kinds[results[i]] = "host"
                    start = owner.get(op.operands[i], op.operands[i])
                    if kinds.get(start) == "temp":
                        kinds[start] = "host"

        kernels = _before_first_reader(kernels, copies_back, owner)
        kernels = combine_collectives(kernels, owner, self.hw, cost, self.mesh)
        charge_rendezvous_waits(kernels, self.hw, cost, loop_body=bool(carried))
        starts: list[float] | None = [] if self.timeline else None
        cost.runtime = list_schedule(kernels, owner, self.overlap, starts)
        if starts is not None:
            cost.timeline = timeline_events(kernels, starts)
        assign_buffers(kernels, owner, kinds, returns, cost, top, carried)
        return cost

    # -- kernels ---------------------------------------------------------------------------
    def _kernel(self, root: Op, kind: Collective | None, fused: set[Value],
                recomputed: set[Value], claimed: set[Op], cost: BlockCost,
                dropped: set[int] | None = None) -> Kernel:
        """The kernel rooted at `root` (`kind`: its `communication_kind`; `recomputed`: the
        block's splats that fusing members recompute; `dropped`: a while's carried values
        that XLA removes)."""
        name = SHORT_NAMES[root.name]
        if kind is not None:
            c = collective_cost(root, self.mesh, self.hw)
            cost.collectives.append(c)
            cost.comm_s += c.time_s
            return Kernel(root, list(root.inputs), list(root.results), "comm", c.time_s,
                          comm_s=c.time_s, collective=c)
        if name in ("while", "case", "if"):
            return self._compound(root, cost, dropped or set())

        # The fused closure: root plus every fused producer reachable through fused values,
        # each charged its work unless an earlier kernel it is duplicated into was.
        names, memo, hw, rates = SHORT_NAMES, self.memo, self.hw, self.vector_rates
        members: list[Op] = []
        reads: dict[Value, int] = {}  # input -> the most bytes a member reads of it
        compute = 0.0
        stack, seen = [root], {root}
        while stack:
            op = stack.pop()
            members.append(op)
            if op not in claimed:  # a producer duplicated into several kernels is charged once
                claimed.add(op)
                flops, trans, known, element, matrix = opcost.work(op, memo)
                if not known:
                    cost.unknown_ops.add(op.name)
                cost.flops += flops
                cost.transcendentals += trans
                if matrix:
                    compute += hw.matmul_seconds(flops, element)
                else:
                    rate = rates.get(element)
                    if rate is None:
                        rate = rates[element] = hw.vector_flops_for(element)
                    vector = flops + (opcost.TRANSCENDENTAL_FLOPS - 1.0) * trans
                    compute += vector / rate
            # Operand 0 of a partial read or an in-place update is read in part (or not at all).
            first = names[op.name] in _PART_READ
            consumer = names[op.name] in opcost.FUSION_CONSUMERS
            for v in op.inputs:
                if v in fused or (consumer and v in recomputed):  # fused: an op's result
                    producer = v.producer
                    if producer not in seen:
                        seen.add(producer)
                        stack.append(producer)
                    first = False
                    continue
                n = 0 if v.type.opaque else v.type.nbytes
                if first:
                    first = False
                    n = (min(n, nbytes(op.results[0])) if names[op.name] in opcost.PARTIAL_READS
                         else 0)
                if n > reads.get(v, -1):
                    reads[v] = n
        if name in opcost.IN_PLACE:
            written = nbytes(root.operands[-1]) if name == "scatter" else nbytes(root.operands[1])
        else:
            written = sum(nbytes(r) for r in root.results)
        moved = sum(reads.values()) + written
        memory = hw.memory_seconds(moved)
        link = getattr(hw, "host_link", None)
        if link is not None and opcost.placement(root) is not None:
            # A move to host memory or back (RM's offload): the array crosses the host link
            # once, on the compute stream (no overlap with compute is assumed).
            memory = max(memory, written / link.bandwidth_bytes_per_s + link.latency_s)
        duration = max(compute, memory) + hw.kernel_overhead_s
        cost.bytes += moved
        cost.kernels += 1
        cost.compute_s += duration
        return Kernel(root, list(reads), list(root.results), "compute", duration,
                      compute_s=duration, shareable=None, ops=members)

    def _compound(self, op: Op, cost: BlockCost, dropped: set[int]) -> Kernel:
        """A while loop (body + condition, times the trip count) or the costliest branch.
        A while neither reads nor writes the carried values XLA removes (`dropped`)."""
        if short_name(op) == "while":
            trips = trip_count(op)
            if trips is None:
                trips = 1
                cost.unknown_trips += 1
            cond, body = (r.blocks[0] for r in op.regions)
            parts = [self.block(cond, cond.ops[-1].operands if cond.ops else []),
                     self.block(body, body.ops[-1].operands if body.ops else [],
                                carried=body.args)]
            chosen, times = parts, trips
        else:
            branches = [self.block(r.blocks[0], r.blocks[0].ops[-1].operands if r.blocks[0].ops
                                   else []) for r in op.regions]
            chosen, times = [max(branches, key=lambda b: b.runtime)], 1
            parts = branches
        inputs, outputs = list(op.inputs), list(op.results)
        if dropped:
            inputs = [v for i, v in enumerate(op.operands) if i not in dropped] + list(
                op.captures or ())
        if short_name(op) == "while":  # no new buffer for what it removes or passes through
            kept = dropped | passed_through(op)
            outputs = [r for i, r in enumerate(outputs) if i not in kept]
        k = Kernel(op, inputs, outputs, "both",
                    shareable=tuple(inputs) if short_name(op) == "while" else (),
                    parts=chosen, repeats=times)
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


def unit_broadcast(op: Op) -> bool:
    """A `broadcast_in_dim` that only inserts dimensions of size 1, keeping its operand's
    dimensions in order: a bitcast (XLA's algebraic simplifier makes it a reshape)."""
    if short_name(op) != "broadcast_in_dim" or len(op.results) != 1:
        return False
    out = op.results[0].type
    if not out.is_tensor or nbytes(op.results[0]) != nbytes(op.operands[0]):
        return False
    dims = [int(d) for d in re.findall(r"-?\d+", op.attributes.get("broadcast_dimensions", "")
                                       .split(":", 1)[-1])]
    return dims == sorted(dims) and len(dims) == len(op.operands[0].type.shape)


def unit_transpose(op: Op) -> bool:
    """A `transpose` that moves only dimensions of size 1 (the others keep their order): a
    bitcast (XLA's algebraic simplifier makes it a reshape), e.g. `[1, L, ...] -> [L, 1, ...]`
    between a pipeline's stage axis and a layer stack."""
    if short_name(op) != "transpose" or len(op.results) != 1:
        return False
    shape = op.operands[0].type.shape if op.operands[0].type.is_tensor else None
    m = re.search(r"array<i64:\s*([^>]*)>", op.attributes.get("permutation", ""))
    if shape is None or m is None:
        return False
    perm = [int(x) for x in m.group(1).split(",")]
    moved = [d for d in perm if shape[d] != 1]
    return moved == sorted(moved)


_COLLECTIVE_DIM = {Collective.REDUCE_SCATTER: "scatter_dimension",
                   Collective.ALL_GATHER: "all_gather_dim"}


def layout_copies(op: Op, kind: Collective | None) -> tuple[Op | None, Op | None]:
    """The copies XLA's layout assignment puts around a `reduce_scatter` or `all_gather` over
    a dimension that is not the outermost: the collective works on contiguous chunks, so its
    operand gets a layout with that dimension major and the producer's row-major result is
    copied into it (the operand and the copy are live together); an all_gather's result is
    copied back to row-major (XLA:CPU's HLO shows both copies; a reduce_scatter's result
    transposes back as a free bitcast). `(copy of the operand, copy back)`: a copy back reads
    a new value, the collective's own output, and writes the op's result. (None, None) when
    no copy is needed (every dimension before it has size 1)."""
    attr = _COLLECTIVE_DIM.get(kind)
    if attr is None or len(op.operands) != 1 or len(op.results) != 1:
        return None, None
    m = re.match(r"\s*(\d+)", op.attributes.get(attr, "0"))
    dim = int(m.group(1)) if m else 0
    operand = op.operands[0]
    if not operand.type.is_tensor or math.prod(operand.type.shape[:dim]) <= 1:
        return None, None
    copy = Op("stablehlo.copy", [operand], [operand.type])
    if kind is not Collective.ALL_GATHER:
        return copy, None
    result = op.results[0].type
    gathered = Op(op.name, [operand], [result], dict(op.attributes)).results[0]
    return copy, Op("stablehlo.copy", [gathered], [result])


def _before_first_reader(kernels: list[Kernel], copies: dict[Value, Kernel],
                         owner: dict[Value, Value]) -> list[Kernel]:
    """`kernels` with each copy of `copies` (by the value it writes) just before the first
    kernel reading that value, else at the end."""
    if not copies:
        return kernels
    out: list[Kernel] = []
    for k in kernels:
        for v in k.inputs:
            copy = copies.pop(owner.get(v, v), None)
            if copy is not None:
                out.append(copy)
        out.append(k)
    return out + list(copies.values())


def simulate(func: Func, mesh: Mesh, hardware, *, overlap: bool = False,
             donated_args: Sequence[int] = (), fusion: bool = True,
             memo: dict | None = None, timeline: bool = False) -> SimulationResult:
    """Estimate one device's runtime, flops and peak memory for the device-local `func`.

    `hardware` is a `HardwareSpec` (or an object with its methods). `donated_args` are argument
    indices whose buffers outputs may reuse (each donated argument aliases the first unaliased
    output of the same byte size), subtracted as XLA's alias bytes. `memo` (a dict the
    caller keeps) carries per-op work from one simulation to the next. `timeline` fills
    `SimulationResult.timeline` with every kernel and its start.
    """
    mesh = Mesh.of(mesh)
    cost = _Analyser(mesh, hardware, overlap, fusion, memo, timeline).block(
        func.body, func.returns, top=True)
    argument_bytes = sum(nbytes(a) for a in func.args)
    alias = 0
    free_outputs = [nbytes(v) for v in dict.fromkeys(func.returns)]
    for i in donated_args:
        size = nbytes(func.args[i])
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
        memory_limit_bytes=int(getattr(hardware, "memory_bytes", 0)), timeline=cost.timeline)
