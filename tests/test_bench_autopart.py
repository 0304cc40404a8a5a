"""benchmarks/autopart.py end to end on its tiny MLP: a few seconds, nothing written."""

import math

import benchmark_module
import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script


@pytest.fixture(scope="module")
def autopart_bench():
    return benchmark_module.load("autopart")  # benchmarks/autopart.py


def test_tiny_model_end_to_end(autopart_bench, tmp_path):
    from partir_plugin.plugin.manager import searchers

    out = tmp_path / "BENCHMARKS.md"
    rows, text = autopart_bench.run(["--models", "mlp-tiny", "--measure", "mlp-tiny",
                                     "--seconds", "0.2", "--runs", "1", "--no-write",
                                     "--output", str(out)])
    assert not out.exists()
    manual = [r for r in rows if not r.auto]
    autos = [r for r in rows if r.auto]
    assert [r.schedule for r in manual] == ["BP", "BP+MP"]
    assert sum(r.best for r in manual) == 1
    # Two automatic rows per installed searcher, whatever the installed ones are.
    assert {r.searcher for r in autos} == set(searchers())
    assert len(autos) == 2 * len(searchers())
    for r in autos:
        assert r.reference in ("BP", "BP+MP")
        assert math.isfinite(autopart_bench.sim_ratio(r, rows))
        assert math.isfinite(autopart_bench.step_ratio(r, rows))
        assert r.search_s is not None and r.search_s >= 0
    for r in rows:
        assert r.runtime_s > 0 and r.peak_bytes > 0
    assert text.startswith(autopart_bench.HEADING)
    assert text.count("| mlp-tiny |") == len(rows) + 1  # the table, and the summary line
