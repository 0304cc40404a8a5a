"""Every extension point of partir_plugin, documented at its spec (as pytest's hookspec.py).

Plugins are modules or objects with functions marked `@hookimpl` and named as below. They are
found through the `partir_plugin` entry-point group; the built-in ones (under
`partir_plugin.plugins`) are registered through that same group. Set
`PARTIR_DISABLE_PLUGIN_AUTOLOAD=1` to load only the built-in ones.

Each "add" hook returns its contributions; the kernel collects all plugins' answers. A later
registered plugin's entry with the same name overrides an earlier one, so a third party can
replace a built-in (for example a hardware spec with measured numbers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .core.tmr import TileMappingRegistry

hookspec = pluggy.HookspecMarker("partir_plugin")
hookimpl = pluggy.HookimplMarker("partir_plugin")


@hookspec
def partir_add_tactics() -> dict[str, Callable[..., Any]]:
    """Return tactic factories by name, e.g. ``{"BP": batch_parallel}``.

    A factory returns a tactic: an object with ``name`` and ``apply(ctx)`` where ``ctx`` is a
    :class:`partir_plugin.core.actions.TacticContext` offering ``tile``, ``atomic`` and the
    argument leaves. ``ManualPartition`` is one such tactic; presets are factories that build
    ``ManualPartition`` objects. Users reach them as ``partir_plugin.tactic(name, **kwargs)``.
    """


@hookspec
def partir_add_tmr_rules(registry: TileMappingRegistry) -> None:
    """Add tile-mapping rules to ``registry`` (``registry.register(op_name, rule)``).

    A rule is ``rule(op) -> list[TMREntry] | None``; ``None`` defers to the next rule for that op
    name (and finally to the rule derived from Shardy). Use this for ``custom_call`` targets
    (match on ``op.attributes["call_target_name"]``) or to override a built-in rule. A rule must
    only state equivalences that hold: a wrong entry gives wrong numbers.
    """


@hookspec
def partir_add_searchers() -> dict[str, Callable[..., Any]]:
    """Return automatic-partitioning searchers by name, e.g. ``{"mcts": MCTSSearcher}``.

    ``AutomaticPartition(axes, searcher=name)`` instantiates one with its budget and calls
    ``searcher.search(ctx, axes)``, which must only issue ``tile``/``atomic`` actions on ``ctx``.
    """


@hookspec
def partir_add_hardware() -> list[Any]:
    """Return hardware specs (objects with a unique ``name``), selected by
    ``partir_plugin.jit(..., hardware=name)``."""


@hookspec
def partir_add_simulators() -> dict[str, Callable[..., Any]]:
    """Return simulators by name. A simulator is called as
    ``simulate(func, mesh, hardware) -> SimulationResult`` on a device-local program."""
