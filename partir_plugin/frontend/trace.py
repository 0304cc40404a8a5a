"""The first stage: a jax function traced (or a StableHLO module read) into our IR, with every
argument leaf named (DESIGN.md §3), ready to partition (`stages.partition`).

Tracing is where a tactic may change the program (PP substitutes the layer loop): each
tactic's `trace_hook` is entered around jax's trace, and what it gives is the tactic that runs
on this trace (`Traced.tactic_for`), so what one trace found never leaks into another's.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.actions import Leaf
from ..errors import PartitionError
from ..ir.graph import Func, walk
from ..ir.importer import import_lowered, import_stablehlo
from ..ir.locations import kernel_path_prefixes
from ..tactics.base import Tactic, as_tactic
from ..tactics.layer_loop import one_trace


def key_path_str(path) -> str:
    """A jax key path as "a/b/0" (DESIGN.md §3)."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def argument_names(fn, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n):
        if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY,
                                                   params[i].POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        else:
            names.append(f"arg{i}")
    return names


class ArgumentNamesError(ValueError):
    """Names given for a StableHLO entry's arguments that do not fit it."""


@dataclass
class Traced:
    """The logical program and its arguments' names. `in_tree`, `out_tree` and `out_avals`
    are jax's (None for a StableHLO module); `hooked` pairs each schedule entry whose trace
    hook ran with the tactic that runs on this trace."""

    func: Func
    leaves: list[Leaf]
    arg_names: list[str]
    in_tree: Any
    out_tree: Any
    out_avals: list
    out_names: list[str] | None = None  # each output leaf as "output <path>"
    hooked: list[tuple[Any, Tactic]] = field(default_factory=list)
    # The Python callables of the step's host callbacks (`jax.debug.print`, `pure_callback`,
    # `io_callback`), in the order their custom calls index them (`mhlo.backend_config`'s
    # `index`): the partitioned program's executable must hold them (`runtime/embed.py`).
    host_callbacks: tuple = ()

    def tactic_for(self, entry: Any) -> Tactic:
        """The tactic that runs `entry` (a schedule entry) on this trace: what its trace
        hook gave, or the entry itself where it had none or was not traced with."""
        for traced_with, run in self.hooked:
            if traced_with is entry:
                return run
        return as_tactic(entry)

    @classmethod
    def from_stablehlo(cls, source: str | bytes, entry: str = "main",
                       arg_names: Sequence[str] | None = None) -> Traced:
        """A StableHLO module's `entry` (text or bytecode), its arguments named `arg_names`
        (default arg0, arg1, ...). No jax trace: no tactic's trace hook runs."""
        func = import_stablehlo(source, entry)
        refuse_manual_code(func)
        names = list(arg_names) if arg_names is not None else [
            f"arg{i}" for i in range(len(func.args))]
        if len(names) != len(func.args):
            raise ArgumentNamesError(f"@{entry} has {len(func.args)} arguments but "
                                     f"{len(names)} names were given ({','.join(names)})")
        if len(set(names)) != len(names):
            raise ArgumentNamesError(f"names must be distinct, got {names}")
        func.arg_names = list(names)
        return cls(func, [Leaf(n, "", v) for n, v in zip(names, func.args)], names,
                   None, None, [])


# How jax writes a `shard_map` body without Shardy: custom calls entering and leaving it
# (with Shardy, an `sdy.manual_computation`, which `spmd/rules/manual_body.py` inlines).
MANUAL_CUSTOM_CALLS = ("SPMDFullToShardShape", "SPMDShardToFullShape")


def refuse_manual_code(func: Func) -> None:
    """Fail, naming the line, where the program enters code written per device through
    custom calls (a `jax.shard_map` lowered without Shardy): nothing says which values are
    the body's, so it cannot be placed; lowering it as logical code would compute on the
    wrong shapes."""
    for op in walk(func.ops):
        if op.name != "stablehlo.custom_call":
            continue
        target = op.attributes.get("call_target_name", "")
        if any(n in target for n in MANUAL_CUSTOM_CALLS):
            raise PartitionError(
                f"the step calls jax.shard_map at {op.where}, lowered without Shardy "
                f"({target}): partir_plugin places a shard_map's body from Shardy's "
                "manual computation; lower with jax_use_shardy_partitioner on (jax's "
                "default)")


def aval_key(x) -> tuple:
    """What a partitioned program is specialised on, per argument leaf (an array, a tracer,
    a Python scalar or a ShapeDtypeStruct): shape, dtype and weak type, as jax.jit traces it."""
    import jax

    aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    if not all(isinstance(d, int) for d in aval.shape):
        raise PartitionError(
            f"an argument of shape {tuple(aval.shape)} has symbolic dimensions "
            f"(jax.export.symbolic_shape): partir_plugin partitions programs of static shapes; "
            f"export the step for each concrete shape")
    return (tuple(aval.shape), aval.dtype, aval.weak_type)


@functools.cache
def hide_kernel_frames() -> None:
    """Keep the kernel's frames out of the locations jax records for every op it traces.

    jax writes an op's Python frames up to the outermost caller, ours (the driver's) included,
    into the program's locations, and from there into the compiled step's stack frames. Its
    own frames and Flax's are excluded the same way (`register_exclusion`), so a profile's
    stack shows the user's code only, and a move of the driver's code changes no program."""
    from jax.extend.source_info_util import register_exclusion

    for prefix in kernel_path_prefixes():
        register_exclusion(prefix)


def _lower(traced, platform: str | None):
    """`traced` lowered for `platform`, else (None, or jax cannot here) for this backend."""
    import jax

    if platform is None or platform == jax.default_backend():
        return traced.lower()
    try:
        return traced.lower(lowering_platforms=(platform,))
    except Exception as e:  # noqa: BLE001 - any op jax has no rule for there: say which
        warnings.warn(f"cannot lower the step for {platform!r} here ({type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}); the estimate is of the "
                      f"program as {jax.default_backend()!r} runs it", stacklevel=3)
        return traced.lower()


def trace(fn, args: tuple, schedule: Sequence = (), mesh=None,
          platform: str | None = None) -> Traced:
    """Lower `fn` with jax (no sharding: partitioning starts from the logical program,
    whatever sharding an argument carries) and import it; name every argument leaf.

    The trace hooks of `schedule`'s tactics (for `mesh`) are entered around jax's trace;
    with any, a fresh wrapper is traced, so a trace jax cached without them is not reused.
    `platform` ("cuda", "tpu", ...; None: this process's backend) lowers the program as that
    platform would run it, for an estimate (`HardwareSpec.platform`); where jax cannot lower
    it for that platform here, it is lowered for this process's backend, with a warning."""
    import jax

    hide_kernel_frames()

    def abstract(x):
        shape, dtype, weak = aval_key(x)
        return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak)

    names = argument_names(fn, len(args))
    abstract = jax.tree_util.tree_map(abstract, args)
    hooks = [(entry, hook) for entry in schedule
             if (hook := as_tactic(entry).trace_hook(mesh)) is not None]
    with contextlib.ExitStack() as stack:
        stack.enter_context(one_trace())
        hooked = [(entry, stack.enter_context(hook)) for entry, hook in hooks]
        traced_fn = (lambda *a: fn(*a)) if hooks else fn
        try:
            staged = jax.jit(traced_fn, keep_unused=True).trace(*abstract)
        except ValueError as e:
            if "passed to shard_map" not in str(e):
                raise
            staged = _trace_with_explicit_shardings(traced_fn, args, e)
        lowered = _lower(staged, platform)
    func = import_lowered(lowered)
    refuse_manual_code(func)
    leaves: list[Leaf] = []
    flat_in = []
    for name, arg in zip(names, abstract):
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
            flat_in.append((name, key_path_str(path), leaf))
    if any("token" in v.type.element for v in func.args):
        raise PartitionError(
            "the step has ordered effects (jax.debug.print(..., ordered=True) or "
            "io_callback(..., ordered=True)): jax threads a token through the step for them, "
            "which partir_plugin does not partition; pass ordered=False (each callback still "
            "runs once, on one device)")
    if len(flat_in) != len(func.args):
        raise PartitionError(f"traced function has {len(func.args)} array arguments but the "
                             f"arguments have {len(flat_in)} leaves")
    out_avals = jax.tree_util.tree_leaves(lowered.out_info)
    for v, aval in [*zip(func.args, (leaf for _, _, leaf in flat_in)),
                    *zip(func.returns, out_avals)]:
        if jax.dtypes.issubdtype(aval.dtype, jax.dtypes.extended):
            func.element_rank[v] = len(aval.shape)
    for (name, path, _), v in zip(flat_in, func.args):
        leaves.append(Leaf(name, path, v, func.element_rank.get(v)))
    func.arg_names = [lf.qualified for lf in leaves]
    func.result_paths = [key_path_str(path) for path, _ in
                         jax.tree_util.tree_flatten_with_path(lowered.out_info)[0]]
    out_names = [f"output {path!r}" if path else "output" for path in func.result_paths]
    return Traced(func, leaves, names, lowered.in_tree, lowered.out_tree, out_avals,
                  out_names, hooked, host_callbacks(lowered, func))


def _trace_with_explicit_shardings(fn, args: tuple, error: ValueError):
    """`fn` traced with its arguments' shardings, for a step whose `jax.shard_map` runs on a
    mesh with Explicit axes (`jax.make_mesh`'s default): jax checks its in_specs against the
    arguments' types, which carry a sharding only there. Partitioning still starts from the
    logical program; the trace takes the shardings only where a step needs them, since in
    Explicit mode they also constrain how jax traces other ops."""
    import jax

    def sharded(x):
        shape, dtype, weak = aval_key(x)
        sharding = (x.sharding if isinstance(x, jax.ShapeDtypeStruct)
                    else getattr(jax.typeof(x), "sharding", None))
        explicit = isinstance(sharding, jax.sharding.NamedSharding) and any(
            t == jax.sharding.AxisType.Explicit for t in sharding.mesh.axis_types)
        return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak,
                                    sharding=sharding if explicit else None)

    try:
        return jax.jit(fn, keep_unused=True).trace(*jax.tree_util.tree_map(sharded, args))
    except ValueError as again:
        if "passed to shard_map" not in str(again):
            raise
        raise PartitionError(
            f"the step's jax.shard_map checks its in_specs against its arguments' shardings "
            f"(its mesh has Explicit axes, as jax.make_mesh's do by default): "
            f"{str(error).splitlines()[0]} Pass the step arguments placed as the in_specs say "
            f"(jax.device_put(x, NamedSharding(mesh, spec))), or build the mesh with "
            f"axis_types=(jax.sharding.AxisType.Auto, ...)") from error


def host_callbacks(lowered, func: Func) -> tuple:
    """The host callbacks jax registered while lowering the step. jax keeps them with its
    lowering, not in the public `Lowered`; where a jax version keeps them elsewhere, a step
    with callbacks fails here (run without its callables, it would crash the process)."""
    lowering = getattr(lowered, "_lowering", None)
    found = tuple(getattr(lowering, "compile_args", {}).get("host_callbacks", ()))
    if not found:
        calls = [op for op in walk(func.ops) if op.name == "stablehlo.custom_call"
                 and "index = " in op.attributes.get("mhlo.backend_config", "")]
        if calls:
            raise PartitionError(
                f"the step's host callback at {calls[0].where} cannot be partitioned with this "
                "jax version: partir_plugin finds no callables in its lowering")
    return found
