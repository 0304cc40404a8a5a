"""Each layer's weights cast to the compute dtype once per step, not once per microbatch.

A mixed-precision layer (Flax's `dtype=bfloat16` with f32 parameters) casts its weights at
each call. In the unpipelined step a layer is called once per step; in a pipeline it is called
once per microbatch, so the cast (a read of the f32 weights and a write of their bf16 copy)
runs M times, and under recomputation M times more. Megatron-LM keeps the half-precision
copy of the weights for the whole step instead.

`narrowed_inputs` finds the stacked layer inputs the body only ever casts to a narrower
float (the single use of the input, through calls such as `jax.checkpoint` and nested
`jax.jit`); the pipeline casts those once, outside its loop, and hands the body the cast
copy through `cast_once`, whose gradient is the wide input's: each microbatch's weight
gradient is converted to f32 before it is added to the others, as the per-call cast's
transpose did, so the sum over microbatches stays in f32 (jax would accumulate the
cotangent of a loop-invariant bf16 copy in bf16). The values the body computes are the same
bits: the cast is elementwise and the body read nothing else of the input. The cost: the
cast copy of the stage's weights is live for the step (2 bytes a parameter in bf16), as in
Megatron.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from .layer_program import call_body


def narrowed_inputs(jaxpr: jex_core.Jaxpr, first: int) -> list[np.dtype | None]:
    """For each input of `jaxpr` from index `first` on: the narrower float dtype that its
    only use casts it to, or None (used otherwise, more than once, or not a float)."""
    return [_only_cast(jaxpr, v) for v in jaxpr.invars[first:]]


def _only_cast(jaxpr: jex_core.Jaxpr, var) -> np.dtype | None:
    dtype = getattr(var.aval, "dtype", None)  # a typed PRNG key's is no numpy dtype
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        return None
    dtype = np.dtype(dtype)
    if any(v is var for v in jaxpr.outvars):
        return None
    uses = [(eqn, k) for eqn in jaxpr.eqns for k, v in enumerate(eqn.invars) if v is var]
    if len(uses) != 1:
        return None
    eqn, k = uses[0]
    name = eqn.primitive.name
    if name == "convert_element_type":
        new = np.dtype(eqn.params["new_dtype"])
        narrower = jnp.issubdtype(new, jnp.floating) and new.itemsize < dtype.itemsize
        return new if narrower else None
    body = call_body(eqn)  # not custom-derivative calls: their rules would see the input
    return None if body is None else _only_cast(body, body.invars[k])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def cast_once(dtype, wide, narrow):
    """`narrow` (a stop-gradient cast of `wide`, made once) where the body casts `wide`;
    the gradient goes to `wide`, converted to its `dtype`."""
    del dtype, wide
    return narrow


def _cast_once_fwd(dtype, wide, narrow):
    del dtype, wide
    return narrow, None


def _cast_once_bwd(dtype, _, cotangent):
    return cotangent.astype(dtype), None


cast_once.defvjp(_cast_once_fwd, _cast_once_bwd)
