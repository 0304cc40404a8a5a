"""Built-in simulators: `analytical` (roofline kernels, ring collectives, live-range memory)."""

from __future__ import annotations

from ...hookspecs import hookimpl
from .analytical import simulate as analytical_simulate


@hookimpl
def partir_add_simulators():
    return {"analytical": analytical_simulate}
