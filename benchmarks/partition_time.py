"""Partitioning time against jax.jit's lower + compile, per model family and size (issues 11, 23).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python benchmarks/partition_time.py
    (or `make bench-partition-time`; options: --models transformer decoder moe gns unet
    --layers 8 16 32 64 --scan-layers 8 64 --reps 3 --no-write)

Families (`FAMILIES`), each a train step (forward, backward, optimizer) with abstract
arguments (`jax.eval_shape`: nothing runs) and a schedule from the presets:
- transformer: `partir_plugin/models/transformer.py` (Flax; d_model 256, ffw 1024, 8 heads of
  32, vocabulary 512, batch 8, sequence 32; Adam), BP+MP+Z3 on {batch: 4, model: 2};
- decoder: the plain-JAX + optax decoder LM of `benchmarks/decoder_lm.py` (d 256, 8 heads,
  ffw 1024, vocabulary 1024, batch 16 x 128; adamw), BP+MP+Z3 on {batch: 4, model: 2};
- moe: the mixture of experts of `partir_plugin/models/moe.py` (d 128, 4 heads of 32, 4
  experts of width 512, top-2, vocabulary 512, batch 16 x 32), BP+EP+MP on
  {batch: 2, expert: 2, model: 2};
- gns: the graph network simulator of `partir_plugin/models/gns.py` (256 nodes, 1024 edges,
  latent 128, MLPs 2 x 256), L message-passing steps, edge sharding ES on {batch: 8};
- unet: the UNet of `partir_plugin/models/unet.py` (32x32x3 images, levels (1, 2) x 32
  channels, batch 8), BP+MP on {batch: 4, model: 2}, one size.
Layered families run at L layers unrolled and (transformer, decoder, moe) `scan`ned over
layers. The simulator's estimate (`hardware="tpu-v3"`) follows every tactic, as the reports
need it.

Per size:
- the breakdown of one partitioning, phase by phase: jax's lowering of the unsharded step,
  the import of its StableHLO, per tactic the tactic's actions with propagation, the
  lowering of the final state to the device-local program, printing it, jax's lowering of
  the program that embeds it (a manual `shard_map` of `partir_call`) and XLA's compile of
  that; then the per-tactic report made on this thread (each tactic's program lowered,
  incrementally, and simulated: "report cold s", what a read before compiling costs).
  "Our passes" are import + tactics + final lowering + print + embedding: what `partir.jit`
  adds to jax's lowering of the step;
- end to end, `partir_plugin.jit(step, mesh, schedule).lower(*args)` then `.compile()`
  against `jax.jit(step, in_shardings=meta.in_shardings, out_shardings=meta.out_shardings)
  .lower(*args)` then `.compile()` (the same shardings, jax's own Shardy propagation and SPMD
  partitioner), lower and compile timed apart. Each repetition builds a fresh train-step
  function for each side and clears jax's in-memory caches first (no persistent cache is
  configured), so neither side hits a cache; the sides alternate (A B, then B A); per
  column the minimum over repetitions, the ratio from the minimum totals. After ours'
  compile, the first `meta.report()` is timed apart ("report wait s": `partir.jit` makes
  the rows on another thread while XLA compiles, so this is what is left of them; the read
  also waits for that thread, which is done before the peer runs).

The growth exponent is the least-squares slope of log(schedule time per tactic) against
log(op count) over a family's unrolled sizes: 1 is linear. Writes the section "## Partitioning
time vs jax.jit's compile" of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import sys
import time
from collections.abc import Callable

import harness  # noqa: E402,F401  (before jax: 8 CPU devices, repo root on sys.path)

COMMAND = ("XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python "
           "benchmarks/partition_time.py")
HEADING = "## Partitioning time vs jax.jit's compile"
HARDWARE = "tpu-v3"
MESH = {"batch": 4, "model": 2}


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family: `build(layers, scan)` -> (fresh train step, abstract args, schedule)
    with a new function object on every call; `tactics` names the schedule's tactics in order;
    `layered` families take L (and `scannable` ones a scanned variant), others one size."""

    name: str
    mesh: dict
    tactics: tuple[str, ...]
    build: Callable[[int, bool], tuple]
    layered: bool = True
    scannable: bool = True


def _abstract(init):
    import jax

    return jax.eval_shape(lambda: init(jax.random.PRNGKey(0)))


def _bp_mp_z3() -> list:
    """The issue's schedule for the transformer-shaped families (Megatron rule by names)."""
    import partir_plugin as partir
    from partir_plugin.models import megatron

    return [partir.tactic("BP", axis="batch"),
            partir.tactic("MP", rule=megatron.transformer_rule, axis="model"),
            partir.tactic("Z3", axis="batch")]


def _transformer(layers: int, scan: bool):
    from partir_plugin.models import transformer

    cfg = dataclasses.replace(transformer.Config.small(layers=layers, scan=scan), batch=8,
                              seq_len=32, vocab=512, d_model=256, heads=8, head_dim=32,
                              ffw=1024)
    schedule = _bp_mp_z3()
    return (transformer.make_train_step(cfg), _abstract(lambda k: transformer.init(cfg, k)),
            schedule)


def _decoder(layers: int, scan: bool):
    import decoder_lm  # benchmarks/decoder_lm.py

    cfg = decoder_lm.Config(layers=layers, scan=scan)  # d 256, 8 heads, ffw 1024, v 1024, 16x128
    schedule = _bp_mp_z3()
    return (decoder_lm.make_train_step(cfg), _abstract(lambda k: decoder_lm.init(cfg, k)),
            schedule)


def _moe(layers: int, scan: bool):
    import partir_plugin as partir
    from partir_plugin.models import megatron, moe

    cfg = dataclasses.replace(moe.Config.small(layers=layers, scan=scan), batch=16, seq_len=32,
                              vocab=512, d_model=128, heads=4, head_dim=32, ffw=512)
    schedule = [partir.tactic("BP", axis="batch"),
                partir.tactic("EP", megatron.expert_rule, axis="expert"),
                partir.tactic("MP", rule=megatron.moe_rule, axis="model")]
    return moe.make_train_step(cfg), _abstract(lambda k: moe.init(cfg, k)), schedule


def _gns(layers: int, scan: bool):
    import partir_plugin as partir
    from partir_plugin.models import gns

    cfg = dataclasses.replace(gns.Config.small(), nodes=256, edges=1024, node_features=16,
                              edge_features=4, out_dim=3, latent=128, mlp_hidden=256,
                              steps=layers)
    return (gns.make_train_step(cfg), _abstract(lambda k: gns.init(cfg, k)),
            [partir.tactic("ES", axis="batch")])


def _unet(layers: int, scan: bool):
    import partir_plugin as partir
    from partir_plugin.models import megatron, unet

    cfg = dataclasses.replace(unet.Config.small(), batch=8, image_size=32, channels=32)
    schedule = [partir.tactic("BP", axis="batch"),
                partir.tactic("MP", rule=megatron.unet_rule, axis="model")]
    return unet.make_train_step(cfg), _abstract(lambda k: unet.init(cfg, k)), schedule


FAMILIES = {f.name: f for f in [
    Family("transformer", MESH, ("BP", "MP", "Z3"), _transformer),
    Family("decoder", MESH, ("BP", "MP", "Z3"), _decoder),
    Family("moe", {"batch": 2, "expert": 2, "model": 2}, ("BP", "EP", "MP"), _moe),
    Family("gns", {"batch": 8}, ("ES",), _gns, scannable=False),
    Family("unet", MESH, ("BP", "MP"), _unet, layered=False, scannable=False),
]}


@dataclasses.dataclass
class Size:
    family: Family
    layers: int
    scan: bool
    ops: int = 0  # ops of the imported program (regions included)
    local_ops: int = 0  # ops of the final device-local program
    phases: dict = dataclasses.field(default_factory=dict)  # phase -> seconds
    ours: list = dataclasses.field(default_factory=list)  # (lower s, compile s)
    peer: list = dataclasses.field(default_factory=list)  # (lower s, compile s)
    ours_cpu: list = dataclasses.field(default_factory=list)  # CPU s of lower + compile
    peer_cpu: list = dataclasses.field(default_factory=list)
    report: list = dataclasses.field(default_factory=list)  # first read after compile

    @property
    def name(self) -> str:
        if not self.family.layered:
            return "one size"
        return f"L={self.layers}" + (" scan" if self.scan else "")

    def build(self):
        return self.family.build(self.layers, self.scan)

    @property
    def schedule_s(self) -> float:
        """Partitioning proper: every tactic's actions and propagation, the final lowering."""
        return sum(v for k, v in self.phases.items()
                   if k.split(" ")[0] in self.family.tactics or k == "lower (final)")

    @property
    def passes_s(self) -> float:
        """What partir.jit adds to jax's lowering of the step: import, schedule, print and
        the embedding's jax lowering."""
        return (self.phases["import"] + self.schedule_s + self.phases["print"]
                + self.phases["embed (jax lowering)"])

    @property
    def report_s(self) -> float:
        """The report's first read after `.compile()`: what is left of making it, which
        `partir.jit` starts on another thread when XLA's compile begins."""
        return min(self.report)

    @property
    def report_cold_s(self) -> float:
        """Making the report on the caller's thread (a read before compiling): the
        breakdown's lowering and simulation of every tactic's program."""
        return self.phases["report: lower"] + self.phases["report: simulate"]

    @property
    def per_op_tactic_us(self) -> float:
        return self.schedule_s / len(self.family.tactics) / self.ops * 1e6

    def best(self, side: list, i: int | None = None) -> float:
        """The minimum over repetitions of lower (i=0), compile (1) or their sum (None)."""
        return min(sum(t) if i is None else t[i] for t in side)

    @property
    def ratio(self) -> float:
        return self.best(self.ours) / self.best(self.peer)

    @property
    def cpu_ratio(self) -> float:
        """The same ratio in CPU seconds (this process, all threads): what each side costs
        the machine, less moved by other jobs on shared cores than wall time."""
        return min(self.ours_cpu) / min(self.peer_cpu)

    @property
    def ratio_with_report(self) -> float:
        return (self.best(self.ours) + self.report_s) / self.best(self.peer)


class _PhaseClock:
    """Times `apply_schedule` and the report's first read by wrapping names that
    `partir_plugin.schedule` and `partir_plugin.report.rows` call: `AfterTactic` (built once
    per tactic, right after its propagation), `lower_to_spmd` and `estimate`."""

    NAMES = (("schedule", "AfterTactic"), ("schedule", "lower_to_spmd"),
             ("report.rows", "lower_to_spmd"), ("report.rows", "estimate"))

    def __init__(self):
        import importlib

        self.events = []
        self.orig = {(m, n): (importlib.import_module(f"partir_plugin.{m}"),
                              getattr(importlib.import_module(f"partir_plugin.{m}"), n))
                     for m, n in self.NAMES}

    def __enter__(self):
        def timed(name, fn):
            def wrapper(*a, **k):
                start = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    self.events.append((name, start, time.perf_counter()))
            return wrapper

        for (_, n), (module, fn) in self.orig.items():
            setattr(module, n, timed(n, fn))
        return self

    def __exit__(self, *exc):
        for (_, n), (module, fn) in self.orig.items():
            setattr(module, n, fn)

    def schedule(self, start: float, tactics: tuple[str, ...]) -> dict[str, float]:
        """Per tactic its actions + propagation (up to its `AfterTactic`), then the final
        lowering."""
        out, t = {}, start
        after = [e for e in self.events if e[0] == "AfterTactic"]
        for tactic, (_, _, end) in zip(tactics, after):
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


@harness.compiles_compile()
def breakdown(size: Size) -> None:
    """One partitioning, phase by phase (the same steps `PartitionedFunction.lower` takes),
    then the first read of its report; each phase keeps its minimum over the calls."""
    import jax

    from partir_plugin.core.mesh import Mesh
    from partir_plugin.frontend.trace import trace
    from partir_plugin.ir.graph import walk
    from partir_plugin.ir.importer import import_lowered
    from partir_plugin.options import PartitionOptions
    from partir_plugin.runtime.executable import DeviceLocalFunction, jax_mesh_for
    from partir_plugin.stages import partition

    harness.fresh()
    mesh = size.family.mesh
    step, args, schedule = size.build()
    t0 = time.perf_counter()
    lowered = jax.jit(step, keep_unused=True).lower(*args)
    t1 = time.perf_counter()
    import_lowered(lowered)
    t2 = time.perf_counter()
    traced = trace(step, args)  # the same two steps, plus naming the argument leaves
    size.ops = sum(1 for _ in walk(traced.func.ops))
    with _PhaseClock() as clock:
        t3 = time.perf_counter()
        part = partition(traced, Mesh.of(mesh), schedule,
                         PartitionOptions(hardware=HARDWARE, scatter_sums=True))
    t4 = time.perf_counter()
    text = part.program.text()
    t5 = time.perf_counter()
    function = DeviceLocalFunction("step", text, jax_mesh_for(mesh), part.program.in_layouts,
                                   part.program.out_layouts, traced.out_avals)
    embedded = jax.jit(function).lower(*jax.tree.leaves(args))
    t6 = time.perf_counter()
    embedded.compile()
    t7 = time.perf_counter()
    with _PhaseClock() as report:
        list(part.reports)
    size.local_ops = sum(1 for _ in walk(part.program.func.ops))
    phases = {"jax lowering": t1 - t0, "import": t2 - t1,
              **clock.schedule(t3, size.family.tactics), "print": t5 - t4,
              "embed (jax lowering)": t6 - t5, "XLA compile (ours)": t7 - t6,
              **report.report()}
    size.phases = {k: min(v, size.phases.get(k, v)) for k, v in phases.items()}


def _ours(size: Size):
    """(lower s, compile s, CPU s, meta) of `partir.jit(step, mesh, schedule).lower(*args)
    .compile()` on a fresh step."""
    import partir_plugin as partir

    step, args, schedule = size.build()
    cpu, start = time.process_time(), time.perf_counter()
    fn, meta = partir.jit(step, size.family.mesh, schedule, hardware=HARDWARE)
    lowered = fn.lower(*args)
    mid = time.perf_counter()
    lowered.compile()
    return mid - start, time.perf_counter() - mid, time.process_time() - cpu, meta


def _peer(size: Size, in_shardings, out_shardings) -> None:
    """jax.jit with our shardings on a fresh step: (lower s, compile s) and CPU s."""
    import jax

    step, args, _ = size.build()
    cpu, start = time.process_time(), time.perf_counter()
    lowered = jax.jit(step, in_shardings=in_shardings,
                      out_shardings=out_shardings).lower(*args)
    mid = time.perf_counter()
    lowered.compile()
    size.peer.append((mid - start, time.perf_counter() - mid))
    size.peer_cpu.append(time.process_time() - cpu)


@harness.compiles_compile()
def compare(size: Size, reps: int) -> None:
    """Ours against jax.jit, alternating, fresh functions, caches cleared; after ours'
    compile, the first read of its report (`meta.report()`), timed apart."""

    shardings = None  # ours' (in, out) shardings, for the peer; our IR is not kept alive
    for rep in range(reps):
        for who in (("ours", "peer") if rep % 2 == 0 else ("peer", "ours")):
            if who == "peer" and shardings is None:
                continue  # the peer needs our shardings: it runs after ours in rep 0
            harness.fresh()
            if who == "ours":
                lower, compile_, cpu, meta = _ours(size)
                size.ours.append((lower, compile_))
                size.ours_cpu.append(cpu)
                start = time.perf_counter()
                meta.report()
                size.report.append(time.perf_counter() - start)
                shardings = meta.in_shardings, meta.out_shardings
                del meta
            else:
                _peer(size, *shardings)
    if not size.peer:  # one repetition: the peer after ours
        harness.fresh()
        _peer(size, *shardings)


def exponent(sizes: list[Size]) -> float:
    """Least-squares slope of log(schedule s per tactic) over log(op count)."""
    xs = [math.log(s.ops) for s in sizes]
    ys = [math.log(s.schedule_s / len(s.family.tactics)) for s in sizes]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def _schedule_name(family: Family) -> str:
    return "+".join(family.tactics) + " on " + ", ".join(f"{k}: {v}"
                                                          for k, v in family.mesh.items())


def row(s: Size) -> str:
    jax_compile = s.best(s.peer, 1)
    return (f"| {s.family.name} | {s.name} | {s.ops} | {s.best(s.ours, 0):.2f} | "
            f"{s.best(s.ours, 1):.2f} | {s.best(s.peer, 0):.2f} | {jax_compile:.2f} | "
            f"**{s.ratio:.2f}** | {s.cpu_ratio:.2f} | "
            f"{s.passes_s:.2f} ({100 * s.passes_s / jax_compile:.0f}%) | "
            f"{s.report_cold_s:.2f} ({100 * s.report_cold_s / jax_compile:.0f}%) | "
            f"{s.report_s:.2f} ({100 * s.report_s / jax_compile:.0f}%) | "
            f"{s.ratio_with_report:.2f} | {s.per_op_tactic_us:.1f} |")


def section(sizes: list[Size], reps: dict, total_s: float) -> str:
    import jax

    families = list(dict.fromkeys(s.family.name for s in sizes))
    lines = [
        HEADING, "",
        f"Command: `make bench-partition-time` (runs `{COMMAND}`; {total_s / 60:.1f} min in "
        f"all). jax {jax.__version__}, {platform.machine()}, {os.cpu_count()} cores shared with "
        "other work. Families (the script's docstring has their sizes): "
        + "; ".join(f"{f}: {_schedule_name(FAMILIES[f])}" for f in families)
        + f"; the simulator's estimate (`{HARDWARE}`) after every tactic. Abstract arguments: "
        "nothing runs.",
        "",
        "End to end: ours = `partir_plugin.jit(step, mesh, schedule).lower(*args)` (trace, "
        "import, schedule, print, the shard_map embedding's jax lowering) then `.compile()` "
        "(XLA); jax = `jax.jit(step, in_shardings=meta.in_shardings, out_shardings="
        "meta.out_shardings).lower(*args)` then `.compile()`. Fresh functions and "
        "`jax.clear_caches()` and `gc.collect()` before every measurement, the two sides "
        "alternating; per column "
        "the minimum of the repetitions (" + ", ".join(f"{k}: {v}" for k, v in reps.items())
        + "), ours/jax from the minimum totals; \"CPU ours/jax\" the same ratio in CPU "
        "seconds of the process (all threads: XLA compiles on several), which other jobs on "
        "the shared cores move less than wall time. \"our passes\" = import + tactics + final "
        "lowering + print + the embedding's jax lowering (the breakdown's minima; in "
        "parentheses as % of jax's compile). The per-tactic report (each tactic's program "
        "lowered and simulated) is made on another thread while XLA compiles the step, or "
        "on its first read if that comes first: \"report cold s\" is making it on the "
        "caller's thread (the breakdown's report rows: a read before compiling), \"report "
        "wait s\" the first `meta.report()` after ours' compile (what is left of it then), "
        "and (ours + report)/jax the ratio with that wait. "
        "µs/op/tactic = schedule time (the tactics' actions + propagation, the final "
        "lowering) / tactics / ops.",
        "",
        "| model | size | ops | ours lower s | ours compile s | jax lower s | jax compile s "
        "| ours/jax | CPU ours/jax | our passes s (% of jax compile) | report cold s (%) "
        "| report wait s (%) | (ours + report)/jax | µs/op/tactic |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [row(s) for s in sizes]
    for f in families:
        unrolled = [s for s in sizes if s.family.name == f and not s.scan]
        if len(unrolled) > 1:
            lines += ["", f"Growth exponent of {f}'s schedule time per tactic over its unrolled "
                          f"sizes (log-log slope against op count; 1 = linear): "
                          f"**{exponent(unrolled):.2f}**."]
    for f in families:
        mine = [s for s in sizes if s.family.name == f]
        lines += ["", f"Breakdown of one {f} partitioning (seconds; per phase the minimum over "
                      "as many runs as the end-to-end repetitions, at most 2):", "",
                  "| phase | " + " | ".join(s.name for s in mine) + " |",
                  "|---|" + "---|" * len(mine)]
        for p in mine[0].phases:
            lines.append(f"| {p} | " + " | ".join(f"{s.phases[p]:.3f}" for s in mine) + " |")
        lines.append("| schedule (the tactics and the final lowering) | "
                     + " | ".join(f"{s.schedule_s:.3f}" for s in mine) + " |")
        lines.append("| our passes | " + " | ".join(f"{s.passes_s:.3f}" for s in mine) + " |")
    lines += ["", harness.ANALYSIS_MARKER, ""]
    return "\n".join(lines)


def sizes_of(family: Family, layers: list[int], scan_layers: list[int]) -> list[Size]:
    if not family.layered:
        return [Size(family, 0, False)]
    return ([Size(family, n, False) for n in layers]
            + ([Size(family, n, True) for n in scan_layers] if family.scannable else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
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
    for name in args.models:
        for size in sizes_of(FAMILIES[name], args.layers, args.scan_layers):
            n = (args.reps if size.layers <= 16 or size.scan
                 else (min(args.reps, 2) if size.layers <= 32 else 1))
            reps[f"{name} {size.name}"] = n
            for _ in range(min(n, 2)):  # each compiles once more: at most twice
                breakdown(size)
            compare(size, n)
            sizes.append(size)
            print(row(size), "  ".join(f"{k} {v:.3f}" for k, v in size.phases.items()),
                  flush=True)
    text = section(sizes, reps, time.perf_counter() - t0)
    harness.publish(HEADING, text, args.output, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
