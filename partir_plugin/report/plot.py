"""The report as a figure: estimated runtime, peak memory and collective counts per tactic."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..spmd.collectives import COUNTED_KINDS, Collective
from .tactic_report import TacticReport


def plot(tactics: Sequence[TacticReport], path, *, mesh: dict[str, int] | None,
         hardware: str | None) -> Path:
    """Write a figure of estimated runtime, estimated peak memory and collective counts
    (stacked AG/AR/RS/A2A, plus AP when present) per tactic to `path` (format from its
    suffix, PNG by default). Uses matplotlib's Agg canvas; the global backend is untouched."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    path = Path(path)
    names = [t.name for t in tactics]
    xs = list(range(len(names)))
    fig = Figure(figsize=(max(9.0, 1.2 * len(names) * 3), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_rt, ax_mem, ax_col = fig.subplots(1, 3)

    runtimes = [t.estimated_runtime_s for t in tactics]
    scale, unit = _time_scale([r for r in runtimes if r is not None])
    ax_rt.bar(xs, [(r or 0.0) * scale for r in runtimes], color="tab:blue")
    ax_rt.set_title("estimated runtime")
    ax_rt.set_ylabel(unit)

    mems = [t.estimated_peak_memory_bytes for t in tactics]
    mscale, munit = _bytes_scale([m for m in mems if m is not None])
    ax_mem.bar(xs, [(m or 0) * mscale for m in mems], color="tab:green")
    ax_mem.set_title("estimated peak memory / device")
    ax_mem.set_ylabel(munit)

    kinds = [k for k in COUNTED_KINDS if k is not Collective.ALL_PERMUTE]
    if any(t.collectives.get(Collective.ALL_PERMUTE, 0) for t in tactics):
        kinds.append(Collective.ALL_PERMUTE)
    bottom = [0] * len(xs)
    for kind in kinds:
        counts = [t.collectives.get(kind, 0) for t in tactics]
        ax_col.bar(xs, counts, bottom=bottom, label=kind.short)
        bottom = [b + c for b, c in zip(bottom, counts)]
    ax_col.set_title("collectives")
    ax_col.set_ylabel("count")
    ax_col.legend(fontsize="small")
    ax_col.yaxis.set_major_locator(MaxNLocator(integer=True))

    for ax in (ax_rt, ax_mem, ax_col):
        ax.set_xticks(xs, names, rotation=30 if len(names) > 4 else 0)
    title = f"mesh {mesh}" + (f", hardware {hardware}" if hardware else "")
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=path.suffix.lstrip(".").lower() or "png")
    return path


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
