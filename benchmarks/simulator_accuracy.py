"""How far the analytical simulator is from what XLA:CPU does, on 8 virtual CPU devices.

    .venv/bin/python benchmarks/simulator_accuracy.py [--runs 10] [--recalibrate] [--no-write]

For each model x schedule it partitions and compiles the train step with `partir_plugin.jit`
(hardware "host-cpu", the spec `partir calibrate` saves; calibrated first when no file exists or
with `--recalibrate`) and compares

- the estimated peak memory of the device-local program with XLA's own figure for the compiled
  program (argument + output + temp - alias bytes from its memory analysis), and
- the estimated step time with the measured one (median of `--runs` runs after warm-up, inputs
  already placed, `jax.block_until_ready`; the runs of all cases are interleaved so that load
  from elsewhere on the host does not favour some cases),

prints a table, the relative memory errors and the Spearman rank correlation of step time, and
writes them into docs/BENCHMARKS.md under "## Simulator accuracy" (only that section is replaced).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness  # noqa: E402,F401  (before jax: 8 CPU devices, repo root on sys.path)

ROOT = harness.ROOT

COMMAND = ".venv/bin/python benchmarks/simulator_accuracy.py"
HEADING = "## Simulator accuracy"
MEMORY_TARGET = 0.10
RANK_TARGET = 0.9


@dataclasses.dataclass
class Case:
    model: str
    schedule_name: str
    make: object  # () -> (train_step, args, schedule)


@dataclasses.dataclass
class Row:
    model: str
    schedule: str
    collectives: str
    est_mem: int
    xla_mem: int
    est_time: float
    measured_time: float

    @property
    def mem_err(self) -> float:
        return (self.est_mem - self.xla_mem) / self.xla_mem


def _mlp_case(hidden: int, layers: int, batch: int, features: int):
    import optax

    from partir_plugin.examples import mlp

    def make():
        model, optimizer = mlp.MLP(hidden=hidden, layers=layers, classes=16), optax.adam(1e-3)
        params, opt_state, data = mlp.init(model, optimizer, batch_size=batch, features=features)
        return mlp.make_train_step(model, optimizer), (params, opt_state, data)

    return make


def _transformer_case():
    import jax

    from partir_plugin.models import transformer

    config = dataclasses.replace(
        transformer.Config.small(),
        batch=16,
        seq_len=64,
        vocab=512,
        d_model=128,
        heads=4,
        head_dim=32,
        ffw=512,
    )

    def make():
        params, opt_state, batch = transformer.init(config, jax.random.PRNGKey(0))
        return transformer.make_train_step(config), (params, opt_state, batch)

    return make


def _transformer_mp_rule(path: str, shape: tuple):
    """Megatron on the MLP blocks: dense_up split on outputs, dense_down on inputs."""
    if path.endswith("dense_up/kernel"):
        return 1
    if path.endswith("dense_down/kernel"):
        return 0
    return None


def _schedules(batch_arg: str, batch_sel, mp_rule) -> dict[str, list]:
    import partir_plugin as partir

    bp = partir.ManualPartition({batch_arg: batch_sel}, axis="batch", name="BP")
    mp = partir.ManualPartition({"params": mp_rule}, axis="model", name="MP")
    # Z2 keeps the parameters replicated (atomic) on the axis: without it propagation carries the
    # optimizer state's tiling through the Adam update into the parameters, which is Z3.
    z2 = partir.ManualPartition(
        {"params": partir.REPLICATED, "opt_state": partir.FIRST_DIVISIBLE_DIM},
        axis="batch",
        name="Z2",
    )
    z3 = partir.ManualPartition(
        {"params": partir.FIRST_DIVISIBLE_DIM, "opt_state": partir.FIRST_DIVISIBLE_DIM},
        axis="batch",
        name="Z3",
    )
    return {
        "BP": [bp],
        "MP": [mp],
        "BP+MP": [bp, mp],
        "BP+Z2": [bp, z2],
        "BP+Z3": [bp, z3],
        "BP+MP+Z3": [bp, mp, z3],
    }


def cases() -> list[tuple[str, str, object, list]]:
    """(model, schedule name, make, schedule) for every combination measured."""
    from partir_plugin.examples import mlp

    out = []
    mlp_models = {
        "mlp-h256x4-b512": _mlp_case(256, 4, 512, 256),
        "mlp-h512x4-b1024": _mlp_case(512, 4, 1024, 256),
        "mlp-h1024x2-b128": _mlp_case(1024, 2, 128, 512),
    }
    mlp_scheds = _schedules("batch", 0, mlp.megatron_rule)
    for model, make in mlp_models.items():
        for name in ("BP", "MP", "BP+MP", "BP+Z2", "BP+Z3", "BP+MP+Z3"):
            out.append((model, name, make, mlp_scheds[name]))
    t_scheds = _schedules("batch", {"tokens": 0, "targets": 0}, _transformer_mp_rule)
    for name in ("BP", "BP+MP", "BP+Z3"):
        out.append(("transformer-d128x2", name, _transformer_case(), t_scheds[name]))
    return out


def ensure_calibrated(force: bool) -> Path:
    from partir_hardware.host import calibration_path

    path = calibration_path()
    if force or not path.exists():
        print(f"calibrating the host-cpu spec (partir calibrate) -> {path}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "partir_plugin.cli", "calibrate"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return path


@dataclasses.dataclass
class Prepared:
    model: str
    schedule: str
    compiled: object
    placed: tuple
    row: Row


def prepare(model: str, schedule_name: str, make, schedule, mesh) -> Prepared:
    """Partition + compile one case, read XLA's memory analysis, place the inputs, warm up."""
    import jax

    import partir_plugin as partir

    step_fn, args = make()
    step, meta = partir.jit(step_fn, mesh, schedule, hardware="host-cpu")
    compiled = step.lower(*args).compile()
    stats = compiled.memory_analysis()
    xla_mem = (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
    )
    placed = jax.device_put(args, meta.in_shardings)
    for _ in range(2):
        jax.block_until_ready(compiled(*placed))
    last = meta.tactics[-1]
    short = {
        "all_gather": "AG",
        "all_reduce": "AR",
        "reduce_scatter": "RS",
        "all_to_all": "A2A",
        "all_permute": "AP",
    }
    coll = " ".join(f"{short[k]}{v}" for k, v in last.collectives.items() if v) or "-"
    row = Row(
        model,
        schedule_name,
        coll,
        int(last.estimated_peak_memory_bytes),
        int(xla_mem),
        float(last.estimated_runtime_s),
        float("nan"),
    )
    return Prepared(model, schedule_name, compiled, placed, row)


def time_all(prepared: list[Prepared], runs: int) -> None:
    """Median step time per case. Runs are interleaved (round r times every case once), so a
    burst of load from elsewhere on the host hits all cases alike instead of a few."""
    import jax

    times: list[list[float]] = [[] for _ in prepared]
    for _ in range(runs):
        for i, p in enumerate(prepared):
            start = time.perf_counter()
            jax.block_until_ready(p.compiled(*p.placed))
            times[i].append(time.perf_counter() - start)
    for p, t in zip(prepared, times):
        p.row.measured_time = statistics.median(t)


def spearman(xs: list[float], ys: list[float]) -> float:
    try:
        from scipy.stats import spearmanr
    except ImportError:

        def ranks(v):
            order = sorted(range(len(v)), key=lambda i: v[i])
            r = [0.0] * len(v)
            i = 0
            while i < len(order):
                j = i
                while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                    j += 1
                for k in range(i, j + 1):
                    r[order[k]] = (i + j) / 2
                i = j + 1
            return r

        rx, ry = ranks(xs), ranks(ys)
        mx, my = statistics.fmean(rx), statistics.fmean(ry)
        cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
        var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
        return cov / var if var else float("nan")
    return float(spearmanr(xs, ys).statistic)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def table(rows: list[Row]) -> list[str]:
    head = [
        "model",
        "schedule",
        "collectives",
        "est. mem MiB",
        "XLA mem MiB",
        "mem err",
        "est. ms",
        "measured ms",
        "est/measured",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    r.model,
                    r.schedule,
                    r.collectives,
                    _mib(r.est_mem),
                    _mib(r.xla_mem),
                    f"{r.mem_err * 100:+.1f}%",
                    _ms(r.est_time),
                    _ms(r.measured_time),
                    f"{r.est_time / r.measured_time:.2f}",
                ]
            )
            + " |"
        )
    return lines


def summary(rows: list[Row]) -> dict:
    errs = [abs(r.mem_err) for r in rows]
    within = sum(e <= MEMORY_TARGET for e in errs)
    rho = spearman([r.est_time for r in rows], [r.measured_time for r in rows])
    return {
        "n": len(rows),
        "mean_abs_mem_err": statistics.fmean(errs),
        "max_abs_mem_err": max(errs),
        "median_abs_mem_err": statistics.median(errs),
        "within": within,
        "rho": rho,
    }


def section(rows: list[Row], s: dict, spec_line: str, runs: int) -> str:
    import jax

    worst = max(rows, key=lambda r: abs(r.mem_err))
    lines = [
        HEADING,
        "",
        f"Command: `{COMMAND}` (about two minutes; calibrates the `host-cpu` spec first when "
        "`~/.cache/partir_plugin/host_cpu.json` is missing, or with `--recalibrate`).",
        "",
        f"{s['n']} model x schedule combinations, each a train step (forward, backward, Adam) "
        "partitioned by `partir_plugin.jit` on a `batch=4, model=2` mesh of 8 virtual CPU devices "
        f"(jax {jax.__version__}, {platform.machine()}, {os.cpu_count()} cores), estimated with "
        f"the calibrated `host-cpu` spec ({spec_line}). Memory: the simulator's peak per device "
        "vs XLA's memory analysis of the compiled device-local program (argument + output + "
        f"temp - alias bytes). Time: the estimate vs the median of {runs} runs after 2 warm-up "
        "runs, inputs already on their devices, the cases' runs interleaved.",
        "",
        *table(rows),
        "",
        f"- Peak memory: mean |error| {s['mean_abs_mem_err'] * 100:.1f}%, median "
        f"{s['median_abs_mem_err'] * 100:.1f}%, max {s['max_abs_mem_err'] * 100:.1f}% "
        f"({worst.model} {worst.schedule}); {s['within']}/{s['n']} within the 10% target.",
        f"- Step time: Spearman rank correlation {s['rho']:.3f} (target >= {RANK_TARGET}); "
        f"{'meets' if s['rho'] >= RANK_TARGET else 'misses'} the target.",
        "",
        "What the memory model reproduces of XLA's buffer assignment (checked against the "
        "buffer-assignment dumps, `--xla_dump_to`, of these programs): temporaries are placed in "
        "output buffers that are written after they die (XLA assigns live-out buffers first, "
        "then fits the other buffers, largest first, into allocations whose occupants do not "
        "overlap them; only the rest goes to the temp heap): on the 4-layer MLPs nearly all "
        "activations and reduced gradients live in the new parameters' and optimizer moments' "
        "buffers; an elementwise kernel takes over an input's buffer only when it reads that "
        "input elementwise (not through a transpose); a `reduce_scatter` over an inner "
        "dimension copies its operand into a scattered-dimension-major layout first, the "
        "operand and the copy live at once (the Z2/Z3 weight gradients of the MLPs). And what "
        "XLA:CPU's fusion materialises (the `host-cpu` spec's `duplicates_expensive_ops=False`, "
        "`library_reductions=True`): an expensive op (exp, tanh, divide, rsqrt, ...) read by "
        "several kernels is computed once and kept (the GELU's tanh from the forward to the "
        "backward pass, the softmax's exp), and a producer read by a reduction (a YNNPACK "
        "fusion, which takes in only producers nothing else reads) and by another kernel is "
        "materialised, after XLA's CSE has merged the copies JAX emits (the broadcasts of the "
        "norms' scales and rsqrt, kept from the forward to the backward pass). These took the "
        "transformer from -6% (BP, BP+MP) and -20% (BP+Z3) to the figures above.",
        "",
        "Where it falls short, and why:",
        "",
        "- XLA:CPU's matmuls want row-major operands with the contracting dimension in place "
        "and batch dimensions major, so it materialises transposes around some matmuls "
        "(`transpose_copy`/`copy_bitcast` fusions: the weight gradients' transposed operands, "
        "the attention's head-major copies); the simulator treats them as fused or free. "
        "Around attention the copy replaces its source (same bytes), but a weight gradient's "
        "copy lives next to its source: the transformer's Z3 peak (the unembedding's weight "
        "gradient) holds one such 512 KiB copy the simulator lacks (part of its -3%).",
        "- The simulator orders kernels with its own memory-first list-scheduling heuristic, "
        "not XLA's schedule, so which temporary can wait in which output buffer sometimes "
        "differs (the remaining few-percent errors of the MLP cases, in both directions). "
        "The transformer's BP and BP+MP are now over-estimated by 4-7%: at its peak the "
        "simulator holds more 128 KiB activations than XLA does at its own (22 against 16 on "
        "BP), while the broadcasts and the tanh it now keeps are held by XLA too; not analysed "
        "further.",
        "- Step time: the absolute error is up to about 3x (est/measured column) because 8 "
        "virtual devices share the host's cores (their kernels and the `host` link contend; the "
        "calibration measures them while all run, but not with every op mix), and XLA:CPU's "
        "per-op speed differs from one roofline figure for all matmul shapes. The ratio moves "
        "with the load on the host: est/measured ranged 0.4-3.1 over our runs, the rank "
        "correlation 0.93-0.96 (0.85 before the runs were interleaved). Rank order is what the "
        "simulator is for (choosing between schedules); with 2 shared cores the measurements "
        "themselves vary by 10-30% between runs, which limits the correlation that can be "
        "observed.",
        "",
        harness.ANALYSIS_MARKER,
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="timed runs per case (default 10)")
    parser.add_argument("--recalibrate", action="store_true", help="run `partir calibrate` first")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/BENCHMARKS.md")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    ensure_calibrated(args.recalibrate)

    import jax

    from partir_plugin.plugin.resolve import resolve_hardware

    if len(jax.devices()) < 8:
        print(
            "needs 8 devices: run as a script (it sets XLA_FLAGS before jax starts)",
            file=sys.stderr,
        )
        return 1
    spec = resolve_hardware("host-cpu")
    link = spec.links[spec.default_link]
    spec_line = (
        f"{spec.flops_per_s['f32'] / 1e9:.1f} GFLOP/s f32, "
        f"{spec.memory_bandwidth_bytes_per_s / 1e9:.2f} GB/s memory, "
        f"{link.bandwidth_bytes_per_s / 1e9:.2f} GB/s / {link.latency_s * 1e6:.1f} µs per "
        f"ring step / {link.overhead_s * 1e6:.1f} µs per collective links, "
        f"{spec.kernel_overhead_s * 1e6:.1f} µs per kernel"
    )
    mesh = jax.make_mesh((4, 2), ("batch", "model"), devices=jax.devices()[:8])
    prepared = []
    for model, name, make, schedule in cases():
        p = prepare(model, name, make, schedule, mesh)
        prepared.append(p)
        print(
            f"{model:20s} {name:9s} mem est {_mib(p.row.est_mem):>8s} MiB xla "
            f"{_mib(p.row.xla_mem):>8s} MiB ({p.row.mem_err * 100:+.1f}%)  time est "
            f"{_ms(p.row.est_time):>8s} ms",
            flush=True,
        )
    print(f"timing {len(prepared)} cases x {args.runs} interleaved runs ...", flush=True)
    time_all(prepared, args.runs)
    rows = [p.row for p in prepared]
    s = summary(rows)
    text = section(rows, s, spec_line, args.runs)
    harness.publish(HEADING, text, args.output, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
