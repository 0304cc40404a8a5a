"""Collective cost: a ring model per group of mesh axes.

Each collective runs as a ring over the k = prod(axis sizes) devices that differ only in its axes,
limited by the slowest link class among those axes; on a spec with a cluster
(`HardwareSpec.devices_per_node`), by the links its device groups span in the mesh
(`HardwareSpec.link_for_axes` with the mesh: within a node, or across nodes). One ring step
costs the link latency, one collective the link's fixed overhead (a rendezvous, measured on
the host); the bandwidth term is the bytes each device sends divided by the link bandwidth.
"""

from __future__ import annotations

import re

from partir_plugin.extend import (
    Collective,
    CollectiveCost,
    LinkClass,
    Mesh,
    Op,
    collective_axes,
    collective_kind,
)

from .opcost import SHORT_NAMES

# Unmarked StableHLO collectives (e.g. from shard_map) by op name.
_OP_KINDS = {
    "all_reduce": Collective.ALL_REDUCE, "all_gather": Collective.ALL_GATHER,
    "reduce_scatter": Collective.REDUCE_SCATTER, "all_to_all": Collective.ALL_TO_ALL,
    "collective_permute": Collective.ALL_PERMUTE,
}


def ring_steps_and_sent(kind: Collective | str, nbytes: float, k: int) -> tuple[int, float]:
    """(latency-bound ring steps, bytes each device sends) for a collective over k devices.

    `nbytes` is the full array for all_gather (the result) and reduce_scatter (the operand), the
    local buffer for all_reduce, all_to_all and all_permute.
    """
    if k <= 1:
        return 0, 0.0
    if kind == Collective.ALL_REDUCE:  # reduce_scatter then all_gather
        return 2 * (k - 1), 2.0 * (k - 1) / k * nbytes
    if kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL):
        return k - 1, (k - 1) / k * nbytes
    if kind == Collective.ALL_PERMUTE:
        return 1, float(nbytes)
    raise ValueError(f"no ring model for collective kind {kind!r}")


def ring_time(kind: Collective | str, nbytes: float, k: int, link: LinkClass) -> float:
    """overhead + steps * latency + sent bytes / bandwidth; e.g. all_reduce:
    overhead + 2(k-1) * latency + 2(k-1)/k * N / bandwidth (nothing when k = 1)."""
    steps, sent = ring_steps_and_sent(kind, nbytes, k)
    if not steps:
        return 0.0
    return link.overhead_s + steps * link.latency_s + sent / link.bandwidth_bytes_per_s


def _replica_group_size(op: Op) -> int:
    text = op.attributes.get("replica_groups", "")
    m = re.search(r"tensor<(\d+)x(\d+)x", text)
    return int(m.group(2)) if m else 1


def communication_kind(op: Op) -> Collective | None:
    """The collective kind `op` communicates with, or None for local work (including the
    `all_slice` marker, which is a local dynamic_slice)."""
    kind = collective_kind(op)
    if kind is not None:
        return kind if kind.counted else None
    return _OP_KINDS.get(SHORT_NAMES[op.name])


def collective_cost(op: Op, mesh: Mesh, hardware, count: int = 1) -> CollectiveCost:
    """Cost of one collective op of a device-local program on `hardware`."""
    kind = communication_kind(op)
    if kind is None:
        raise ValueError(f"{op.name} is not a collective")
    axes = collective_axes(op)
    if axes:
        k = mesh.product(axes)
    elif kind == Collective.ALL_PERMUTE:
        k = 2
    else:
        k = _replica_group_size(op)
    link = hardware.link_for_axes(axes, mesh)
    if kind == Collective.ALL_GATHER:
        nbytes = sum(r.type.nbytes for r in op.results)
    else:
        nbytes = sum(v.type.nbytes for v in op.operands if v.type.is_tensor)
    _, sent = ring_steps_and_sent(kind, nbytes, k)
    return CollectiveCost(kind=str(kind), axes=tuple(axes), group_size=k, link=link.name,
                          bytes=int(nbytes), sent_bytes=sent,
                          time_s=ring_time(kind, nbytes, k, link), count=count)
