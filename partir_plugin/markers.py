"""Markers: jax functions a step calls to tell the partitioner something, which run as plain
jax under `jax.jit`: `tag` names a value for tactics, `roll` is a rotation the partitioner
lowers to collective_permutes.
"""

from __future__ import annotations


def tag(x, name: str):
    """Name an intermediate value so tactics can address it (paper 1 §8): an identity in the
    program (a `reduce_precision` to the value's own precision inside the named scope
    `ir.dialect.tag_scope(name)`), so `jax.jit(fn)` runs the same function unchanged."""
    import jax
    import jax.numpy as jnp

    from .ir.dialect import tag_scope

    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"partir_plugin.tag supports floating-point values, got {x.dtype}")
    info = jnp.finfo(x.dtype)
    with jax.named_scope(tag_scope(name)):
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

    from .ir.dialect import ROLL_OP

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


def interleave(x, repeats: int, stages: int, inverse: bool = False):
    """The stacked layers `x` (`[L, ...]`) reordered so that block s of `stages` contiguous
    blocks holds layer chunks s, s+S, ..., s+(R-1)S (chunks of L/(R·S) layers): the storage
    a circular pipeline's stage s reads. `inverse=True` undoes it.

    Where dimension 0 is tiled over `stages` devices, the lowering moves the chunks between
    devices with collective_permutes (each device keeps 1/S of the stack throughout); under
    `jax.jit` it is a reshape and a transpose.
    """
    global _interleave_fn
    if _interleave_fn is None:
        _interleave_fn = _make_interleave()
    return _interleave_fn(x, int(repeats), int(stages), bool(inverse))


def interleaved_order(x, repeats: int, stages: int, inverse: bool):
    """`interleave`'s meaning as plain jax (its composite's decomposition)."""
    layers = x.shape[0]
    per = layers // (repeats * stages)
    rest = x.shape[1:]
    major, minor = (stages, repeats) if inverse else (repeats, stages)
    y = x.reshape(major, minor, per, *rest)
    return y.swapaxes(0, 1).reshape(layers, *rest)


def _make_interleave():
    import functools

    import jax

    from .ir.dialect import INTERLEAVE_OP

    def composite(x, repeats, stages, inverse):
        op = jax.lax.composite(lambda v, *, repeats, stages, inverse: interleaved_order(
            v, repeats, stages, inverse), name=INTERLEAVE_OP)
        return op(x, repeats=repeats, stages=stages, inverse=inverse)

    @functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
    def reordered(x, repeats, stages, inverse):
        return composite(x, repeats, stages, inverse)

    def forward(x, repeats, stages, inverse):
        return composite(x, repeats, stages, inverse), None

    def backward(repeats, stages, inverse, _, g):
        return (reordered(g, repeats, stages, not inverse),)

    reordered.defvjp(forward, backward)
    return reordered


_interleave_fn = None
