"""The timeline: kernels in program order on a compute and a communication stream, each
starting when its inputs are ready and its stream is free (DESIGN.md §2.5)."""

from __future__ import annotations

from partir_plugin.extend import Value

from .costs import Kernel


def list_schedule(kernels: list[Kernel], owner: dict[Value, Value], overlap: bool) -> float:
    """List-schedule kernels in program order on a compute and a communication stream; the
    end time. Without `overlap` the two streams are one."""
    ready: dict[Value, float] = {}
    free = {"compute": 0.0, "comm": 0.0}
    for k in kernels:
        start = max((ready.get(owner.get(v, v), 0.0) for v in k.inputs), default=0.0)
        if k.stream == "both" or not overlap:
            start = max(start, free["compute"], free["comm"])
            end = start + k.duration
            free["compute"] = free["comm"] = end
        else:
            start = max(start, free[k.stream])
            end = start + k.duration
            free[k.stream] = end
        for r in k.outputs:
            ready[r] = end
    return max(free.values())
