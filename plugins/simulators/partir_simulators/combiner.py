"""XLA's collective combiners: independent collectives of one kind over the same devices run
as one.

XLA's AllReduceCombiner (and, on GPU, its AllGatherCombiner and ReduceScatterCombiner) merges
collectives that do not depend on each other, up to a byte threshold and 256 operands, so a
data-parallel step that the partitioner writes with one all-reduce per gradient pays the
ring's latency once, as the compiled program does (XLA:CPU turns the 36 gradient all-reduces
of a BP transformer step into one: docs/BENCHMARKS.md). Without this, latency-bound steps
with many small gradients (a UNet) look slow under BP and a search prefers replicated
compute that runs several times slower.

The model: in program order, a collective joins the open group of its kind (same reduction,
same mesh axes) while the group stays under the spec's threshold; a group closes when a
kernel reads one of its results (which also makes every member independent of the others,
as XLA requires) or when it is full. The combined collective runs where its last member
was, on the summed bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from partir_plugin.extend import Mesh, Value

from .comm import ring_time
from .costs import BlockCost, Kernel

MAX_COMBINED = 256  # XLA's combine_threshold_count


@dataclass
class _Group:
    members: list[int] = field(default_factory=list)  # indices into the kernel list
    bytes: int = 0


def _key(k: Kernel, combined: frozenset[str]) -> tuple | None:
    """What a collective must share with others to be combined with them, or None."""
    c = k.collective
    if c is None or c.kind not in combined:
        return None
    op = k.root
    reducer = ()
    if op.regions and op.regions[0].blocks and op.regions[0].blocks[0].ops:
        reducer = (op.regions[0].blocks[0].ops[0].name,)
    return (c.kind, c.axes, c.group_size, c.link, *reducer)


def combine_collectives(kernels: list[Kernel], owner: dict[Value, Value], hardware,
                        cost: BlockCost, mesh: Mesh) -> list[Kernel]:
    """`kernels` with the collectives the spec's backend combines merged, in program order;
    `cost.comm_s` is corrected for the merged durations."""
    combined = frozenset(hardware.combined_collectives)
    threshold = hardware.combine_threshold_bytes
    if not combined or threshold <= 0:
        return kernels
    out: list[Kernel | None] = []
    open_groups: dict[tuple, _Group] = {}
    pending: dict[Value, tuple] = {}  # a result of an open group's member -> the group's key

    def close(key: tuple) -> None:
        group = open_groups.pop(key)
        members = [out[i] for i in group.members]
        for k in members:
            for r in k.outputs:
                pending.pop(r, None)
        if len(members) < 2:
            return
        first = members[0].collective
        duration = ring_time(first.kind, group.bytes, first.group_size,
                             hardware.link_for_axes(first.axes, mesh))
        cost.comm_s += duration - sum(k.duration for k in members)
        merged = Kernel(members[0].root, [v for k in members for v in k.inputs],
                        [v for k in members for v in k.outputs], "comm", duration,
                        comm_s=duration, members=members)
        for i in group.members[:-1]:
            out[i] = None
        out[group.members[-1]] = merged

    for k in kernels:
        if pending:  # else no group is open
            readers_of = {pending[owner.get(v, v)] for v in k.inputs
                          if owner.get(v, v) in pending}
            for key in readers_of:
                close(key)
        key = _key(k, combined)
        if key is None:
            out.append(k)
            continue
        size = k.collective.bytes
        group = open_groups.get(key)
        if group is not None and (group.bytes + size > threshold
                                  or len(group.members) >= MAX_COMBINED):
            close(key)
            group = None
        if group is None:
            group = open_groups[key] = _Group()
        group.members.append(len(out))
        group.bytes += size
        out.append(k)
        for r in k.outputs:
            pending[r] = key
    for key in list(open_groups):
        close(key)
    return [k for k in out if k is not None]
