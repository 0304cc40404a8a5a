"""The planner's search space: how N devices split over the mesh axes (`Layout`), and the
ordinary schedule one configuration is (`Candidate`): PP with its microbatches, schedule and
repeats on `stage`, BP and ZeRO on `data`, EP on `expert`, MP (a Megatron-style rule or
AutomaticPartition) on `model`, RM."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ..errors import PartitionError


class PlanError(PartitionError):
    """No configuration fits, or none could be estimated in the time given, or the step's
    arguments are not what the planner needs."""


Rule = Callable[[str, tuple], "int | None"]

# Mesh axes, major to minor: the model axis is the minor one, so its groups are neighbours
# (a node's devices, where the mesh's device order fills a node first).
STAGE, DATA, EXPERT, MODEL = "stage", "data", "expert", "model"


@dataclass(frozen=True)
class Roles:
    """Which of the step's arguments is the batch, the parameters, the optimizer state
    (None: the step has no such argument)."""

    batch: str
    params: str | None
    opt_state: str | None

    @classmethod
    def of(cls, names: list[str], batch: str, params: str, opt_state: str) -> Roles:
        if batch not in names:
            raise PlanError(f"plan: the step's arguments are {names}; none is named "
                                 f"{batch!r}, the batch (pass batch='<argument name>')")
        return cls(batch, params if params in names else None,
                   opt_state if opt_state in names else None)


@dataclass(frozen=True)
class Layout:
    """N devices as stage x data x expert x model (axes of size 1 are left out of the mesh,
    except `stage` when a schedule pipelines or accumulates gradients over it)."""

    stage: int = 1
    data: int = 1
    expert: int = 1
    model: int = 1

    @property
    def devices(self) -> int:
        return self.stage * self.data * self.expert * self.model

    def mesh(self, with_stage: bool = False) -> dict[str, int]:
        sizes = {STAGE: self.stage, DATA: self.data, EXPERT: self.expert, MODEL: self.model}
        mesh = {a: n for a, n in sizes.items() if n > 1 or (a == STAGE and with_stage)}
        return mesh or {DATA: 1}


@dataclass(frozen=True)
class Candidate:
    """One configuration: a layout and what runs on each axis.

    `microbatches` > 1 with one stage is gradient accumulation (PP on a stage axis of size 1);
    `zero` is 0, 2 or 3 (ZeRO stage on the data axis); `remat` an RM policy or None, and
    `remat_unit` what it recomputes when pipelined (RM's `unit`: "iteration" or "layer")."""

    layout: Layout
    microbatches: int = 1
    pipeline: str = "gpipe"
    repeats: int = 1
    zero: int = 0
    remat: str | None = None
    remat_unit: str = "iteration"

    @property
    def pipelined(self) -> bool:
        return self.layout.stage > 1 or self.microbatches > 1

    @property
    def bubble(self) -> float:
        """GPipe's idle fraction (S-1)/(M·R+S-1)."""
        s = self.layout.stage
        return (s - 1) / (self.microbatches * self.repeats + s - 1)

    @property
    def mesh(self) -> dict[str, int]:
        return self.layout.mesh(with_stage=self.pipelined)

    def label(self, model: str = "MP") -> str:
        """The schedule in a few words: `PP(stage 4, M 8) BP(data 8) Z2 MP(model 8)`;
        `model` names the model axis's tactic ("Auto" where AutomaticPartition chose)."""
        lay, parts = self.layout, []
        if self.remat:
            per_layer = ", layer" if self.remat_unit == "layer" else ""
            parts.append(f"RM({self.remat}{per_layer})")
        if self.pipelined:
            kind = "GA" if lay.stage == 1 else "PP"
            extra = (f", {self.pipeline} x{self.repeats}" if self.repeats > 1 else "")
            parts.append(f"{kind}(stage {lay.stage}, M {self.microbatches}{extra})")
        if lay.data > 1:
            parts.append(f"BP(data {lay.data})")
        if lay.expert > 1:
            parts.append(f"EP(expert {lay.expert})")
        if lay.model > 1:
            parts.append(f"{model}(model {lay.model})")
        if self.zero:
            parts.append(f"Z{self.zero}(data)")
        return " ".join(parts) or "replicated"

    def schedule(self, roles: Roles, model: Any | None, expert_rule: Rule | None) -> list:
        """The schedule, as ordinary tactics (presets by name); `model` is the tactic for
        the model axis (MP with the user's rule, a frozen or fresh AutomaticPartition)."""
        from ..tactics import tactic

        lay, out = self.layout, []
        if self.remat:
            out.append(tactic("RM", policy=self.remat, unit=self.remat_unit))
        if self.pipelined:
            out.append(tactic("PP", axis=STAGE, microbatches=self.microbatches,
                              schedule=self.pipeline, repeats=self.repeats))
        if lay.data > 1:
            out.append(tactic("BP", axis=DATA, inputs=(roles.batch,)))
        if lay.expert > 1:
            out.append(tactic("EP", expert_rule, axis=EXPERT, params=roles.params,
                              batch=roles.batch))
        if lay.model > 1:
            out.append(model)
        if self.zero:
            out.append(tactic(f"Z{self.zero}", axis=DATA, params=roles.params,
                              opt_state=roles.opt_state))
        return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SpaceLimits:
    """What the step and the cluster allow: the batch, the stacked layers (None: no layer
    loop, so no PP), the model-axis sizes the rule's dimensions take, whether an expert rule
    and an optimizer state exist, the devices of a node, the RM policies offered."""

    batch: int
    layers: int | None
    model_sizes: tuple[int, ...] | None  # None: any (AutomaticPartition decides)
    expert_sizes: tuple[int, ...] | None  # None: no expert rule
    zero: bool
    devices_per_node: int | None
    remat_policies: tuple[str, ...]


def layouts(devices: int, limits: SpaceLimits) -> Iterator[Layout]:
    """Every split of `devices` the step and the cluster allow: the model axis within a node
    (when the spec says how many devices a node has), stages dividing the layers, data (x
    expert) dividing the batch."""
    for model in divisors(devices):
        if limits.model_sizes is not None and model not in limits.model_sizes:
            continue
        node = limits.devices_per_node
        if node and (model > node or node % model):
            continue
        for expert in divisors(devices // model):
            if expert > 1 and (limits.expert_sizes is None or expert not in limits.expert_sizes):
                continue
            for stage in divisors(devices // (model * expert)):
                if stage > 1 and (limits.layers is None or limits.layers % stage):
                    continue
                data = devices // (model * expert * stage)
                if limits.batch % (data * expert):
                    continue
                yield Layout(stage, data, expert, model)


def candidates(layout: Layout, limits: SpaceLimits, accumulate: bool) -> Iterator[Candidate]:
    """The configurations of one layout: microbatch counts and pipeline schedules (with
    stages), gradient accumulation (`accumulate`: when the layout alone cannot fit), ZeRO
    stages (with data parallelism), RM policies (pipelined: recomputing each iteration, or
    each layer of it, which keeps every layer's input but does not rewrite the layers'
    residuals)."""
    shards = layout.data * layout.expert
    rows = limits.batch // shards  # rows per data shard
    pipelines: list[Candidate] = []
    if layout.stage > 1:
        s = layout.stage
        for m in (s, 2 * s, 4 * s, 8 * s):
            if rows % m == 0:
                pipelines.append(Candidate(layout, microbatches=m))
                layers = limits.layers or 0
                if m >= s and layers % (2 * s) == 0:
                    pipelines.append(Candidate(layout, microbatches=m, pipeline="circular",
                                               repeats=2))
    else:
        pipelines.append(Candidate(layout))
        if accumulate and limits.layers is not None:
            pipelines += [Candidate(layout, microbatches=m) for m in (2, 4, 8, 16)
                          if rows % m == 0]
    zeros = (0, 2, 3) if limits.zero and layout.data > 1 else (0,)
    for base in pipelines:
        units = ("iteration", "layer") if base.pipelined else ("iteration",)
        for z in zeros:
            yield replace(base, zero=z)
            for remat in limits.remat_policies:
                for unit in units:
                    yield replace(base, zero=z, remat=remat, remat_unit=unit)
