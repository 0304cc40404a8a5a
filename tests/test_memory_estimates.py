"""benchmarks/memory_estimates.py at the tests' sizes: the simulator's estimated peak per
device within 0.8-1.25x of XLA's memory analysis of the compiled partitioned step, for the
shapes that were wrong (issue 37): a scan whose residual stacks are carried values, its body
rematerialised, and the pipelined scan (with its unread carries and loop invariants)."""

import benchmark_module
import pytest

memory_estimates = benchmark_module.load("memory_estimates")
SCHEDULES = {s.name: s for s in memory_estimates.SCHEDULES}


@pytest.mark.parametrize("family, schedule", [
    ("jax lax.scan MLP", "[BP]"),
    ("jax lax.scan MLP", "[BP, RM full]"),
    ("jax lax.scan MLP", "[PP, BP, RM full]"),
    # The linen recipe partitions slowly (dropout, masks); the dots policy on a scan is also
    # checked by tests/test_simulator.py.
    pytest.param("flax linen LM (nn.scan)", "[BP, RM dots]", marks=pytest.mark.slow),
])
def test_estimated_peak_is_within_a_quarter_of_xla(family, schedule):
    row = memory_estimates.measure(family, SCHEDULES[schedule], small=True)
    assert memory_estimates.LOW <= row.ratio <= memory_estimates.HIGH, row
