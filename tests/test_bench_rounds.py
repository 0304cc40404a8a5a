"""The paired-rounds comparison bench-plan ranks measured plans with: a pair counts as told
apart only when one plan is faster in enough of the rounds (a sign test), and the agreement
counts the estimate's order only over such pairs."""

import benchmark_module

harness = benchmark_module.load("harness")
plan = benchmark_module.load("plan")


def test_faster_in_rounds_is_a_two_sided_sign_test():
    fast, slow = [1.0] * 10, [1.1] * 10
    assert harness.faster_in_rounds(fast, slow) == -1
    assert harness.faster_in_rounds(slow, fast) == 1
    # 9 of 10: p = 2 * 11 / 1024 = 0.021; 8 of 10: p = 0.11, not told apart
    nine = [1.0] * 9 + [1.2]
    assert harness.faster_in_rounds(nine, slow) == -1
    eight = [1.0] * 8 + [1.2, 1.2]
    assert harness.faster_in_rounds(eight, slow) == 0
    # a median gap is not enough: alternating wins tell nothing, however large the margins
    assert harness.faster_in_rounds([1.0, 2.0] * 5, [1.5] * 10) == 0
    # tied rounds are left out of the test
    assert harness.faster_in_rounds([1.0] * 6 + [1.1] * 4, [1.1] * 10) == -1
    assert harness.faster_in_rounds([1.0] * 3, [1.0] * 3) == 0


def test_agreement_counts_only_resolved_pairs():
    rounds = 10
    rows = [plan.Row("a", {}, 1.0, 0, [1.0] * rounds),   # estimated fastest, measured fastest
            plan.Row("b", {}, 2.0, 0, [3.0] * rounds),   # estimated second, measured slowest
            plan.Row("c", {}, 3.0, 0, [2.0, 4.0] * 5)]   # b and c: not told apart
    rho, resolved, agreeing = plan.agreement(rows)
    assert (resolved, agreeing) == (2, 2)  # a < b and a < c, both as estimated
    rows[0].step_s = [5.0] * rounds  # now a is measured slowest: both pairs disagree
    rho, resolved, agreeing = plan.agreement(rows)
    assert (resolved, agreeing) == (2, 0) and rho < 0
