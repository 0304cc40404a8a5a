"""Layouts at the program's boundary: the user's in/out shardings name whole mesh axes only.

Inside the program a value may be tiled on sub-axes (`core/subaxis.py`), which a
`jax.sharding.PartitionSpec` cannot name. Adjacent parts of one axis on a dimension are already
folded into the axis (`Layout.from_tiles`); what is left of a sub-axis is dropped from the
boundary layout: an argument arrives replicated on it and the program slices it locally, a
result is gathered on it before it is returned. Each such drop is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.mesh import Mesh
from ..core.subaxis import is_sub_axis
from .layout import Layout


@dataclass(frozen=True)
class BoundaryDrop:
    """Sub-axes an argument or result's tiling had that its sharding at the boundary lacks."""

    what: str  # "argument 'x'" / "result 0"
    axes: tuple[str, ...]
    inside: Layout
    boundary: Layout

    def __str__(self) -> str:
        how = ("arrives so and is sliced locally" if self.what.startswith("argument")
               else "is gathered to it before it is returned")
        return (f"{self.what} is tiled {self.inside} inside the program, on sub-axes "
                f"{', '.join(self.axes)} that no sharding can name: its sharding is "
                f"{self.boundary.spec()} ({how})")


def at_boundary(layout: Layout, mesh: Mesh) -> tuple[Layout, tuple[str, ...]]:
    """`layout` with its sub-axes folded into whole axes where they can be and dropped where
    they cannot, and the dropped sub-axes."""
    dims, dropped = [], []
    for d in layout.dims:
        folded = mesh.fold(d) if len(d) > 1 else d
        dropped += [a for a in folded if is_sub_axis(a)]
        dims.append(tuple(a for a in folded if not is_sub_axis(a)))
    if not dropped:
        return layout, ()
    return Layout(tuple(dims), layout.partial), tuple(dropped)


class ProgramBoundary:
    """What the lowering's walk asks at the program's edge, chosen once per program: the
    layout each argument arrives in and each result leaves in, and which lowering rules may
    apply inside (`admits`). Reports the sub-axes it had to drop (`drops`)."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.drops: list[BoundaryDrop] = []

    def argument(self, inside: Layout, shape: tuple[int, ...], what: str) -> Layout:
        """The layout an argument tiled `inside` arrives in: its sub-axes that no sharding
        can name dropped (`at_boundary`), and, tiled unevenly, its largest divisible layout
        (jax needs divisible shardings; the program slices it into its padded tiles)."""
        layout, dropped = at_boundary(inside, self.mesh)
        if dropped:
            self.drops.append(BoundaryDrop(what, dropped, inside, layout))
        return layout.divisible(shape, self.mesh)

    def result(self, inside: Layout, produced: Layout, shape: tuple[int, ...], what: str
               ) -> Layout:
        """The layout a result declared `inside` and made `produced` leaves in: as an
        argument's, trimmed where it is uneven (whether that is allowed is the caller's
        policy: `stages.uneven_outputs`)."""
        return self.argument(inside, shape, what)

    def admits(self, rule) -> bool:
        """May the lowering rule `rule` (`rules.base.LoweringRule`) apply inside?"""
        return True


class AsProduced(ProgramBoundary):
    """The TMR verifier's boundary: each result leaves in the layout its producer made it,
    pending sums unreduced (the verifier runs one op's tiles and combines them itself), so no
    rule that makes other layouts than the op's TMR entries applies."""

    def result(self, inside: Layout, produced: Layout, shape: tuple[int, ...], what: str
               ) -> Layout:
        return produced

    def admits(self, rule) -> bool:
        return not rule.changes_layouts
