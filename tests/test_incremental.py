"""Incremental partitioning (issue 11): after each tactic the lowering reuses the device-local
code of what the tactic left unchanged, and the simulator the per-op work. The program, its
collective counts and its estimates must be those of a lowering from scratch."""

from __future__ import annotations

import dataclasses

import jax
import pytest
from jaxlib.mlir import ir

import partir_plugin as partir
from partir_plugin.core.mesh import Mesh
from partir_plugin.errors import UnknownNameError
from partir_plugin.frontend.trace import trace
from partir_plugin.ir.importer import make_context
from partir_plugin.models import megatron, transformer
from partir_plugin.options import PartitionOptions
from partir_plugin.plugin.resolve import simulate
from partir_plugin.spmd.lowering import LoweringCache, lower_to_spmd
from partir_plugin.stages import partition

MESH = Mesh.of({"batch": 4, "model": 2})


def _tactics():
    return {"BP": partir.tactic("BP", axis="batch"),
            "MP": partir.tactic("MP", rule=megatron.transformer_rule, axis="model"),
            "Z3": partir.tactic("Z3", axis="batch"), "EMB": partir.tactic("EMB", axis="model")}


@pytest.fixture(scope="module", params=[False, True], ids=["unrolled", "scan"])
def traced(request):
    cfg = dataclasses.replace(transformer.Config.small(layers=2, scan=request.param), batch=8)
    args = jax.eval_shape(lambda: transformer.init(cfg, jax.random.PRNGKey(0)))
    return trace(transformer.make_train_step(cfg), args)


@pytest.mark.parametrize("order", ["BP+MP+Z3", "MP+Z3+BP", "Z3+BP+MP+EMB"])
def test_incremental_lowering_matches_a_fresh_one(traced, order):
    tactics = _tactics()
    part = partition(traced, MESH, [tactics[t] for t in order.split("+")],
                     PartitionOptions(hardware="tpu-v3", scatter_sums=True))
    fresh = lower_to_spmd(part.state)
    assert part.program.counts == fresh.counts
    assert part.reports[-1].collectives == fresh.counts
    ours = simulate(part.program.func, MESH, "tpu-v3")
    ref = simulate(fresh.func, MESH, "tpu-v3")
    assert ours.runtime_s == pytest.approx(ref.runtime_s, rel=1e-6)
    assert ours.peak_memory_bytes == ref.peak_memory_bytes
    assert ours.collective_counts == ref.collective_counts
    assert part.reports[-1].estimated_runtime_s == pytest.approx(ref.runtime_s, rel=1e-6)
    with make_context():
        assert ir.Module.parse(part.program.text()).operation.verify()


def test_a_cached_lowering_of_an_unchanged_state_reuses_every_op(traced):
    tactics = _tactics()
    part = partition(traced, MESH, [tactics["BP"], tactics["MP"]],
                     PartitionOptions(scatter_sums=True))
    cache = LoweringCache()
    first = lower_to_spmd(part.state, cache)
    second = lower_to_spmd(part.state, cache)
    top = [op for op in second.func.ops if op.name not in ("stablehlo.while", "stablehlo.case")]
    reused = set(map(id, first.func.ops))
    assert all(id(op) in reused for op in top)
    assert second.counts == first.counts


def test_report_rows_are_made_on_first_read(traced, monkeypatch):
    """Partitioning lowers only the final state; each tactic's row (its program lowered and
    simulated) is made when the report is first read, and equals the row of a schedule that
    stopped after that tactic."""
    import partir_plugin.report.rows as rows

    made = []
    estimate = rows.estimate
    monkeypatch.setattr(rows, "estimate", lambda *a, **k: made.append(1) or estimate(*a, **k))
    tactics = _tactics()
    part = partition(traced, MESH, [tactics["BP"], tactics["MP"], tactics["Z3"]],
                     PartitionOptions(hardware="tpu-v3", scatter_sums=True))
    assert not part.reports.made and not made and len(part.reports) == 3
    rows = list(part.reports)
    assert part.reports.made and len(made) == 3
    assert rows[-1].collectives == part.program.counts
    for k in (1, 2):
        prefix = partition(traced, MESH, [tactics[t] for t in ("BP", "MP")[:k]],
                           PartitionOptions(hardware="tpu-v3", scatter_sums=True)).reports[-1]
        assert rows[k - 1].collectives == prefix.collectives
        assert rows[k - 1].estimated_runtime_s == pytest.approx(prefix.estimated_runtime_s,
                                                                 rel=1e-6)
        assert rows[k - 1].estimated_peak_memory_bytes == prefix.estimated_peak_memory_bytes


def test_an_unknown_hardware_name_fails_when_partitioning(traced):
    with pytest.raises(UnknownNameError, match="no-such-chip"):
        partition(traced, MESH, [_tactics()["BP"]],
                  PartitionOptions(hardware="no-such-chip", scatter_sums=True))
