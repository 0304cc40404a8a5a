"""The timeline: kernels in program order on a compute and a communication stream, each
starting when its inputs are ready and its stream is free (DESIGN.md §2.5)."""

from __future__ import annotations

import dataclasses

from partir_plugin.extend import TimelineEvent, Value

from .costs import Kernel
from .opcost import short_name


def list_schedule(kernels: list[Kernel], owner: dict[Value, Value], overlap: bool,
                  starts: list[float] | None = None) -> float:
    """List-schedule kernels in program order on a compute and a communication stream; the
    end time. Without `overlap` the two streams are one. Each kernel's start is appended to
    `starts` when given."""
    ready: dict[Value, float] = {}
    free = {"compute": 0.0, "comm": 0.0}
    for k in kernels:
        start = max([ready.get(owner.get(v, v), 0.0) for v in k.inputs], default=0.0)
        if k.stream == "both" or not overlap:
            start = max(start, free["compute"], free["comm"])
            end = start + k.duration
            free["compute"] = free["comm"] = end
        else:
            start = max(start, free[k.stream])
            end = start + k.duration
            free[k.stream] = end
        if starts is not None:
            starts.append(start)
        for r in k.outputs:
            ready[r] = end
    return max(free.values())


def timeline_events(kernels: list[Kernel], starts: list[float]) -> list[TimelineEvent]:
    """The kernels as timeline events: a loop or branch as one event followed by the events of
    the blocks it runs (their first iteration, with the loop's trip count and period), in
    order (within its span); a combined collective one event for its members."""
    events: list[TimelineEvent] = []
    for k, start in zip(kernels, starts):
        if k.stream == "both":  # a slice for the loop or branch, its blocks' kernels inside
            # The body's events once, at the first iteration, each marked with this loop's
            # trip count and period (`TimelineEvent.loops`): a long loop is not listed
            # iteration by iteration unless a trace asks (`executions()`).
            inner: list[TimelineEvent] = []
            offset = start
            for part in k.parts:
                inner += [dataclasses.replace(e, start_s=e.start_s + offset)
                          for e in part.timeline]
                offset += part.runtime
            period = offset - start
            if k.repeats > 1:
                inner = [dataclasses.replace(e, loops=((k.repeats, period), *e.loops))
                         for e in inner]
            # the loop ends with its last kernel (summing the parts in another order could
            # leave it a rounding error short, and a child would stick out)
            last = max((e.start_s + e.duration_s + sum((n - 1) * p for n, p in e.loops)
                        for e in inner), default=start)
            end = max(start + k.duration, last)
            name = short_name(k.root) + (f" x{k.repeats}" if k.repeats > 1 else "")
            events.append(TimelineEvent(name, "compute", start, end - start, (k.root,), (),
                                        tuple(k.inputs), tuple(k.outputs)))
            events += inner
            continue
        name = short_name(k.root)
        if k.members:  # a combined collective
            ops = tuple(m.root for m in k.members)
            collectives = tuple(m.collective for m in k.members if m.collective is not None)
            if len(k.members) > 1:
                name = f"{name} x{len(k.members)} (combined)"
        else:
            ops = (k.root,)
            collectives = (k.collective,) if k.collective is not None else ()
        events.append(TimelineEvent(name, k.stream, start, k.duration, ops, collectives,
                                    tuple(k.inputs), tuple(k.outputs)))
    return events
