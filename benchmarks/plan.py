"""partir.plan on 8 CPU devices: does its ranking of its top plans match their measured step
times on this host, and does the best run with jax.jit's numbers? (issue 38)

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python benchmarks/plan.py
    (or `make bench-plan`; options: --seconds 60 --top 5 --rounds 16 --block 5 --no-write)

For the scanned transformer of `partir_plugin/models/transformer.py` (8 layers, d_model 128,
batch 16, sequence 32; Adam) with the Megatron rule, and the scanned MoE of
`partir_plugin/models/moe.py` (4 layers, 4 experts) with its Megatron and expert rules:
`partir.plan(step, *args, devices=8, hardware="host-cpu", seconds=...)`, then each of the
top plans run through `partir.jit` and its loss compared with jax.jit's. Timing: `--rounds`
rounds, each running every plan in a fresh random order for one unrecorded and `--block`
recorded steps (`harness.interleaved_rounds`); a plan's time is the median over rounds of its
per-round medians. The agreement is Spearman's rank correlation between estimated and measured
step times, and, over the pairs of plans the paired rounds tell apart (a sign test), how many
the estimate orders the same way. The
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


def model_configs() -> dict:
    """name -> the model's config (benchmarks/host_collectives.py measures the same two)."""
    from partir_plugin.models import moe, transformer

    return {
        "transformer": dataclasses.replace(transformer.Config.small(layers=8, scan=True),
                                           batch=16, seq_len=32, vocab=256, d_model=128,
                                           heads=4, head_dim=32, ffw=512),
        "moe": dataclasses.replace(moe.Config(layers=4, scan=True), batch=16, seq_len=32,
                                   vocab=256, d_model=64, heads=4, head_dim=16, ffw=128,
                                   experts=4),
    }


def workloads() -> dict[str, tuple]:
    """name -> (step, args, plan keywords)."""
    import jax

    from partir_plugin.models import megatron, moe, transformer

    configs = model_configs()
    t, m = configs["transformer"], configs["moe"]
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


def measure(name: str, seconds: float, top: int, rounds: int, block: int) -> tuple[list[Row], str]:
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
    calls = []
    for p, row in zip(chosen, rows):
        harness.fresh()
        fn, meta = partir.jit(step, p.mesh, p.schedule)
        out = jax.block_until_ready(fn(*args))  # compiles; the loss checked on it
        row.loss_error = abs(float(out[-1]) - want) / abs(want)
        calls.append((fn, harness.placed(args, meta)))
    for row, times in zip(rows, harness.interleaved_rounds(calls, rounds, block)):
        row.step_s = times
        print(f"  {name} {row.label:40s} {statistics.median(times) * 1e3:.1f} ms", flush=True)
    return rows, searched


def agreement(rows: list[Row]) -> tuple[float, int, int]:
    """(Spearman of estimated against measured medians, pairs the rounds tell apart, of
    those the pairs the estimate orders the same way). `rows` are in estimated order."""
    est = [r.estimated_s for r in rows]
    got = [statistics.median(r.step_s) for r in rows]
    resolved = agreeing = 0
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            verdict = harness.faster_in_rounds(rows[i].step_s, rows[j].step_s)
            if verdict:
                resolved += 1
                # rows i and j in estimated order: agreeing when the measurement does too
                agreeing += (verdict < 0) == (est[i] <= est[j])
    return spearman(est, got), resolved, agreeing


def section(results: dict[str, tuple[list[Row], str]], seconds: float, rounds: int,
            block: int, total_s: float) -> str:
    from partir_plugin.report.text import fmt_bytes, fmt_time

    lines = [HEADING, "",
             f"Command: `make bench-plan` (runs `{COMMAND}`; {total_s / 60:.1f} min). "
             f"`partir.plan(step, *args, devices=8, hardware=\"host-cpu\", "
             f"seconds={seconds:g})` on the scanned transformer (8 layers, d_model 128, batch "
             "16, sequence 32, Adam; Megatron rule) and the scanned MoE (4 layers, 4 experts, "
             "d_model 64; Megatron and expert rules); each of the top plans run through "
             "`partir.jit` on 8 virtual CPU devices sharing the host's cores (arguments placed "
             f"in the step's input shardings first) in {rounds} rounds, each running every plan "
             f"in a fresh random order: one step unrecorded, then {block} steps, their median "
             "the plan's time in the round. Measured: the median over rounds. Spearman: rank "
             "correlation of estimated and measured step times. Resolved pairs: pairs of plans "
             "that one is faster than the other in enough of the rounds for a two-sided sign "
             "test (p < 0.05); agreeing: those the estimate orders the same way.", ""]
    for name, (rows, searched) in results.items():
        rho, resolved, agreeing = agreement(rows)
        pairs = len(rows) * (len(rows) - 1) // 2
        lines += [f"**{name}**: {searched}; Spearman {rho:.2f}; the rounds resolve "
                  f"{resolved} of {pairs} pairs, and the estimate orders {agreeing} of them "
                  "the same way.", "",
                  "| # | plan | mesh | est. step | measured step (quartiles over rounds) | "
                  "est. peak / device | loss vs jax.jit |", "|---|---|---|---|---|---|---|"]
        for i, r in enumerate(rows):
            q1, _, q3 = statistics.quantiles(r.step_s, n=4)
            lines.append(f"| {i + 1} | {r.label} | {r.mesh} | {fmt_time(r.estimated_s)} | "
                         f"{fmt_time(statistics.median(r.step_s))} ({fmt_time(q1)}-"
                         f"{fmt_time(q3)}) | {fmt_bytes(r.estimated_peak)} | "
                         f"{r.loss_error:.1e} |")
        lines.append("")
    lines += [harness.ANALYSIS_MARKER, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--only", choices=["transformer", "moe"], default=None)
    harness.add_output_args(parser)
    args = parser.parse_args(argv)
    if not harness.has_devices(8):
        return 1
    t0 = time.perf_counter()
    names = [args.only] if args.only else ["transformer", "moe"]
    results = {n: measure(n, args.seconds, args.top, args.rounds, args.block) for n in names}
    text = section(results, args.seconds, args.rounds, args.block, time.perf_counter() - t0)
    harness.publish(HEADING, text, args.output, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
