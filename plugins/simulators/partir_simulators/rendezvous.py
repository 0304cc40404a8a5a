"""Rendezvous waits: on devices that time-share cores, a collective waits for its group's
last member.

Eight virtual CPU devices are eight threads on a host's few cores. While they compute, the OS
scheduler runs some ahead of others, so they reach a collective apart, and the collective
starts when the last member of its group arrives. The further they computed since they last
met, the further apart they are: the wait is a fraction of the compute since the device's
previous collective, larger for larger groups (`HardwareSpec.rendezvous_wait`, measured by
`partir calibrate`: 14-22% of the stretch for all 8 devices of this project's 2-core host,
0-15% for smaller groups, where the link cost of a small collective is 35-90 us). Devices
with cores of their own (every accelerator spec) list no waits and pay none.

The stretch is counted in program order: the compute kernels since the last collective; a
loop (or branch) whose body has collectives ends a stretch with its body's tail, and a
loop body's first collective follows the body's tail of the iteration before.
"""

from __future__ import annotations

from .costs import BlockCost, Kernel


def _group_size(k: Kernel) -> int:
    members = k.members or [k]
    return max((m.collective.group_size for m in members if m.collective is not None),
               default=1)


def _walk(kernels: list[Kernel], since: float, hardware=None, cost: BlockCost | None = None
          ) -> tuple[float, bool]:
    """(compute after the last collective, whether there is one); with `hardware`, each
    collective's wait is added to its kernel and to `cost`."""
    synced = False
    for k in kernels:
        if k.stream == "compute":
            since += k.duration
        elif k.stream == "comm":
            synced = True
            if hardware is not None:
                wait = hardware.wait_fraction(_group_size(k)) * since
                k.duration += wait
                k.comm_s += wait
                cost.comm_s += wait
            since = 0.0
        else:  # a loop or branch: its body's tail if the body meets the other devices
            bodies = [part for part in k.parts if part.synced]
            if bodies:
                synced = True
                since = bodies[-1].tail_s
            else:
                since += k.duration
    return since, synced


def charge_rendezvous_waits(kernels: list[Kernel], hardware, cost: BlockCost,
                            loop_body: bool) -> None:
    """Add each collective's rendezvous wait to its kernel (and `cost.comm_s`) when the spec
    lists waits; record the block's tail (`cost.synced`, `cost.tail_s`) for the loop that
    runs it."""
    if not getattr(hardware, "rendezvous_wait", None):
        return
    tail, synced = _walk(kernels, 0.0)
    cost.synced, cost.tail_s = synced, tail
    if synced:
        _walk(kernels, tail if loop_body else 0.0, hardware, cost)
