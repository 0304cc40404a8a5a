"""What `partir_plugin.jit` tells the user: the report rows of one partitioning and the ways
to show them (text, JSON, Chrome trace, HTML, figure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import chrome_trace, html, plot, text
from .records import SCHEMA
from .tactic_report import TacticReport


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

    def report(self, detail: bool = False, group_by: text.GroupBy | str = "line") -> str:
        """A table, one row per tactic, with the change from the previous tactic; with
        `detail`, then per tactic the collectives it added (`records`), costliest first,
        grouped by source line (`group_by="layer"`: by layer)."""
        if not self.tactics:
            return "(not partitioned yet: call the function or .lower(*args) first)"
        return text.render(self.tactics, mesh=self.mesh, hardware=self.hardware,
                           detail=detail, group_by=group_by)

    def write_trace(self, path) -> Path:
        """Write the simulated timeline of the program after each tactic as Chrome
        trace-event JSON (open it in https://ui.perfetto.dev or chrome://tracing):
        kernels and collectives on separate threads, each collective's record in its args,
        a counter of live bytes; one process per tactic."""
        return chrome_trace.write_trace(self.tactics, path, mesh=self.mesh,
                                        hardware=self.hardware)

    def write_html(self, path) -> Path:
        """Write one self-contained HTML report (no network loads): the per-tactic table and
        the costliest collectives with their source lines and the decision behind each."""
        return html.write_html(self.tactics, path, mesh=self.mesh, hardware=self.hardware)

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
        return plot.plot(self.tactics, path, mesh=self.mesh, hardware=self.hardware)
