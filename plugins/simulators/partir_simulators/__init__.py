"""Built-in simulators: `analytical` (roofline kernels, ring collectives, live-range memory)."""

from __future__ import annotations

from partir_plugin.extend import Simulator, hookimpl

from .analytical import simulate as analytical_simulate

ANALYTICAL = "analytical"


@hookimpl
def partir_add_simulators() -> dict[str, Simulator]:
    return {ANALYTICAL: analytical_simulate}


@hookimpl
def partir_default_simulator() -> str:
    return ANALYTICAL
