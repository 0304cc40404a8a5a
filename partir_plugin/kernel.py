"""The plugin manager: pluggy over the `partir_plugin` entry-point group."""

from __future__ import annotations

import functools
import os
from importlib.metadata import entry_points

import pluggy

from . import hookspecs

ENTRY_POINT_GROUP = "partir_plugin"
BUILTIN_DISTRIBUTION = "partir-plugin"
DISABLE_AUTOLOAD_ENV = "PARTIR_DISABLE_PLUGIN_AUTOLOAD"


def _is_builtin(ep) -> bool:
    dist = getattr(ep, "dist", None)
    name = (dist.name if dist is not None else "").replace("_", "-").lower()
    return name == BUILTIN_DISTRIBUTION or ep.value.startswith("partir_plugin.plugins")


@functools.lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, built on first use (keeps `import` light)."""
    pm = pluggy.PluginManager("partir_plugin")
    pm.add_hookspecs(hookspecs)
    skip_third_party = os.environ.get(DISABLE_AUTOLOAD_ENV, "") not in ("", "0")
    eps = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (not _is_builtin(e), e.name))
    for ep in eps:
        if skip_third_party and not _is_builtin(ep):
            continue
        if pm.get_plugin(ep.name) is not None:
            continue
        pm.register(ep.load(), name=ep.name)
    return pm


def _merged(results) -> dict:
    merged: dict = {}
    for part in reversed(results):  # pluggy returns last-registered first
        merged.update(part or {})
    return merged


def tactic_factories() -> dict:
    return _merged(plugin_manager().hook.partir_add_tactics())


def searchers() -> dict:
    return _merged(plugin_manager().hook.partir_add_searchers())


def simulators() -> dict:
    return _merged(plugin_manager().hook.partir_add_simulators())


def hardware_specs() -> dict:
    specs: dict = {}
    for part in reversed(plugin_manager().hook.partir_add_hardware()):
        for spec in part or []:
            specs[spec.name] = spec
    return specs


def loaded_plugins() -> list[tuple[str, str]]:
    """(name, module or object) for every registered plugin, for `partir plugins`."""
    pm = plugin_manager()
    return [(name, getattr(p, "__name__", repr(p))) for name, p in pm.list_name_plugin()]
