"""benchmarks/shard_map_toll.py run small: both sides compile the N-argument function, XLA's
partitioner passes are found in the profiled compiles, and the section names every count."""

import benchmark_module
import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script


def test_both_sides_compile_and_the_section_lists_each_count_and_pass():
    toll = benchmark_module.load("shard_map_toll")
    rows = toll.measure([2, 6], reps=1)
    assert [r.n for r in rows] == [2, 6]
    assert all(r.jit_s > 0 and r.manual_s > 0 for r in rows)
    # Both sides run XLA's partitioner passes, the manual one included (the toll).
    for r in rows:
        for side in (r.jit_passes, r.manual_passes):
            assert set(side) == set(toll.PASSES) and all(s > 0 for s in side.values())
    text = toll.section(rows, reps=1)
    assert "| 2 |" in text and "| 6 |" in text and text.startswith(toll.HEADING)
    assert all(f"{p} s" in text for p in toll.PASSES)


def test_passes_can_be_left_out():
    toll = benchmark_module.load("shard_map_toll")
    (row,) = toll.measure([2], reps=1, passes=False)
    assert row.manual_passes == {} and "shardy-xla" not in toll.section([row], reps=1)
