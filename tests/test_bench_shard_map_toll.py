"""benchmarks/shard_map_toll.py run small: both sides compile the N-argument function and the
section names every count."""

import benchmark_module


def test_both_sides_compile_and_the_section_lists_each_count():
    toll = benchmark_module.load("shard_map_toll")
    rows = toll.measure([2, 6], reps=1)
    assert [n for n, _, _ in rows] == [2, 6]
    assert all(a > 0 and b > 0 for _, a, b in rows)
    text = toll.section(rows, reps=1)
    assert "| 2 |" in text and "| 6 |" in text and text.startswith(toll.HEADING)
