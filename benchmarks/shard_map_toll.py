"""XLA's compile of a fully manual `shard_map` against `jax.jit` with shardings, by operand count
(issue 23): the toll XLA's partitioner passes take on the embedding of every partitioned step.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python benchmarks/shard_map_toll.py
    (options: --args 200 400 800 1600 --reps 2 --no-write)

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
import time

import harness  # noqa: F401  (before jax: 8 CPU devices)

HEADING = "## XLA's shard_map toll by operand count"
COMMAND = ("XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python "
           "benchmarks/shard_map_toll.py")


def _compile_s(n: int, manual: bool) -> float:
    """Seconds to compile the N-argument function on one side (lowering not counted)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), ("b",), axis_types=(jax.sharding.AxisType.Auto,))
    args = [jax.ShapeDtypeStruct((64, 64), jnp.float32) for _ in range(n)]

    def f(*xs):  # a fresh function object per call: no cache hit
        return [jnp.tanh(x) for x in xs]

    if manual:
        spec = tuple(P("b") for _ in range(n))
        step = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=list(spec)))
    else:
        sharding = tuple(NamedSharding(mesh, P("b")) for _ in range(n))
        step = jax.jit(f, in_shardings=sharding, out_shardings=list(sharding))
    lowered = step.lower(*args)
    start = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - start


def measure(counts: list[int], reps: int) -> list[tuple[int, float, float]]:
    """Per operand count (N, jax.jit s, shard_map s), minima over `reps`, sides alternating."""
    rows = []
    for n in counts:
        best = {False: float("inf"), True: float("inf")}
        for rep in range(reps):
            for manual in ((False, True) if rep % 2 == 0 else (True, False)):
                harness.fresh()
                best[manual] = min(best[manual], _compile_s(n, manual))
        rows.append((n, best[False], best[True]))
    return rows


def section(rows: list[tuple[int, float, float]], reps: int) -> str:
    import jax

    lines = [HEADING, "",
             f"Command: `{COMMAND}` (jax {jax.__version__}; minimum of {reps} compiles per "
             "side, alternating). XLA's compile only (lowering not counted) of N `tanh`s, "
             "each argument 64x64 f32 sharded over 8 devices: `jax.jit` with shardings "
             "against the same function in a fully manual `jax.shard_map` (what `partir.jit` "
             "compiles).", "",
             "| arguments | jax.jit compile s | shard_map compile s | shard_map / jax.jit |",
             "|---|---|---|---|"]
    lines += [f"| {n} | {a:.3f} | {b:.3f} | {b / a:.2f} |" for n, a, b in rows]
    return "\n".join([*lines, "", harness.ANALYSIS_MARKER, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--args", type=int, nargs="+", default=[200, 400, 800, 1600])
    parser.add_argument("--reps", type=int, default=2)
    harness.add_output_args(parser)
    args = parser.parse_args(argv)
    rows = measure(args.args, args.reps)
    harness.publish(HEADING, section(rows, args.reps), args.output, not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
