"""One record per collective: what it is, what it costs, and which line and decision made it.

The lowering puts on every collective the edge it converts (`spmd.provenance.Conversion`:
the value, the consumer, the two layouts); the simulator gives its bytes, time and how often
it runs; the importer kept every op's MLIR location. A report row keeps, per collective op of
its program, a `CollectiveSite`: the cheap facts, taken while the row is made (the next
tactic's lowering reuses and re-points the program's ops). The source line, phase and
parameter need the locations parsed: `CollectiveSite.record()` does that, on first read of
`TacticReport.records`, so partitioning never pays for it.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..core.state import PartitionState
from ..cost import CollectiveCost, SimulationResult
from ..ir.graph import Op, Value, walk
from ..ir.locations import ParsedLocation, Phase, SourceLocation, is_library_file, parse_location
from ..ir.opsets import ARGUMENT_PASS_THROUGH, PARTITIONED_REGIONS
from ..spmd.collectives import Collective, collective_axes, collective_kind
from ..spmd.layout import Layout
from ..spmd.provenance import Conversion, Movement
from ..spmd.rules.regather import Regathered

SCHEMA = "partir.collectives/v1"  # the version of `CollectiveRecord.to_json`


class Reason(enum.StrEnum):
    """Why a collective is there (the decision behind it)."""

    PARTIAL_SUM = "partial sum"  # an op summed over a tiled dimension: its partials reduced
    GATHER = "gather for use"  # a consumer needs more of a tiled value than one tile
    CONFLICT = "conflict"  # propagation stopped at the consumer: its operand is gathered
    RESOLVED = "conflict resolved"  # the consumer's conflict was resolved by moving this value
    RESHARD = "reshard"  # a tiling moves between dimensions or axes (all_to_all, permute)
    BOUNDARY = "boundary"  # the function returns the value in its declared layout
    LOOP = "loop-carried"  # a loop or branch carries the value in one layout
    MOVEMENT = "movement"  # the program moves data between devices (a pipeline's shift)


@dataclass(frozen=True)
class CollectiveFacts:
    """What a collective is and what it costs: known when its report row is made."""

    id: str
    kind: Collective
    axes: tuple[str, ...]
    bytes: int
    count: int
    est_time_s: float | None


@dataclass(frozen=True)
class CollectiveRecord(CollectiveFacts):
    """One collective op of a device-local program (`Metadata.tactics[i].records`).

    `bytes`: the buffer each device holds for it per execution (the full array for all_gather
    and reduce_scatter, as the ring model counts); `count`: executions per step (a loop's trip
    count); `est_time_s`: the simulated time of one execution (None without a simulator);
    `tactic`: the first tactic after which the program has this collective (`TacticRule`,
    which names it in a profile too); `op`: the
    StableHLO op it serves (the one whose sum it reduces, else the consumer); `source`: that
    op's line (`ir.locations`), None when the module has no locations; `stack`: every user
    frame, innermost first; `param`: the parameter's key path where it gathers a parameter or
    reduces its gradient. `id` is stable: the same program gives the same ids.
    """

    phase: Phase
    tactic: str
    reason: Reason
    op: str
    source: SourceLocation | None
    param: str | None = None
    name_stack: str = ""
    stack: tuple[SourceLocation, ...] = ()

    @property
    def layer(self) -> str:
        """Where in the model: the module path of the name stack (Flax names its modules,
        `Block_1/attn/query`), else the line that called the function holding `source`."""
        path = "/".join(s for s in self.name_stack.split("/")[:-1] if "(" not in s)
        return path or (self.stack[1].short if len(self.stack) > 1 else "")

    @property
    def total_time_s(self) -> float | None:
        """Estimated time per step: one execution's time by the count."""
        return None if self.est_time_s is None else self.est_time_s * self.count

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "kind": str(self.kind), "axes": list(self.axes),
            "bytes": self.bytes, "count": self.count, "est_time_s": self.est_time_s,
            "phase": str(self.phase), "tactic": self.tactic, "reason": str(self.reason),
            "op": self.op, "name_stack": self.name_stack, "param": self.param,
            "source": _source_json(self.source),
            "stack": [_source_json(f) for f in self.stack],
        }


def _source_json(s: SourceLocation | None) -> dict | None:
    return None if s is None else {"file": s.file, "line": s.line, "function": s.function}


class ProgramIndex:
    """What records need about the program being partitioned, computed once per schedule and
    only as far as asked: stable op numbers (for ids), parsed locations, the first backward
    op (for the optimizer phase), and which parameters each source line's ops read (for
    gradients)."""

    def __init__(self, state: PartitionState):
        self.func = state.func
        self.arg_names = state.func.arg_names
        self.users = state.users  # value -> (op, input index); (None, i): returned
        self._numbers: dict[Op, int] | None = None
        self._blocks: dict[int, tuple[int, int]] | None = None
        self._parents: dict[Op, Op] = {}  # an op in a region -> the op holding the region
        self._parsed: dict[Op, ParsedLocation] = {}
        self._first_backward: int | None = None
        self._params_at: dict[tuple, list[Value]] | None = None
        self._read_at: dict[Value, Op] = {}  # an argument -> the first forward op reading it

    # -- ids ----------------------------------------------------------------------------
    def number(self, op: Op | None) -> int:
        if self._numbers is None:
            self._numbers, self._blocks, self._parents = {}, {}, {}
            for o in walk(self.func.ops):
                i = self._numbers[o] = len(self._numbers)
                for r, region in enumerate(o.regions):
                    for block in region.blocks:
                        self._blocks[id(block)] = (i, r)
                        for inner in block.ops:
                            self._parents[inner] = o
        return self._numbers.get(op, -1)

    def value_key(self, v: Value) -> tuple:
        if v.producer is not None:
            return ("op", self.number(v.producer), v.index)
        self.number(None)  # builds the block table
        assert self._blocks is not None
        return ("arg", *self._blocks.get(id(v.owner), (-1, -1)), v.index)

    # -- locations ----------------------------------------------------------------------
    def parsed(self, op: Op | None) -> ParsedLocation:
        if op is None or op.mlir_location is None:
            return ParsedLocation()
        p = self._parsed.get(op)
        if p is None:
            p = self._parsed[op] = parse_location(op.mlir_location)
        return p

    def located(self, op: Op | None, limit: int = 64) -> Op | None:
        """`op`, or where it has no source frames (jax lowers a few ops, e.g. a `take`'s
        gather or its transpose `scatter-add`, without a traceback) the nearest op it reads
        from or that reads it that has them (breadth first, at most `limit` ops)."""
        queue, seen = [op], set()
        while queue and len(seen) < limit:
            x = queue.pop(0)
            if x is None or x in seen:
                continue
            seen.add(x)
            if self.parsed(x).frames:
                return x
            queue += [v.producer for v in x.inputs]
            queue += [u for r in x.results for u, _ in self.users.get(r, [])]
        return op

    def phase(self, op: Op | None) -> Phase:
        """forward/backward from jax's name stack (`jvp(`, `transpose(`; a loop body's ops
        are named inside the loop, so the loops holding the op count too); outside autodiff,
        optimizer when the op is in optax or follows the backward pass, else other (forward
        in a program without autodiff)."""
        self.number(None)  # builds the region parents
        outer = op
        while outer is not None:
            phase = self.parsed(outer).autodiff_phase
            if phase is not None:
                return phase
            outer = self._parents.get(outer)
        if self.parsed(op).in_optimizer_library:
            return Phase.OPTIMIZER
        first = self.first_backward()
        if first < 0:
            return Phase.FORWARD
        return Phase.OPTIMIZER if self.number(op) > first else Phase.OTHER

    def first_backward(self) -> int:
        """The number of the first op under `transpose(`, -1 when there is none."""
        if self._first_backward is None:
            self._first_backward = -1
            for i, op in enumerate(walk(self.func.ops)):
                if self.parsed(op).autodiff_phase is Phase.BACKWARD:
                    self._first_backward = i
                    break
        return self._first_backward

    # -- parameters ---------------------------------------------------------------------
    def argument_of(self, v: Value) -> str | None:
        """The argument `v` is (through data movement only), by its key path."""
        while v.producer is not None and v.producer.name in ARGUMENT_PASS_THROUGH:
            v = v.producer.operands[0]
        if v.owner is self.func.body and v.index < len(self.arg_names):
            return self.arg_names[v.index]
        return None

    def gradient_of(self, v: Value, op: Op | None) -> str | None:
        """The parameter whose gradient `v` is: backward ops carry the line of the forward op
        they differentiate, so `v` (made by `op`) is the gradient of the argument of its shape
        (up to a transpose) that the forward ops of that line read."""
        if op is None or self.phase(op) is not Phase.BACKWARD:
            return None
        shape = sorted(v.type.shape)  # the backward pass may produce it transposed
        for arg in self.params_at().get(_line_key(self.parsed(op)), []):
            if sorted(arg.type.shape) == shape:
                return self.arg_names[arg.index]
        return None

    def returned_gradient(self, v: Value) -> str | None:
        """The parameter whose gradient `v` is, where the function returns `v` (through data
        movement) under a key path that ends as one argument's of its size does: a step's
        `(loss, grads)` returns `grads["wq"]` as `1/wq` for the argument `params/wq`. The
        layer loop's stacked gradients have no op of their own to read it from."""
        while True:
            users = self.users.get(v, [])
            if len(users) != 1:
                return None
            (user, k), = users
            if user is None:
                break
            if user.name not in ARGUMENT_PASS_THROUGH:
                return None
            v = user.results[0]
        paths = self.func.result_paths
        if k >= len(paths) or not paths[k]:
            return None
        parts = paths[k].split("/")
        size = v.type.num_elements
        for drop in range(1, len(parts)):
            tail = parts[drop:]
            found = [name for arg, name in zip(self.func.args, self.arg_names)
                     if name.split("/")[-len(tail):] == tail
                     and arg.type.num_elements == size]
            if len(found) == 1:
                return found[0]
        return None

    def params_at(self) -> dict[tuple, list[Value]]:
        """Per source stack and scope, the arguments read there (through data movement) by
        forward ops."""
        if self._params_at is None:
            self._params_at = {}
            for arg in self.func.args[: len(self.arg_names)]:
                stack, seen = [arg], set()
                while stack:
                    x = stack.pop()
                    for u, _ in self.users.get(x, []):
                        if u is None or u in seen:
                            continue
                        seen.add(u)
                        if u.name in ARGUMENT_PASS_THROUGH:
                            stack.extend(u.results)
                        elif self.phase(u) in (Phase.FORWARD, Phase.OTHER):
                            self._params_at.setdefault(_line_key(self.parsed(u)),
                                                       []).append(arg)
                            self._read_at.setdefault(arg, u)
        return self._params_at

    def gradient_by_shape(self, v: Value) -> Value | None:
        """The one argument forward ops read that has `v`'s shape (up to a transpose), if
        exactly one has: the parameter of a gradient made by an op without a location."""
        self.params_at()
        for same in (lambda a: a.type.shape == v.type.shape,
                     lambda a: sorted(a.type.shape) == sorted(v.type.shape)):
            found = [a for a in self._read_at if same(a)]
            if found:
                return found[0] if len(found) == 1 else None
        return None


def _line_key(loc: ParsedLocation) -> tuple:
    """What a forward op shares with the backward ops differentiating it: its frames, and its
    scope (a model calling one layer function in a loop differs only there)."""
    return (loc.frames, loc.scope)


@dataclass
class CollectiveSite:
    """A collective op of one report row's program, as far as known while the row is made."""

    facts: CollectiveFacts
    reason: Reason
    served: Op | None  # the op of the program being partitioned it serves
    value: Value | None  # the value it converts
    index: ProgramIndex = field(repr=False)
    local: Op | None = field(default=None, repr=False)  # the device-local collective op
    tactic: str = ""

    def record(self) -> CollectiveRecord:
        index = self.index
        located = index.located(self.served)
        phase = index.phase(located)
        param = None
        if self.value is not None:
            param = index.argument_of(self.value)
        if param is None and self.value is not None and self.reason is Reason.PARTIAL_SUM:
            arg = None
            if located is not self.served and phase is Phase.BACKWARD:
                # no location of its own: a parameter's gradient when only one has its shape,
                # shown at the line that reads the parameter
                arg = index.gradient_by_shape(self.value)
            if arg is not None:
                param = index.arg_names[arg.index]
                located = index.located(index._read_at[arg])
            else:
                param = (index.gradient_of(self.value, located)
                         or index.returned_gradient(self.value))
        loc = index.parsed(located)
        stack = tuple(f for f in loc.frames if f is loc.source or not is_library_file(f.file))
        return CollectiveRecord(
            **{f.name: getattr(self.facts, f.name) for f in fields(CollectiveFacts)},
            phase=phase, tactic=self.tactic, reason=self.reason, op=
            self.served.name if self.served is not None else "", source=loc.source,
            param=param, name_stack=loc.name_stack, stack=stack)


def _reason(conv: Conversion, kind: Collective, axes: tuple[str, ...],
            state: PartitionState) -> Reason:
    if conv.have.partial and kind in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER):
        return Reason.PARTIAL_SUM
    consumer = conv.consumer
    if consumer is None:
        return Reason.BOUNDARY
    if any((consumer, a) in state.resolved for a in axes):
        return Reason.RESOLVED
    if _placed_apart(conv, state):
        return Reason.RESHARD
    if any(_conflict(conv, a, state) for a in axes):
        return Reason.CONFLICT
    if consumer.name in PARTITIONED_REGIONS:
        return Reason.LOOP
    if kind is Collective.ALL_GATHER:
        return Reason.GATHER
    return Reason.RESHARD


def _placed_apart(conv: Conversion, state: PartitionState) -> bool:
    """Is the value tiled otherwise than its producer makes it, and wanted as it is tiled (a
    split result placed for the later ops that read it in slices, `core/splitting.py`)?"""
    v = conv.value
    if conv.have.partial or v.producer is None:
        return False
    declared = Layout.from_tiles(v.type.rank, state.tiles_of(v), mesh=state.mesh)
    return conv.want == declared != conv.have


def _conflict(conv: Conversion, axis: str, state: PartitionState) -> bool:
    """Did two decisions on `axis` meet at the consumer? Either propagation stopped there, or
    the consumer is already in a loop over `axis` that does not take the value as it is tiled
    on `axis`, and no other user takes it (or what it was moved from) so either: that tiling
    serves nobody (unlike a parameter sharded for storage, gathered for use but updated in
    place by the optimizer)."""
    consumer = conv.consumer
    if consumer is None:
        return False
    if state.stopped_at(consumer, axis):
        return True
    if not state.in_loop(consumer, axis) or all(axis not in d for d in conv.have.dims):
        return False
    x, chain = conv.value, {consumer}
    while True:
        dim = state.dim_of(x, axis)
        for user, i in state.users.get(x, []) if dim is not None else ():
            if user is not None and user not in chain and any(
                    a == axis and entry.operands[i] == dim for a, entry in state.nest_of(user)):
                return False
        if x.producer is None or x.producer.name not in ARGUMENT_PASS_THROUGH:
            return True
        chain.add(x.producer)
        x = x.producer.operands[0]


def _costs(sim: SimulationResult | None) -> dict[Op, tuple[CollectiveCost, int]]:
    """Per collective op, its cost and how many times the timeline runs it."""
    out: dict[Op, tuple[CollectiveCost, int]] = {}
    for event in sim.timeline if sim is not None else ():
        for op, cost in zip(event.ops, event.collectives):
            seen = out.get(op)
            out[op] = (cost, event.count if seen is None else seen[1] + event.count)
    return out


def collective_sites(ops: Iterable[Op], state: PartitionState, sim: SimulationResult | None,
                     index: ProgramIndex) -> list[CollectiveSite]:
    """A site per counted collective among `ops` (a device-local program's, in order)."""
    costs = _costs(sim)
    sites: list[CollectiveSite] = []
    ordinal: dict[object, int] = {}  # a conversion's (an emitting op's) collectives so far
    ids: set[str] = set()
    for op in ops:
        kind = collective_kind(op)
        if kind is None or not kind.counted:
            continue
        axes = collective_axes(op)
        conv = op.origin if isinstance(op.origin, Conversion) else None
        if isinstance(op.origin, Movement):  # stable across rows: keyed by the marker op
            marker = op.origin.op
            n = ordinal[marker] = ordinal.get(marker, -1) + 1
            key: tuple = ("movement", index.number(marker), n)
            reason, served, value = Reason.MOVEMENT, marker, marker.operands[0]
        elif conv is None:
            # Emitted by an op's own lowering (a halo exchange, own reducer's gather): that
            # op, whose number keeps the id across rows (as a conversion's value and consumer
            # do).
            served = op.origin if isinstance(op.origin, Op) else None
            n = ordinal[served] = ordinal.get(served, -1) + 1
            key = ("emitted", index.number(served), n)
            reason, value = Reason.RESHARD, None
        else:
            n = ordinal[conv] = ordinal.get(conv, -1) + 1
            value = conv.value
            reason = _reason(conv, kind, axes, state)
            producer = value.producer
            served = producer if (reason is Reason.PARTIAL_SUM or conv.consumer is None) \
                else conv.consumer
            consumer = index.number(conv.consumer) if conv.consumer is not None else "return"
            key = (index.value_key(value), consumer, n)
        key = (*key, str(kind), axes)
        # not on a timeline: dead code the simulator dropped (0), or no timeline at all (1)
        cost, count = costs.get(op, (None, 0 if costs else 1))
        nbytes = max(sum(v.type.nbytes for v in op.operands if v.type.is_tensor),
                     sum(r.type.nbytes for r in op.results if r.type.is_tensor))
        sid = _stable_id(key)
        while sid in ids:  # one consumer converting one value twice (x @ x.T)
            sid = _stable_id((*key, sid))
        ids.add(sid)
        facts = CollectiveFacts(sid, kind, axes, nbytes, count,
                                cost.time_s if cost is not None else None)
        sites.append(CollectiveSite(facts, reason, served, value, index, op))
    return sites


def _stable_id(key: tuple) -> str:
    return "c" + hashlib.blake2b(repr(key).encode(), digest_size=6).hexdigest()


def attribute_tactics(rows: Sequence[tuple[str, PartitionState, list[CollectiveSite]]]) -> None:
    """Each site's tactic (`TacticRule` over the rows up to its own, in schedule order)."""
    for i, (_, _, sites) in enumerate(rows):
        rule = TacticRule([(name, state) for name, state, _ in rows[:i + 1]])
        for s in sites:
            assert s.local is not None
            s.tactic = rule.of(s.local.origin, s.facts.kind, s.facts.axes)


def _flatten(decisions: tuple):
    for d in decisions:
        if isinstance(d, tuple):
            yield from _flatten(d)
        else:
            yield d


def _regathered(state: PartitionState, v: Value) -> bool:
    """Is `v` gathered afresh per consumer (as the lowering decides it: a value Z3 asked
    for, or one made from it by layout ops alone)?"""
    return bool(state.regather) and not Regathered(state).shared(v)


def _on(pairs: tuple, axes: frozenset[str]) -> tuple:
    """The (axis, ...) pairs of `pairs` on `axes` or on a part of one (`model:(1)2`)."""
    return tuple(p for p in pairs if p[0].split(":")[0] in axes)


class TacticRule:
    """Which tactic made a collective (`CollectiveRecord.tactic`, and the tactic in its name,
    `collective_names.py`): the first tactic after which every decision the collective
    depends on, restricted to its mesh axes, is final: the tiling of the value it converts,
    the loop nests of the ops producing and consuming it and the tiling of the consumer's
    results (a scatter's lowering gathers its updates for a result tiled on the axis), or
    the nest of the op whose lowering emitted it and the tiling of that op's operands and
    results. Decisions only append, so that is the first tactic whose program has the
    collective, known without lowering each tactic's program (the names are made before
    XLA compiles; the records' rows are lowered later). `after`: each tactic's name and the
    state it left, in schedule order (for a report row, up to the row's tactic)."""

    def __init__(self, after: Sequence[tuple[str, PartitionState]]):
        self.after = list(after)
        self._axes: dict[int, frozenset[str]] = {}

    def _axes_of(self, i: int) -> frozenset[str]:
        """The mesh axes (whole) the state after tactic `i` has tiled anything on."""
        axes = self._axes.get(i)
        if axes is None:
            state = self.after[i][1]
            axes = self._axes[i] = frozenset(
                a.split(":")[0] for tiles in state.tiling.values() for a, _ in tiles)
        return axes

    def of(self, origin: object, kind: Collective, axes: tuple[str, ...]) -> str:
        if not self.after:
            return ""
        on = frozenset(a.split(":")[0] for a in axes)
        final = self._decisions(self.after[-1][1], origin, kind, on)
        if not any(_flatten(final)):
            # Nothing about its own ops on its axes: a sum forwarded to it from upstream
            # (`accumulation.py`). The first tactic deciding anything on those axes.
            return next((name for i, (name, _) in enumerate(self.after)
                         if on & self._axes_of(i)), self.after[-1][0])
        for name, state in self.after:
            if self._decisions(state, origin, kind, on) == final:
                return name
        return self.after[-1][0]

    @staticmethod
    def _decisions(state: PartitionState, origin: object, kind: Collective,
                   on: frozenset[str]) -> tuple:
        def made(v: Value) -> tuple:
            """What decides the layout `v` is made in: its producer's nest (an argument's
            own tiling)."""
            if v.producer is None:
                return _on(state.tiles_of(v), on)
            return _on(state.nest_of(v.producer), on)

        if isinstance(origin, Conversion):
            v = origin.value
            if kind is Collective.ALL_REDUCE:
                # A sum the producer left pending, whatever the consumer takes of it (on
                # XLA:CPU a sum wanted tiled is all-reduced, then sliced).
                return (made(v),)
            consumer = origin.consumer
            if consumer is None:
                return (made(v), _on(state.tiles_of(v), on), _regathered(state, v))
            return (made(v), _on(state.nest_of(consumer), on), _regathered(state, v),
                    tuple(_on(state.tiles_of(r), on) for r in consumer.results))
        if isinstance(origin, Op):  # emitted by the op's own lowering (a roll, a halo)
            return (_on(state.nest_of(origin), on),
                    tuple(made(v) for v in origin.inputs),
                    tuple(_on(state.tiles_of(r), on) for r in origin.results))
        return ()
