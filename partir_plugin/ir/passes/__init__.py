"""Rewrites of an imported program, run by the importer as one pipeline (`pipeline.py`).

`IMPORT_PIPELINE`, in order: drop jax's sharding annotations, split joint optimization
barriers, fuse a max-pool gradient's pad / select_and_scatter / slice into one op, fold pads
into the windowed ops they feed. (Calls and composites are inlined by the import walk itself:
it reads each callee's MLIR once per call site, which is what inlining it costs.)
"""

from __future__ import annotations

from .padded_scatter import FusePaddedScatters
from .pipeline import FuncPass, Pipeline
from .sharding_constraints import DropShardingConstraints
from .split_barriers import SplitBarriers
from .window_padding import FoldWindowPadding

IMPORT_PIPELINE = Pipeline((DropShardingConstraints(), SplitBarriers(), FusePaddedScatters(),
                            FoldWindowPadding()))

__all__ = ["IMPORT_PIPELINE", "FuncPass", "Pipeline"]
