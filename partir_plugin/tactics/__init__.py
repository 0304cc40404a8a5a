"""Tactics: what a schedule is made of (`base.Tactic`), the user's own (`manual`), a
searcher's (`automatic`), the layer loop found while the step is traced (`layer_loop`) and the
tactics that change it: pipeline parallelism (`pipeline_parallel`) and rematerialization
(`rematerialization`, with `host_offload`); and the presets plugins contribute, built by name
(`tactic`)."""

from __future__ import annotations

from typing import Any

from ..errors import PartitionError


def tactic(preset: str, /, *args: Any, **kwargs: Any) -> Any:
    """A preset tactic contributed by a plugin, e.g. `tactic("BP", axis="batch")` or
    `tactic("MP", rule, axis="model")`; further arguments (including `name`, the report's
    label) go to the preset's factory, and a wrong one is reported against its signature."""
    import inspect

    from ..plugin.manager import tactic_factories

    factories = tactic_factories()
    if preset not in factories:
        raise PartitionError(f"no tactic preset {preset!r} (available: {sorted(factories)})")
    factory = factories[preset]
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return factory(*args, **kwargs)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"partir_plugin.tactic({preset!r}, ...): {e}; the preset's "
                        f"parameters are {preset}{signature}") from None
    return factory(*args, **kwargs)
