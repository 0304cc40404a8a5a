"""partir.plan on 8 CPU devices: does its ranking of its top plans match their measured step
times on this host, and does the best run with jax.jit's numbers? (issue 38)

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python benchmarks/plan.py
    (or `make bench-plan`; options: --seconds 60 --top 5 --reps 3 --steps 10 --no-write)

For the scanned transformer of `partir_plugin/models/transformer.py` (8 layers, d_model 128,
batch 16, sequence 32; Adam) with the Megatron rule, and the scanned MoE of
`partir_plugin/models/moe.py` (4 layers, 4 experts) with its Megatron and expert rules:
`partir.plan(step, *args, devices=8, hardware="host-cpu", seconds=...)`, then each of the
top plans run through `partir.jit` (the median of `--steps` steps, `--reps` repetitions with
the plans alternating, the minimum of the medians) and its loss compared with jax.jit's. The
agreement is Spearman's rank correlation between estimated and measured step times. The
host-cpu spec is the one `partir calibrate` measures; 8 virtual devices share the host's
cores, so what is measured is this host, not a cluster.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import harness  # noqa: F401  (before jax: 8 CPU devices, repo root on sys.path)
from simulator_accuracy import spearman

COMMAND = ("XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python "
           "benchmarks/plan.py")
HEADING = "## partir.plan on 8 CPU devices: estimated against measured (issue 38)"


def workloads() -> dict[str, tuple]:
    """name -> (step, args, plan keywords)."""
    import jax

    from partir_plugin.models import megatron, moe, transformer

    t = dataclasses.replace(transformer.Config.small(layers=8, scan=True), batch=16,
                            seq_len=32, vocab=256, d_model=128, heads=4, head_dim=32,
                            ffw=512)
    m = dataclasses.replace(moe.Config(layers=4, scan=True), batch=16, seq_len=32, vocab=256,
                            d_model=64, heads=4, head_dim=16, ffw=128, experts=4)
    return {
        "transformer": (transformer.make_train_step(t), transformer.init(t, jax.random.PRNGKey(0)),
                        {"model_rule": megatron.transformer_rule}),
        "moe": (moe.make_train_step(m), moe.init(m, jax.random.PRNGKey(0)),
                {"model_rule": megatron.moe_rule, "expert_rule": megatron.expert_rule}),
    }


@dataclasses.dataclass
class Row:
    label: str
    mesh: dict
    estimated_s: float
    estimated_peak: int
    step_s: list = dataclasses.field(default_factory=list)
    loss_error: float = 0.0


def measure(name: str, seconds: float, top: int, reps: int, steps: int) -> tuple[list[Row], str]:
    import jax

    import partir_plugin as partir

    step, args, keywords = workloads()[name]
    start = time.perf_counter()
    plans = partir.plan(step, *args, devices=8, hardware="host-cpu", seconds=seconds,
                        **keywords)
    searched = f"{plans.stats.summary()} (wall {time.perf_counter() - start:.0f} s)"
    chosen = plans[:top]
    want = float(jax.jit(step)(*args)[-1])
    rows = [Row(p.label, p.mesh, p.estimate.step_time_s, p.estimate.peak_memory_bytes)
            for p in chosen]
    fns, placed = [], []
    for p in chosen:
        harness.fresh()
        fn, meta = partir.jit(step, p.mesh, p.schedule)
        jax.block_until_ready(fn(*args))
        fns.append(fn)
        placed.append(harness.placed(args, meta))
    for rep in range(reps):
        for i in (range(len(chosen)) if rep % 2 == 0 else reversed(range(len(chosen)))):
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                out = jax.block_until_ready(fns[i](*placed[i]))
                times.append(time.perf_counter() - t0)
            rows[i].step_s.append(statistics.median(times))
            rows[i].loss_error = abs(float(out[-1]) - want) / abs(want)
            print(f"  {name} {rows[i].label:40s} rep {rep}: {min(rows[i].step_s) * 1e3:.1f} ms",
                  flush=True)
    return rows, searched


def section(results: dict[str, tuple[list[Row], str]], seconds: float, reps: int, steps: int,
            total_s: float) -> str:
    from partir_plugin.report.text import fmt_bytes, fmt_time

    lines = [HEADING, "",
             f"Command: `make bench-plan` (runs `{COMMAND}`; {total_s / 60:.1f} min). "
             f"`partir.plan(step, *args, devices=8, hardware=\"host-cpu\", "
             f"seconds={seconds:g})` on the scanned transformer (8 layers, d_model 128, batch "
             "16, sequence 32, Adam; Megatron rule) and the scanned MoE (4 layers, 4 experts, "
             "d_model 64; Megatron and expert rules); each of the top plans run through "
             f"`partir.jit` on 8 virtual CPU devices sharing the host's cores (arguments placed in "
             f"the step's input shardings first), {reps} "
             f"repetitions alternating, each the median of {steps} steps, minimum shown. "
             "Spearman: rank correlation of estimated and measured step times.", ""]
    for name, (rows, searched) in results.items():
        est = [r.estimated_s for r in rows]
        got = [min(r.step_s) for r in rows]
        lines += [f"**{name}**: {searched}; Spearman {spearman(est, got):.2f}.", "",
                  "| # | plan | mesh | est. step | measured step | est. peak / device | "
                  "loss vs jax.jit |", "|---|---|---|---|---|---|---|"]
        for i, r in enumerate(rows):
            lines.append(f"| {i + 1} | {r.label} | {r.mesh} | {fmt_time(r.estimated_s)} | "
                         f"{fmt_time(min(r.step_s))} | {fmt_bytes(r.estimated_peak)} | "
                         f"{r.loss_error:.1e} |")
        lines.append("")
    lines += [harness.ANALYSIS_MARKER, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", choices=["transformer", "moe"], default=None)
    harness.add_output_args(parser)
    args = parser.parse_args(argv)
    if not harness.has_devices(8):
        return 1
    t0 = time.perf_counter()
    names = [args.only] if args.only else ["transformer", "moe"]
    results = {n: measure(n, args.seconds, args.top, args.reps, args.steps) for n in names}
    text = section(results, args.seconds, args.reps, args.steps, time.perf_counter() - t0)
    harness.publish(HEADING, text, args.output, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
