"""The simulated timeline as a Chrome trace-event file, for Perfetto and chrome://tracing.

One process per report row (the program after that tactic, on one device), with a thread for
compute kernels and one for collectives: complete (`X`) events on one thread never overlap,
so slices nest as the viewers require. A collective's slice carries its record (kind, axes,
bytes, phase, tactic, reason, op, source line, parameter) in `args`, which the viewers show
on click and Perfetto's SQL can query; a combined collective (the backend's combiner) is one
slice listing its members. A counter per process shows live bytes. File-level facts go in
`otherData`: Perfetto refuses a top-level `metadata` key (jax's profiler deletes it too).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..cost import TimelineEvent, expand_timeline
from .records import SCHEMA, CollectiveRecord
from .tactic_report import TacticReport

TRACE_SCHEMA = "partir.trace/v1"
COMPUTE_TID, COLLECTIVE_TID = 1, 2


def chrome_trace(tactics: Sequence[TacticReport], *, mesh: dict | None = None,
                 hardware: str | None = None) -> dict[str, Any]:
    """The trace-event JSON object for the rows' simulated timelines."""
    events: list[dict[str, Any]] = []
    for pid, row in enumerate(tactics, start=1):
        events += [
            _meta(pid, None, "process_name", f"after {row.name} (one device, simulated)"),
            _meta(pid, None, "process_sort_index", pid, key="sort_index"),
            _meta(pid, COMPUTE_TID, "thread_name", "compute"),
            _meta(pid, COLLECTIVE_TID, "thread_name", "collectives"),
        ]
        by_op = {site.local: record for site, record in zip(row.sites, row.records)}
        timeline = expand_timeline(row.timeline)  # every iteration of every loop
        for e in timeline:
            events.append(_slice(pid, e, [by_op[op] for op in e.ops if op in by_op]))
        events += _live_bytes(pid, timeline)
    return {
        "displayTimeUnit": "ns",
        "otherData": {"schema": TRACE_SCHEMA, "records_schema": SCHEMA,
                      "hardware": hardware or "", "mesh": json.dumps(mesh or {}),
                      "tactics": json.dumps([t.name for t in tactics])},
        "traceEvents": events,
    }


def write_trace(tactics: Sequence[TacticReport], path, **facts) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(tactics, **facts)))
    return path


def _meta(pid: int, tid: int | None, name: str, value, key: str = "name") -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": {key: value}}
    if tid is not None:
        event["tid"] = tid
    return event


def _slice(pid: int, e: TimelineEvent, records: list[CollectiveRecord]) -> dict[str, Any]:
    collective = e.stream == "comm"
    name = e.name
    args: dict[str, Any] = {"ops": [op.name for op in e.ops]}
    if collective and len(records) == 1:
        r = records[0]
        where = f" {r.source.short}" if r.source else ""
        name = f"{r.kind}[{','.join(r.axes)}]{where}"
        args = _record_args(r)
    elif collective:
        args["members"] = [_record_args(r) for r in records]
    start, end = _ns(e.start_s), _ns(e.start_s + e.duration_s)
    return {"ph": "X", "pid": pid, "tid": COLLECTIVE_TID if collective else COMPUTE_TID,
            "ts": start / 1e3, "dur": (end - start) / 1e3, "name": name,
            "cat": "collective" if collective else "compute", "args": args}


def _ns(seconds: float) -> int:
    """Times are written in whole nanoseconds (as viewers keep them): a kernel that starts
    where another ends then starts exactly there, and slices nest without rounding overlaps."""
    return round(seconds * 1e9)


def _record_args(r: CollectiveRecord) -> dict[str, Any]:
    data = r.to_json()
    data["source"] = str(r.source) if r.source else None
    data["stack"] = [str(f) for f in r.stack]
    return data


def _live_bytes(pid: int, timeline: list[TimelineEvent]) -> list[dict[str, Any]]:
    """A counter of the bytes live on the device: each kernel's results from its start to
    the end of their last reader (the end of the program when returned or never read), plus
    what no kernel defines (arguments, constants) throughout. Buffer reuse is not modelled:
    an upper estimate of the simulator's peak, which the report states."""
    if not timeline:
        return []
    end = max(e.start_s + e.duration_s for e in timeline)
    defined: dict[Any, float] = {}
    last_read: dict[Any, float] = {}
    for e in timeline:
        for v in e.outputs:
            defined.setdefault(v, e.start_s)
        for v in e.inputs:
            last_read[v] = max(last_read.get(v, 0.0), e.start_s + e.duration_s)
    changes: dict[float, int] = {}
    for v in set(defined) | set(last_read):
        size = v.type.nbytes if v.type.is_tensor else 0
        start = defined.get(v, 0.0)
        stop = last_read.get(v, end) if v in defined and v in last_read else end
        changes[start] = changes.get(start, 0) + size
        changes[max(stop, start)] = changes.get(max(stop, start), 0) - size
    live, out = 0, []
    for t in sorted(changes):
        live += changes[t]
        out.append({"ph": "C", "pid": pid, "ts": _ns(t) / 1e3, "name": "live bytes",
                    "args": {"bytes": live}})
    return out
