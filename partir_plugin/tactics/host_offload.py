"""Moves of values to host memory (RM's offload) in the traced program, on every backend.

jax writes a move between memory spaces as `device_put` to a memory kind, and lowers it as an
`annotate_device_placement` custom call on TPU and GPU only; on XLA:CPU (jax 0.10) the move
lowers to nothing, so a step offloading on CPU silently keeps everything on the device. An
estimate of the step for a GPU still needs to see the moves: while an offloading trace is in
this context (`showing_moves`), the CPU lowering writes them as TPU and GPU do. Running such
a program on XLA:CPU computes the right numbers and offloads nothing (RM says so).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import jax

# The platforms where jax lowers moves to host memory (`jax._src.dispatch`).
OFFLOADING_PLATFORMS = frozenset({"tpu", "gpu", "cuda", "rocm"})
PLACEMENT_TARGET = "annotate_device_placement"  # the custom call of a move

_SHOWING: contextvars.ContextVar[bool] = contextvars.ContextVar("partir_show_host_moves",
                                                               default=False)


def backend_offloads(platform: str | None = None) -> bool:
    """Does jax lower moves to host memory on `platform` (None: jax's default backend)?"""
    return (platform or jax.default_backend()) in OFFLOADING_PLATFORMS


@contextlib.contextmanager
def showing_moves():
    """While entered (in this context), jax's CPU lowering writes moves to a memory kind as
    the `annotate_device_placement` custom calls TPU and GPU get."""
    _register_cpu_lowering()
    token = _SHOWING.set(True)
    try:
        yield
    finally:
        _SHOWING.reset(token)


@functools.cache
def _register_cpu_lowering() -> None:
    """Put `_cpu_device_put` in front of jax's CPU lowering of `device_put` (once)."""
    from jax._src import dispatch
    from jax._src.interpreters import mlir

    entry = mlir._platform_specific_lowerings["cpu"].get(dispatch.device_put_p) or \
        mlir._lowerings[dispatch.device_put_p]
    mlir.register_lowering(dispatch.device_put_p,
                           functools.partial(_cpu_device_put, entry.rule), platform="cpu")


def _cpu_device_put(jax_rule, ctx, *xs, devices, srcs, copy_semantics):
    """jax's rule, except that a move to a memory space while `showing_moves` is the custom
    call jax writes on TPU and GPU."""
    from jax._src import core
    from jax._src.interpreters import mlir

    if not _SHOWING.get() or not any(isinstance(d, core.MemorySpace) for d in devices):
        return jax_rule(ctx, *xs, devices=devices, srcs=srcs, copy_semantics=copy_semantics)
    out = []
    for x, device, src, aval in zip(xs, devices, srcs, ctx.avals_out):
        if isinstance(device, core.MemorySpace):
            out.append(mlir.wrap_with_memory_kind(ctx.module_context, x,
                                                  core.mem_space_to_kind(device), aval))
        else:
            sub = ctx.replace(avals_in=[aval], avals_out=[aval])
            out.extend(jax_rule(sub, x, devices=(device,), srcs=(src,),
                                copy_semantics=copy_semantics[:1]))
    return out
