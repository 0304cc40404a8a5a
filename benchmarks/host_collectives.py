"""What collectives cost on 8 virtual CPU devices that share the host's cores, against what
the host-cpu spec charges: why ZeRO plans rank differently here than estimated (issue 38).

    make bench-host-collectives   (runs COMMAND below)
    options: --rounds 20 --block 3 --kernels 160 --families moe transformer --no-write

Part 1, patterns. A scanned loop of 16 iterations on a {data: 2, expert: 4} mesh (the MoE's
best mesh); each iteration is one or two stretches of `--kernels` small elementwise kernels,
each stretch followed by psums of 4 KiB over the named groups: E over expert (groups of 4), D
over data (pairs), A over both (all 8). The cost of a pattern is its time per iteration beyond
the same loop without psums. The charge is the spec's: per psum its link cost (the ring
model) plus `rendezvous_wait` of its group times the stretch right before it (nothing for a
psum right after another).

Part 2, ZeRO on two families, each on the mesh of its best plan in bench-plan: the scanned
MoE (4 layers, 4 experts, d_model 64) on {data: 2, expert: 4} with BP and EP, and the scanned
transformer (8 layers, d_model 128) on {data: 4, model: 2} with BP and MP; each without ZeRO
and with Z2 or Z3 on data, three ways: the loss alone, loss and gradients, the Adam step.
Estimated by `partir.estimate` on host-cpu, measured through `partir.jit`; CPU is the
process's user + sys time per step (getrusage, in the same rounds).

Timing: `harness.interleaved_rounds` (every program once per round, in a fresh random order),
medians over rounds. The host drifts by tens of percent within minutes; only differences
within one run mean anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import statistics
import sys
import time

import harness  # noqa: F401  (before jax: 8 CPU devices, repo root on sys.path)

COMMAND = ("XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python "
           "benchmarks/host_collectives.py")
HEADING = "## Collectives on 8 virtual CPU devices sharing the host's cores (issue 38)"
ITERATIONS = 16
GROUPS = {"E": ("expert",), "D": ("data",), "A": ("data", "expert")}
MESH = {"data": 2, "expert": 4}
# Patterns: "S" a stretch, a letter psums over GROUPS[letter]. Each against the loop with the
# same stretches and no psum.
PATTERNS = ["S E", "S D", "S A", "S E D", "S D E", "S E D D", "S E A", "S A S D", "S E S D"]


@dataclasses.dataclass
class PatternRow:
    pattern: str
    measured_s: float  # per iteration, beyond the loop without psums
    charged_s: float
    cpu_s: float  # CPU (all threads) per iteration, beyond the loop without psums


@dataclasses.dataclass
class StepRow:
    family: str
    step: str
    schedule: str
    estimated_s: float
    measured_s: float
    cpu_s: float


def _pattern_loop(pattern: str, kernels: int):
    """(jitted loop, its argument) for one pattern on the {data: 2, expert: 4} mesh."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices("cpu")[:8]).reshape(*MESH.values()), tuple(MESH))
    spec = P(tuple(MESH))

    def iteration(v, _):
        for token in pattern.split():
            if token == "S":
                v = jax.lax.fori_loop(0, kernels, lambda i, x: jnp.tanh(x) * 0.5 + 0.25, v)
            else:
                v = v.at[:1024].add(jax.lax.psum(v[:1024], GROUPS[token]) * (1.0 / 8))
        return v, None

    def body(v):
        return jax.lax.scan(iteration, v, None, length=ITERATIONS)[0]

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
    return fn, (jax.device_put(jnp.ones((8 * 4096,), jnp.float32), NamedSharding(mesh, spec)),)


def charge(pattern: str, stretch_s: float, spec) -> float:
    """What the spec charges per iteration: each psum's link cost, and its group's rendezvous
    wait on the stretch right before it (none when it follows another psum). This restates
    `partir_simulators.rendezvous` for a loop of measured stretches: the simulator cannot read
    these loops itself, since a shard_map lowers to `sdy.manual_computation`, an op it has no
    cost for."""
    from partir_simulators.comm import ring_time

    total, since = 0.0, 0.0
    for token in pattern.split():
        if token == "S":
            since += stretch_s
            continue
        g = 1
        for axis in GROUPS[token]:
            g *= MESH[axis]
        total += ring_time("all_reduce", 4096, g, spec.link_for_axes(GROUPS[token]))
        total += spec.wait_fraction(g) * since
        since = 0.0
    return total


def measure_patterns(kernels: int, rounds: int, block: int, spec) -> tuple[list[PatternRow],
                                                                           dict[int, float]]:
    bases = sorted({p.split().count("S") for p in PATTERNS})
    programs = {f"base{n}": _pattern_loop(" ".join(["S"] * n), kernels) for n in bases}
    programs.update({p: _pattern_loop(p, kernels) for p in PATTERNS})
    measured = dict(zip(programs, timed_rounds(list(programs.values()), rounds, block)))
    times = {name: wall for name, (wall, _) in measured.items()}
    cpu = {name: cpu for name, (_, cpu) in measured.items()}
    stretch = {n: times[f"base{n}"] / ITERATIONS / n for n in bases}
    rows = []
    for p in PATTERNS:
        n = p.split().count("S")
        base = f"base{n}"
        rows.append(PatternRow(p, (times[p] - times[base]) / ITERATIONS,
                               charge(p, stretch[n], spec), (cpu[p] - cpu[base]) / ITERATIONS))
    return rows, stretch


@dataclasses.dataclass(frozen=True)
class Family:
    """A model of bench-plan (`plan.model_configs`), on the mesh of its best plan there, with
    the tactics of that plan but ZeRO."""

    name: str  # "moe" or "transformer"
    mesh: dict
    plain: str  # the schedule's label without ZeRO

    def steps(self) -> tuple[dict, tuple, list]:
        """(step name -> step function of (params, opt_state, batch), the arguments, the
        schedule without ZeRO)."""
        import jax
        from partir_tactics import batch_parallel, expert_parallel, model_parallel
        from plan import model_configs

        from partir_plugin.models import common, megatron, moe, transformer

        config = model_configs()[self.name]
        if self.name == "moe":
            module, second = moe, expert_parallel(megatron.expert_rule, "expert")
        else:
            module, second = transformer, model_parallel(megatron.transformer_rule, "model")

        def loss(params, opt_state, batch):
            return module.loss_fn(config, params, batch)

        def grads(params, opt_state, batch):
            value, g = jax.value_and_grad(lambda p: module.loss_fn(config, p, batch))(params)
            return g, value

        steps = {"loss": loss, "loss + grads": grads,
                 "Adam step": common.adam_train_step(config, module.loss_fn)}
        args = module.init(config, jax.random.PRNGKey(0))
        return steps, args, [batch_parallel("data"), second]


FAMILIES = {f.name: f for f in (Family("moe", {"data": 2, "expert": 4}, "BP EP"),
                                Family("transformer", {"data": 4, "model": 2}, "BP MP"))}


class CpuTimed:
    """A step that records the process's CPU time (user + sys, every thread) of each call, so
    CPU is measured in the same rounds as the wall time."""

    def __init__(self, fn) -> None:
        self.fn, self.cpu_s = fn, []

    def __call__(self, *args):
        import jax

        before = resource.getrusage(resource.RUSAGE_SELF)
        out = jax.block_until_ready(self.fn(*args))
        after = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu_s.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        return out


def timed_rounds(calls: list[tuple], rounds: int, block: int) -> list[tuple[float, float]]:
    """Per call `(fn, args)`: (median wall time over rounds, median CPU time per call)."""
    timed = [(CpuTimed(fn), args) for fn, args in calls]
    walls = harness.interleaved_rounds(timed, rounds, block)
    return [(statistics.median(w), statistics.median(t.cpu_s)) for w, (t, _) in zip(walls, timed)]


def measure_zero(family: str, rounds: int, block: int) -> list[StepRow]:
    """Each step of `family` without ZeRO, with Z2 and with Z3 on data: estimated and
    measured (wall and CPU in the same rounds)."""
    import jax
    from partir_tactics import zero2, zero3

    import partir_plugin as partir
    from partir_plugin.estimation import Estimator

    fam = FAMILIES[family]
    steps, args, base = fam.steps()
    schedules = {fam.plain: base, f"{fam.plain} Z2": [*base, zero2("data")],
                 f"{fam.plain} Z3": [*base, zero3("data")]}
    rows, calls = [], []
    for name, fn in steps.items():
        estimator = Estimator(fn, args, "host-cpu")  # one trace for the three schedules
        for label, schedule in schedules.items():
            estimate = estimator.estimate(fam.mesh, schedule)
            harness.fresh()
            step, meta = partir.jit(fn, fam.mesh, schedule)
            jax.block_until_ready(step(*args))
            calls.append((step, harness.placed(args, meta)))
            rows.append(StepRow(family, name, label, estimate.step_time_s, 0.0, 0.0))
    for row, (wall, cpu) in zip(rows, timed_rounds(calls, rounds, block)):
        row.measured_s, row.cpu_s = wall, cpu
        print(f"  {family:11s} {row.step:12s} {row.schedule:9s} est {row.estimated_s * 1e3:7.2f}"
              f" ms  measured {row.measured_s * 1e3:7.2f} ms  cpu {row.cpu_s * 1e3:7.2f} ms",
              flush=True)
    return rows


def section(patterns: list[PatternRow], stretch: dict[int, float], zero: list[StepRow], spec,
            args, total_s: float) -> str:
    from partir_plugin.report.text import fmt_time

    waits = ", ".join(f"{g}: {w:.3f}" for g, w in sorted(spec.rendezvous_wait.items()))
    link = spec.links[spec.default_link]
    lines = [HEADING, "",
             f"Command: `make bench-host-collectives` (runs `{COMMAND}`; {total_s / 60:.1f} "
             f"min). host-cpu as calibrated here: collective overhead "
             f"{link.overhead_s * 1e6:.1f} us, latency {link.latency_s * 1e6:.1f} us per ring "
             f"step, rendezvous_wait {{{waits}}}. {args.rounds} rounds of {args.block} steps, "
             "medians over rounds.", "",
             f"**Patterns** (module docstring): loops on {{data: 2, expert: 4}}, each stretch "
             f"{args.kernels} small kernels ({fmt_time(stretch[1])} per stretch here). E: psum "
             "over expert (groups of 4), D: over data (pairs), A: over all 8. Cost: time per "
             "iteration beyond the loop without psums.", "",
             "| pattern | measured per iteration | charged (own group) | charged / measured | "
             "CPU per iteration (all threads) |",
             "|---|---|---|---|---|"]
    for r in patterns:
        ratio = f"{r.charged_s / r.measured_s:.2f}" if r.measured_s > 0 else "-"
        lines.append(f"| {r.pattern} | {r.measured_s * 1e6:.0f} us | {r.charged_s * 1e6:.0f} us "
                     f"| {ratio} | {r.cpu_s * 1e6:.0f} us |")
    lines += ["", "**ZeRO on two families**, each on the mesh of its best plan in bench-plan: "
              "estimated (host-cpu) against measured step, and CPU (user + sys of all threads) "
              "per step; the last three columns relative to the same step without ZeRO.", "",
              "| family | mesh | step | schedule | est. step | measured step | CPU per step | "
              "est. - without ZeRO | measured - without ZeRO | CPU - without ZeRO |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    plain = {(r.family, r.step): r for r in zero
             if r.schedule == FAMILIES[r.family].plain}
    for r in zero:
        p = plain[r.family, r.step]
        lines.append(f"| {r.family} | {FAMILIES[r.family].mesh} | {r.step} | {r.schedule} | "
                     f"{fmt_time(r.estimated_s)} | {fmt_time(r.measured_s)} | "
                     f"{fmt_time(r.cpu_s)} | {(r.estimated_s - p.estimated_s) * 1e3:+.2f} ms | "
                     f"{(r.measured_s - p.measured_s) * 1e3:+.2f} ms | "
                     f"{(r.cpu_s - p.cpu_s) * 1e3:+.2f} ms |")
    lines += ["", harness.ANALYSIS_MARKER, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--block", type=int, default=3)
    parser.add_argument("--kernels", type=int, default=160)
    parser.add_argument("--families", nargs="*", choices=list(FAMILIES),
                        default=list(FAMILIES), help="part 2's models (none: patterns only)")
    harness.add_output_args(parser)
    args = parser.parse_args(argv)
    if not harness.has_devices(8):
        return 1
    from partir_plugin.plugin.resolve import resolve_hardware

    t0 = time.perf_counter()
    spec = resolve_hardware("host-cpu")
    patterns, stretch = measure_patterns(args.kernels, args.rounds, args.block, spec)
    for r in patterns:
        print(f"  {r.pattern:10s} measured {r.measured_s * 1e6:7.1f} us  charged "
              f"{r.charged_s * 1e6:7.1f} us  cpu {r.cpu_s * 1e6:7.1f} us", flush=True)
    zero = [row for family in args.families
            for row in measure_zero(family, args.rounds, args.block)]
    text = section(patterns, stretch, zero, spec, args, time.perf_counter() - t0)
    harness.publish(HEADING, text, args.output, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
