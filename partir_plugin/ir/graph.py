"""The small Python IR: values, ops, blocks and regions, as in MLIR but with nothing else.

Attributes are kept as their MLIR text, parsed only where the TMR or lowering needs them, so
an op we do not understand still round-trips exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .opsets import PARTITIONED_REGIONS
from .types import TensorType


class Value:
    """An SSA value: an op result or a block argument."""

    __slots__ = ("type", "_owner", "index", "tag", "producer")

    def __init__(self, type: TensorType, owner: Op | Block, index: int):
        self.type = type
        self.owner = owner
        self.index = index
        self.tag: str | None = None  # the `partir_plugin.tag` name of a tag op's result

    @property
    def owner(self) -> Op | Block:
        return self._owner

    @owner.setter
    def owner(self, owner: Op | Block) -> None:
        # `producer`, the op defining the value (None for a block argument), is a plain slot
        # kept with the owner (rewrites that fuse ops move a result to the new op): propagation,
        # the simulator and the records read it hundreds of thousands of times per schedule.
        self._owner = owner
        self.producer: Op | None = owner if isinstance(owner, Op) else None

    def __repr__(self) -> str:
        where = self.owner.name if isinstance(self.owner, Op) else "arg"
        return f"<Value {where}#{self.index}: {self.type}>"


class Op:
    """An operation. `rule` is the parsed Shardy sharding rule, when Shardy has one."""

    __slots__ = ("name", "operands", "results", "attributes", "regions", "rule", "captures",
                 "_location", "mlir_location", "origin")

    def __init__(self, name: str, operands: list[Value], result_types: list[TensorType],
                 attributes: dict[str, str] | None = None, regions: list[Region] | None = None):
        self.name = name
        self.operands = list(operands)
        self.results = [Value(t, self, i) for i, t in enumerate(result_types)]
        self.attributes = dict(attributes or {})
        # Most ops have no regions and no captures: the empty tuple, shared, rather than two
        # empty lists per op, which Python's cyclic GC would walk in every full collection.
        self.regions: Sequence[Region] = tuple(regions) if regions else ()
        self.rule = None
        # Values defined outside and used inside this op's regions (implicit operands).
        self.captures: Sequence[Value] = ()
        self._location: str | None = None
        # The imported op's MLIR location object (`ir.locations` parses it when a message or
        # a diagnostic names the op: parsing every op would cost more than importing it).
        self.mlir_location: object | None = None
        # Why a pass made this op: the op of the partitioned program whose lowering emitted
        # it, or for a conversion's collectives the `Conversion` (`spmd/provenance.py`).
        self.origin: object | None = None

    @property
    def location(self) -> str | None:
        """The op's name location (jax's name stack), for messages."""
        if self._location is None and self.mlir_location is not None:
            from .locations import location_name

            self._location = location_name(self.mlir_location)
        return self._location

    @location.setter
    def location(self, value: str | None) -> None:
        self._location = value

    @property
    def where(self) -> str:
        """The op's name stack and the user's line that wrote it, as far as they are known
        (for messages)."""
        where = self.location or "an unknown location"
        if self.mlir_location is not None:
            from .locations import parse_location

            source = parse_location(self.mlir_location).source
            if source is not None:
                where += f" ({source})"
        return where

    @property
    def inputs(self) -> list[Value]:
        """Explicit operands followed by implicitly captured values."""
        return self.operands + self.captures if self.captures else self.operands

    def __repr__(self) -> str:
        return f"<Op {self.name} ({len(self.operands)} -> {len(self.results)})>"


@dataclass
class Block:
    args: list[Value] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)

    def add_arg(self, type: TensorType) -> Value:
        v = Value(type, self, len(self.args))
        self.args.append(v)
        return v


@dataclass
class Region:
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Func:
    """A function: its body block holds the args; `returns` are the returned values."""

    name: str
    body: Block
    returns: list[Value]
    arg_names: list[str] = field(default_factory=list)
    result_paths: list[str] = field(default_factory=list)  # each output's key path ("1/w")
    arg_attrs: dict[int, str] = field(default_factory=dict)  # arg index -> "name = value, ..."
    # Arguments and results holding an extended dtype's elements (typed PRNG keys): their
    # trailing dimensions are each element's words (a threefry key's 2 uint32s), so only
    # the leading `rank` (the array's own) may be tiled. Value -> that rank.
    element_rank: dict[Value, int] = field(default_factory=dict)
    # `partir_plugin.tag` names -> every value tagged so, in program order (a model that calls
    # the same layer twice, or a scan body and its prologue, tags several values alike).
    tags: dict[str, list[Value]] = field(default_factory=dict)
    # The functions its `func.call`s and composites name, by symbol, as imported (each once);
    # `passes.inline_calls` inlines them at every call site and empties it.
    callees: dict[str, Func] = field(default_factory=dict, repr=False)

    @property
    def args(self) -> list[Value]:
        return self.body.args

    @property
    def ops(self) -> list[Op]:
        return self.body.ops


def walk(ops: list[Op]):
    """Every op in `ops` and, recursively, in their regions (pre-order)."""
    for op in ops:
        yield op
        for region in op.regions:
            for block in region.blocks:
                yield from walk(block.ops)


def tagged_values(ops: list[Op]) -> dict[str, list[Value]]:
    """Every tag name in `ops` (regions included) -> the values tagged so, in program order."""
    tags: dict[str, list[Value]] = {}
    for op in walk(ops):
        for r in op.results:
            if r.tag is not None:
                tags.setdefault(r.tag, []).append(r)
    return tags


def captures_of(op: Op) -> list[Value]:
    """Values used inside `op`'s regions but defined outside them, in first-use order."""
    defined: set[Value] = set()
    used: list[Value] = []
    for region in op.regions:
        for block in region.blocks:
            defined.update(block.args)
    inner = list(walk([b_op for r in op.regions for b in r.blocks for b_op in b.ops]))
    for o in inner:
        defined.update(o.results)
        for r in o.regions:
            for b in r.blocks:
                defined.update(b.args)
    seen: set[Value] = set()
    for o in inner:
        for v in o.operands:
            if v not in defined and v not in seen:
                seen.add(v)
                used.append(v)
    return used


def clone_region(region: Region, env: dict[Value, Value]) -> Region:
    """A copy of `region`, its outside values mapped through `env` (which gains the copies)."""
    out = Region()
    for block in region.blocks:
        b = Block()
        for a in block.args:
            env[a] = b.add_arg(a.type)
        for op in block.ops:
            new = Op(op.name, [env.get(v, v) for v in op.operands], [r.type for r in op.results],
                     dict(op.attributes), [clone_region(r, env) for r in op.regions])
            new.mlir_location = op.mlir_location
            for r, n in zip(op.results, new.results):
                env[r] = n
            b.ops.append(new)
        out.blocks.append(b)
    return out


def blocks(block: Block):
    """`block` and, recursively, every block of its ops' regions."""
    yield block
    for op in block.ops:
        for region in op.regions:
            for b in region.blocks:
                yield from blocks(b)


def use_counts(func: Func) -> dict[Value, int]:
    """How many times each value is read (by any op, regions included, or returned)."""
    uses: dict[Value, int] = {}
    for op in walk(func.ops):
        for v in op.inputs:
            uses[v] = uses.get(v, 0) + 1
    for v in func.returns:
        uses[v] = uses.get(v, 0) + 1
    return uses


def partitionable_ops(ops: list[Op]):
    """Top-level ops and, recursively, the ops of `while` bodies and conditions and of `case`
    branches (partitioned like the top level), terminators included, in program order."""
    for op in ops:
        yield op
        if op.name in PARTITIONED_REGIONS:
            for region in op.regions:
                for block in region.blocks:
                    yield from partitionable_ops(block.ops)


def users_of(func: Func) -> dict[Value, list[tuple[Op | None, int]]]:
    """Map each value to its users (op, input index) among `partitionable_ops`, with the
    function's return as (None, i)."""
    users: dict[Value, list[tuple[Op | None, int]]] = {}
    for op in partitionable_ops(func.ops):
        for i, v in enumerate(op.inputs):
            users.setdefault(v, []).append((op, i))
    for i, v in enumerate(func.returns):
        users.setdefault(v, []).append((None, i))
    return users
