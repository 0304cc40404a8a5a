"""What the analytical simulator computes per kernel and per block: the records that the
kernel costing (analytical.py), the timeline and the buffer assignment exchange."""

from __future__ import annotations

from dataclasses import dataclass, field

from partir_plugin.extend import CollectiveCost, Op, TimelineEvent, Value


def nbytes(v: Value) -> int:
    """Bytes of a tensor value (0 for tokens and other non-tensors)."""
    t = v.type
    return 0 if t.opaque else t.nbytes


@dataclass
class Kernel:
    """One launched kernel: a root op with its fused producers, a collective, or a loop or
    branch (a barrier on both streams)."""

    root: Op
    inputs: list[Value]
    outputs: list[Value]
    stream: str  # "compute", "comm" or "both" (a loop or branch: a barrier on both)
    duration: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    transient: int = 0
    # Inputs whose buffer the result may take over when read for the last time. None for a
    # compute kernel until buffer assignment finds a same-sized input dying there and asks
    # (`buffers.shareable_inputs` of `ops`): most kernels never need it.
    shareable: tuple[Value, ...] | None = ()
    ops: list[Op] = field(default_factory=list)  # a compute kernel's root and fused producers
    collective: CollectiveCost | None = None  # a collective's cost record
    members: list[Kernel] = field(default_factory=list)  # a combined collective's parts
    # A loop or branch: the blocks that run, in order, `repeats` times (for timelines).
    parts: list[BlockCost] = field(default_factory=list)
    repeats: int = 1


@dataclass
class BlockCost:
    """The totals of one block (a function body, a loop body, a branch)."""

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
    # Whether the block has collectives, and its compute after the last one (rendezvous.py;
    # only where the spec lists rendezvous waits).
    synced: bool = False
    tail_s: float = 0.0
    # The block's kernels with their starts (from 0), when a timeline was asked for.
    timeline: list[TimelineEvent] = field(default_factory=list)
