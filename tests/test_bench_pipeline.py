"""benchmarks/pipeline.py in one short repetition: every schedule gives jax.jit's loss, the
pipelined rows report their bubble and permutes, and the T32 estimate has its five rows (the
two with RM under an H100's 80 GiB)."""


import benchmark_module
import pytest

# Runs a benchmark script (47 s): `make test-all`. The schedules' numbers against jax.jit are
# the default suite's in test_pipeline.py and test_pp_recipes.py; this checks the script.
pytestmark = [pytest.mark.slow, pytest.mark.exhaustive]


def test_pipeline_benchmark_writes_its_section(tmp_path):
    pipeline = benchmark_module.load("pipeline")
    out = tmp_path / "BENCHMARKS.md"
    assert pipeline.main(["--reps", "1", "--steps", "1", "--output", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Benchmarks") and pipeline.HEADING in text
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    assert len(rows) == 4 + 5, rows
    # T32 with recomputation fits an 80 GiB H100; without, no schedule does.
    for line in rows[4:]:
        gib = float(line.split("|")[4].split()[0])
        assert (gib < 80) == (", RM]" in line), line
    for line in rows[:4]:
        assert float(line.rsplit("|", 2)[1]) < 1e-5  # loss vs jax.jit
    assert "| [PP, BP] M=8 | {'stage': 4, 'batch': 2} |" in text and "27.3% | 2 |" in text
    assert "| [PP, BP, MP] M=6 | {'stage': 4, 'batch': 8, 'model': 2} |" in text
