"""The plugin manager: pluggy over the `partir_plugin` entry-point group, and the name
registries built from the plugins' answers (one rule for duplicates, see `hookspecs`).

The kernel never names a built-in plugin: defaults come from the `partir_default_*` hooks and
every name from the `partir_add_*` hooks.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

import pluggy

from ..errors import PluginError, UnknownNameError
from . import hookspecs

if TYPE_CHECKING:
    from ..core.tmr import TileMappingRegistry
    from ..cost import HardwareSpec

ENTRY_POINT_GROUP = "partir_plugin"
BUILTIN_DISTRIBUTION = "partir-plugin"
DISABLE_AUTOLOAD_ENV = "PARTIR_DISABLE_PLUGIN_AUTOLOAD"


def _is_builtin(ep: EntryPoint) -> bool:
    """Built-in = an entry point of this distribution: decided by who ships it, not by
    the module's name."""
    dist = getattr(ep, "dist", None)
    name = (dist.name if dist is not None else "").replace("_", "-").lower()
    return name == BUILTIN_DISTRIBUTION


@functools.lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, built on first use (keeps `import` light)."""
    return build_plugin_manager()


def build_plugin_manager(extra: Sequence[tuple[str, object]] = ()) -> pluggy.PluginManager:
    """A manager with the entry points' plugins (built-ins first), then `extra` (name,
    plugin) pairs, checked: a hook implementation without a hook spec is a PluginError."""
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
    for name, plugin in extra:
        pm.register(plugin, name=name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        name = pm.get_name(e.plugin) or repr(e.plugin)
        raise PluginError(f"plugin {name!r}: {e} (a misspelled hook name? the hooks are those "
                          f"of partir_plugin.plugin.hookspecs: {sorted(_hook_names())})") from None
    return pm


def _hook_names() -> list[str]:
    return [n for n in dir(hookspecs) if n.startswith("partir_")]


def _answers(hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
    """(plugin name, answer) for every implementation of `hook`, in registration order
    (built-ins first), so a duplicate can name both plugins."""
    pm = plugin_manager()
    out = []
    for impl in getattr(pm.hook, hook).get_hookimpls():
        out.append((impl.plugin_name, impl.function(**{k: kwargs[k] for k in impl.argnames})))
    return out


def _register(kind: str, merged: dict[str, tuple[str, Any]], name: str, plugin: str,
              value: Any) -> None:
    """Add `name` from `plugin`; an earlier entry is replaced only through `override(...)`."""
    is_override = isinstance(value, hookspecs.Override)
    if is_override:
        value = value.value
    if name in merged and not is_override:
        raise PluginError(f"{kind} {name!r} is contributed by both plugin {merged[name][0]!r} "
                          f"and plugin {plugin!r}; rename one, or return "
                          f"`override(...)` from {plugin!r} to replace it on purpose")
    merged[name] = (plugin, value)


def _named(kind: str, hook: str) -> dict[str, Any]:
    merged: dict[str, tuple[str, Any]] = {}
    for plugin, answer in _answers(hook):
        for name, value in (answer or {}).items():
            _register(kind, merged, name, plugin, value)
    return {name: value for name, (_, value) in merged.items()}


def default_registry() -> TileMappingRegistry:
    """A TMR registry with the kernel's rule providers and every plugin's rules (here, not in
    core/, so that PartIR:Core never depends on the plugin manager)."""
    from ..core.rules import PROVIDERS
    from ..core.tmr import TileMappingRegistry

    registry = TileMappingRegistry(providers=PROVIDERS)
    plugin_manager().hook.partir_add_tmr_rules(registry=registry)
    return registry


def tactic_factories() -> dict[str, Callable[..., Any]]:
    return _named("tactic preset", "partir_add_tactics")


def searchers() -> dict[str, Callable[..., Any]]:
    return _named("searcher", "partir_add_searchers")


def simulators() -> dict[str, Callable[..., Any]]:
    return _named("simulator", "partir_add_simulators")


def _hardware_index() -> tuple[dict[str, HardwareSpec], dict[str, str]]:
    """Specs by name, and every lower-cased name and alias -> the spec's name."""
    merged: dict[str, tuple[str, Any]] = {}
    for plugin, answer in _answers("partir_add_hardware"):
        for spec in answer or []:
            inner = spec.value if isinstance(spec, hookspecs.Override) else spec
            _register("hardware spec", merged, inner.name, plugin, spec)
    specs = {name: spec for name, (_, spec) in merged.items()}
    keys: dict[str, str] = {}
    owner: dict[str, str] = {}
    for name, (plugin, spec) in merged.items():
        for key in (name, *getattr(spec, "aliases", ())):
            low = key.lower()
            if low in keys and keys[low] != name:
                raise PluginError(f"hardware name {key!r} means both {keys[low]!r} (plugin "
                                  f"{owner[low]!r}) and {name!r} (plugin {plugin!r})")
            keys[low], owner[low] = name, plugin
    return specs, keys


def hardware_specs() -> dict[str, HardwareSpec]:
    """Every registered spec by its canonical name."""
    return _hardware_index()[0]


def find_hardware(name: str) -> HardwareSpec:
    """The spec called `name` or one of its aliases, case-insensitively."""
    specs, keys = _hardware_index()
    if name.lower() in keys:
        return specs[keys[name.lower()]]
    known = sorted({*specs, *(a for s in specs.values() for a in getattr(s, "aliases", ()))},
                   key=str.lower)
    raise UnknownNameError(f"unknown hardware {name!r}; available: {known} (add more with a "
                           f"`partir_add_hardware` plugin)")


def default_hardware_name() -> str | None:
    """What `partir_default_hardware` answers (None: no plugin offers a default)."""
    return plugin_manager().hook.partir_default_hardware()


def default_simulator_name() -> str | None:
    """What `partir_default_simulator` answers (None: no simulator plugin is installed)."""
    return plugin_manager().hook.partir_default_simulator()


def default_searcher_name() -> str | None:
    """What `partir_default_searcher` answers (None: no searcher plugin is installed)."""
    return plugin_manager().hook.partir_default_searcher()


def add_cli_commands(subparsers: Any) -> None:
    """Let every plugin add its `partir` subcommands."""
    plugin_manager().hook.partir_add_cli_commands(subparsers=subparsers)


def loaded_plugins() -> list[tuple[str, str]]:
    """(name, module or object) for every registered plugin, for `partir plugins`."""
    pm = plugin_manager()
    return [(name, getattr(p, "__name__", repr(p))) for name, p in pm.list_name_plugin()]
