"""Automatic against manual partitioning, a Fig. 11-like comparison (issue 12).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python benchmarks/autopart.py
    (or `make bench-autopart`; options: --models t2 t8 unet mlp t32 --seconds 8 --runs 5
    --measure t2 unet mlp --searchers mcts greedy --no-write)

Per model, on the mesh {batch: 4, model: 2} with the simulator's estimates on `a100-40gb`
(`partir_plugin.jit(step, mesh, schedule, hardware="a100-40gb")`):

- the manual schedules (presets BP, MP with the model's Megatron rule, Z2, Z3, and EMB for the
  transformers); "best manual" is the one with the lowest simulated runtime among those whose
  simulated peak memory fits the device (ties: lower memory; when none fits, among all);
- for every installed searcher S (`partir_plugin.plugin.manager.searchers()`, enumerated at run
  time): `[AutomaticPartition(["batch", "model"], searcher=S, seconds=...)]`, compared with the best
  manual schedule, and `[BP, AutomaticPartition(["model"], searcher=S, seconds=...)]`,
  compared with BP+MP; options `{"seed": 0, "progress": False, "hardware": "a100-40gb"}`.

Per schedule: the final report row's simulated runtime and peak memory
(`meta.tactics[-1]`, filled by `step.lower(*args)`), the wall time of `step.lower` (trace,
schedule, lowering), and for automatic rows the search: seconds, iterations and evaluations from
the report row's `search` (`SearchResult`). The small models are also run on 8 virtual CPU devices:
the reference schedules and every automatic one, each compiled and warmed up, then the
schedules alternate run by run (round robin, order rotated every round); median of `--runs`
runs, `jax.block_until_ready`. T32 at the paper's size (`transformer.Config.paper()`) is
partitioned from abstract arguments (`jax.eval_shape`) and only simulated.

Writes the section "## Automatic partitioning (Fig. 11)" of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

import harness  # noqa: E402,F401  (before jax: 8 CPU devices, repo root on sys.path)

COMMAND = ("XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python "
           "benchmarks/autopart.py")
HEADING = "## Automatic partitioning (Fig. 11)"
MESH = {"batch": 4, "model": 2}
HARDWARE = "a100-40gb"  # the default cost model of every search and report (`--hardware`)
DEFAULT_MODELS = ("t2", "t8", "unet", "mlp", "t32")
DEFAULT_MEASURE = ("t2", "unet", "mlp", "mlp-tiny")
DEFAULT_SECONDS = 10.0
DEFAULT_RUNS = 5
WARMUP = 2


# ----------------------------------------------------------------------------- the models


@dataclasses.dataclass
class Model:
    name: str
    desc: str
    build: Callable[[], tuple]  # () -> (train_step, args, mp_rule); args abstract if not run
    manual: tuple[str, ...]
    runnable: bool = True  # False: simulated only (abstract arguments)


_T_MANUAL = ("BP", "BP+MP", "BP+Z2", "BP+Z3", "BP+MP+Z2", "BP+MP+Z3", "BP+MP+Z3+EMB")
_MANUAL = ("BP", "BP+MP", "BP+Z2", "BP+Z3", "BP+MP+Z2", "BP+MP+Z3")


def _transformer(layers: int | None) -> Model:
    def build():
        import jax

        from partir_plugin.models import megatron, transformer

        if layers is None:
            cfg = transformer.Config.paper()
            args = jax.eval_shape(lambda: transformer.init(cfg, jax.random.PRNGKey(0)))
        else:
            cfg = dataclasses.replace(transformer.Config.small(layers=layers), batch=16,
                                      seq_len=256, vocab=1024, d_model=512, heads=8,
                                      head_dim=64, ffw=2048)
            args = transformer.init(cfg, jax.random.PRNGKey(0))
        return transformer.make_train_step(cfg), args, megatron.transformer_rule

    if layers is None:
        return Model("t32", "T32 at the paper's size (`transformer.Config.paper()`: L32 d4096 "
                     "h32x128 f10880 v32000 b48 s2048), simulated only", build, _T_MANUAL,
                     runnable=False)
    return Model(f"t{layers}", f"T{layers}: decoder LM L{layers} d512 h8x64 f2048 v1024 b16 "
                 "s256", build, _T_MANUAL)


def _unet() -> Model:
    def build():
        import jax

        from partir_plugin.models import megatron, unet

        cfg = dataclasses.replace(unet.Config.small(), batch=16, image_size=16, channels=32,
                                  channel_mult=(1, 2), num_res=1, groups=8, attn_heads=4)
        return unet.make_train_step(cfg), unet.init(cfg, jax.random.PRNGKey(0)), \
            megatron.unet_rule

    return Model("unet", "UNet (DDPM): 16x16x3 images, 2 levels of 32/64 channels, 1 residual "
                 "block per level, 4-head middle attention, b16", build, _MANUAL)


def _mlp(tiny: bool = False) -> Model:
    def build():
        import jax

        from partir_plugin.models import megatron, mlp

        cfg = (dataclasses.replace(mlp.Config.small(), batch=16) if tiny else
               mlp.Config(batch=256, in_dim=512, hidden=(1024,) * 4, num_classes=512))
        return mlp.make_train_step(cfg), mlp.init(cfg, jax.random.PRNGKey(0)), megatron.mlp_rule

    if tiny:
        return Model("mlp-tiny", "MLP 16-32-32-10, b16 (for tests)", build, ("BP", "BP+MP"))
    return Model("mlp", "MLP 512-1024x4-512, b256", build, _MANUAL)


MODELS: dict[str, Callable[[], Model]] = {
    "t2": lambda: _transformer(2), "t8": lambda: _transformer(8), "unet": _unet,
    "mlp": _mlp, "t32": lambda: _transformer(None), "mlp-tiny": lambda: _mlp(tiny=True),
}


# ----------------------------------------------------------------------------- schedules


def manual_schedule(name: str, mp_rule) -> list:
    import partir_plugin as partir

    make = {"BP": lambda: partir.tactic("BP", axis="batch"),
            "MP": lambda: partir.tactic("MP", rule=mp_rule, axis="model"),
            "Z2": lambda: partir.tactic("Z2", axis="batch"),
            "Z3": lambda: partir.tactic("Z3", axis="batch"),
            "EMB": lambda: partir.tactic("EMB", axis="model")}
    return [make[t]() for t in name.split("+")]


def auto_schedules(searcher: str, seconds: float, hardware: str
                   ) -> dict[str, tuple[list, str]]:
    """name -> (schedule, the manual schedule it is compared with: None = best manual)."""
    import partir_plugin as partir

    options = {"seed": 0, "progress": False, "hardware": hardware}

    def auto(axes):
        return partir.AutomaticPartition(list(axes), searcher=searcher, seconds=seconds,
                                         options=dict(options))

    return {f"Auto(batch,model) [{searcher}]": ([auto(("batch", "model"))], None),
            f"BP+Auto(model) [{searcher}]": ([partir.tactic("BP", axis="batch"),
                                              auto(("model",))], "BP+MP")}


# ----------------------------------------------------------------------------- measuring


@dataclasses.dataclass
class Row:
    model: str
    schedule: str
    auto: bool
    runtime_s: float
    peak_bytes: int
    lower_s: float
    reference: str | None = None  # auto rows: the manual schedule compared with
    searcher: str | None = None
    search_s: float | None = None
    iterations: int | None = None
    evaluations: int | None = None
    actions: int | None = None  # tile actions the automatic tactic applied
    step_times: list[float] = dataclasses.field(default_factory=list)
    run: Callable | None = dataclasses.field(default=None, repr=False)
    best: bool = False
    error: str | None = None  # the automatic run failed: its exception

    @property
    def step_s(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None


def partition(model: Model, name: str, schedule: list, built: tuple, measure: bool,
              hardware: str, searcher: str | None = None, reference: str | None = None
              ) -> Row:
    import jax

    import partir_plugin as partir

    train_step, args, _ = built
    start = time.perf_counter()
    step, meta = partir.jit(train_step, MESH, schedule, hardware=hardware)
    step.lower(*args)
    lower_s = time.perf_counter() - start
    final = meta.tactics[-1]
    row = Row(model.name, name, searcher is not None, final.estimated_runtime_s,
              final.estimated_peak_memory_bytes, lower_s, reference, searcher)
    if searcher is not None:
        search = final.search  # the automatic tactic is the schedule's last
        row.search_s, row.iterations, row.evaluations = (search.seconds, search.iterations,
                                                         search.evaluations)
        row.actions = sum(1 for a in final.actions if a.startswith("tile"))
    if measure:
        placed = jax.device_put(args, meta.in_shardings)
        row.run = lambda: step(*placed)
    return row


def time_rows(rows: list[Row], runs: int) -> None:
    """Compile and warm up each, then round robin: every round runs each row once, the order
    rotated by one every round."""
    import jax

    for r in rows:
        for _ in range(WARMUP):
            jax.block_until_ready(r.run())
    for i in range(runs):
        k = i % len(rows)
        for r in rows[k:] + rows[:k]:
            start = time.perf_counter()
            jax.block_until_ready(r.run())
            r.step_times.append(time.perf_counter() - start)


def best_manual(rows: list[Row], memory_bytes: int) -> Row:
    return min(rows, key=lambda r: (r.peak_bytes > memory_bytes, r.runtime_s, r.peak_bytes))


def bench_model(model: Model, searchers: list[str], seconds: float, runs: int, measure: bool,
                hardware: str) -> list[Row]:
    measure = measure and model.runnable
    built = model.build()
    manual = []
    for name in model.manual:
        manual.append(partition(model, name, manual_schedule(name, built[2]), built, measure,
                                hardware))
        _progress(manual[-1])
    best = best_manual(manual, _memory_bytes(hardware))
    best.best = True
    by_name = {r.schedule: r for r in manual}
    autos = []
    for s in searchers:
        for name, (schedule, ref) in auto_schedules(s, seconds, hardware).items():
            ref = ref if ref in by_name else best.schedule
            try:
                autos.append(partition(model, name, schedule, built, measure, hardware,
                                       searcher=s, reference=ref))
            except Exception as e:  # one searcher's failure is a result, not the end
                autos.append(Row(model.name, name, True, math.nan, 0, math.nan, ref, s,
                                 error=f"{type(e).__name__}: {e}".splitlines()[0][:160]))
            _progress(autos[-1])
    if measure:
        refs = [best] + [r for r in manual if r is not best and
                         any(a.reference == r.schedule for a in autos)]
        timed = refs + [a for a in autos if a.run is not None]
        print(f"  timing {len(timed)} schedules x {runs} runs ...", flush=True)
        time_rows(timed, runs)
        for r in timed:
            print(f"  {r.schedule:32s} step {r.step_s * 1e3:9.1f} ms", flush=True)
    for r in manual + autos:
        r.run = None  # free the placed arguments
    return manual + autos


def _progress(r: Row) -> None:
    if r.error:
        print(f"{r.model:8s} {r.schedule:30s} FAILED: {r.error}", flush=True)
        return
    extra = ""
    if r.auto:
        extra = (f"  search {_fmt(r.search_s, '.1f')} s, {_fmt(r.iterations)} it, "
                 f"{_fmt(r.evaluations)} evals, {r.actions} tiles")
    print(f"{r.model:8s} {r.schedule:30s} sim {r.runtime_s * 1e3:10.3f} ms  "
          f"{r.peak_bytes / 2**20:10.1f} MiB  lower {r.lower_s:6.1f} s{extra}", flush=True)


# ----------------------------------------------------------------------------- reporting


def _fmt(x, spec: str = "") -> str:
    return "-" if x is None else format(x, spec)


def sim_ratio(r: Row, rows: list[Row]) -> float | None:
    ref = next((m for m in rows if m.model == r.model and m.schedule == r.reference), None)
    return None if ref is None else r.runtime_s / ref.runtime_s


def step_ratio(r: Row, rows: list[Row]) -> float | None:
    ref = next((m for m in rows if m.model == r.model and m.schedule == r.reference), None)
    if ref is None or r.step_s is None or ref.step_s is None:
        return None
    return r.step_s / ref.step_s


HEAD = ["model", "schedule", "sim. runtime ms", "sim. peak MiB", "vs", "sim. auto/ref",
        "search s (iters / evals)", "tiles", "lower s", "step ms (CPU)", "step auto/ref"]


def table(rows: list[Row], memory_bytes: int) -> list[str]:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for r in rows:
        if r.error:
            lines.append(f"| {r.model} | {r.schedule} | failed: {r.error} |"
                         + " |" * (len(HEAD) - 3))
            continue
        ratio, sratio = sim_ratio(r, rows), step_ratio(r, rows)
        name = f"**{r.schedule}** (best manual)" if r.best else r.schedule
        peak = f"{r.peak_bytes / 2**20:.0f}" + (" (over)" if r.peak_bytes > memory_bytes else "")
        search = "-"
        if r.auto:
            search = (f"{_fmt(r.search_s, '.1f')} ({_fmt(r.iterations)} / "
                      f"{_fmt(r.evaluations)})")
        lines.append("| " + " | ".join([
            r.model, name, f"{r.runtime_s * 1e3:.3f}", peak, r.reference or "-",
            f"**{ratio:.2f}**" if ratio is not None else "-", search, _fmt(r.actions),
            f"{r.lower_s:.1f}", _fmt(r.step_s and r.step_s * 1e3, ".1f"),
            f"**{sratio:.2f}**" if sratio is not None else "-"]) + " |")
    return lines


def summary(rows: list[Row], searchers: list[str]) -> list[str]:
    """One line per model: the references, then auto/reference per searcher as simulated
    ratio / measured ratio (the Fig. 11 view)."""
    kinds = [("Auto(batch,model)", "best manual"), ("BP+Auto(model)", "BP+MP")]
    head = ["model", "best manual (sim. ms)", "BP+MP (sim. ms)"]
    head += [f"{kind} [{s}] / {ref}" for kind, ref in kinds for s in searchers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        best = next(r for r in mine if r.best)
        bpmp = next((r for r in mine if r.schedule == "BP+MP"), None)
        cells = [model, f"{best.schedule} ({best.runtime_s * 1e3:.3g})",
                 f"{bpmp.runtime_s * 1e3:.3g}" if bpmp else "-"]
        for kind, _ in kinds:
            for s in searchers:
                r = next((r for r in mine if r.schedule == f"{kind} [{s}]"), None)
                if r is None or r.error:
                    cells.append("failed" if r else "-")
                    continue
                cell = f"**{sim_ratio(r, rows):.2f}**"
                if step_ratio(r, rows) is not None:
                    cell += f" / {step_ratio(r, rows):.2f}"
                cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def analysis(rows: list[Row], memory_bytes: int) -> list[str]:
    failed = [r for r in rows if r.error]
    rows = [r for r in rows if not r.error]
    autos = [r for r in rows if r.auto]
    worse = [r for r in autos if (sim_ratio(r, rows) or 0) > 1.005]
    better = [r for r in autos if (sim_ratio(r, rows) or math.inf) < 0.995]
    timed = [r for r in autos if step_ratio(r, rows) is not None]
    slow = [r for r in timed if step_ratio(r, rows) > 1.05]
    nothing = [r for r in autos if r.actions == 0]
    over = sorted({r.model for r in rows if r.best and r.peak_bytes > memory_bytes})
    bigger = [r for r in autos if r.peak_bytes > 1.05 * _ref(r, rows).peak_bytes]

    def names(rs, f):
        return ", ".join(f"{r.model} {r.schedule} {f(r, rows):.2f}" for r in rs) or "none"

    lines = [
        "Reading (generated from the figures above):",
        "",
        f"- Simulated: automatic is worse than its reference in {len(worse)} of {len(autos)} "
        f"runs ({names(worse, sim_ratio)}), better in {len(better)} "
        f"({names(better, sim_ratio)}), equal elsewhere.",
        f"- Simulated peak memory of the automatic result more than 5% above its reference's in "
        f"{len(bigger)} of {len(autos)} runs"
        + (" (" + ", ".join(f"{r.model} {r.schedule} {r.peak_bytes / _ref(r, rows).peak_bytes:.1f}x"
                           for r in bigger) + ")" if bigger else "")
        + ". (The built-in searchers' cost, docs/autopart.md, is runtime x (1 + penalty x "
        "overflow): memory below the device's size does not count, so they do not look for "
        "ZeRO-like savings.)",
        f"- Measured on CPU: automatic is more than 5% slower than its reference in "
        f"{len(slow)} of {len(timed)} timed runs ({names(slow, step_ratio)}). CPU step times on "
        "8 virtual devices sharing the host's cores measure compute and copies, not the A100 "
        "the search costs for: they check that the chosen partitionings run and are not "
        "pathological; they do not test the simulator (a partitioning that leaves work "
        "replicated costs little on an A100's compute estimate but runs every replicated "
        "FLOP on the shared CPU cores).",
    ]
    if over:
        lines.append(
            f"- {', '.join(over)}: no manual schedule fits the {memory_bytes / 2**30:.0f} GiB "
            "device on this 8-device mesh (no rematerialisation; the paper ran T32 on 32 "
            "devices), so every candidate of the search is penalised for overflow and the "
            "comparison is between overflowing programs.")
    if nothing:
        lines.append("- Searches that applied no tile action (the starting state was the best "
                     "found in the budget): "
                     + ", ".join(f"{r.model} {r.schedule}" for r in nothing) + ".")
    if failed:
        lines.append("- Failed automatic runs: " + "; ".join(
            f"{r.model} {r.schedule}: {r.error}" for r in failed) + ".")
    return lines + [""]


def _ref(r: Row, rows: list[Row]) -> Row:
    return next(m for m in rows if m.model == r.model and m.schedule == r.reference)


def section(rows: list[Row], models: list[Model], searchers: list[str], args,
            total_s: float) -> str:
    import jax

    argv = (f"--models {' '.join(args.models)} --seconds {args.seconds:g} --runs {args.runs} "
            f"--measure {' '.join(args.measure)} --searchers {' '.join(searchers)}"
            + (f" --hardware {args.hardware}" if args.hardware != HARDWARE else ""))
    lines = [
        HEADING,
        "",
        f"Command: `make bench-autopart` (runs `{COMMAND}`; this run: `{argv}`, "
        f"{total_s / 60:.1f} min in all, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC).",
        "",
        f"Setup: mesh {MESH} of 8 virtual CPU devices (jax {jax.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} cores shared with other work); estimates by "
        f"the analytical simulator on `{args.hardware}` (`partir_plugin.jit(..., "
        f'hardware="{args.hardware}"`). Models (train steps: forward, backward, Adam): '
        + "; ".join(m.desc for m in models) + ".",
        "",
        "- Manual schedules from the presets: BP (batch), MP (the model's Megatron rule: "
        "`megatron.transformer_rule`, `megatron.unet_rule`, and for the MLP hidden layers "
        "split column/row in pairs), Z2/Z3 (ZeRO on the batch axis), EMB (embedding on the "
        "model axis). Best manual: lowest simulated runtime among the schedules whose "
        "simulated peak fits the device's memory (ties: lower memory; when none fits, among "
        "all).",
        f"- Automatic, per installed searcher ({', '.join(searchers)}): "
        '`AutomaticPartition(["batch", "model"], searcher=S, seconds=...)` against the best '
        'manual schedule, and `[BP, AutomaticPartition(["model"], ...)]` against BP+MP, options '
        f'`{{"seed": 0, "progress": False, "hardware": "{args.hardware}"}}`, a budget of '
        f"{args.seconds:g} s each (checked between iterations, so a search overruns by up to one "
        "iteration).",
        "- sim. runtime / peak: the final report row (`meta.tactics[-1]`); \"(over)\": above "
        "the device's memory. Search s: the searcher's own figures (iterations / evaluations = "
        "simulated candidates) when it reports them, else the wall time of the tactic; tiles: "
        "tile actions the automatic tactic applied; lower s: `step.lower(*args)` (trace, "
        "schedule, lowering, estimates).",
        f"- Step ms: measured on the CPU devices, median of {args.runs} runs after {WARMUP} "
        "warm-up runs per schedule (compile included there), the schedules of a model "
        "alternating round robin, `jax.block_until_ready`; only the reference schedules and "
        "the automatic ones are timed.",
        "",
        "Summary: automatic / reference, simulated runtime in bold, then the measured CPU step "
        "time where the model was run (below 1: automatic is faster).",
        "",
        *summary(rows, searchers),
        "",
        "All schedules:",
        "",
        *table(rows, _memory_bytes(args.hardware)),
        "",
        *analysis(rows, _memory_bytes(args.hardware)),
        harness.ANALYSIS_MARKER,
        "",
    ]
    return "\n".join(lines)


def _memory_bytes(hardware: str) -> int:
    from partir_plugin.plugin.resolve import resolve_hardware

    return resolve_hardware(hardware).memory_bytes


# ----------------------------------------------------------------------------- main


def run(argv: list[str] | None = None) -> tuple[list[Row], str]:
    """Run the benchmark; (rows, section text). The section is written unless --no-write."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=MODELS)
    parser.add_argument("--measure", nargs="*", default=list(DEFAULT_MEASURE),
                        help="models whose steps are also run on the CPU devices (default: "
                             + " ".join(DEFAULT_MEASURE) + "; T32 never)")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS,
                        help=f"search budget per automatic run (default {DEFAULT_SECONDS:g})")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS,
                        help=f"timed runs per schedule (default {DEFAULT_RUNS})")
    parser.add_argument("--searchers", nargs="+", default=None,
                        help="default: every installed searcher")
    parser.add_argument("--hardware", default=HARDWARE,
                        help=f"the spec searches and reports cost for (default {HARDWARE}; "
                             "host-cpu: the calibrated host, to compare with the CPU step "
                             "times)")
    harness.add_output_args(parser)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()

    from partir_plugin.plugin.manager import searchers as installed

    available = sorted(installed())
    searchers = args.searchers or available
    unknown = sorted(set(searchers) - set(available))
    if unknown:
        parser.error(f"unknown searcher(s) {unknown}; installed: {available}")
    if any(m in args.measure for m in args.models) and not harness.has_devices(8):
        raise SystemExit(1)
    models = [MODELS[m]() for m in args.models]
    rows: list[Row] = []
    for model in models:
        rows += bench_model(model, searchers, args.seconds, args.runs,
                            model.name in args.measure, args.hardware)
    args.searchers = searchers
    text = section(rows, models, searchers, args, time.perf_counter() - t0)
    harness.publish(HEADING, text, args.output, write=not args.no_write)
    return rows, text


def main(argv: list[str] | None = None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
