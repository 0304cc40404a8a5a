"""Lowering `partir_plugin.markers.interleave` (the `partir.interleave` op): the circular
pipeline's layer order. With the stack's dimension 0 cut into S blocks over S devices, device
p holds chunks pR .. pR+R-1 in layer order and needs chunks p, p+S, ..., p+(R-1)S: chunk c
moves from device c // R (local slot c % R) to device c % S (local slot c // S). For each pair
of slots (r, j) one `collective_permute` moves, from every device that has one, the chunk in
slot j that belongs in slot r of another device; a device receives at most one chunk per
permute (zeros otherwise), so slot r is the sum of its R receptions. R² permutes of one chunk
each: every device keeps 1/S of the stack throughout. Other tilings gather the dimension,
reorder it locally and slice it back.
"""

from __future__ import annotations

from ...ir.attributes import i64_array
from ...ir.dialect import INTERLEAVE_OP
from ...ir.graph import Value
from ...ir.types import TensorType
from ..emitter import Emitter
from .markers import Marker


class Interleave(Marker):
    op_name = INTERLEAVE_OP

    def move(self, em: Emitter, x: Value, attrs: dict, dim: int, axes: tuple[str, ...]
             ) -> Value:
        return lower_interleave(em, x, attrs["repeats"], attrs["stages"], attrs["inverse"],
                                axes)


def lower_interleave(em: Emitter, x: Value, repeats: int, stages: int, inverse: bool,
                     axes: tuple[str, ...]) -> Value:
    """`x` (this device's block of the stack, or the whole stack when `axes` is empty) in the
    interleaved layer order (`inverse`: back in layer order)."""
    if not axes:
        return _local(em, x, repeats, stages, inverse)
    if em.mesh.product(axes) != stages:
        whole = em.all_gather(x, 0, axes)
        return em.all_slice(_local(em, whole, repeats, stages, inverse), {0: tuple(axes)})
    groups = em.mesh.groups(tuple(axes))
    R, S = repeats, stages
    per = x.type.shape[0] // R
    slots = []
    for r in range(R):  # the slot being filled on the receiving side
        received = []
        for j in range(R):  # the slot it is sent from
            pairs = []
            for dst in range(S):
                # forward: dst's slot r holds chunk r*S + dst, kept by device c // R in slot
                # c % R. inverse: dst's slot r holds chunk dst*R + r, kept by device c % S in
                # slot c // S.
                c = dst * R + r if inverse else r * S + dst
                src, src_slot = (c % S, c // S) if inverse else (c // R, c % R)
                if src_slot == j:
                    pairs += [(g[src], g[dst]) for g in groups]
            if pairs:
                chunk = em.slice(x, 0, j * per, (j + 1) * per)
                received.append(em.collective_permute(chunk, pairs, axes))
        slot = received[0]
        for other in received[1:]:
            slot = em.emit("stablehlo.add", [slot, other], [slot.type]).results[0]
        slots.append(slot)
    return em.concatenate(slots, 0)


def _local(em: Emitter, x: Value, repeats: int, stages: int, inverse: bool) -> Value:
    """The reordering on a whole stack: reshape to [major, minor, chunk...], swap, reshape."""
    shape = x.type.shape
    per = shape[0] // (repeats * stages)
    major, minor = (stages, repeats) if inverse else (repeats, stages)
    split = TensorType((major, minor, per, *shape[1:]), x.type.element)
    swapped = TensorType((minor, major, per, *shape[1:]), x.type.element)
    y = em.emit("stablehlo.reshape", [x], [split]).results[0]
    perm = [1, 0, *range(2, len(split.shape))]
    y = em.emit("stablehlo.transpose", [y], [swapped], {"permutation": i64_array(perm)}
                ).results[0]
    return em.emit("stablehlo.reshape", [y], [x.type]).results[0]
