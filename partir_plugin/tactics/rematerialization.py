"""RM: rematerialization of the layer loop (issue 37), without model edits.

While `partir_plugin.jit` traces the step, the layer loop's unit of work (the body of the
`lax.scan` over stacked layers, or with PP each pipeline iteration's stage body) runs under
`jax.checkpoint` with one of jax's policies, so the backward pass recomputes what the policy
does not save. The program that reaches the partitioner already holds the recomputation,
so every tactic composes with it and the simulator charges it as any other op; plain
`jax.jit` of the step still runs the model as written.

With `modules=` (Flax linen class or module names, NNX class names; globs), RM recomputes
the calls of those modules instead, wherever the step calls them (`module_calls`): inside the
layer loop that is each layer, and under PP each layer of each pipeline iteration, as
Megatron-LM recomputes.

Offload (`offload=True`) keeps the saved residuals in host memory (`pinned_host`) instead of
device memory: jax moves them there and back (`device_put` to a memory space, lowered as
`annotate_device_placement` custom calls on TPU and GPU). XLA:CPU has no such lowering in jax
0.10 (the moves vanish): there RM refuses offload, unless the step is estimated for a spec
with a `host_link` (`host_offload`: the program shows the moves, the simulator charges them,
and the step, if run on CPU, keeps its residuals on the device).
"""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
from jax.extend import core as jex_core

from ..core.actions import TacticContext
from ..errors import PartitionError
from .base import Tactic
from .host_offload import backend_offloads, showing_moves
from .layer_loop import LayerLoopHook, LoopRun, ScanCall, Unit, no_layer_loop
from .module_calls import MatchedCall, ModuleCalls


class Policy(enum.Enum):
    """What the recomputed unit saves for the backward pass (jax's `checkpoint_policies`)."""

    FULL = "full"  # nothing but its inputs (the layer's input): `nothing_saveable`
    DOTS = "dots"  # matmul outputs without batch dimensions: `dots_with_no_batch_dims_saveable`
    ALL_DOTS = "all_dots"  # every matmul output, attention's included: `dots_saveable`
    NAMES = "names"  # the values tagged `checkpoint_name(x, n)` for n in `names`
    NONE = "none"  # everything (no rematerialization)


# What RM recomputes in the layer loop: "iteration", each iteration of the loop (with PP a
# pipeline iteration: every layer of a stage on a microbatch, saving only its input); "layer",
# each layer (with PP: of each iteration, as Megatron-LM recomputes; saving every layer's
# input). Without PP an iteration is a layer.
UNITS = ("iteration", "layer")

# The memory kind saved residuals go to with offload=True.
HOST_MEMORY = "pinned_host"


def jax_policy(policy: Policy, names: tuple[str, ...], offload: bool) -> Callable | None:
    """jax's checkpoint policy for `policy` (None: save nothing, `nothing_saveable`)."""
    cp = jax.checkpoint_policies
    if offload:
        if policy is Policy.DOTS:
            return cp.offload_dot_with_no_batch_dims("device", HOST_MEMORY)
        return cp.save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=list(names),
            offload_src="device", offload_dst=HOST_MEMORY)
    return {Policy.FULL: cp.nothing_saveable,
            Policy.DOTS: cp.dots_with_no_batch_dims_saveable,
            Policy.ALL_DOTS: cp.dots_saveable,
            Policy.NAMES: cp.save_only_these_names(*names),
            Policy.NONE: cp.everything_saveable}[policy]


class OffloadWarning(UserWarning):
    """RM's offload is estimated but will not happen on the backend that runs the step."""


@dataclass(frozen=True)
class RematerializationFigures:
    """What RM changes in the step, counted on jax's trace of its unit of work (the loop body,
    or with PP the stage body of one iteration) times the loop's trip count, for the whole
    batch before partitioning (a device holds its share of it): the residuals the backward
    pass keeps with and without RM (the residuals of `jax.vjp`), those RM keeps in
    host memory, and the FLOPs of the forward work the backward pass does again (the vjp's
    FLOPs with RM minus without: matmuls 2·M·N·K, other arithmetic one per element)."""

    unit: str
    trips: int
    residual_bytes_without: int
    residual_bytes_with: int
    offloaded_bytes: int
    recompute_flops: float

    @property
    def activation_bytes_saved(self) -> int:
        """Device memory the backward pass no longer keeps (whole batch)."""
        return self.residual_bytes_without - self.residual_bytes_with

    def describe(self) -> str:
        mib = 2**20
        return (f"saves {self.activation_bytes_saved / mib:.1f} MiB of activations "
                f"({self.residual_bytes_without / mib:.1f} -> "
                f"{self.residual_bytes_with / mib:.1f} MiB kept for the backward pass"
                + (f", {self.offloaded_bytes / mib:.1f} MiB in host memory"
                   if self.offloaded_bytes else "")
                + f"), recomputes {self.recompute_flops / 1e9:.3g} GFLOP "
                f"({self.unit} x {self.trips}; whole batch, before partitioning)")


@dataclass
class _Found:
    """What one trace found: the layer loop's line, the RM figures, the scans passed over."""

    site: str | None = None
    figures: RematerializationFigures | None = None
    passed_over: list[str] = field(default_factory=list)


@dataclass
class Rematerialization(Tactic):
    """RM: recompute the layer loop's activations in the backward pass instead of keeping
    them (`policy`: "full", "dots", "all_dots", "names" with `names`, or "none"), optionally
    keeping what is saved in host memory (`offload`, with "dots" or "names").

    The layer loop is the one PP pipelines (a `lax.scan` over stacked layers, as Flax
    `nn.scan` writes it); with PP in the schedule, each pipeline iteration is recomputed, or
    with `unit="layer"` each layer of each iteration (`UNITS`).
    With `modules` (Flax linen class or module names, NNX class names; globs), the calls are
    recomputed instead, each on its own (under PP: each layer of each iteration).
    RM decides no tiling: it changes the traced program, and its report row says what it
    saves and what it recomputes (`RematerializationFigures`)."""

    policy: str = "full"
    names: tuple[str, ...] = ()
    offload: bool = False
    modules: tuple[str, ...] = ()
    unit: str = "iteration"
    name: str = "RM"
    chosen: Policy = field(init=False, repr=False)

    @property
    def unit_kind(self) -> Unit:
        return Unit.LAYER if self.unit == "layer" else Unit.ITERATION

    def __post_init__(self) -> None:
        known = [p.value for p in Policy]
        if self.policy not in known:
            raise PartitionError(f"{self.name}: unknown policy {self.policy!r} (available: "
                                 f"{', '.join(map(repr, known))})")
        self.chosen = Policy(self.policy)
        self.names = tuple(self.names)
        if isinstance(self.modules, str):
            self.modules = (self.modules,)
        self.modules = tuple(self.modules)
        if not all(isinstance(m, str) and m for m in self.modules):
            raise PartitionError(f"{self.name}: modules={self.modules!r}: give Flax module "
                                 f"class or module names (globs such as 'Block' or 'block_*')")
        if self.unit not in UNITS:
            raise PartitionError(f"{self.name}: unknown unit {self.unit!r} (available: "
                                 f"{', '.join(map(repr, UNITS))})")
        if self.modules and self.unit != "iteration":
            raise PartitionError(f"{self.name}: modules= recomputes each selected module "
                                 f"call: unit={self.unit!r} does not apply with it")
        if self.chosen is Policy.NAMES and not self.names:
            raise PartitionError(f"{self.name}: policy 'names' saves the values the model "
                                 f"tags with jax.ad_checkpoint.checkpoint_name: list them "
                                 f"in names=(...)")
        if self.names and self.chosen is not Policy.NAMES:
            raise PartitionError(f"{self.name}: names={self.names} go with policy='names', "
                                 f"not {self.policy!r}")
        if self.offload and self.chosen not in (Policy.DOTS, Policy.NAMES):
            raise PartitionError(f"{self.name}: offload=True moves the residuals a policy "
                                 f"saves to host memory: it needs policy 'dots' or 'names' "
                                 f"(got {self.policy!r}, which saves "
                                 + ("only the layer inputs, kept by the loop itself)"
                                    if self.chosen is Policy.FULL else "everything)"))

    def trace_hook(self, mesh) -> _RematHook | _ModuleRematHook | None:
        if self.chosen is Policy.NONE:
            return None
        return _ModuleRematHook(self) if self.modules else _RematHook(self)

    def apply(self, ctx: TacticContext) -> None:
        """Untraced (a StableHLO file, or a step traced without this tactic's hook): nothing
        to rematerialize, unless the policy is "none"."""
        _RematRun(self, _Found()).apply(ctx)


class _RematHook(LayerLoopHook):
    """While the step is traced: the layer loop's unit of work under `jax.checkpoint`."""

    def __init__(self, tactic: Rematerialization):
        super().__init__()
        self.tactic = tactic
        self.run = _RematRun(tactic, _Found(passed_over=self.passed_over))

    def entered(self) -> _RematRun:
        return self.run

    def __enter__(self) -> _RematRun:
        # Offloading: the moves to host memory stay in the program on every backend.
        self._moves = showing_moves() if self.tactic.offload else None
        if self._moves is not None:
            self._moves.__enter__()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        if self._moves is not None:
            self._moves.__exit__(*exc)

    def found(self, call: ScanCall) -> None:
        self.run.found.site = call.site

    def remat(self, fn: Callable, trips: int, unit: str, kind: Unit) -> Callable:
        rm, found = self.tactic, self.run.found
        if rm.unit_kind not in kind:
            return fn
        policy = jax_policy(rm.chosen, rm.names, rm.offload)

        def unit_of_work(*args):
            # `fn` is traced once, as the loop alone would trace it (a Flax body counts the
            # random keys it draws per trace); RM's checks, figures and checkpoint read that
            # trace.
            pure = _traced_once(fn, args)
            if rm.chosen is Policy.NAMES:
                _check_names(rm, pure.jaxpr, found.site)
            # The unit is a loop body: the loop keeps XLA from merging the recomputation
            # with the forward pass, so no optimization barrier is needed (jax.checkpoint's
            # docs).
            checkpointed = jax.checkpoint(pure, policy=policy, prevent_cse=False)
            if found.figures is None:
                found.figures = _figures(pure, checkpointed, args, trips, unit)
            return checkpointed(*args)

        return unit_of_work


class _ModuleRematHook:
    """While the step is traced: each call of a selected Flax module under `nn.checkpoint`."""

    def __init__(self, tactic: Rematerialization):
        self.tactic = tactic
        self.found = _Found()
        self.calls = ModuleCalls(tactic.modules, self._wrap)
        self.tags: set[str] = set()  # the checkpoint names the selected calls tag
        # A call's figures and tags by what determines them (`_call_key`): an unrolled model's
        # identical blocks are traced apart once, not once per block.
        self._seen: dict[tuple, tuple[RematerializationFigures | None, set[str]]] = {}

    def __enter__(self) -> _ModuleRematRun:
        self._moves = showing_moves() if self.tactic.offload else None
        if self._moves is not None:
            self._moves.__enter__()
        self.calls.__enter__()
        return _ModuleRematRun(self.tactic, self.found, self.calls, self.tags)

    def __exit__(self, *exc) -> None:
        self.calls.__exit__(*exc)
        if self._moves is not None:
            self._moves.__exit__(*exc)

    def _wrap(self, call: MatchedCall) -> Callable:
        import flax.linen as nn
        from flax import nnx

        rm = self.tactic
        policy = jax_policy(rm.chosen, rm.names, rm.offload)
        is_nnx = isinstance(call.module, nnx.Module)
        traced = _nnx_module_function(call) if is_nnx else _module_function(call)
        if traced is not None:
            pure, args = traced
            key = _call_key(call, args)
            if key not in self._seen:
                self._seen[key] = (
                    _module_figures(pure, args, policy, type(call.module).__name__),
                    _module_names(pure, args) if rm.chosen is Policy.NAMES else set())
            figures, tags = self._seen[key]
            if figures is not None:
                self.found.figures = _summed(self.found.figures, figures)
            self.tags |= tags
        method = call.method
        remat = nnx.remat if is_nnx else nn.checkpoint
        return remat(lambda module, *a, **k: method(module, *a, **k), policy=policy)


def _summed(a: RematerializationFigures | None,
            b: RematerializationFigures) -> RematerializationFigures:
    if a is None:
        return b
    unit = a.unit if b.unit in a.unit.split(", ") else f"{a.unit}, {b.unit}"
    return RematerializationFigures(
        unit, a.trips + b.trips, a.residual_bytes_without + b.residual_bytes_without,
        a.residual_bytes_with + b.residual_bytes_with, a.offloaded_bytes + b.offloaded_bytes,
        a.recompute_flops + b.recompute_flops)


def _module_function(call: MatchedCall) -> tuple[Callable, tuple] | None:
    """One module call as a pure function of (its variables, its array arguments), traced
    apart from the step: the module unbound, with a key for each of its random streams, and
    those arguments. None for a module without a scope."""
    import numpy as np

    module = call.module
    leaves, tree = jax.tree.flatten((call.args, call.kwargs))
    is_array = [isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "aval") for x in leaves]
    try:
        variables = module.variables
        streams = list(getattr(module.scope, "rngs", {}) or {})
        unbound = module.clone(parent=None)
    except Exception:  # noqa: BLE001 - a module without scope: nothing to trace apart
        return None

    def pure(variables, *arrays):
        it = iter(arrays)
        full = [next(it) if a else x for x, a in zip(leaves, is_array)]
        args, kwargs = jax.tree.unflatten(tree, full)
        rngs = {n: jax.random.PRNGKey(0) for n in streams}
        return unbound.apply(variables, *args, rngs=rngs, **kwargs)  # its __call__

    return pure, (variables, *(x for x, a in zip(leaves, is_array) if a))


def _nnx_module_function(call: MatchedCall) -> tuple[Callable, tuple] | None:
    """One NNX module call as a pure function of (its state, its array arguments), traced
    apart from the step (`nnx.split` / `nnx.merge`); None where the module will not split."""
    import numpy as np
    from flax import nnx

    leaves, tree = jax.tree.flatten((call.args, call.kwargs))
    is_array = [isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "aval") for x in leaves]
    try:
        graphdef, state = nnx.split(call.module)
    except Exception:  # noqa: BLE001 - nothing to trace apart: the call runs rematerialized
        return None
    method = call.method

    def pure(state, *arrays):
        it = iter(arrays)
        full = [next(it) if a else x for x, a in zip(leaves, is_array)]
        args, kwargs = jax.tree.unflatten(tree, full)
        return method(nnx.merge(graphdef, state), *args, **kwargs)

    return pure, (state, *(x for x, a in zip(leaves, is_array) if a))


def _call_key(call: MatchedCall, args: tuple) -> tuple:
    """What a module call's figures depend on: the module's class and configuration (its
    dataclass fields but its name and parent), the shapes and dtypes of its variables and
    arguments, and the non-array arguments; a key equal to no other where that is not
    hashable."""
    import dataclasses

    module = call.module
    if not dataclasses.is_dataclass(module):  # an NNX module: its configuration is unknown
        return (object(),)
    config = tuple((f.name, getattr(module, f.name, None)) for f in dataclasses.fields(module)
                   if f.name not in ("name", "parent"))
    leaves, tree = jax.tree.flatten(args)
    avals = tuple((tuple(x.shape), str(x.dtype)) for x in leaves)
    static = [x for x in jax.tree.leaves((call.args, call.kwargs))
              if not hasattr(x, "shape")]
    key = (type(module), config, tree, avals, tuple(map(repr, static)))
    try:
        hash(key)
    except TypeError:
        return (object(),)
    return key


def _module_figures(pure: Callable, args: tuple, policy,
                    unit: str) -> RematerializationFigures | None:
    """RM's figures for one module call (`_module_function`); None where its trace fails (the
    call still runs rematerialized)."""
    try:
        return _figures(pure, jax.checkpoint(pure, policy=policy), args, 1, unit)
    except Exception:  # noqa: BLE001 - figures are a report, never a reason to fail the step
        return None


def _module_names(pure: Callable, args: tuple) -> set[str]:
    """The checkpoint names one module call tags (for policy "names")."""
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    try:
        return _names_in(jax.make_jaxpr(pure)(*specs).jaxpr)
    except Exception:  # noqa: BLE001 - untraceable apart: checked by nothing, said nowhere
        return set()


@dataclass(frozen=True)
class _Traced:
    """A function traced once (its jaxpr and output structure), callable without tracing it
    again."""

    closed: jex_core.ClosedJaxpr
    out_tree: Any

    @property
    def jaxpr(self):
        return self.closed.jaxpr

    def __call__(self, *args):
        out = jex_core.jaxpr_as_fun(self.closed)(*jax.tree.leaves(args))
        return jax.tree.unflatten(self.out_tree, out)


def _traced_once(fn: Callable, args: tuple) -> _Traced:
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    return _Traced(closed, jax.tree.structure(shape))


def _check_names(rm: Rematerialization, jaxpr, site: str | None) -> None:
    """Every name RM saves is tagged in the loop's body (`checkpoint_name`): a name that
    matches nothing would silently recompute everything."""
    tagged = sorted(_names_in(jaxpr))
    missing = [n for n in rm.names if n not in tagged]
    if missing:
        raise PartitionError(
            f"{rm.name}: names {missing} are not tagged in the layer body of the scan at "
            f"{site} (tag a value with jax.ad_checkpoint.checkpoint_name(x, name); "
            f"tagged there: {tagged or 'none'})")


def _names_in(jaxpr) -> set[str]:
    found = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "name":
            found.add(eqn.params["name"])
        for sub in jex_core.jaxprs_in_params(eqn.params):
            found |= _names_in(sub)
    return found


# Ops that move or view data without arithmetic (not counted as FLOPs).
_DATA_MOVEMENT = frozenset({
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice",
    "dynamic_slice", "dynamic_update_slice", "concatenate", "pad", "copy", "copy_p",
    "convert_element_type", "gather", "scatter", "select_n", "iota", "rev", "device_put",
    "name", "optimization_barrier", "stop_gradient", "broadcast"})


def _jaxpr_flops(jaxpr) -> float:
    """FLOPs of a jaxpr: a matmul 2·M·N·K, other arithmetic one per output element, a scan's
    body times its length, a cond's costliest branch."""
    total = 0.0
    for eqn in jaxpr.eqns:
        subs = list(jex_core.jaxprs_in_params(eqn.params))
        if subs:
            inner = [_jaxpr_flops(s) for s in subs]
            if eqn.primitive.name == "cond":
                total += max(inner)
            else:
                total += eqn.params.get("length", 1) * sum(inner) if (
                    eqn.primitive.name == "scan") else sum(inner)
            continue
        name = eqn.primitive.name
        out = [math.prod(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape")]
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * out[0] * math.prod(lhs[d] for d in contract)
        elif name not in _DATA_MOVEMENT:
            total += sum(out)
    return total


def _residual_bytes(fn: Callable, specs) -> tuple[int, int]:
    """Bytes of the residuals the vjp of `fn` keeps: (in device memory, in host memory). The
    pullback `jax.vjp` returns is a pytree of them (what `jax.ad_checkpoint.
    print_saved_residuals` prints); its avals carry their memory space."""
    pullback = jax.make_jaxpr(lambda *args: jax.vjp(fn, *args)[1])(*specs)
    device = host = 0
    for aval in pullback.out_avals:
        nbytes = math.prod(aval.shape) * aval.dtype.itemsize
        if str(getattr(aval, "memory_space", "")).lower().endswith("host"):
            host += nbytes
        else:
            device += nbytes
    return device, host


def _vjp_flops(fn: Callable, specs) -> float:
    """FLOPs of `fn`'s forward and backward pass (its vjp applied to ones)."""

    def forward_backward(*args):
        out, pullback = jax.vjp(fn, *args)
        return pullback(jax.tree.map(lambda o: jax.numpy.ones(o.shape, o.dtype), out))

    return _jaxpr_flops(jax.make_jaxpr(forward_backward)(*specs).jaxpr)


def _figures(fn: Callable, checkpointed: Callable, args: tuple, trips: int,
             unit: str) -> RematerializationFigures:
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    without, _ = _residual_bytes(fn, specs)
    with_rm, offloaded = _residual_bytes(checkpointed, specs)
    recompute = _vjp_flops(checkpointed, specs) - _vjp_flops(fn, specs)
    return RematerializationFigures(unit, trips, without * trips, with_rm * trips,
                                    offloaded * trips, max(recompute, 0.0) * trips)


@dataclass(frozen=True, eq=False)
class _RematRun(LoopRun):
    """RM on one trace: the tactic's options with what that trace found (`_Found`)."""

    tactic: Rematerialization
    found: _Found

    def apply(self, ctx: TacticContext) -> None:
        rm, found = self.tactic, self.found
        if rm.chosen is Policy.NONE:
            ctx.state.notes.append(f"{rm.name}: policy 'none': nothing rematerialized")
            return
        if found.site is None:
            raise no_layer_loop(rm.name, "rematerializes the body of", found.passed_over)
        if rm.offload:
            self._check_offload(ctx)
        ctx.rematerialization = found.figures
        ctx.state.notes.append(self.describe())

    def _check_offload(self, ctx: TacticContext) -> None:
        """Offload where jax cannot lower it (XLA:CPU): refused, unless the step is estimated
        for a spec with a host link (then a warning says the CPU run keeps the residuals)."""
        from ..plugin.resolve import resolve_hardware_option

        rm, platform = self.tactic, jax.default_backend()
        spec = resolve_hardware_option(ctx.hardware)
        link = getattr(spec, "host_link", None)
        if backend_offloads(platform):
            if link is None and spec is not None:
                ctx.state.notes.append(f"{rm.name}: hardware {spec.name!r} has no host_link: "
                                       f"the estimate charges nothing for the offload moves")
            return
        if link is None:
            raise PartitionError(
                f"{rm.name}: offload=True needs a backend with host memory kinds: jax "
                f"{jax.__version__} lowers moves to host memory ('{HOST_MEMORY}') on TPU and "
                f"GPU only, and on XLA:{platform.upper()} drops them, so the residuals would "
                f"stay on the device. Run on a GPU or TPU, or estimate the step for one with "
                f"hardware= a spec with a host_link (e.g. 'h100')")
        warnings.warn(f"{rm.name}: offload estimated for {spec.name!r} (host link "
                      f"{link.bandwidth_bytes_per_s / 1e9:.0f} GB/s); run on "
                      f"XLA:{platform.upper()}, the step keeps its residuals on the device "
                      f"(jax lowers no moves to host memory there)", OffloadWarning,
                      stacklevel=2)

    def describe(self) -> str:
        rm, found = self.tactic, self.found
        what = _policy_text(rm)
        return (f"{rm.name}: the layer loop at {found.site} rematerialized ({what}"
                + (", residuals offloaded to host memory" if rm.offload else "") + ")"
                + (f": {found.figures.describe()}" if found.figures else ""))


def _policy_text(rm: Rematerialization) -> str:
    return f"policy {rm.policy!r}" + (f" names {list(rm.names)}" if rm.names else "")


@dataclass(frozen=True, eq=False)
class _ModuleRematRun(_RematRun):
    """RM with `modules=` on one trace: the calls its hook rematerialized (`calls`)."""

    calls: ModuleCalls | None = None
    tags: set[str] = field(default_factory=set)

    def apply(self, ctx: TacticContext) -> None:
        rm, calls = self.tactic, self.calls
        if calls is None or not calls.matched:
            seen = list(calls.seen) if calls is not None else []
            raise PartitionError(
                f"{rm.name}: modules={list(rm.modules)} matched no Flax module called by "
                f"the step (linen: by class or module name; NNX: by class name): "
                + (f"it calls the linen modules {', '.join(seen[:12])}"
                   + (" ..." if len(seen) > 12 else "")
                   if seen else "it calls no linen module and no NNX module of those classes "
                   "(modules= selects Flax modules; for a layer loop written otherwise leave "
                   "modules out)"))
        missing = sorted(set(rm.names) - self.tags)
        if rm.chosen is Policy.NAMES and missing:
            raise PartitionError(
                f"{rm.name}: names {missing} are not tagged (checkpoint_name) in the calls of "
                f"modules {list(rm.modules)}" + (f"; they tag {sorted(self.tags)}"
                                                  if self.tags else "; they tag none"))
        if rm.offload:
            self._check_offload(ctx)
        ctx.rematerialization = self.found.figures
        ctx.state.notes.append(self.describe())

    def describe(self) -> str:
        rm, calls, figures = self.tactic, self.calls, self.found.figures
        matched = calls.matched if calls is not None else []
        kinds = sorted({label.split(" ")[0] for label in matched})
        return (f"{rm.name}: {len(matched)} call(s) of {', '.join(kinds)} rematerialized "
                f"({_policy_text(rm)}" + (", residuals offloaded to host memory"
                                          if rm.offload else "") + ")"
                + (f": {figures.describe()}" if figures else "")
                + (" (a call in a loop body is traced, and counted, once)" if matched else ""))
