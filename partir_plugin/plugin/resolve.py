"""Cost-model objects by name: hardware specs and simulators looked up through the plugin
manager, and `simulate`, which runs the chosen simulator on a device-local program.

The types live in `cost.py`, which knows no registry; this module joins them to the plugins.
"""

from __future__ import annotations

import inspect

from ..core.mesh import Mesh
from ..cost import HardwareSpec, SimulationResult, Simulator
from ..errors import UnknownNameError
from . import manager


def resolve_hardware(hardware: str | HardwareSpec | None) -> HardwareSpec:
    """A spec object as is; a name or alias (any case) as a hardware plugin registered it;
    None as the `partir_default_hardware` hook chooses. Unknown names raise
    `UnknownNameError` listing the known ones."""
    if hardware is not None and not isinstance(hardware, str):
        return hardware
    if hardware is None:
        hardware = manager.default_hardware_name()
        if hardware is None:
            raise UnknownNameError("no hardware given and no plugin offers a default "
                                   "(`partir_default_hardware`)")
    return manager.find_hardware(hardware)


def resolve_hardware_option(hardware: str | HardwareSpec | None) -> HardwareSpec | None:
    """What `partir.jit(hardware=...)` keeps: the spec, resolved once; None only when no
    hardware plugin offers a default (then reports have no estimates)."""
    if hardware is None and manager.default_hardware_name() is None:
        return None
    return resolve_hardware(hardware)


def resolve_simulator(simulator: str | Simulator | None = None) -> Simulator:
    """A simulator callable as is, the one registered under that name, or (None) the one the
    `partir_default_simulator` hook names."""
    if callable(simulator):
        return simulator
    registry = manager.simulators()
    if simulator is None:
        simulator = manager.default_simulator_name()
        if simulator is None:
            raise UnknownNameError(f"no simulator given and no plugin offers a default "
                                   f"(`partir_default_simulator`); available: "
                                   f"{sorted(registry)}")
    if simulator not in registry:
        raise UnknownNameError(f"unknown simulator {simulator!r}; available: "
                               f"{sorted(registry)} (add more with a `partir_add_simulators` "
                               f"plugin)")
    return registry[simulator]


_OPTIONAL = ("memo", "timeline")  # options a simulator may ignore


def simulate(func, mesh, hardware: str | HardwareSpec | None, *, overlap: bool = False,
             simulator: str | Simulator | None = None, **options) -> SimulationResult:
    """Estimate runtime, flops and peak memory of the device-local `func` on one device.

    `mesh` is a `Mesh`, a dict of axis sizes or a `jax.sharding.Mesh`; `hardware` and
    `simulator` are names registered by plugins or objects (None: the plugins' defaults).
    `overlap` lets communication run alongside independent compute; extra `options` (e.g.
    `donated_args`) go to the simulator. `memo`, a dict the caller keeps across simulations
    of programs that share ops, is a cache, and `timeline=True` asks for
    `SimulationResult.timeline`: a simulator without those parameters does without.
    """
    spec = resolve_hardware(hardware)
    sim = resolve_simulator(simulator)
    params = inspect.signature(sim).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = dict(options)
    for optional in _OPTIONAL:
        if optional not in params and not takes_any:
            kwargs.pop(optional, None)
    if overlap or "overlap" in params or takes_any:
        kwargs["overlap"] = overlap
    unknown = [k for k in kwargs if k not in params and not takes_any]
    if unknown:
        raise TypeError(f"simulator {simulator!r} does not accept {unknown}")
    return sim(func, Mesh.of(mesh), spec, **kwargs)
