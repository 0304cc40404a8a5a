"""Concrete collectives of a plan: what a device-local StableHLO program executes.

Each step carries everything needed to emit it without knowing about factor axes: replica
groups (each ordered as the concatenation / chunk order), slice indices, or permutation
pairs, all in replica ids (row-major over the mesh axes, like `Mesh.devices.flat`).
`axes` names the mesh axes or sub-axes (`model:(1)4`) whose factor coordinates the step's
groups were derived from, and `dims` the array dimensions it touches; `in_type`/`out_type` are
the paper types (over factor axes) under the logical device map, kept for checking and
printing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..collectives import Collective
from .types import DistType


@dataclass(frozen=True)
class Step:
    axes: tuple[str, ...]
    factor_axes: tuple[str, ...]
    dims: tuple[int, ...]
    bytes_per_device: int  # Fig. 11 cost of this step, in bytes
    in_local_shape: tuple[int, ...]
    out_local_shape: tuple[int, ...]
    in_type: DistType
    out_type: DistType


@dataclass(frozen=True)
class AllGather(Step):
    """Concatenate the group members' tiles along `dim`, in group order."""

    dim: int
    groups: list[list[int]]
    kind: Collective = field(default=Collective.ALL_GATHER, init=False)


@dataclass(frozen=True)
class AllToAll(Step):
    """Split `split_dim` into len(group) chunks, send chunk k to member k, concatenate the
    received chunks along `concat_dim` in member order. `dims` = (concat_dim, split_dim):
    the axes leave `concat_dim` and enter `split_dim`."""

    split_dim: int
    concat_dim: int
    groups: list[list[int]]
    kind: Collective = field(default=Collective.ALL_TO_ALL, init=False)


@dataclass(frozen=True)
class AllSlice(Step):
    """Local dynamic slice: split `dim` into `num_blocks`, replica r keeps `block_index[r]`."""

    dim: int
    num_blocks: int
    block_index: list[int]
    kind: Collective = field(default=Collective.ALL_SLICE, init=False)


@dataclass(frozen=True)
class AllPermute(Step):
    """collective_permute with `pairs` (source, target): a full permutation of the replicas,
    so every device receives a tile; (r, r) pairs keep the tile in place."""

    pairs: list[tuple[int, int]]
    kind: Collective = field(default=Collective.ALL_PERMUTE, init=False)

    @property
    def moved(self) -> int:
        """Devices whose tile actually changes hands."""
        return sum(s != t for s, t in self.pairs)


def describe(step: Step) -> str:
    """One line: kind, axes (mesh axes or sub-axes as the records name them, and the factor
    axes of the types below where they differ) and the collective's parameters."""
    axes, factors = ",".join(step.axes), ",".join(step.factor_axes)
    axes = "-" if not factors else axes if axes == factors else f"{axes} = {factors}"
    if isinstance(step, AllGather):
        what = f"dim {step.dim}, groups of {len(step.groups[0])}"
    elif isinstance(step, AllToAll):
        what = (
            f"split dim {step.split_dim}, concat dim {step.concat_dim}, "
            f"groups of {len(step.groups[0])}"
        )
    elif isinstance(step, AllSlice):
        what = f"dim {step.dim} into {step.num_blocks} blocks"
    else:
        assert isinstance(step, AllPermute)
        what = f"{step.moved} of {len(step.pairs)} devices move"
    return f"{step.kind!s:<11} axes ({axes}): {what}"
