"""Sub-axes: a mesh axis split row-major into smaller axes (PartIR paper 1 §8, Shardy).

A reshape such as `16 -> 4x4` on an axis of 8 devices needs the axis split: `{model: 8}` as
`{model:(1)4, model:(4)2}`, the major sub-axis of size 4 tiling the first factor and the
minor one of size 2 the second. A sub-axis is spelt as Shardy spells it, `parent:(pre)size`:
`pre` is the product of the sizes of the more major sub-axes of `parent`, so device
coordinate `c` along `parent` has coordinate `(c // (parent_size // (pre * size))) % size`
along the sub-axis. Sub-axes are axis names of their own: the mesh gives them a size, a
stride, coordinates and collective groups, so everything that works per axis (propagation,
layouts, collectives, costs) works on them unchanged.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_SPELLING = re.compile(r"^(?P<parent>.+):\((?P<pre>\d+)\)(?P<size>\d+)$")


@dataclass(frozen=True)
class SubAxis:
    """`size` consecutive digits of `parent`'s coordinate, below `pre` more major ones. A
    whole axis of size n is `SubAxis(name, 1, n)` (spelt as the plain name)."""

    parent: str
    pre: int
    size: int

    @property
    def hi(self) -> int:
        """`pre * size`: the part of the parent at or above this sub-axis."""
        return self.pre * self.size

    def spelling(self, parent_size: int) -> str:
        if self.pre == 1 and self.size == parent_size:
            return self.parent
        return f"{self.parent}:({self.pre}){self.size}"

    def overlaps(self, other: SubAxis) -> bool:
        """Do both use some digit of the same parent (a value tiled on both would be tiled
        twice by the same devices)?"""
        return (self.parent == other.parent and self.pre < other.hi
                and other.pre < self.hi)

    def split(self, major_size: int) -> tuple[SubAxis, SubAxis]:
        """This sub-axis as its major part of `major_size` and the minor rest."""
        return (SubAxis(self.parent, self.pre, major_size),
                SubAxis(self.parent, self.pre * major_size, self.size // major_size))


@functools.lru_cache(maxsize=4096)
def parse(axis: str) -> SubAxis | None:
    """The sub-axis `axis` spells, or None for a plain axis name."""
    m = _SPELLING.match(axis)
    if m is None:
        return None
    return SubAxis(m.group("parent"), int(m.group("pre")), int(m.group("size")))


def parent_of(axis: str) -> str:
    """The mesh axis `axis` is part of (itself for a plain axis)."""
    sub = parse(axis)
    return axis if sub is None else sub.parent


def is_sub_axis(axis: str) -> bool:
    return parse(axis) is not None
