"""benchmarks/partition_time.py's phase breakdown on one-layer models of two families: the
clock it wraps around the pipeline must still see every tactic, the final lowering and the
report's first read (it relies on names inside `partir_plugin.schedule` and
`partir_plugin.report.rows`)."""

import benchmark_module
import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script


@pytest.mark.parametrize("family", ["transformer", "gns"])
def test_breakdown_times_every_phase(family):
    partition_time = benchmark_module.load("partition_time")
    size = partition_time.Size(partition_time.FAMILIES[family], 1, False)
    partition_time.breakdown(size)
    tactics = [f"{t} propagate" for t in size.family.tactics]
    assert list(size.phases) == ["jax lowering", "import", *tactics, "lower (final)", "print",
                                 "embed (jax lowering)", "XLA compile (ours)", "report: lower",
                                 "report: simulate"]
    # The last tactic's row reuses the final program: a one-tactic schedule lowers no more.
    lowers_again = len(tactics) > 1
    assert all(v > 0 for k, v in size.phases.items()
               if k != "report: lower" or lowers_again), size.phases
    assert size.ops > 0 and size.local_ops > 0
    assert size.schedule_s == sum(size.phases[p] for p in [*tactics, "lower (final)"])
    assert size.passes_s > size.schedule_s


def test_every_family_has_sizes():
    partition_time = benchmark_module.load("partition_time")
    families = partition_time.FAMILIES.values()
    sizes = {f.name: partition_time.sizes_of(f, [8, 16], [8]) for f in families}
    assert sum(1 for f in families if f.scannable) >= 3
    assert all(len(v) == (3 if f.scannable else 2 if f.layered else 1)
               for f, v in zip(families, sizes.values()))
