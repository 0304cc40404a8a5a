"""The report as text: the per-tactic table (shared with the HTML report), the notes and
conflicts after each tactic, and the detail view of the collectives each tactic added."""

from __future__ import annotations

import enum
from collections.abc import Container, Sequence

from ..ir.locations import NO_LOCATIONS_HINT
from ..ir.types import format_bytes
from ..plugin.manager import default_hardware_name
from ..spmd.collectives import COUNTED_KINDS
from .records import CollectiveRecord
from .tactic_report import TacticReport


def fmt_bytes(n) -> str:
    return "-" if n is None else format_bytes(n)


def _fmt_gflop(f) -> str:
    if f is None:
        return "-"
    g = f / 1e9
    return f"{g:.3g}" if g < 1000 else f"{g:.0f}"


def fmt_time(s) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


class GroupBy(enum.StrEnum):
    """How the detail report groups a tactic's collectives."""

    LINE = "line"  # the source line each serves
    LAYER = "layer"  # `CollectiveRecord.layer`

    def of(self, r: CollectiveRecord) -> str:
        if self is GroupBy.LAYER:
            return r.layer or "-"
        return r.source.short if r.source else "(no source location)"


def render(tactics: Sequence[TacticReport], *, mesh: dict[str, int] | None,
           hardware: str | None, detail: bool = False,
           group_by: GroupBy | str = "line") -> str:
    """A table, one row per tactic, with the change from the previous tactic; with
    `detail`, then per tactic the collectives it added (`records`), costliest first,
    grouped by source line (`group_by="layer"`: by layer)."""
    head, rows = tactic_table(tactics)
    out = [f"mesh {mesh}{_hardware_note(hardware)}",
           *_table(head, rows, right=range(1, len(head)))]
    last = tactics[-1]
    if last.unsupported_ops:
        out.append("ops without a TMR rule, kept replicated: " + ", ".join(
            f"{k} x{v}" for k, v in sorted(last.unsupported_ops.items())))
    out += last.padding
    shown = noted = 0
    for t in tactics:
        for note in t.notes[noted:]:
            out.append(f"after {t.name}: {note}")
        noted = len(t.notes)
        for r in t.resolutions[shown:]:
            out.append(f"resolved after {t.name}: {r}")
        shown = len(t.resolutions)
        for c in t.conflicts[:5]:
            out.append(f"conflict after {t.name}: {c}")
        if len(t.conflicts) > 5:
            out.append(f"... and {len(t.conflicts) - 5} more conflicts after {t.name}")
    if detail:
        out += _detail(tactics, GroupBy(group_by))
    return "\n".join(out)


def tactic_table(tactics: Sequence[TacticReport]) -> tuple[list[str], list[list[str]]]:
    """The report's columns and one row per tactic, with the change from the previous one
    (the text report and the HTML report show the same table)."""
    head = ["tactic", *(k.short for k in COUNTED_KINDS), "est. runtime", "Δ runtime",
            "est. peak mem", "Δ mem", "conflicts", "est. GFLOP"]
    rows = []
    prev = None
    for t in tactics:
        c = t.collectives
        d_rt = d_mem = "-"
        if prev is not None and t.estimated_runtime_s is not None and \
                prev.estimated_runtime_s:
            d_rt = f"{t.estimated_runtime_s / prev.estimated_runtime_s:.2f}x"
        if prev is not None and t.estimated_peak_memory_bytes is not None and \
                prev.estimated_peak_memory_bytes:
            d_mem = f"{t.estimated_peak_memory_bytes / prev.estimated_peak_memory_bytes:.2f}x"
        rows.append([t.name, *(str(c.get(k, 0)) for k in COUNTED_KINDS), fmt_time(
            t.estimated_runtime_s), d_rt, fmt_bytes(t.estimated_peak_memory_bytes), d_mem,
            str(len(t.conflicts)), _fmt_gflop(t.estimated_flops)])
        prev = t
    return head, rows


def _hardware_note(hardware: str | None) -> str:
    """", hardware NAME", saying when NAME is the default spec (no `hardware=` needed)."""
    if not hardware:
        return ", no estimates (no hardware spec installed)"
    if hardware == default_hardware_name():
        return f", hardware {hardware} (the default spec; choose another with hardware=)"
    return f", hardware {hardware}"


def _detail(tactics: Sequence[TacticReport], group_by: GroupBy) -> list[str]:
    """Per tactic, the collectives it added, grouped, costliest first."""
    out: list[str] = []
    other = GroupBy.LAYER if group_by is GroupBy.LINE else GroupBy.LINE
    head = [str(group_by), str(other), "est. time", "count", "collective", "bytes",
            "phase", "op", "reason", "param", "id"]
    for t in tactics:
        added = [r for r in t.records if r.tactic == t.name]
        if not added:
            continue
        total = sum(r.total_time_s or 0.0 for r in added)
        out += ["", f"collectives added by {t.name}: {len(added)}, est. "
                    f"{fmt_time(total)} per step"]
        rows = []
        for key, group in _grouped(added, group_by):
            for i, r in enumerate(group):
                rows.append([key if i == 0 else "", other.of(r),
                             fmt_time(r.total_time_s), f"x{r.count}",
                             f"{r.kind}[{','.join(r.axes)}]", fmt_bytes(r.bytes),
                             str(r.phase), r.op.removeprefix("stablehlo."), str(r.reason),
                             r.param or "", r.id])
        out += ["  " + line for line in _table(head, rows, right=(2, 3, 5))]
    records = [r for t in tactics for r in t.records]
    unplaced = sum(r.source is None for r in records)
    if records and unplaced == len(records):
        out.append(f"note: {NO_LOCATIONS_HINT}")
    elif unplaced:
        out.append(f"note: {unplaced} collectives serve ops that jax lowered without a "
                   f"source location")
    return out


def _table(head: list[str], rows: list[list[str]], right: Container[int]) -> list[str]:
    """Aligned text columns (those in `right` right-aligned, numbers): the header, a rule,
    the rows."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(r: list[str]) -> str:
        return "  ".join(x.rjust(w) if i in right else x.ljust(w)
                         for i, (x, w) in enumerate(zip(r, widths))).rstrip()

    return [line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _grouped(records: list[CollectiveRecord], by: GroupBy
             ) -> list[tuple[str, list[CollectiveRecord]]]:
    """Records grouped, the costliest group first, each costliest first (then by the other
    key and id)."""
    groups: dict[str, list[CollectiveRecord]] = {}
    for r in records:
        groups.setdefault(by.of(r), []).append(r)
    other = GroupBy.LAYER if by is GroupBy.LINE else GroupBy.LINE
    cost = lambda rs: -sum(r.total_time_s or 0.0 for r in rs)  # noqa: E731
    return sorted(((k, sorted(g, key=lambda r: (cost([r]), other.of(r), r.id)))
                   for k, g in groups.items()),
                  key=lambda kg: (cost(kg[1]), kg[0]))
