"""benchmarks/context_parallel.py on `transformer.Config.small()`: both conflict policies give
jax.jit's loss, "stop" records conflicts and gathers more, "redistribute" resolves every
conflict; the section it writes has one row per policy."""


import benchmark_module
import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script


def test_small_model_stop_vs_redistribute(tmp_path):
    context_parallel = benchmark_module.load("context_parallel")
    rows = context_parallel.run(["small"])
    stop, redistribute = ({r.policy: r for r in rows}[p] for p in context_parallel.POLICIES)
    assert stop.conflicts and not stop.resolutions
    assert not redistribute.conflicts and redistribute.resolutions
    assert redistribute.counts["all_gather"] < stop.counts["all_gather"]
    for r in rows:
        assert r.loss_vs_jax is not None and r.loss_vs_jax < 1e-5, r
        assert r.runtime_s and r.peak_bytes
    out = tmp_path / "BENCHMARKS.md"
    context_parallel.harness.write_section(context_parallel.HEADING,
                                           context_parallel.section(rows, "a100-40gb"), out)
    text = out.read_text()
    assert text.count("| small | CP | {seq: 4} |") == 2
