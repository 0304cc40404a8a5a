"""Lowering `partir_plugin.roll` (the `partir.roll` op): a rotation of a tiled dimension is a
rotation of the devices' blocks, so it moves whole blocks with `collective_permute` instead of
gathering the dimension (the slices and concatenate `jnp.roll` is made of would gather).

With the dimension cut into n blocks of b elements over `axes`, a global shift `q·b + r`
(0 <= r < b) gives device p the last r elements of block p−q−1 followed by the first b−r of
block p−q (indices mod n): one permute when r = 0, two otherwise, none when the blocks do not
move (q ≡ 0 mod n, r = 0).
"""

from __future__ import annotations

from ...ir.dialect import ROLL_OP
from ...ir.graph import Value
from ..emitter import Emitter
from .markers import Marker


class Roll(Marker):
    op_name = ROLL_OP

    def move(self, em: Emitter, x: Value, attrs: dict, dim: int, axes: tuple[str, ...]
             ) -> Value:
        return lower_roll(em, x, attrs["shift"], dim, axes)


def lower_roll(em: Emitter, x: Value, shift: int, dim: int, axes: tuple[str, ...]) -> Value:
    """`x` (this device's block of a dimension tiled over `axes`, or the whole dimension when
    `axes` is empty) rolled by the global `shift` along `dim`."""
    b = x.type.shape[dim]
    if not axes:
        return _local_roll(em, x, shift % b, dim)
    q, r = divmod(shift, b)
    head = _rotate_blocks(em, x, q, axes)
    if r == 0:
        return head
    tail = _rotate_blocks(em, x, q + 1, axes)
    return em.concatenate([em.slice(tail, dim, b - r, b), em.slice(head, dim, 0, b - r)], dim)


def _rotate_blocks(em: Emitter, x: Value, steps: int, axes: tuple[str, ...]) -> Value:
    """Device p gets block p − steps (mod n) along `axes`."""
    groups = em.mesh.groups(tuple(axes))
    n = len(groups[0])
    if steps % n == 0:
        return x
    pairs = [(g[j], g[(j + steps) % n]) for g in groups for j in range(n)]
    return em.collective_permute(x, pairs, axes)


def _local_roll(em: Emitter, x: Value, r: int, dim: int) -> Value:
    if r == 0:
        return x
    b = x.type.shape[dim]
    return em.concatenate([em.slice(x, dim, b - r, b), em.slice(x, dim, 0, b - r)], dim)
