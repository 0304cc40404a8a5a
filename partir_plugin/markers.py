"""Markers: jax functions a step calls to tell the partitioner something, which run as plain
jax under `jax.jit`: `tag` names a value for tactics, `roll` is a rotation the partitioner
lowers to collective_permutes.
"""

from __future__ import annotations


def tag(x, name: str):
    """Name an intermediate value so tactics can address it (paper 1 §8).

    An identity in the program (a `reduce_precision` to the value's own precision inside the
    named scope `partir_tag[name]`), so `jax.jit(fn)` runs the same function unchanged.
    """
    import jax
    import jax.numpy as jnp

    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"partir_plugin.tag supports floating-point values, got {x.dtype}")
    info = jnp.finfo(x.dtype)
    with jax.named_scope(f"partir_tag[{name}]"):
        return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def roll(x, shift: int, axis: int = 0):
    """`jnp.roll(x, shift, axis)` that partitions as a rotation between devices.

    Where `axis` is tiled over mesh axes, the lowering sends each device's block (or the two
    pieces of neighbouring blocks a shift that is not a multiple of the block needs) with
    `collective_permute`s instead of gathering the dimension; a plain `jnp.roll` is slices and
    a concatenate, which on a tiled dimension gather. Under `jax.jit` it is `jnp.roll`. The
    pipelined layer loop shifts its stage state with it; a ring of key/value blocks
    (ring attention) is another user.
    """
    return _roll(x, shift, axis)


def _roll_composite(x, shift: int, axis: int):
    import jax
    import jax.numpy as jnp

    from .ir.importer import ROLL_OP

    # A composite keeps the roll one op through jax's lowering (the importer keeps it whole);
    # its decomposition is what runs where nothing partitions it.
    op = jax.lax.composite(lambda v, *, shift, axis: jnp.roll(v, shift, axis), name=ROLL_OP)
    return op(x, shift=shift, axis=axis)


def _make_roll():
    """`roll` with its derivative: the cotangent rolls back (a composite has no AD rules)."""
    import functools

    import jax

    @functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
    def rolled(x, shift, axis):
        return _roll_composite(x, shift, axis)

    def forward(x, shift, axis):
        return _roll_composite(x, shift, axis), None

    def backward(shift, axis, _, g):
        return (rolled(g, -shift, axis),)

    rolled.defvjp(forward, backward)
    return rolled


def _roll(x, shift: int, axis: int):
    global _roll_fn
    if _roll_fn is None:
        _roll_fn = _make_roll()
    axis = axis % x.ndim
    return _roll_fn(x, int(shift) % x.shape[axis] if x.shape[axis] else 0, axis)


_roll_fn = None
