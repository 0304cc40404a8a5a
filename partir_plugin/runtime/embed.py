"""`partir_call`: a jax primitive that embeds a device-local StableHLO module in a jax program.

It is bound inside a `jax.shard_map` over every mesh axis, so each device runs the module on
its own tiles. Its MLIR lowering parses our module into the context being lowered, merges its
functions into the enclosing module (`mlir.merge_mlir_modules`, as jax's `jax.export` call
lowering does) and emits a `func.call`: the program jax compiles holds our collectives and
nothing of partir_plugin, so it dispatches through jax's C++ path, composes with a user's
`jax.jit` or `lax.scan`, donates buffers and serializes with `jax.export`.

The primitive has no differentiation or batching rule on purpose: a partitioned train step is
differentiated inside (`jax.grad` before `partir.jit`), and a clear error says so.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from ..errors import PartitionError

_CHANNEL = re.compile(r"#stablehlo\.channel_handle<handle = \d+")
# A host callback's custom call names its Python callable by index into the host callbacks
# of the module jax compiles (`jax._src.callback.emit_python_callback`).
_CALLBACK_INDEX = re.compile(r"mhlo\.backend_config = \{index = (\d+) : ui64\}")


@dataclass(frozen=True, eq=False)
class DeviceLocalModule:
    """A device-local module's text and the local (per-device) avals of its results.

    Compared by identity: a jaxpr holding a `partir_call` holds the module it was built
    with, and two partitions of the same function are different programs.
    """

    name: str
    text: str
    out_avals: tuple[jax.core.ShapedArray, ...]
    host_callbacks: tuple = ()  # the callables its host callbacks index, in index order
    channels: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", len(_CHANNEL.findall(self.text)))


partir_call_p = Primitive("partir_call")
partir_call_p.multiple_results = True


@partir_call_p.def_abstract_eval
def _abstract_eval(*avals, module: DeviceLocalModule):
    return module.out_avals


def _lower(ctx: mlir.LoweringRuleContext, *args, module: DeviceLocalModule):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import func as func_dialect

    # Every collective gets a channel of the enclosing module (unique, as jax's own are).
    fresh = iter([ctx.module_context.new_channel() for _ in range(module.channels)])
    text = _CHANNEL.sub(lambda _: f"#stablehlo.channel_handle<handle = {next(fresh)}",
                        module.text)
    if module.host_callbacks:  # registered with the module jax compiles, indexed anew
        first = len(ctx.module_context.host_callbacks)
        for callback in module.host_callbacks:
            ctx.module_context.add_host_callback(callback)
        text = _CALLBACK_INDEX.sub(
            lambda m: f"mhlo.backend_config = {{index = {first + int(m.group(1))} : ui64}}",
            text)
    sub = ir.Module.parse(text, context=ctx.module_context.context)
    main = ir.SymbolTable(sub.operation)["main"]
    result_types = main.type.results
    name = mlir.merge_mlir_modules(ctx.module_context.module, f"partir_{module.name}", sub,
                                   dst_symtab=ctx.module_context.symbol_table)
    # A call without a name: XLA's inliner prefixes the call's op_name to every inlined op's,
    # and our ops carry jax's own names already (`jit(step)/jvp(...)/dot_general`).
    call = func_dialect.CallOp(result_types, ir.FlatSymbolRefAttr.get(name), list(args),
                               loc=ir.Location.unknown())
    return call.results


mlir.register_lowering(partir_call_p, _lower)


def _unsupported(transform: str):
    def rule(*args, module: DeviceLocalModule, **kwargs):
        raise PartitionError(
            f"{transform} of the partitioned function {module.name!r} is not supported: "
            f"partir_plugin partitions a whole step. Apply {transform} inside the function "
            f"you pass to partir_plugin.jit (e.g. jax.value_and_grad in the train step).")
    return rule


ad.primitive_jvps[partir_call_p] = _unsupported("jax.grad (or jax.jvp)")
batching.primitive_batchers[partir_call_p] = _unsupported("jax.vmap")

_names = itertools.count()


def fresh_name(base: str) -> str:
    """A symbol name for a module (merge_mlir_modules uniquifies it further if needed)."""
    clean = re.sub(r"\W", "_", base) or "fn"
    return f"{clean}_{next(_names)}"
