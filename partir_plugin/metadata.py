"""What `partir_plugin.jit` tells the user: per-tactic collectives, estimates and conflicts."""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Container, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .ir.locations import NO_LOCATIONS_HINT
from .ir.types import format_bytes
from .records import SCHEMA, CollectiveRecord, CollectiveSite
from .simulation import TimelineEvent
from .spmd.collectives import COUNTED_KINDS, Collective
from .tactics.automatic import SearchResult

# The name of the report's first row when it shows the unpartitioned program.
BASELINE = "(replicated)"


@dataclass
class TacticReport:
    """The whole program as it stands after one tactic (paper 1 Table 2, Table 3)."""

    name: str
    collectives: dict[str, int]
    estimated_runtime_s: float | None = None
    estimated_peak_memory_bytes: int | None = None
    estimated_flops: float | None = None
    conflicts: list[str] = field(default_factory=list)
    unsupported_ops: dict[str, int] = field(default_factory=dict)
    actions: list[str] = field(default_factory=list)
    # What an automatic tactic's search found (decisions, costs, effort); None for others.
    search: SearchResult | None = None
    # Conflicts resolved by redistribution so far (op, location, entry, moves, bytes).
    resolutions: list[str] = field(default_factory=list)
    # What tactics so far said about the program (`PartitionState.notes`).
    notes: list[str] = field(default_factory=list)
    # One line per padded dimension of the program as it stands (`core/padding.py`): its
    # size, axes, padding and the masks the lowering put before the ops that read it.
    padding: list[str] = field(default_factory=list)
    # Per collective op of the program, what the row knew when it was made; `records` turns
    # them into `CollectiveRecord`s on first read (parsing source locations then).
    sites: list[CollectiveSite] = field(default_factory=list, compare=False, repr=False)
    # The simulated timeline of the program (kernels with their starts), for `write_trace`.
    timeline: list[TimelineEvent] = field(default_factory=list, compare=False, repr=False)

    @functools.cached_property
    def records(self) -> list[CollectiveRecord]:
        """One record per collective op of the program as it stands after this tactic, in
        program order; grouped by kind they give `collectives`."""
        return [site.record() for site in self.sites]

    def to_json(self) -> dict[str, Any]:
        """The row as plain data, its records included (`records.SCHEMA`)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("sites", "timeline")}
        if self.search is not None:
            data["search"] = asdict(self.search)
        data["records"] = [r.to_json() for r in self.records]
        return data


def fmt_bytes(n) -> str:
    return "-" if n is None else format_bytes(n)


def _fmt_gflop(f) -> str:
    if f is None:
        return "-"
    g = f / 1e9
    return f"{g:.3g}" if g < 1000 else f"{g:.0f}"


def _spec_str(spec) -> str:
    """A PartitionSpec as "P('batch', None)"; strings pass through."""
    if isinstance(spec, str):
        return spec
    entries = tuple(spec)
    while entries and entries[-1] is None:
        entries = entries[:-1]
    return "P(" + ", ".join(repr(e) for e in entries) + ")"


def _partition_spec_type():
    import sys

    jax_sharding = sys.modules.get("jax.sharding")  # no spec can exist before jax is imported
    return getattr(jax_sharding, "PartitionSpec", None)


def _is_sharding_leaf(x) -> bool:
    spec_type = _partition_spec_type()
    return x is None or isinstance(x, str) or hasattr(x, "spec") or (
        spec_type is not None and isinstance(x, spec_type))


def _sharding_str(s) -> str | None:
    if s is None:
        return None
    if hasattr(s, "spec"):  # NamedSharding
        return _spec_str(s.spec)
    return _spec_str(s)


def shardings_to_specs(tree) -> Any:
    """A pytree of shardings (NamedSharding, PartitionSpec or spec strings) as plain JSON:
    dicts stay dicts (keys as strings), sequences become lists, each sharding a spec string."""
    if _is_sharding_leaf(tree):
        return _sharding_str(tree)
    if hasattr(tree, "items"):
        return {str(k): shardings_to_specs(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [shardings_to_specs(v) for v in tree]
    return str(tree)


def _jsonable(x) -> Any:
    """Plain JSON types: numpy scalars as numbers, tuples as lists, non-finite floats as None."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if hasattr(x, "item"):  # numpy scalar
        return _jsonable(x.item())
    return str(x)


def fmt_time(s) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


@dataclass
class Metadata:
    """Filled when the partitioned callable first sees arguments (or on `.lower`)."""

    # One row per tactic; from `partir.jit` a `TacticReports`, lowered and simulated while
    # XLA compiles the step, or on first read (partitioning never waits for the report).
    tactics: Sequence[TacticReport] = field(default_factory=list)
    in_shardings: Any = None
    out_shardings: Any = None
    device_local_stablehlo: str | None = None
    hardware: str | None = None
    mesh: dict[str, int] | None = None

    def fill(self, reports: Sequence[TacticReport], mesh: dict[str, int], hardware,
             in_shardings, out_shardings, device_local_stablehlo: str) -> Metadata:
        """Record one partitioning (`partir.jit` on new input avals, `partir report`)."""
        self.tactics = reports
        self.mesh = dict(mesh)
        self.hardware = getattr(hardware, "name", hardware)
        self.in_shardings, self.out_shardings = in_shardings, out_shardings
        self.device_local_stablehlo = device_local_stablehlo
        return self

    def report(self, detail: bool = False, group_by: GroupBy | str = "line") -> str:
        """A table, one row per tactic, with the change from the previous tactic; with
        `detail`, then per tactic the collectives it added (`records`), costliest first,
        grouped by source line (`group_by="layer"`: by layer)."""
        if not self.tactics:
            return "(not partitioned yet: call the function or .lower(*args) first)"
        head, rows = tactic_table(self.tactics)
        out = [f"mesh {self.mesh}{self._hardware_note()}",
               *_table(head, rows, right=range(1, len(head)))]
        last = self.tactics[-1]
        if last.unsupported_ops:
            out.append("ops without a TMR rule, kept replicated: " + ", ".join(
                f"{k} x{v}" for k, v in sorted(last.unsupported_ops.items())))
        out += last.padding
        shown = noted = 0
        for t in self.tactics:
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
            out += self._detail(GroupBy(group_by))
        return "\n".join(out)

    def _detail(self, group_by: GroupBy) -> list[str]:
        """Per tactic, the collectives it added, grouped, costliest first."""
        out: list[str] = []
        other = GroupBy.LAYER if group_by is GroupBy.LINE else GroupBy.LINE
        head = [str(group_by), str(other), "est. time", "count", "collective", "bytes",
                "phase", "op", "reason", "param", "id"]
        for t in self.tactics:
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
        records = [r for t in self.tactics for r in t.records]
        unplaced = sum(r.source is None for r in records)
        if records and unplaced == len(records):
            out.append(f"note: {NO_LOCATIONS_HINT}")
        elif unplaced:
            out.append(f"note: {unplaced} collectives serve ops that jax lowered without a "
                       f"source location")
        return out

    def write_trace(self, path) -> Path:
        """Write the simulated timeline of the program after each tactic as Chrome
        trace-event JSON (open it in https://ui.perfetto.dev or chrome://tracing):
        kernels and collectives on separate threads, each collective's record in its args,
        a counter of live bytes; one process per tactic."""
        from .trace import write_trace

        return write_trace(self.tactics, path, mesh=self.mesh, hardware=self.hardware)

    def write_html(self, path) -> Path:
        """Write one self-contained HTML report (no network loads): the per-tactic table and
        the costliest collectives with their source lines and the decision behind each."""
        from .html_report import write_html

        return write_html(self, path)

    def _hardware_note(self) -> str:
        """", hardware NAME", saying when NAME is the default spec (no `hardware=` needed)."""
        if not self.hardware:
            return ", no estimates (no hardware spec installed)"
        from .kernel import default_hardware_name

        if self.hardware == default_hardware_name():
            return (f", hardware {self.hardware} (the default spec; choose another with "
                    f"hardware=)")
        return f", hardware {self.hardware}"

    def to_json(self) -> dict:
        """A JSON-serialisable dict: mesh, hardware, per-tactic reports and the in/out
        shardings as spec strings ("P('batch', None)") in the arguments' structure."""
        return _jsonable({
            "mesh": dict(self.mesh) if self.mesh is not None else None,
            "hardware": self.hardware,
            "records_schema": SCHEMA,
            "tactics": [t.to_json() for t in self.tactics],
            "in_shardings": shardings_to_specs(self.in_shardings),
            "out_shardings": shardings_to_specs(self.out_shardings),
        })

    def plot(self, path) -> Path:
        """Write a figure of estimated runtime, estimated peak memory and collective counts
        (stacked AG/AR/RS/A2A, plus AP when present) per tactic to `path` (format from its
        suffix, PNG by default). Uses matplotlib's Agg canvas; the global backend is untouched."""
        if not self.tactics:
            raise ValueError("nothing to plot: the function is not partitioned yet (call it or "
                             ".lower(*args) first)")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        path = Path(path)
        names = [t.name for t in self.tactics]
        xs = list(range(len(names)))
        fig = Figure(figsize=(max(9.0, 1.2 * len(names) * 3), 3.6), layout="constrained")
        FigureCanvasAgg(fig)
        ax_rt, ax_mem, ax_col = fig.subplots(1, 3)

        runtimes = [t.estimated_runtime_s for t in self.tactics]
        scale, unit = _time_scale([r for r in runtimes if r is not None])
        ax_rt.bar(xs, [(r or 0.0) * scale for r in runtimes], color="tab:blue")
        ax_rt.set_title("estimated runtime")
        ax_rt.set_ylabel(unit)

        mems = [t.estimated_peak_memory_bytes for t in self.tactics]
        mscale, munit = _bytes_scale([m for m in mems if m is not None])
        ax_mem.bar(xs, [(m or 0) * mscale for m in mems], color="tab:green")
        ax_mem.set_title("estimated peak memory / device")
        ax_mem.set_ylabel(munit)

        kinds = [k for k in COUNTED_KINDS if k is not Collective.ALL_PERMUTE]
        if any(t.collectives.get(Collective.ALL_PERMUTE, 0) for t in self.tactics):
            kinds.append(Collective.ALL_PERMUTE)
        bottom = [0] * len(xs)
        for kind in kinds:
            counts = [t.collectives.get(kind, 0) for t in self.tactics]
            ax_col.bar(xs, counts, bottom=bottom, label=kind.short)
            bottom = [b + c for b, c in zip(bottom, counts)]
        ax_col.set_title("collectives")
        ax_col.set_ylabel("count")
        ax_col.legend(fontsize="small")
        ax_col.yaxis.set_major_locator(MaxNLocator(integer=True))

        for ax in (ax_rt, ax_mem, ax_col):
            ax.set_xticks(xs, names, rotation=30 if len(names) > 4 else 0)
        title = f"mesh {self.mesh}" + (f", hardware {self.hardware}" if self.hardware else "")
        fig.suptitle(title)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format=path.suffix.lstrip(".").lower() or "png")
        return path


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


def _table(head: list[str], rows: list[list[str]], right: Container[int]) -> list[str]:
    """Aligned text columns (those in `right` right-aligned, numbers): the header, a rule,
    the rows."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(r: list[str]) -> str:
        return "  ".join(x.rjust(w) if i in right else x.ljust(w)
                         for i, (x, w) in enumerate(zip(r, widths))).rstrip()

    return [line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)]


class GroupBy(enum.StrEnum):
    """How the detail report groups a tactic's collectives."""

    LINE = "line"  # the source line each serves
    LAYER = "layer"  # `CollectiveRecord.layer`

    def of(self, r: CollectiveRecord) -> str:
        if self is GroupBy.LAYER:
            return r.layer or "-"
        return r.source.short if r.source else "(no source location)"


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


def _time_scale(values) -> tuple[float, str]:
    top = max(values, default=0.0)
    if top >= 1:
        return 1.0, "s"
    if top >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def _bytes_scale(values) -> tuple[float, str]:
    top = max(values, default=0)
    for i, unit in enumerate(("B", "KiB", "MiB", "GiB")):
        if top < 1024 ** (i + 1) or unit == "GiB":
            return 1 / 1024 ** i, unit
    return 1.0, "B"
