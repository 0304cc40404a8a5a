"""benchmarks/partition_time.py's phase breakdown on a one-layer transformer: the clock it
wraps around the pipeline must still see every tactic, the final lowering and the report's
first read (it relies on names inside `partir_plugin.pipeline`)."""


import benchmark_module


def test_breakdown_times_every_phase():
    partition_time = benchmark_module.load("partition_time")
    size = partition_time.Size(1, False)
    partition_time.breakdown(size)
    tactics = [f"{t} propagate" for t in partition_time.TACTICS]
    assert list(size.phases) == ["jax lowering", "import", *tactics, "lower (final)", "print",
                                 "embed + XLA compile (ours)", "report: lower",
                                 "report: simulate"]
    assert all(v > 0 for v in size.phases.values()), size.phases
    assert size.ops > 0 and size.local_ops > 0
    assert size.schedule_s == sum(size.phases[p] for p in [*tactics, "lower (final)"])
