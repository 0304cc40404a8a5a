"""benchmarks/plan_at_scale.py on its smallest row with a short budget (30 s: with 10, a slow
host estimated four configurations, all over 80 GiB, and found no plan): the published
configuration is estimated both ways, a plan is found, and the section says whether it is
accepted (the full run, `make bench-plan-scale`, takes 3 minutes a row)."""

import benchmark_module
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.exhaustive]  # plans a 1.7B GPT on 32 GPUs


def test_plan_at_scale_writes_its_section(tmp_path):
    scale = benchmark_module.load("plan_at_scale")
    out = tmp_path / "BENCHMARKS.md"
    scale.main(["--rows", "1.7B", "--seconds", "30", "--output", str(out)])
    text = out.read_text()
    assert scale.HEADING in text
    (row,) = [line for line in text.splitlines() if line.startswith("| 1.7B |")]
    assert row.rstrip().endswith(("| yes |", "| no |")) and " x 1 x 32 |" in row
