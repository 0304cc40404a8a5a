"""`partir.plan`: the fastest schedules that fit, for a step, a device count and a cluster.

The search: every split of N devices over stage x data x expert x model the step and the
cluster allow (`space.layouts`), each with its microbatch counts, pipeline schedules, ZeRO
stages and RM policies (`space.candidates`); candidates whose memory lower bound exceeds the
limit are pruned before anything is partitioned (`bounds.Bounds.memory`); the rest are
partitioned and simulated (`estimate.Estimator`, which shares a trace among candidates whose
schedules trace alike) in order of a rough time (`bounds.Bounds.time`) until the time budget
is spent. Plans that fit in their own estimate come back sorted by estimated step time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.mesh import Mesh
from ..errors import PartitionError
from ..estimation import Estimate, Estimator
from ..options import PartitionOptions
from .bounds import Bounds, Sizes
from .space import (
    MODEL,
    Candidate,
    Layout,
    PlanError,
    Roles,
    Rule,
    SpaceLimits,
    candidates,
    divisors,
    layouts,
)

# The share of `seconds` one AutomaticPartition search of the model axis may take (it runs
# once per model-axis size; its decisions are frozen and replayed on the other candidates).
AUTO_SHARE = 0.1
# The most devices a model axis searched by AutomaticPartition spans on a cluster that does
# not say its node size (Megatron's rule: tensor parallelism within an 8-GPU node).
AUTO_MODEL_MAX = 8


@dataclass(frozen=True)
class Plan:
    """One configuration: run it with `partir.jit(fn, plan.mesh, plan.schedule)`.

    `mesh` is axis sizes, major to minor; `schedule` ordinary tactics; `estimate` the
    simulated step (`partir.estimate`'s); `why` one line saying what the plan does and the
    figures it was chosen on; `label` the schedule in a few words."""

    mesh: dict[str, int]
    schedule: list
    estimate: Estimate
    why: str
    label: str


@dataclass
class SearchStats:
    """What a search did: configurations considered, pruned by the memory bound (or because
    the same configuration with more ZeRO sharding was over the limit), estimated, over the
    limit in their estimate, failed to partition (with the reasons), traces made."""

    considered: int = 0
    pruned: int = 0
    estimated: int = 0
    over_limit: int = 0
    failed: list[str] = field(default_factory=list)
    traces: int = 0
    seconds: float = 0.0
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)  # what was left out of the space, and why

    def summary(self) -> str:
        return (f"{self.considered} configurations, {self.pruned} pruned by memory, "
                f"{self.estimated} estimated ({self.over_limit} over the limit, "
                f"{len(self.failed)} failed), {self.traces} traces, {self.seconds:.1f} s"
                + (" (time budget spent)" if self.timed_out else ""))


class Plans(list):
    """The plans, fastest first (a list of `Plan`), with `stats`, what the search did."""

    def __init__(self, plans: Sequence[Plan], stats: SearchStats) -> None:
        super().__init__(plans)
        self.stats = stats


def plan(fn, *args, devices: int, hardware=None, memory_limit: int | None = None,
         seconds: float = 60.0, model_rule: Rule | None = None,
         expert_rule: Rule | None = None, batch: str = "batch", params: str = "params",
         opt_state: str = "opt_state", progress: bool | None = None,
         max_estimates: int | None = None, **options: Any) -> Plans:
    """Plans for `fn(*args)` on `devices` devices of `hardware`, fastest first.

    `args` are arrays or `jax.ShapeDtypeStruct` pytrees; the step's arguments named `batch`,
    `params` and `opt_state` are the batch (split by BP and PP), the parameters (by MP, EP,
    PP, Z3) and the optimizer state (by ZeRO). `memory_limit`: bytes per device (None: the
    spec's memory). `model_rule`: a Megatron-style rule `(path, shape) -> dim | None` for the
    model axis; None: AutomaticPartition searches that axis (once per axis size, frozen).
    `expert_rule` (for EP) offers an expert axis. `seconds` bounds the search, tracing
    included (one estimate is made whatever it says; the last may end past it), and
    `max_estimates` (None: no bound) the number of configurations simulated, a budget that
    does not depend on the machine's speed or load; a progress
    bar on stderr when it is a terminal, or with `progress=True`. `options` are
    `partir.estimate`'s. Raises `PlanError` when nothing fits, saying the closest.
    """
    start = time.perf_counter()
    if not isinstance(devices, int) or devices < 1:
        raise PlanError(f"plan: devices must be a positive int, got {devices!r}")
    est = Estimator(fn, args, hardware, PartitionOptions(**options))
    hw = est.hardware
    limit = int(memory_limit if memory_limit is not None else hw.memory_bytes)
    one = Mesh.of({"data": 1})
    replicated = est.estimate(one, [])
    traced, _ = est.traced(one, [])
    roles = Roles.of(traced.arg_names, batch, params, opt_state)
    batch_size = max(lf.shape[0] for lf in traced.leaves if lf.arg == roles.batch and lf.shape)
    stats = SearchStats()
    layers, no_pipelines = _layer_loop(est)
    if no_pipelines:
        stats.notes.append(no_pipelines)
    leaves = tuple((lf, lf.value.type.nbytes) for lf in traced.leaves)
    sizes = Sizes(leaves, tuple((tuple(a.shape), a.size * a.dtype.itemsize)
                                for a in traced.out_avals),
                  replicated.compute_s, replicated.simulation.kernels,
                  replicated.simulation.temp_peak_bytes)
    node = getattr(hw, "devices_per_node", None)
    limits = SpaceLimits(
        batch=batch_size, layers=layers,
        model_sizes=_rule_sizes(model_rule, traced.leaves, roles, devices, node),
        expert_sizes=(None if expert_rule is None or roles.params is None else
                      _rule_sizes(expert_rule, traced.leaves, roles, devices, None)),
        zero=roles.params is not None and roles.opt_state is not None,
        devices_per_node=node,
        # RM rematerializes the layer loop: a step without one has nothing for it to do.
        remat_policies=_remat_policies() if layers is not None else ())
    bounds = Bounds(sizes, roles, layers, model_rule, expert_rule, hw)
    fitting, closest = [], None
    for layout in layouts(devices, limits):
        plain = bounds.memory(Candidate(layout))
        for c in candidates(layout, limits, accumulate=plain > limit):
            stats.considered += 1
            need = bounds.memory(c)
            if need <= limit:
                fitting.append(c)
            else:
                stats.pruned += 1
                if closest is None or need < closest[0]:
                    closest = (need, c)
    if not stats.considered:
        raise PlanError(_no_split(devices, limits, model_rule is not None))
    if not fitting:
        raise PlanError(_nothing_fits(devices, limit, hw.name, closest, stats))
    search = _Search(est, roles, model_rule, expert_rule, limit, start + seconds, seconds,
                     stats, node, max_estimates)
    plans = search.run(_Queue(fitting, bounds, limit), progress)
    stats.traces, stats.seconds = est.traces_made, time.perf_counter() - start
    if not plans:
        raise PlanError(_none_estimated(devices, limit, hw.name, search, stats))
    plans.sort(key=lambda p: p.estimate.step_time_s)
    best = plans[0].estimate.step_time_s
    return Plans([_with_rank(p, best) for p in plans], stats)


class _Queue:
    """The candidates left, next = the likeliest to fit, then the best guessed time; the
    first candidate of each layout before a second of any (so every split of the devices is
    seen early). Likely memory is `Bounds.memory` with the activations whole on the model
    axis, its activations scaled per kind of candidate (pipelined or not, with or without a
    model axis, RM) by the smallest ratio seen so far of what an estimate left for them to
    that figure: after one pipeline's came out twice its figure, the other pipelines wait."""

    def __init__(self, candidates: list[Candidate], bounds: Bounds, limit: int) -> None:
        self.limit = limit
        # (likely memory, its activations part, guessed time) per candidate
        self.figures = {c: (bounds.memory(c, model_splits_activations=False),
                            bounds.activations(c, model_splits_activations=False),
                            bounds.time(c)) for c in candidates}
        self.left = set(self.figures)
        self.ratio: dict[tuple, float] = {}
        self.seen: set[Layout] = set()

    @staticmethod
    def kind(c: Candidate) -> tuple:
        return (c.layout.stage > 1, c.layout.model > 1, c.remat, c.remat_unit)

    def __len__(self) -> int:
        return len(self.left)

    def _key(self, c: Candidate) -> tuple:
        likely, activations, guess = self.figures[c]
        likely += activations * (self.ratio.get(self.kind(c), 1.0) - 1)
        fits = likely <= self.limit
        return (not fits, c.layout in self.seen, guess, c.label())

    def pop(self) -> Candidate:
        c = min(self.left, key=self._key)
        self.left.remove(c)
        self.seen.add(c.layout)
        return c

    def learn(self, c: Candidate, peak: int) -> None:
        """The estimated peak of `c` (popped before)."""
        likely, activations, _ = self.figures[c]
        if activations > 0:
            k = self.kind(c)
            ratio = (peak - (likely - activations)) / activations
            self.ratio[k] = min(self.ratio.get(k, float("inf")), max(ratio, 1.0))


@dataclass
class _Search:
    """The estimating loop over the candidates that passed the bounds, best guess first."""

    est: Estimator
    roles: Roles
    model_rule: Rule | None
    expert_rule: Rule | None
    limit: int
    deadline: float
    seconds: float
    stats: SearchStats
    node: int | None
    max_estimates: int | None = None
    frozen: dict[int, Any] = field(default_factory=dict)  # model size -> frozen search
    closest: tuple[int, Candidate] | None = None
    # Per configuration but its ZeRO stage, the highest stage estimated over the limit: a
    # lower one keeps more on each device, so it is over too and is not estimated.
    over: dict[Candidate, int] = field(default_factory=dict)
    last: Estimate | None = None  # the estimate `one` made (None: it made none)

    def run(self, queue: _Queue, progress: bool | None) -> list[Plan]:
        from tqdm.auto import tqdm

        show = sys.stderr.isatty() if progress is None else progress
        plans: list[Plan] = []
        with tqdm(total=len(queue), desc="partir.plan", disable=not show, leave=False,
                  unit="config", file=sys.stderr, dynamic_ncols=True) as bar:
            while queue:
                # At least one estimate, even where tracing the step took the whole budget.
                if time.perf_counter() >= self.deadline and self.stats.estimated:
                    self.stats.timed_out = True
                    break
                if self.max_estimates is not None and self.stats.estimated >= self.max_estimates:
                    break
                c = queue.pop()
                found = self.one(c)
                if found is not None:
                    plans.append(found)
                if self.last is not None:
                    queue.learn(c, self.last.peak_memory_bytes)
                bar.update(1)
                bar.set_postfix(fit=len(plans))
        return plans

    def model_tactic(self, size: int) -> tuple[Any, bool]:
        """The model axis's tactic, and whether it is a fresh search to freeze."""
        if self.model_rule is not None:
            from ..tactics import tactic

            return tactic("MP", self.model_rule, axis=MODEL, params=self.roles.params), False
        if size in self.frozen:
            return self.frozen[size], False
        from ..tactics.automatic import AutomaticPartition

        return AutomaticPartition([MODEL], seconds=max(1.0, AUTO_SHARE * self.seconds),
                                  options={"progress": False}), True

    def one(self, c: Candidate) -> Plan | None:
        self.last = None
        unsharded = replace(c, zero=0)
        if self.over.get(unsharded, -1) >= c.zero:
            self.stats.pruned += 1
            return None
        model, fresh = self.model_tactic(c.layout.model) if c.layout.model > 1 else (None,
                                                                                     False)
        schedule = c.schedule(self.roles, model, self.expert_rule)
        try:
            e = self.est.estimate(c.mesh, schedule)
        except PartitionError as err:
            self.stats.failed.append(f"{c.label()}: {err}")
            return None
        self.stats.estimated += 1
        self.last = e
        if fresh:
            found = next((row.search for row in e.tactics if row.search is not None), None)
            if found is not None:
                frozen = self.frozen[c.layout.model] = found.as_tactic()
                schedule = [frozen if t is model else t for t in schedule]
        if e.peak_memory_bytes > self.limit:
            self.stats.over_limit += 1
            self.over[unsharded] = max(self.over.get(unsharded, -1), c.zero)
            if self.closest is None or e.peak_memory_bytes < self.closest[0]:
                self.closest = (e.peak_memory_bytes, c)
            return None
        decisions = None if self.model_rule is not None else self.frozen.get(c.layout.model)
        why = _why(c, e, self.limit, self.node, decisions)
        return Plan(c.mesh, schedule, e, why, c.label("MP" if decisions is None else "Auto"))


def _why(c: Candidate, e: Estimate, limit: int, node: int | None, auto=None) -> str:
    """The plan's line; `auto` is the frozen AutomaticPartition of the model axis, if any."""
    from ..report.text import fmt_bytes, fmt_time

    lay, parts = c.layout, []
    if lay.model > 1:
        parts.append(f"model axis of {lay.model}"
                     + (f" within a node of {node}" if node else "")
                     + ("" if auto is None else
                        f" (AutomaticPartition: {len(auto.decisions)} decisions)"))
    if lay.stage > 1:
        parts.append(f"{lay.stage} stages, {c.microbatches} microbatches: bubble "
                     f"{c.bubble:.0%}")
    elif c.microbatches > 1:
        parts.append(f"{c.microbatches} accumulation steps")
    if c.zero:
        what = "optimizer state" if c.zero == 2 else "params and optimizer state"
        parts.append(f"{what} sharded {lay.data} ways")
    if c.remat:
        each = ", each layer" if c.remat_unit == "layer" else ""
        parts.append(f"recomputes activations ({c.remat}{each})")
    parts.append(f"est. {fmt_time(e.step_time_s)}/step (compute {fmt_time(e.compute_s)}, "
                 f"communication {fmt_time(e.communication_s)}), peak "
                 f"{fmt_bytes(e.peak_memory_bytes)} of {fmt_bytes(limit)}")
    return "; ".join(parts)


def _with_rank(p: Plan, best: float) -> Plan:
    ratio = p.estimate.step_time_s / best if best else 1.0
    return replace(p, why=p.why + ("" if ratio == 1.0 else f"; {ratio:.2f}x the best"))


def _no_split(devices: int, limits: SpaceLimits, ruled: bool) -> str:
    """Why no mesh of `devices` devices exists for this step: the constraints `layouts`
    applies, with this step's figures."""
    rules = [f"the data axis (times an expert axis) divide the batch of {limits.batch}"]
    if limits.model_sizes is not None:
        sizes = ", ".join(map(str, limits.model_sizes))
        rules.append(f"the model axis be a size model_rule splits every leaf it names by "
                     f"({sizes})" if ruled else f"the model axis be one of ({sizes})")
    if limits.devices_per_node:
        rules.append(f"the model axis divide a node's {limits.devices_per_node} devices")
    rules.append(f"stages divide the {limits.layers} stacked layers" if limits.layers
                 else "no stages (the step has no layer loop)")
    return (f"plan: no mesh of {devices} devices splits this step: it needs "
            + "; ".join(rules) + f". Try a device count those divide (a divisor of "
            f"{limits.batch}, the batch, always is)")


def _nothing_fits(devices: int, limit: int, hw: str, closest, stats: SearchStats) -> str:
    from ..report.text import fmt_bytes

    text = (f"plan: no configuration of {devices} devices fits {fmt_bytes(limit)} per device "
            f"on {hw}: all {stats.considered} need more by their lower bound")
    if closest is not None:
        text += f"; the smallest, {closest[1].label()}, needs {fmt_bytes(closest[0])}"
    return text


def _none_estimated(devices: int, limit: int, hw: str, search: _Search,
                    stats: SearchStats) -> str:
    from ..report.text import fmt_bytes

    text = f"plan: no plan for {devices} devices on {hw} within {fmt_bytes(limit)}: "
    text += stats.summary()
    if search.closest is not None:
        text += (f"; the smallest estimate, {search.closest[1].label()}, needs "
                 f"{fmt_bytes(search.closest[0])}")
    if stats.failed:
        text += f"; first failure: {stats.failed[0]}"
    if stats.timed_out:
        text += f"; give more than seconds={search.seconds:g}"
    return text


def _layer_loop(est: Estimator) -> tuple[int | None, str | None]:
    """The stacked layers of the step's layer loop (what PP pipelines), or None and why."""
    from ..tactics import tactic

    pp = tactic("PP", axis="stage", microbatches=1)
    try:
        est.traced(Mesh.of({"stage": 1}), [pp])
    except PartitionError as e:
        return None, f"no pipelines: {e}"
    if pp.last_found is None:
        return None, "no pipelines: the step has no layer loop (a lax.scan over stacked layers)"
    return pp.last_found.layers, None


def _rule_sizes(rule: Rule | None, leaves, roles: Roles, devices: int,
                node: int | None) -> tuple[int, ...] | None:
    """The axis sizes `rule` splits every leaf it names evenly by (1 always; None: no rule,
    any size up to a node, or `AUTO_MODEL_MAX`)."""
    if roles.params is None:
        return (1,)
    if rule is None:
        cap = node or AUTO_MODEL_MAX
        return tuple(d for d in divisors(devices) if d <= cap)
    dims = []
    for lf in leaves:
        if lf.arg != roles.params:
            continue
        dim = rule(lf.path, lf.shape)
        if isinstance(dim, int):
            dims.append(lf.shape[dim])
    return tuple(d for d in divisors(devices) if d == 1 or (dims and all(x % d == 0
                                                                        for x in dims)))


def _remat_policies() -> tuple[str, ...]:
    """RM's policies, where a plugin offers the RM preset."""
    from ..plugin.manager import tactic_factories

    return ("dots", "full") if "RM" in tactic_factories() else ()
