"""Partitioning time against jax.jit's compile, and how it grows with the program (issue 11).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python benchmarks/partition_time.py
    (or `make bench-partition-time`; options: --layers 8 16 32 64 --scan-layers 8 64 --reps 3
    --no-write)

The transformer of `partir_plugin/models/transformer.py` (d_model 256, ffw 1024, 8 heads of 32,
vocabulary 512, batch 8, sequence 32; a train step: forward, backward, Adam) at L layers,
unrolled and scanned over layers (`Config.scan=True`), schedule BP+MP+Z3 on the mesh
{batch: 4, model: 2} with the simulator's estimate after every tactic (`hardware="tpu-v3"`, as
the reports need it). Arguments are abstract (`jax.eval_shape`): nothing is run.

Per size:
- the breakdown of one partitioning, phase by phase: jax's lowering of the unsharded step,
  the import of its StableHLO, per tactic the tactic's actions with propagation, the
  lowering of the final state to the device-local program, printing it, and jax's lowering
  of the step as it runs (a manual `shard_map` embedding the module) plus XLA's compile of it
  (no SPMD partitioning inside the shard_map); then the first read of the per-tactic report
  (each tactic's program lowered, incrementally, and simulated);
- the end-to-end ratio of `partir_plugin.jit(step, mesh, schedule).lower(*args).compile()`
  (trace, import, schedule, print, embed, XLA compile) to `jax.jit(step,
  in_shardings=meta.in_shardings, out_shardings=meta.out_shardings).lower(*args).compile()`
  (the same shardings, jax's own Shardy propagation and SPMD partitioner). Each repetition
  builds a fresh train-step function for each side and clears jax's in-memory caches first
  (no persistent cache is configured), so neither side hits a cache; the sides alternate
  (A B, then B A); the minimum over repetitions is reported. After ours, the first
  `meta.report()` is timed apart ("report s").

The growth exponent is the least-squares slope of log(schedule time per tactic) against
log(op count) over the unrolled sizes: 1 is linear. Writes the section "## Partitioning time
vs jax.jit's compile" of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import sys
import time

import harness  # noqa: E402,F401  (before jax: 8 CPU devices, repo root on sys.path)

COMMAND = ("XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python "
           "benchmarks/partition_time.py")
HEADING = "## Partitioning time vs jax.jit's compile"
MESH = {"batch": 4, "model": 2}
HARDWARE = "tpu-v3"
TACTICS = ("BP", "MP", "Z3")


def config(layers: int, scan: bool):
    from partir_plugin.models import transformer

    return dataclasses.replace(transformer.Config.small(layers=layers, scan=scan), batch=8,
                               seq_len=32, vocab=512, d_model=256, heads=8, head_dim=32,
                               ffw=1024)


def build(layers: int, scan: bool):
    """(fresh train step, abstract args, schedule): a new function object on every call."""
    import jax

    import partir_plugin as partir
    from partir_plugin.models import megatron, transformer

    cfg = config(layers, scan)
    args = jax.eval_shape(lambda: transformer.init(cfg, jax.random.PRNGKey(0)))
    schedule = [partir.tactic("BP", axis="batch"),
                partir.tactic("MP", rule=megatron.transformer_rule, axis="model"),
                partir.tactic("Z3", axis="batch")]
    return transformer.make_train_step(cfg), args, schedule


@dataclasses.dataclass
class Size:
    layers: int
    scan: bool
    ops: int = 0  # ops of the imported program (regions included)
    local_ops: int = 0  # ops of the final device-local program
    phases: dict = dataclasses.field(default_factory=dict)  # phase -> seconds
    ours: list = dataclasses.field(default_factory=list)
    peer: list = dataclasses.field(default_factory=list)
    report: list = dataclasses.field(default_factory=list)  # first read of ours' report

    @property
    def name(self) -> str:
        return f"L={self.layers}" + (" scan" if self.scan else "")

    @property
    def schedule_s(self) -> float:
        """Partitioning proper: every tactic's actions and propagation, the final lowering."""
        return sum(v for k, v in self.phases.items()
                   if k.split(" ")[0] in TACTICS or k == "lower (final)")

    @property
    def per_op_tactic_us(self) -> float:
        return self.schedule_s / len(TACTICS) / self.ops * 1e6

    @property
    def ratio(self) -> float:
        return min(self.ours) / min(self.peer)

    @property
    def ratio_with_report(self) -> float:
        return (min(self.ours) + min(self.report)) / min(self.peer)


class _PhaseClock:
    """Times `apply_schedule` and the report's first read by wrapping names that
    `partir_plugin.pipeline` calls: `_AfterTactic` (built once per tactic, right after its
    propagation), `lower_to_spmd` and `estimate`."""

    NAMES = ("_AfterTactic", "lower_to_spmd", "estimate")

    def __init__(self):
        import partir_plugin.pipeline as pipeline

        self.pipeline, self.events = pipeline, []
        self.orig = {n: getattr(pipeline, n) for n in self.NAMES}

    def __enter__(self):
        def timed(name, fn):
            def wrapper(*a, **k):
                start = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    self.events.append((name, start, time.perf_counter()))
            return wrapper

        for n, fn in self.orig.items():
            setattr(self.pipeline, n, timed(n, fn))
        return self

    def __exit__(self, *exc):
        for n, fn in self.orig.items():
            setattr(self.pipeline, n, fn)

    def schedule(self, start: float) -> dict[str, float]:
        """Per tactic its actions + propagation (up to its `_AfterTactic`), then the final
        lowering."""
        out, t = {}, start
        after = [e for e in self.events if e[0] == "_AfterTactic"]
        for tactic, (_, _, end) in zip(TACTICS, after):
            out[f"{tactic} propagate"] = end - t
            t = end
        (_, l0, l1), = [e for e in self.events if e[0] == "lower_to_spmd"]
        out["lower (final)"] = l1 - l0
        return out

    def report(self) -> dict[str, float]:
        """The report's first read: per tactic, the lowering and the estimate."""
        lowers = [e for e in self.events if e[0] == "lower_to_spmd"]
        estimates = [e for e in self.events if e[0] == "estimate"]
        return {"report: lower": sum(e[2] - e[1] for e in lowers),
                "report: simulate": sum(e[2] - e[1] for e in estimates)}


def breakdown(size: Size) -> None:
    """One partitioning, phase by phase (the same steps `PartitionedFunction.lower` takes),
    then the first read of its report; each phase keeps its minimum over the calls."""
    import jax

    from partir_plugin.core.mesh import Mesh
    from partir_plugin.ir.graph import walk
    from partir_plugin.ir.importer import import_lowered
    from partir_plugin.pipeline import apply_schedule, trace
    from partir_plugin.runtime.executable import DeviceLocalFunction, jax_mesh_for

    jax.clear_caches()
    step, args, schedule = build(size.layers, size.scan)
    t0 = time.perf_counter()
    lowered = jax.jit(step, keep_unused=True).lower(*args)
    t1 = time.perf_counter()
    import_lowered(lowered)
    t2 = time.perf_counter()
    traced = trace(step, args)  # the same two steps, plus naming the argument leaves
    size.ops = sum(1 for _ in walk(traced.func.ops))
    with _PhaseClock() as clock:
        t3 = time.perf_counter()
        part = apply_schedule(traced.func, traced.leaves, Mesh.of(MESH), schedule,
                              hardware=HARDWARE, arg_names=traced.arg_names)
    t4 = time.perf_counter()
    text = part.program.text()
    t5 = time.perf_counter()
    function = DeviceLocalFunction("step", text, jax_mesh_for(MESH), part.program.in_layouts,
                                   part.program.out_layouts, traced.out_avals)
    jax.jit(function).lower(*jax.tree.leaves(args)).compile()  # embed (shard_map) + XLA
    t6 = time.perf_counter()
    with _PhaseClock() as report:
        list(part.reports)
    size.local_ops = sum(1 for _ in walk(part.program.func.ops))
    phases = {"jax lowering": t1 - t0, "import": t2 - t1, **clock.schedule(t3),
              "print": t5 - t4, "embed + XLA compile (ours)": t6 - t5, **report.report()}
    size.phases = {k: min(v, size.phases.get(k, v)) for k, v in phases.items()}


def compare(size: Size, reps: int) -> None:
    """`partir.jit(...).lower` against jax.jit's lower + compile, alternating, fresh functions;
    after ours, the first read of its report (`meta.report()`), timed apart."""
    import jax

    import partir_plugin as partir

    meta = None
    for rep in range(reps):
        for who in (("ours", "peer") if rep % 2 == 0 else ("peer", "ours")):
            if who == "peer" and meta is None:
                continue  # the peer needs our shardings: it runs after ours in rep 0
            jax.clear_caches()
            step, args, schedule = build(size.layers, size.scan)
            start = time.perf_counter()
            if who == "ours":
                fn, meta = partir.jit(step, MESH, schedule, hardware=HARDWARE)
                fn.lower(*args).compile()
                size.ours.append(time.perf_counter() - start)
                start = time.perf_counter()
                meta.report()
                size.report.append(time.perf_counter() - start)
            else:
                jax.jit(step, in_shardings=meta.in_shardings,
                        out_shardings=meta.out_shardings).lower(*args).compile()
                size.peer.append(time.perf_counter() - start)
    if not size.peer:  # one repetition: the peer after ours
        jax.clear_caches()
        step, args, _ = build(size.layers, size.scan)
        start = time.perf_counter()
        jax.jit(step, in_shardings=meta.in_shardings,
                out_shardings=meta.out_shardings).lower(*args).compile()
        size.peer.append(time.perf_counter() - start)


def exponent(sizes: list[Size]) -> float:
    """Least-squares slope of log(schedule s per tactic) over log(op count)."""
    xs = [math.log(s.ops) for s in sizes]
    ys = [math.log(s.schedule_s / len(TACTICS)) for s in sizes]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def section(sizes: list[Size], reps: dict, total_s: float) -> str:
    import jax

    unrolled = [s for s in sizes if not s.scan]
    phase_names = list(sizes[0].phases)
    lines = [
        HEADING, "",
        f"Command: `make bench-partition-time` (runs `{COMMAND}`; {total_s / 60:.1f} min in "
        f"all). jax {jax.__version__}, {platform.machine()}, {os.cpu_count()} cores shared with "
        "other work. The transformer (d_model 256, ffw 1024, 8 heads, vocabulary 512, batch 8, "
        "sequence 32; train step with Adam) at L layers, unrolled and `scan`ned over layers; "
        f"BP+MP+Z3 on {MESH}; the simulator's estimate (`{HARDWARE}`) after every tactic. "
        "Abstract arguments: nothing runs.",
        "",
        "End to end: ours = `partir_plugin.jit(step, mesh, schedule).lower(*args).compile()` "
        "(trace, import, schedule, print, the shard_map embedding and XLA's compile); jax = "
        "`jax.jit(step, in_shardings=meta.in_shardings, out_shardings=meta.out_shardings)"
        ".lower(*args).compile()`. Fresh functions and `jax.clear_caches()` before every "
        "measurement, the two sides alternating; minimum of the repetitions shown (" +
        ", ".join(f"{k}: {v}" for k, v in reps.items()) + "). The per-tactic report "
        "(each tactic's program lowered and simulated) is made on its first read "
        "(`TacticReports`): \"report s\" is the first `meta.report()` after ours, and the "
        "last column the ratio when the report is read too. µs/op/tactic = schedule time "
        "(all three tactics' actions + propagation, and the final lowering) / 3 / ops.",
        "",
        "| size | ops | device-local ops | ours s | jax s | ours/jax | report s "
        "| (ours + report)/jax | schedule s | µs/op/tactic |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in sizes:
        lines.append(f"| {s.name} | {s.ops} | {s.local_ops} | {min(s.ours):.2f} | "
                     f"{min(s.peer):.2f} | **{s.ratio:.2f}** | {min(s.report):.2f} | "
                     f"{s.ratio_with_report:.2f} | {s.schedule_s:.2f} | "
                     f"{s.per_op_tactic_us:.1f} |")
    if len(unrolled) > 1:
        lines += ["", f"Growth exponent of the schedule time per tactic over the unrolled "
                      f"sizes (log-log slope against op count; 1 = linear): "
                      f"**{exponent(unrolled):.2f}**."]
    lines += ["", "Breakdown of one partitioning (seconds; per phase the minimum over as many "
                  "runs as the end-to-end repetitions):", "",
              "| phase | " + " | ".join(s.name for s in sizes) + " |",
              "|---|" + "---|" * len(sizes)]
    for p in phase_names:
        lines.append(f"| {p} | " + " | ".join(f"{s.phases[p]:.3f}" for s in sizes) + " |")
    lines.append("| schedule (the tactics and the final lowering) | "
                 + " | ".join(f"{s.schedule_s:.3f}" for s in sizes) + " |")
    lines += ["", harness.ANALYSIS_MARKER, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--reps", type=int, default=3,
                        help="end-to-end repetitions per side up to L=16 (2 at L=32, 1 above)")
    parser.add_argument("--scan-layers", type=int, nargs="*", default=[8, 64],
                        help="sizes of the scanned variant (its op count does not grow with L)")
    harness.add_output_args(parser)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    if not harness.has_devices(8):
        return 1
    sizes, reps = [], {}
    for scan, layer_sizes in ((False, args.layers), (True, args.scan_layers)):
        for layers in layer_sizes:
            size = Size(layers, scan)
            n = args.reps if layers <= 16 or scan else (min(args.reps, 2) if layers <= 32
                                                       else 1)
            reps[size.name] = n
            for _ in range(n):
                breakdown(size)
            compare(size, n)
            sizes.append(size)
            print(f"{size.name:10s} ops {size.ops:6d}  ours {min(size.ours):6.2f} s  jax "
                  f"{min(size.peer):6.2f} s  ratio {size.ratio:.2f}  report "
                  f"{min(size.report):.2f} s  schedule "
                  f"{size.schedule_s:.2f} s  {size.per_op_tactic_us:.1f} µs/op/tactic  "
                  + "  ".join(f"{k} {v:.2f}" for k, v in size.phases.items()), flush=True)
    text = section(sizes, reps, time.perf_counter() - t0)
    harness.publish(HEADING, text, args.output, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
