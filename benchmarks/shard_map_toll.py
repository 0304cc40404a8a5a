"""XLA's compile of a fully manual `shard_map` against `jax.jit` with shardings, by operand count
(issue 23): the toll XLA's partitioner passes take on the embedding of every partitioned step.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python benchmarks/shard_map_toll.py
    (options: --args 200 400 800 1600 --reps 2 --no-passes --no-write)

No partir_plugin code runs: the same function of N arguments (each a 64x64 f32 array, one
`tanh` per argument, sharded over all 8 devices on its first dimension) is compiled by
`jax.jit(f, in_shardings, out_shardings)` (Shardy propagation and the SPMD partitioner over
sharded instructions) and by `jax.jit(jax.shard_map(f, ...))` (fully manual: nothing to
propagate or partition, which is how `partir.jit` embeds its device-local program). Fresh
functions, caches cleared and garbage collected before each compile, the sides alternating;
per side the minimum over repetitions. A ratio growing with N is XLA's, not ours.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import harness  # noqa: F401  (before jax: 8 CPU devices)

HEADING = "## XLA's shard_map toll by operand count"
COMMAND = ("XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python "
           "benchmarks/shard_map_toll.py")


# XLA's partitioner passes, as its compile traces name them (jax's profiler).
PASSES = ("shardy-xla", "spmd-partitioning")


@dataclass(frozen=True)
class Row:
    """One operand count: each side's compile seconds (minimum) and its partitioner passes'
    seconds (one profiled compile per side)."""

    n: int
    jit_s: float
    manual_s: float
    jit_passes: dict[str, float]
    manual_passes: dict[str, float]


def _lowered(n: int, manual: bool):
    """The N-argument function lowered on one side (a fresh function: no cache hit)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), ("b",), axis_types=(jax.sharding.AxisType.Auto,))
    args = [jax.ShapeDtypeStruct((64, 64), jnp.float32) for _ in range(n)]

    def f(*xs):
        return [jnp.tanh(x) for x in xs]

    if manual:
        spec = tuple(P("b") for _ in range(n))
        step = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=list(spec)))
    else:
        sharding = tuple(NamedSharding(mesh, P("b")) for _ in range(n))
        step = jax.jit(f, in_shardings=sharding, out_shardings=list(sharding))
    return step.lower(*args)


def _compile_s(n: int, manual: bool) -> float:
    """Seconds to compile the N-argument function on one side (lowering not counted)."""
    lowered = _lowered(n, manual)
    start = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - start


def _pass_s(n: int, manual: bool) -> dict[str, float]:
    """Seconds XLA spends in each of its partitioner passes (`PASSES`) compiling one side:
    a compile under jax's profiler, its events summed by name (the profiler's overhead is
    why these compiles are not the timed ones)."""
    import jax

    lowered = _lowered(n, manual)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            lowered.compile()
        (path,) = Path(trace_dir).glob("**/*.xplane.pb")
        data = jax.profiler.ProfileData.from_file(str(path))
    seconds = dict.fromkeys(PASSES, 0.0)
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                if event.name in seconds:
                    seconds[event.name] += event.duration_ns / 1e9
    return seconds


def measure(counts: list[int], reps: int, passes: bool = True) -> list[Row]:
    """Per operand count, both sides' compile minima over `reps` (sides alternating) and, with
    `passes`, their partitioner passes from one profiled compile each."""
    rows = []
    with harness.compiles_compile():
        for n in counts:
            rows.append(_measure(n, reps, passes))
    return rows


def _measure(n: int, reps: int, passes: bool) -> Row:
    best = {False: float("inf"), True: float("inf")}
    for rep in range(reps):
        for manual in ((False, True) if rep % 2 == 0 else (True, False)):
            harness.fresh()
            best[manual] = min(best[manual], _compile_s(n, manual))
    where = {False: {}, True: {}}
    if passes:
        for manual in (False, True):
            harness.fresh()
            where[manual] = _pass_s(n, manual)
    return Row(n, best[False], best[True], where[False], where[True])


def section(rows: list[Row], reps: int) -> str:
    import jax

    profiled = any(r.manual_passes for r in rows)
    lines = [HEADING, "",
             f"Command: `{COMMAND}` (jax {jax.__version__}; minimum of {reps} compiles per "
             "side, alternating). XLA's compile only (lowering not counted) of N `tanh`s, "
             "each argument 64x64 f32 sharded over 8 devices: `jax.jit` with shardings "
             "against the same function in a fully manual `jax.shard_map` (what `partir.jit` "
             "compiles)."
             + (" Per pass: XLA's partitioner passes in one more compile per side under "
                "jax's profiler (`jax.profiler.trace`, XLA's pass events summed), jax.jit / "
                "shard_map." if profiled else ""), ""]
    head = "| arguments | jax.jit compile s | shard_map compile s | shard_map / jax.jit |"
    rule = "|---|---|---|---|"
    if profiled:
        head += "".join(f" {p} s |" for p in PASSES)
        rule += "---|" * len(PASSES)
    lines += [head, rule]
    for r in rows:
        line = f"| {r.n} | {r.jit_s:.3f} | {r.manual_s:.3f} | {r.manual_s / r.jit_s:.2f} |"
        if profiled:
            line += "".join(f" {r.jit_passes[p]:.3f} / {r.manual_passes[p]:.3f} |"
                            for p in PASSES)
        lines.append(line)
    return "\n".join([*lines, "", harness.ANALYSIS_MARKER, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--args", type=int, nargs="+", default=[200, 400, 800, 1600])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--no-passes", action="store_true",
                        help="skip the profiled compiles that time XLA's partitioner passes")
    harness.add_output_args(parser)
    args = parser.parse_args(argv)
    rows = measure(args.args, args.reps, passes=not args.no_passes)
    harness.publish(HEADING, section(rows, args.reps), args.output, not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
