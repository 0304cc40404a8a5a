"""ZeRO-3's regather: values gathered afresh for each consumer instead of once for all, whose
conversions are therefore neither shared between consumers nor cached."""

from __future__ import annotations

import enum

from ...core.state import PartitionState
from ...ir.graph import Value
from ...ir.opsets import RELAYOUT_OPS
from ..convert import ConversionSharing


class Regather(enum.StrEnum):
    """Which of an argument's tiled leaves are gathered afresh for each consumer instead of
    once for all (ZeRO-3's parameters; the backward pass's uses among the consumers).

    VECTORS is what jax.jit's partitioner ends with on the transformers: a norm scale or bias
    gathered once and used in the forward and backward passes makes XLA merge the broadcasts
    of it into one `[batch, seq, d]` buffer that lives from one pass to the other; gathered
    per use, each broadcast fuses into its consumer (measured: issue 24, docs/BENCHMARKS.md).
    Matrices stay gathered once: XLA keeps the gathered copy either way."""

    NONE = "none"
    VECTORS = "vectors"  # leaves of rank <= 1
    ALL = "all"

    def covers(self, rank: int) -> bool:
        return self is Regather.ALL or (self is Regather.VECTORS and rank <= 1)


class Regathered(ConversionSharing):
    """A value is gathered afresh for each consumer: one the tactic asked for
    (`state.regather`), or one computed from such a value by layout ops alone (a norm scale
    reshaped to `[1, 1, d]`, a weight converted to bf16), which is what is gathered once the
    tiling has flowed through them. Memoised per lowering."""

    def __init__(self, state: PartitionState):
        self.state = state
        self._memo: dict[Value, bool] = {}

    def shared(self, v: Value) -> bool:
        return not self._regathered(v)

    def _regathered(self, v: Value) -> bool:
        known = self._memo.get(v)
        if known is None:
            op = v.producer
            known = v in self.state.regather or (
                op is not None and op.name in RELAYOUT_OPS and len(op.operands) == 1
                and self._regathered(op.operands[0]))
            self._memo[v] = known
        return known


def conversion_sharing(state: PartitionState) -> ConversionSharing:
    """The program's `ConversionSharing`: per consumer for what a tactic regathers, shared
    for everything else (and for every value where nothing is regathered)."""
    return Regathered(state) if state.regather else ConversionSharing()
