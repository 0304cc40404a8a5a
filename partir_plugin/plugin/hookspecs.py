"""Every extension point of partir_plugin, documented at its spec (as pytest's hookspec.py).

Plugins are modules or objects with functions marked `@hookimpl` and named as below. They are
found through the `partir_plugin` entry-point group; the built-in ones (packages
`partir_tactics`, `partir_autopart`, `partir_simulators`, `partir_hardware`,
`partir_tmr_rules`, beside the kernel in this distribution) are registered through that same
group. Set `PARTIR_DISABLE_PLUGIN_AUTOLOAD=1` to load only the built-in ones. A plugin imports
only `partir_plugin` and `partir_plugin.extend`.

After loading, the kernel calls `PluginManager.check_pending()`: a function marked `@hookimpl`
whose name is not a hook below (a misspelling) is an error naming the plugin.

Names are unique. Each "add" hook returns its contributions by name; two plugins contributing
the same name (a tactic preset, searcher, simulator, hardware spec or hardware alias) is an
error naming both, unless the later one wraps its entry in `override(...)`: then it replaces the
earlier one on purpose (a hardware spec with measured numbers, say). Built-in plugins are
registered first, so a third-party plugin can override a built-in but never by accident.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pluggy

if TYPE_CHECKING:
    from ..core.tmr import TileMappingRegistry
    from ..cost import HardwareSpec, Simulator

hookspec = pluggy.HookspecMarker("partir_plugin")
hookimpl = pluggy.HookimplMarker("partir_plugin")

T = TypeVar("T")


@dataclass(frozen=True)
class Override(Generic[T]):
    """An entry that deliberately replaces another plugin's entry of the same name."""

    value: T


def override(value: T) -> Override[T]:
    """Mark a contribution as replacing an earlier plugin's entry with the same name, e.g.
    `return [override(my_a100)]` from `partir_add_hardware`."""
    return Override(value)


@hookspec
def partir_add_tactics() -> dict[str, Callable[..., Any]]:
    """Return tactic factories by name, e.g. ``{"BP": batch_parallel}``.

    A factory takes keyword arguments and returns a tactic: an object with ``name`` and
    ``apply(ctx)`` where ``ctx`` is a :class:`partir_plugin.extend.TacticContext` offering
    ``tile``, ``atomic`` and the argument leaves. ``ManualPartition`` is one such tactic;
    presets are factories that build ``ManualPartition`` objects. Users reach them as
    ``partir_plugin.tactic(name, **kwargs)``.
    """


@hookspec
def partir_add_tmr_rules(registry: TileMappingRegistry) -> None:
    """Add tile-mapping rules to a registry.

    :param registry: the registry being built; call ``registry.register(op_name, rule)``.
        A rule is ``rule(op) -> list[TMREntry] | None``; ``None`` defers to the next rule for
        that op name (and finally to the rule derived from Shardy). Use this for
        ``custom_call`` targets (match on ``op.attributes["call_target_name"]``) or to
        override a built-in rule. A rule must only state equivalences that hold: a wrong entry
        gives wrong numbers.
    """


@hookspec
def partir_add_searchers() -> dict[str, Callable[..., Any]]:
    """Return automatic-partitioning searchers by name, e.g. ``{"mcts": MCTSSearcher}``.

    ``AutomaticPartition(axes, searcher=name)`` instantiates one as
    ``factory(budget=Budget, **options)`` and calls ``searcher.search(ctx, axes)``, which must
    only issue ``tile``/``atomic`` actions on ``ctx`` and returns a ``SearchResult``.
    """


@hookspec
def partir_add_hardware() -> list[HardwareSpec]:
    """Return hardware specs, each with a unique ``name`` and optional ``aliases`` (names
    people type, matched case-insensitively: ``"a100"``, ``"TPUv3"``), selected by
    ``partir_plugin.jit(..., hardware=name)``."""


@hookspec
def partir_add_simulators() -> dict[str, Simulator]:
    """Return simulators by name. A simulator is called as
    ``simulate(func, mesh, hardware, **options) -> SimulationResult`` on a device-local
    program (``func`` an ``extend.Func``, ``mesh`` an ``extend.Mesh``, ``hardware`` an
    ``extend.HardwareSpec``)."""


@hookspec(firstresult=True)
def partir_default_hardware() -> str | None:
    """The name of the hardware spec used when the user names none (reports, searchers).

    The first plugin answering with a name wins; ``None`` passes. The built-in hardware
    plugin answers ``"host-cpu"`` (the spec ``partir calibrate`` measures), so estimates on
    this machine can be checked against real runs.
    """


@hookspec(firstresult=True)
def partir_default_simulator() -> str | None:
    """The name of the simulator used when the user names none. The first plugin answering
    with a name wins; the built-in simulators plugin answers ``"analytical"``."""


@hookspec(firstresult=True)
def partir_default_searcher() -> str | None:
    """The name of the searcher ``AutomaticPartition`` uses when given none. The first plugin
    answering with a name wins; the built-in autopart plugin answers ``"beam"``."""


@hookspec
def partir_add_cli_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add ``partir`` subcommands.

    :param subparsers: the ``partir`` parser's subparsers. Call
        ``p = subparsers.add_parser(name, help=...)``, add arguments to ``p``, and
        ``p.set_defaults(run=fn)`` where ``fn(args: argparse.Namespace) -> int`` runs the
        command and returns the exit status. A name already taken is an argparse error.
    """
