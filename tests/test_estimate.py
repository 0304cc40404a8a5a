"""`partir.estimate`: a schedule's cost on a mesh of any size, from abstract arguments, through
the one driver (the same figures as `partir.jit`'s report), with clear errors."""

from __future__ import annotations

import dataclasses
import time

import jax
import pytest

import partir_plugin as partir
from partir_plugin.errors import PartitionError, UnknownNameError
from partir_plugin.estimation import Estimator
from partir_plugin.models import megatron, transformer
from partir_plugin.plugin.resolve import resolve_hardware


def _schedule(pp: int = 0) -> list:
    out = [partir.tactic("PP", axis="stage", microbatches=pp)] if pp else []
    return out + [partir.tactic("BP", axis="data"),
                  partir.tactic("MP", rule=megatron.transformer_rule, axis="model")]


def test_a_5b_transformer_on_1024_devices_in_seconds_and_data_parallelism_scales():
    """T32 (5.3B parameters) at a global batch of 1024 on 256 and 1024 A100s, from
    ShapeDtypeStructs (no array is ever allocated, no device exists): four times the data
    parallelism does a quarter of the work per device, in less time and memory."""
    cfg = dataclasses.replace(transformer.Config.paper(scan=True), batch=1024)
    args = jax.eval_shape(lambda: transformer.init(cfg, jax.random.PRNGKey(0)))
    step = transformer.make_train_step(cfg)
    start = time.perf_counter()
    small = partir.estimate(step, *args, mesh={"data": 32, "model": 8}, schedule=_schedule(),
                            hardware="a100-40gb")
    large = partir.estimate(step, *args, mesh={"data": 128, "model": 8}, schedule=_schedule(),
                            hardware="a100-40gb")
    assert time.perf_counter() - start < 60
    assert large.mesh == {"data": 128, "model": 8}
    assert large.step_time_s < small.step_time_s
    assert large.flops == pytest.approx(small.flops / 4, rel=0.05)
    assert large.peak_memory_bytes < small.peak_memory_bytes
    # Megatron: all_reduces over the model axis, the gradients' over data.
    assert large.collectives["all_reduce"] > 0
    assert large.hardware == "a100-40gb" and not large.fits  # f32, no recomputation: 600 GiB


@pytest.fixture(scope="module")
def small():
    cfg = dataclasses.replace(transformer.Config.small(layers=4, scan=True), batch=8)
    return transformer.make_train_step(cfg), transformer.init(cfg, jax.random.PRNGKey(0))


def test_the_estimate_is_the_reports_figure_for_the_same_schedule(small):
    """One driver: partir.jit's report row for the last tactic says what estimate says."""
    step, args = small
    mesh, schedule = {"data": 4, "model": 2}, _schedule()
    fn, meta = partir.jit(step, mesh, schedule, hardware="a100-40gb", scatter_sums=True)
    fn.lower(*args)
    got = partir.estimate(step, *args, mesh=mesh, schedule=_schedule(), hardware="a100-40gb")
    assert got.step_time_s == pytest.approx(meta.tactics[-1].estimated_runtime_s)
    assert got.peak_memory_bytes == meta.tactics[-1].estimated_peak_memory_bytes
    assert [r.name for r in got.tactics] == ["BP", "MP"]
    assert got.tactics[-1].collectives == meta.tactics[-1].collectives


def test_schedules_that_trace_alike_share_a_trace(small):
    """Only trace hooks (PP) change the trace: two data/model splits under PP with the same
    stages and microbatches are partitioned from one trace, and give what fresh traces give."""
    step, args = small
    est = Estimator(step, args, "a100-40gb")
    a = est.estimate({"data": 4, "model": 2}, _schedule())
    b = est.estimate({"data": 8}, [partir.tactic("BP", axis="data")])
    c = est.estimate({"stage": 2, "data": 2, "model": 2}, _schedule(pp=2))
    d = est.estimate({"stage": 2, "data": 4}, [partir.tactic("PP", axis="stage",
                                                              microbatches=2),
                                               partir.tactic("BP", axis="data")])
    assert est.traces_made == 2
    fresh = partir.estimate(step, *args, mesh={"stage": 2, "data": 4},
                            schedule=[partir.tactic("PP", axis="stage", microbatches=2),
                                      partir.tactic("BP", axis="data")], hardware="a100-40gb")
    assert d.step_time_s == pytest.approx(fresh.step_time_s)
    assert d.peak_memory_bytes == fresh.peak_memory_bytes
    assert a.step_time_s != b.step_time_s and c.collectives.get("all_permute", 0) > 0


def test_clear_errors(small):
    step, args = small
    with pytest.raises(UnknownNameError, match="unknown hardware 'a1000'.*a100-40gb"):
        partir.estimate(step, *args, mesh={"data": 8}, hardware="a1000")
    with pytest.raises(PartitionError, match=r"entry 1 \(MP\) names mesh axis 'model', which "
                                             r"the mesh \{'data': 8\} lacks"):
        partir.estimate(step, *args, mesh={"data": 8}, schedule=_schedule(),
                        hardware="a100-40gb")
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['donate'\\]"):
        partir.estimate(step, *args, mesh={"data": 8}, donate=True)


def _dropout_step(key, x):
    """A dropout layer and its gradient: jax lowers the random bits per platform (a rolled
    loop of the threefry rounds on CPU, unrolled elsewhere)."""
    def loss(x):
        keep = jax.random.bernoulli(key, 0.9, x.shape)
        return (jax.numpy.where(keep, x / 0.9, 0.0) @ x.T).sum()

    return jax.grad(loss)(x)


def test_estimate_lowers_the_step_for_the_hardware_platform():
    """An estimate for a GPU spec is of the program a GPU runs: no rolled threefry loop, as
    jax lowers it there (on CPU it is a loop of five trips, each a kernel per round); the
    same spec without a platform estimates this process's (CPU) program, which costs more."""
    from partir_plugin.frontend.trace import trace
    from partir_plugin.ir.graph import walk

    args = (jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1024, 1024), jax.numpy.float32))

    def loops(platform):
        return sum(op.name == "stablehlo.while"
                   for op in walk(trace(_dropout_step, args, platform=platform).func.ops))

    assert loops(None) >= 1 and loops("cuda") == 0
    h100 = partir.estimate(_dropout_step, *args, mesh={"batch": 1}, hardware="h100")
    hosted = partir.estimate(_dropout_step, *args, mesh={"batch": 1},
                             hardware=dataclasses.replace(resolve_hardware("h100"),
                                                          platform=None))
    assert h100.step_time_s < hosted.step_time_s


def test_a_spec_with_an_unknown_platform_is_refused():
    """jax would lower for any platform name (its generic rules): a typo must not pass."""
    with pytest.raises(ValueError, match="unknown platform 'gpu'.*cuda"):
        dataclasses.replace(resolve_hardware("h100"), platform="gpu")


def test_a_step_jax_cannot_lower_for_the_platform_is_estimated_as_lowered_here():
    """A host callback lowers only for the backend this process has: the estimate says so
    and estimates the program as lowered here (not an error, not silent)."""
    import numpy as np

    def step(x):
        doubled = jax.pure_callback(lambda a: np.asarray(a) * 2,
                                    jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return (doubled @ x).sum()

    with pytest.warns(UserWarning) as caught:
        est = partir.estimate(step, jax.ShapeDtypeStruct((64, 64), jax.numpy.float32),
                              mesh={"batch": 1}, hardware="h100")
    messages = [str(w.message) for w in caught]
    assert any("cannot lower the step for 'cuda'" in m for m in messages), messages
    # the callback is a host callback the simulator knows (its bytes; no uncosted op)
    assert not est.simulation.unknown_ops
    assert est.step_time_s > 0


def test_an_estimate_simulates_the_program_its_hardware_runs(small):
    """ZeRO's gradient sums are reduce-scattered where the spec's device runs them so (an
    accelerator) and all-reduced then sliced on host-cpu, as `partir.jit` partitions them
    there: the estimate's program is the one that would run, whatever this process's
    backend is; an explicit `scatter_sums` still wins."""
    step, args = small
    mesh = {"data": 4, "model": 2}
    schedule = [*_schedule(), partir.tactic("Z2", axis="data")]
    gpu = partir.estimate(step, *args, mesh=mesh, schedule=schedule, hardware="a100-40gb")
    cpu = partir.estimate(step, *args, mesh=mesh, schedule=schedule, hardware="host-cpu")
    forced = partir.estimate(step, *args, mesh=mesh, schedule=schedule, hardware="host-cpu",
                             scatter_sums=True)
    assert gpu.collectives.get("reduce_scatter", 0) > 0
    assert cpu.collectives.get("reduce_scatter", 0) == 0
    assert cpu.collectives["all_reduce"] > gpu.collectives["all_reduce"]
    assert forced.collectives == gpu.collectives
    fn, meta = partir.jit(step, mesh, schedule)  # this process: CPU
    fn.lower(*args)
    assert meta.tactics[-1].collectives == cpu.tactics[-1].collectives
