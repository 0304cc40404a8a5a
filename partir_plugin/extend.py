"""The plugin-author API (named after `jax.extend`): everything a plugin needs, in one place.

A plugin imports only `partir_plugin` (the user API) and this module; the kernel's other
modules are internal and may move. An import-linter contract in `pyproject.toml` holds the
built-in plugins to that rule, and the third-party example under `tests/third_party_plugin/`
follows it.

What is here, by the hook that needs it:

- every hook: `hookimpl`, `override` (replace another plugin's entry on purpose),
  `PartitionError`, `PluginError`.
- `partir_add_tactics`: `TacticContext` (`tile`, `atomic`, `propagate`, `leaves_of`),
  `Leaf`, `ManualPartition` and the selector constants.
- `partir_add_tmr_rules`: `TileMappingRegistry`, `TMREntry`, `Sum`, the IR (`Op`, `Value`,
  `TensorType`), and the rule helpers the built-in rules share (`entries_from_shardy`,
  `splat_value`, `lookup_dim`), and the verifier that runs a rule's entries on tiles and
  compares them with the op run whole (`verify_rule`, `verify_entry`, `verify_registry`).
- `partir_add_searchers`: `Budget`, `SearchResult`, `PartitionState` (copy, `tile_value`,
  `can_tile`), `propagate`, `lower_to_spmd` (-> `SpmdProgram`; a `LoweringCache` reuses the
  device-local code of states that share it), `simulate`,
  `resolve_hardware`, `resolve_simulator`.
- `partir_add_hardware`: `HardwareSpec`, `LinkClass`.
- `partir_add_simulators`: the device-local program (`Func`, `Block`, `Op`, `Value`,
  `Region`), `Mesh`, `Collective` with `collective_kind` / `collective_axes` (how the lowering
  marks its collectives), `SimulationResult`, `CollectiveCost`, `TimelineEvent`, `Simulator`.
- `partir_add_cli_commands`: `parse_mesh` (the one `AXIS=SIZE,...` parser).
- tools reading reports: `CollectiveRecord` (with `Reason`, `SourceLocation`), one per
  collective of a report row (`TacticReport.records`).
"""

from __future__ import annotations

from .core.actions import Leaf, TacticContext
from .core.mesh import Mesh, parse_mesh
from .core.propagation import propagate
from .core.rules.embedding import lookup_dim
from .core.rules.halo import padded_scatter_entries
from .core.rules.reductions import splat_value
from .core.rules.shardy import entries_from_shardy
from .core.state import PartitionState
from .core.tmr import OWN_REDUCER, Sum, TileMappingRegistry, TMREntry
from .cost import (
    CollectiveCost,
    HardwareSpec,
    LinkClass,
    SimulationResult,
    Simulator,
    TimelineEvent,
)
from .errors import PartitionError, PluginError, UnknownNameError
from .ir.dialect import PADDED_SCATTER_OP
from .ir.graph import Block, Func, Op, Region, Value
from .ir.types import TensorType
from .plugin.hookspecs import Override, hookimpl, override
from .plugin.resolve import resolve_hardware, resolve_simulator, simulate
from .report.records import CollectiveRecord, Reason, SourceLocation
from .spmd.collectives import Collective, collective_axes, collective_kind
from .spmd.lowering import LoweringCache, SpmdProgram, lower_to_spmd
from .spmd.rules.regather import Regather
from .tactics.automatic import Budget, Decision, DecisionKind, FrozenPartition, SearchResult
from .tactics.manual import FIRST_DIVISIBLE_DIM, REPLICATED, UNKNOWN, ManualPartition
from .tactics.pipeline_parallel import PipelineParallel
from .tactics.rematerialization import Rematerialization, RematerializationFigures
from .verify.tmr import (
    EntryVerdict,
    VerificationReport,
    verify_entry,
    verify_registry,
    verify_rule,
)

__all__ = [
    "FIRST_DIVISIBLE_DIM", "OWN_REDUCER", "PADDED_SCATTER_OP", "REPLICATED", "UNKNOWN", "Block",
    "Budget", "Collective", "EntryVerdict", "CollectiveCost", "CollectiveRecord", "Decision",
    "DecisionKind", "FrozenPartition", "Func", "HardwareSpec", "Leaf", "LinkClass",
    "LoweringCache", "ManualPartition", "Mesh", "Op", "Override", "PartitionError",
    "PartitionState", "PipelineParallel", "PluginError", "Reason", "Regather", "Region",
    "Rematerialization", "RematerializationFigures",
    "SearchResult", "SimulationResult", "Simulator", "SourceLocation", "SpmdProgram", "Sum",
    "TMREntry", "TacticContext", "TensorType", "TileMappingRegistry", "TimelineEvent",
    "UnknownNameError", "Value", "VerificationReport", "collective_axes", "collective_kind",
    "entries_from_shardy", "hookimpl", "lookup_dim", "lower_to_spmd", "override",
    "padded_scatter_entries", "parse_mesh", "propagate", "resolve_hardware", "resolve_simulator",
    "simulate", "splat_value", "verify_entry", "verify_registry", "verify_rule",
]
