"""ManualPartition and its selector constants: the user's own tile/atomic decisions (paper 1
§3). Presets (BP, MP, Z2, Z3, ...) are plugins that build these objects."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.actions import Leaf, TacticContext
from ..core.state import PartitionState
from ..errors import PartitionError
from ..spmd.rules.regather import Regather
from .base import Tactic


class PartitionWarning(UserWarning):
    """A schedule that is valid but probably not what was meant (a rule matching no leaf)."""


class _Selector:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"partir_plugin.{self.name}"


REPLICATED = _Selector("REPLICATED")  # keep replicated on the tactic's axis (atomic)
FIRST_DIVISIBLE_DIM = _Selector("FIRST_DIVISIBLE_DIM")  # the first dim that divides (scans: last)
UNKNOWN = _Selector("UNKNOWN")  # no decision: let propagation decide


Selector = Any  # int | _Selector | dict | Callable[[str, tuple], Any] | None


def _path_parts(path: str) -> list[str]:
    return path.split("/") if path else []


@dataclass
class ManualPartition(Tactic):
    """Tile argument leaves on `axis` as `inputs` says (DESIGN.md §3).

    `inputs` maps argument names to selectors: an int dimension, `REPLICATED`,
    `FIRST_DIVISIBLE_DIM`, `UNKNOWN`, a nested dict mirroring part of the argument's pytree,
    or a callable `(path, shape) -> selector` over the leaves' key paths ("Dense_0/kernel").
    `tags` does the same for values named with `partir_plugin.tag`; a name may tag several
    values (every layer's), and the selector applies to each.

    A leaf path is the key path inside the argument: Flax variables passed whole as `params`
    have paths like `"params/Dense_0/kernel"` (the variables dict's "params" collection first).
    A callable selector that decides no leaf of its argument is almost always a path typo: it
    warns (`PartitionWarning`, naming the tactic and argument), or with `strict=True` raises.
    Without `name`, the report row is named from the inputs and axis (`"params@model"`).
    """

    inputs: dict[str, Selector]
    axis: str
    name: str | None = None
    # Tagged intermediates: a dict from tag names to selectors, or a callable `(name, shape) ->
    # selector` over every tag. A decided tag is a redistribution point (`TacticContext.tile`).
    tags: dict[str, Selector] | Callable[[str, tuple], Selector] = field(default_factory=dict)
    strict: bool = False
    # Arguments whose leaves this tactic tiles are gathered afresh for every consumer (ZeRO-3's
    # parameters): a name -> which leaves (`Regather`); a bare tuple of names means all.
    regather: Mapping[str, Regather] | tuple[str, ...] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.inputs, dict):
            raise PartitionError(f"ManualPartition: inputs must be a dict mapping argument "
                                 f"names to selectors, got {type(self.inputs).__name__}")
        if self.name is None:
            names = list(self.inputs) + ([] if callable(self.tags) else list(self.tags))
            self.name = f"{','.join(names) or 'tags'}@{self.axis}"
        if not isinstance(self.regather, Mapping):
            self.regather = dict.fromkeys(self.regather, Regather.ALL)
        self.regather = {arg: Regather(policy) for arg, policy in self.regather.items()}

    def apply(self, ctx: TacticContext) -> None:
        ctx.mesh.check_axis(self.axis)
        for arg, selector in self.inputs.items():
            leaves = ctx.leaves_of(arg)
            self._decided = 0
            self._select(ctx, selector, leaves, depth=0, where=arg)
            if leaves and not self._decided and _has_rule(selector):
                self._matched_nothing(arg, leaves)
        for arg, policy in self.regather.items():
            ctx.state.regather.update(leaf.value for leaf in ctx.leaves_of(arg)
                                      if ctx.state.dim_of(leaf.value, self.axis) is not None
                                      and policy.covers(leaf.value.type.rank))
        for tag, selector in self._tag_selectors(ctx.state).items():
            self._decide(ctx, selector, tag, ctx.state.tagged(tag)[0].type.shape, tag)

    def _matched_nothing(self, arg: str, leaves: list[Leaf]) -> None:
        example = next((lf.path for lf in leaves if lf.path), "")
        message = (f"{self.name}: the selector for argument {arg!r} decided none of its "
                   f"{len(leaves)} leaves on axis {self.axis!r}"
                   + (f" (its leaf paths look like {example!r})" if example else ""))
        if self.strict:
            raise PartitionError(message)
        warnings.warn(message, PartitionWarning, stacklevel=3)

    def reserve(self, state: PartitionState) -> None:
        """Before the schedule runs: make the tags this tactic decides redistribution points
        on its axis, so the propagation of earlier tactics stops there and leaves them to it
        (MQ after MP: Megatron's head sharding stops at the attention core's tags)."""
        state.mesh.check_axis(self.axis)
        for tag in self._tag_selectors(state):
            for v in state.tagged(tag):
                state.boundaries.add((v.producer, self.axis))

    def _tag_selectors(self, state: PartitionState) -> dict[str, Selector]:
        """The tags this tactic decides, with their selectors."""
        tags = self.tags
        if callable(tags):
            tags = {name: tags(name, values[0].type.shape) for name, values in state.tags.items()}
        return {name: sel for name, sel in tags.items() if sel is not None and sel is not UNKNOWN}

    def _select(self, ctx, selector, leaves: list[Leaf], depth: int, where: str) -> None:
        if isinstance(selector, dict):
            for key, sub in selector.items():
                key = str(key)
                chosen = [lf for lf in leaves
                          if len(_path_parts(lf.path)) > depth
                          and _path_parts(lf.path)[depth] == key]
                if not chosen:
                    have = sorted({_path_parts(lf.path)[depth] for lf in leaves
                                   if len(_path_parts(lf.path)) > depth})
                    raise PartitionError(f"{self.name}: {where!r} has no key {key!r} "
                                         f"(keys there: {have})")
                self._select(ctx, sub, chosen, depth + 1, f"{where}/{key}")
            return
        for leaf in leaves:
            sel = selector(leaf.path, leaf.shape) if callable(selector) and not isinstance(
                selector, _Selector) else selector
            self._decide(ctx, sel, leaf, leaf.shape, leaf.qualified)

    def _decide(self, ctx: TacticContext, sel, target, shape, what: str) -> None:
        if sel is None or sel is UNKNOWN:
            return
        self._decided = getattr(self, "_decided", 0) + 1
        if sel is REPLICATED:
            ctx.atomic(target, self.axis)
            return
        if sel is FIRST_DIVISIBLE_DIM:
            values = [target.value] if isinstance(target, Leaf) else ctx.state.tagged(target)
            # A dimension the program indexes at run time (a scan's stacked layers) last:
            # tiled, every iteration all-reduces the layer it reads or writes (the masked
            # window), where another dimension gathers one shard (Z3) or adds nothing (Z2).
            scanned = ctx.state.scanned_dims
            for d in sorted(range(len(shape)), key=lambda d: (tuple(shape), d) in scanned):
                if all(ctx.state.can_tile(v, d, self.axis, padding=False) is None
                       for v in values):
                    ctx.tile(target, d, self.axis)
                    return
            return
        if isinstance(sel, bool) or not isinstance(sel, int):
            raise PartitionError(f"{self.name}: selector for {what!r} must be an int dimension, "
                                 f"REPLICATED, FIRST_DIVISIBLE_DIM, UNKNOWN, a dict or a "
                                 f"callable; got {sel!r}")
        if not -len(shape) <= sel < len(shape):
            raise PartitionError(f"{self.name}: cannot tile {what!r} of shape {tuple(shape)} on "
                                 f"dimension {sel} along axis {self.axis!r}: it has "
                                 f"{len(shape)} dimensions")
        ctx.tile(target, sel, self.axis)


def _has_rule(selector: Selector) -> bool:
    """Whether `selector` holds a callable rule (which may decide nothing without error)."""
    if isinstance(selector, dict):
        return any(_has_rule(s) for s in selector.values())
    return callable(selector) and not isinstance(selector, _Selector)
