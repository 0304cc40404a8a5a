"""benchmarks/plan.py in one short run: the planned transformer's top plans run through
partir.jit with jax.jit's loss, and the section has their estimated and measured times."""

import benchmark_module
import pytest

# Runs a benchmark script: under make test-all (tests/test_planner.py runs the best plan of
# the same transformer against jax.jit under make test).
pytestmark = [pytest.mark.slow, pytest.mark.exhaustive]


def test_plan_benchmark_writes_its_section(tmp_path):
    plan = benchmark_module.load("plan")
    out = tmp_path / "BENCHMARKS.md"
    assert plan.main(["--only", "transformer", "--seconds", "10", "--top", "2", "--rounds", "2",
                      "--block", "1", "--output", str(out)]) == 0
    text = out.read_text()
    assert plan.HEADING in text and "Spearman" in text and "resolve" in text
    rows = [line for line in text.splitlines() if line.startswith("| 1 |")
            or line.startswith("| 2 |")]
    assert len(rows) == 2, rows
    for line in rows:
        assert float(line.rsplit("|", 2)[1]) < 1e-5  # loss vs jax.jit
