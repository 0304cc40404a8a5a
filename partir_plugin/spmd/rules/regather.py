"""ZeRO-3's regather (`state.regather`): a value gathered afresh for each consumer, whose
conversions are therefore neither shared between consumers nor cached."""

from __future__ import annotations

from ...core.state import PartitionState
from ...ir.graph import Value
from ...ir.opsets import RELAYOUT_OPS


class Regathered:
    """Is a value gathered afresh for each consumer: one the tactic asked for
    (`state.regather`), or one computed from such a value by layout ops alone (a norm scale
    reshaped to `[1, 1, d]`, a weight converted to bf16), which is what is gathered once the
    tiling has flowed through them. Memoised per lowering."""

    def __init__(self, state: PartitionState):
        self.state = state
        self._memo: dict[Value, bool] = {}

    def __call__(self, v: Value) -> bool:
        known = self._memo.get(v)
        if known is None:
            op = v.producer
            known = v in self.state.regather or (
                op is not None and op.name in RELAYOUT_OPS and len(op.operands) == 1
                and self(op.operands[0]))
            self._memo[v] = known
        return known
