"""The simulator on Megatron-LM's published GPT runs (issue 38): estimated against measured
throughput, before and after the cluster model.

    .venv/bin/python benchmarks/megatron_sweep.py   (or `make bench-megatron`;
    options: --rows 1.7B 18.4B 1T --no-write)

The runs: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM" (SC'21, arXiv 2104.04473), Table 1 (weak scaling, 1.7B to 1T parameters on
32 to 3072 80GB A100s of Selene, DGX A100 nodes; vocabulary 51,200, sequence 2048, mixed
precision, activation recomputation). Held out: nothing here is fitted to them.

Each run is the project's transformer (`partir_plugin.models.transformer`, `scan=True`,
`dtype="bfloat16"`: bf16 matmuls and activations, f32 parameters and Adam state) at the
published widths, layers, heads and batch, partitioned from abstract arguments
(`jax.ShapeDtypeStruct`s; nothing runs, no devices beyond this host's) on the mesh
`{stage: p, data: d, model: t}` (Megatron's rank order: tensor-parallel ranks adjacent, then
data, then pipeline) with `[PP(stage, microbatches=B/d), BP(data), MP(model, GPT rule)]`
(microbatches of one sequence per data-parallel rank; no PP where p = 1) and simulated on one
device. The GPT rule is Megatron's: `megatron.transformer_rule` for the blocks, and the
embedding and the output layer split over the vocabulary (Megatron's vocab-parallel
embedding). Every layer is traced: the stacked layers are one `lax.scan`, so tracing and
partitioning cost the same at 24 or 128 layers.

Throughput is compared as Megatron reports it: model FLOPs per iteration by the paper's
formula, 96 B s l h^2 (1 + s/6h + V/16lh) (which counts the recomputed forward pass), over
the iteration time; the estimated iteration time is the simulator's step time. So
`estimated / published` = published iteration time / estimated step time (> 1: the estimate
is faster than the run was).

Each configuration is estimated twice on `a100-80gb` (8 GPUs a node, 25 GB/s of InfiniBand per
GPU across nodes): as published, with `RM("full", modules="Block")` (Megatron recomputed every
layer's forward pass in all ten runs, checkpointing each transformer layer; the row counted
against the acceptance), and without recomputation.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time
from datetime import UTC, datetime

import harness  # noqa: F401  (before jax; the repository root on sys.path)

HEADING = "## Megatron-LM's GPT runs: estimated vs published throughput (issue 38)"
COMMAND = ".venv/bin/python benchmarks/megatron_sweep.py"
VOCAB, SEQ = 51200, 2048


@dataclasses.dataclass(frozen=True)
class Run:
    """One row of Table 1: the model, its parallelism and the measured throughput."""

    name: str
    heads: int
    hidden: int
    layers: int
    tensor: int
    pipeline: int
    gpus: int
    batch: int
    tflops_per_gpu: float  # published, achieved (model FLOPs with recomputation)
    # Microbatches of one sequence even where p = 1 (gradient accumulation), as Megatron's
    # configuration sweeps ran; Table 1's p = 1 rows are taken without.
    accumulate: bool = False

    @property
    def data(self) -> int:
        return self.gpus // (self.tensor * self.pipeline)

    @property
    def flops(self) -> float:
        """Model FLOPs of one iteration by the paper's formula (recomputation included)."""
        b, s, layers, h, v = self.batch, SEQ, self.layers, self.hidden, VOCAB
        return 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))

    @property
    def published_s(self) -> float:
        return self.flops / (self.gpus * self.tflops_per_gpu * 1e12)

    @property
    def mesh(self) -> dict[str, int]:
        return {"stage": self.pipeline, "data": self.data, "model": self.tensor}


# Narayanan et al. 2021, Table 1: parameters, attention heads, hidden size, layers,
# tensor-parallel size, pipeline-parallel size, GPUs, batch size, achieved teraFLOP/s per GPU.
RUNS = (
    Run("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    Run("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    Run("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    Run("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    Run("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    Run("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    Run("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    Run("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    Run("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    Run("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163),
)


def gpt_rule(path: str, shape: tuple[int, ...]) -> int | None:
    """Megatron's tensor parallelism for the GPT: the blocks as `megatron.transformer_rule`,
    the embedding table and the output layer over the vocabulary."""
    from partir_plugin.models import megatron

    if path.endswith("embed/embedding"):
        return 0
    if path.endswith("unembed/kernel"):
        return len(shape) - 1
    return megatron.transformer_rule(path, shape)


@dataclasses.dataclass
class Row:
    run: Run
    plain_s: float  # without recomputation
    rm_s: float  # with RM("full"), as published
    comm_s: float  # of the RM("full") estimate
    peak_bytes: int  # of the RM("full") estimate
    plain_peak_bytes: int
    partition_s: float  # the RM("full") schedule

    def ratio(self, seconds: float) -> float:
        """Estimated / published throughput."""
        return self.run.published_s / seconds


def config(run: Run):
    """The project's transformer at the run's published sizes."""
    from partir_plugin.models import transformer

    return transformer.Config(layers=run.layers, batch=run.batch, seq_len=SEQ, vocab=VOCAB,
                              d_model=run.hidden, heads=run.heads,
                              head_dim=run.hidden // run.heads, ffw=4 * run.hidden,
                              scan=True, dtype="bfloat16")


def published_schedule(run: Run, recompute: str | None = None) -> list:
    """Megatron's parallelism as a schedule: PP over `stage` with one sequence per microbatch
    and data-parallel rank (none where p = 1 unless `run.accumulate`), BP over `data`, MP over
    `model` (GPT rule), and `RM(recompute)` when given (the published runs recomputed:
    "full"), per transformer layer as Megatron checkpoints (`modules="Block"`: under PP each
    layer of each microbatch, not the whole stage body)."""
    import partir_plugin as partir

    schedule = [partir.tactic("BP", axis="data"),
                partir.tactic("MP", rule=gpt_rule, axis="model")]
    if run.pipeline > 1 or run.accumulate:
        schedule.insert(0, partir.tactic("PP", axis="stage",
                                         microbatches=run.batch // run.data))
    if recompute is not None:
        schedule.append(partir.tactic("RM", policy=recompute, modules="Block"))
    return schedule


def simulate_run(run: Run, recompute: str | None):
    """The simulator's result for `run` as `published_schedule(run, recompute)` partitions it,
    and the seconds partitioning took."""
    import jax

    from partir_plugin.core.mesh import Mesh
    from partir_plugin.frontend.trace import trace
    from partir_plugin.models import transformer
    from partir_plugin.plugin.resolve import resolve_hardware, simulate
    from partir_plugin.stages import partition

    cfg = config(run)
    args = jax.eval_shape(lambda key: transformer.init(cfg, key), jax.random.PRNGKey(0))
    mesh = Mesh.of(run.mesh)
    schedule = published_schedule(run, recompute)
    hardware = resolve_hardware("a100-80gb")
    start = time.perf_counter()
    # lowered for the GPUs, as partir.estimate does (HardwareSpec.platform)
    part = partition(trace(transformer.make_train_step(cfg), args, schedule, mesh,
                           hardware.platform), mesh, schedule)
    took = time.perf_counter() - start
    return simulate(part.program.func, mesh, hardware), took


def estimate(run: Run) -> Row:
    plain, _ = simulate_run(run, None)
    rm, took = simulate_run(run, "full")
    return Row(run, plain.runtime_s, rm.runtime_s, rm.communication_s, rm.peak_memory_bytes,
               plain.peak_memory_bytes, took)


def section(rows: list[Row]) -> str:
    import jax

    within = [r for r in rows if 0.75 <= r.ratio(r.rm_s) <= 1.33]
    lines = [
        HEADING, "",
        f"`{COMMAND}` ({datetime.now(UTC):%Y-%m-%d}, jax {jax.__version__}, "
        f"{platform.machine()}; estimates only, nothing runs). Narayanan et al. 2021 "
        "(arXiv 2104.04473), Table 1: GPT models of 1.7B-1T parameters on 32-3072 A100 80GB "
        "(DGX A100 nodes), vocabulary 51,200, sequence 2048, batch B, tensor t x pipeline p x "
        "data d. Our model: `transformer.Config(scan=True, dtype=\"bfloat16\")` at the "
        "published sizes, `[PP(stage, microbatches=B/d), BP(data), MP(model, GPT rule), "
        "RM(\"full\", modules=\"Block\")]` on `{stage: p, data: d, model: t}` (as published: "
        "every run recomputed each layer), partitioned from abstract arguments and "
        "simulated on `a100-80gb` (8 GPUs a node, InfiniBand across nodes; "
        "benchmarks/megatron_sweep.py says how). "
        "Throughput ratio = published iteration time (the paper's FLOPs formula over its "
        "achieved TFLOP/s) / estimated step time; > 1: estimated faster than measured. "
        "\"no RM\": the same without recomputation, for reference.", "",
        "| model | t | p | d | GPUs | B | published s/iter | est. s | ratio | est. no RM s | "
        "ratio no RM | comm s | est. peak GiB (no RM) | partition s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        run = r.run
        lines.append(
            f"| {run.name} | {run.tensor} | {run.pipeline} | {run.data} | {run.gpus} | "
            f"{run.batch} | {run.published_s:.2f} | {r.rm_s:.2f} | {r.ratio(r.rm_s):.2f} | "
            f"{r.plain_s:.2f} | {r.ratio(r.plain_s):.2f} | {r.comm_s:.2f} | "
            f"{r.peak_bytes / 2**30:.1f} ({r.plain_peak_bytes / 2**30:.1f}) | "
            f"{r.partition_s:.1f} |")
    lines += ["", f"Within 0.75-1.33x (as published, with recomputation): {len(within)} of "
              f"{len(rows)}.", "", harness.ANALYSIS_MARKER, ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="*", default=[r.name for r in RUNS],
                        help="Table 1 rows by name (default: all)")
    harness.add_output_args(parser)
    args = parser.parse_args()
    known = {r.name: r for r in RUNS}
    unknown = [n for n in args.rows if n not in known]
    if unknown:
        parser.error(f"unknown rows {unknown} (known: {list(known)})")
    rows = []
    for name in args.rows:
        row = estimate(known[name])
        print(f"{name}: published {row.run.published_s:.2f} s, estimated {row.rm_s:.2f} s "
              f"(ratio {row.ratio(row.rm_s):.2f}; without recomputation {row.plain_s:.2f} s), "
              f"peak {row.peak_bytes / 2**30:.1f} GiB (partitioned in {row.partition_s:.1f} s)",
              flush=True)
        rows.append(row)
    harness.publish(HEADING, section(rows), args.output, write=not args.no_write)


if __name__ == "__main__":
    main()
