"""Rewrites of an imported program, run by the importer as one pipeline (`pipeline.py`).

`IMPORT_PIPELINE`, in order: inline calls and composites, drop jax's sharding annotations,
split joint optimization barriers, fuse a max-pool gradient's pad / select_and_scatter / slice
into one op, fold pads into the windowed ops they feed.
"""

from __future__ import annotations

from .inline_calls import InlineCalls
from .padded_scatter import FusePaddedScatters
from .pipeline import FuncPass, Pipeline
from .sharding_constraints import DropShardingConstraints
from .split_barriers import SplitBarriers
from .window_padding import FoldWindowPadding

IMPORT_PIPELINE = Pipeline((InlineCalls(), DropShardingConstraints(), SplitBarriers(),
                            FusePaddedScatters(), FoldWindowPadding()))

__all__ = ["IMPORT_PIPELINE", "FuncPass", "Pipeline"]
