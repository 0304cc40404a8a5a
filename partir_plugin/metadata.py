"""What `partir_plugin.jit` tells the user: per-tactic collectives, estimates and conflicts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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


_SHORT = {"all_gather": "AG", "all_reduce": "AR", "reduce_scatter": "RS", "all_to_all": "A2A",
          "all_permute": "AP"}


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _fmt_time(s) -> str:
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

    tactics: list[TacticReport] = field(default_factory=list)
    in_shardings: Any = None
    out_shardings: Any = None
    device_local_stablehlo: str | None = None
    hardware: str | None = None
    mesh: dict[str, int] | None = None

    def report(self) -> str:
        """A table, one row per tactic, with the change from the previous tactic."""
        if not self.tactics:
            return "(not partitioned yet: call the function or .lower(*args) first)"
        head = ["tactic", "AG", "AR", "RS", "A2A", "AP", "est. runtime", "Δ runtime",
                "est. peak mem", "Δ mem", "conflicts"]
        rows = []
        prev = None
        for t in self.tactics:
            c = t.collectives
            d_rt = d_mem = "-"
            if prev is not None and t.estimated_runtime_s is not None and \
                    prev.estimated_runtime_s:
                d_rt = f"{t.estimated_runtime_s / prev.estimated_runtime_s:.2f}x"
            if prev is not None and t.estimated_peak_memory_bytes is not None and \
                    prev.estimated_peak_memory_bytes:
                d_mem = f"{t.estimated_peak_memory_bytes / prev.estimated_peak_memory_bytes:.2f}x"
            rows.append([t.name, *(str(c.get(k, 0)) for k in _SHORT), _fmt_time(
                t.estimated_runtime_s), d_rt, _fmt_bytes(t.estimated_peak_memory_bytes), d_mem,
                str(len(t.conflicts))])
            prev = t
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        line = lambda r: "  ".join(x.ljust(w) if i == 0 else x.rjust(w)
                                   for i, (x, w) in enumerate(zip(r, widths)))
        out = [f"mesh {self.mesh}" + (f", hardware {self.hardware}" if self.hardware else ""),
               line(head), line(["-" * w for w in widths])]
        out += [line(r) for r in rows]
        last = self.tactics[-1]
        if last.unsupported_ops:
            out.append("ops without a TMR rule, kept replicated: " + ", ".join(
                f"{k} x{v}" for k, v in sorted(last.unsupported_ops.items())))
        for t in self.tactics:
            for c in t.conflicts[:5]:
                out.append(f"conflict after {t.name}: {c}")
            if len(t.conflicts) > 5:
                out.append(f"... and {len(t.conflicts) - 5} more conflicts after {t.name}")
        return "\n".join(out)

    def to_json(self) -> dict:
        return {"mesh": self.mesh, "hardware": self.hardware,
                "tactics": [asdict(t) for t in self.tactics]}
