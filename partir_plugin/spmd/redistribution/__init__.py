"""Memory-efficient array redistribution through collectives (paper 2, DESIGN.md §2.4).

`plan_redistribution(mesh, global_shape, dtype, src_spec, dst_spec)` returns a
`RedistributionPlan` whose steps never hold more per device than the larger of the source
and target tiles. See docs/redistribution.md.
"""

from .plan import RedistributionPlan, plan_redistribution
from .steps import AllGather, AllPermute, AllSlice, AllToAll, Step
from .types import DistType, WeakType, parse_paper_type

__all__ = [
    "AllGather",
    "AllPermute",
    "AllSlice",
    "AllToAll",
    "DistType",
    "RedistributionPlan",
    "Step",
    "WeakType",
    "parse_paper_type",
    "plan_redistribution",
]
