"""One row of the report: the whole program as it stands after one tactic."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..cost import TimelineEvent
from ..tactics.automatic import SearchResult
from ..tactics.rematerialization import RematerializationFigures
from .records import CollectiveRecord, CollectiveSite

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
    # What RM saves and recomputes (its row only; None for other tactics).
    rematerialization: RematerializationFigures | None = None
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
        if self.rematerialization is not None:
            data["rematerialization"] = {**asdict(self.rematerialization),
                                         "activation_bytes_saved":
                                         self.rematerialization.activation_bytes_saved}
        data["records"] = [r.to_json() for r in self.records]
        return data
