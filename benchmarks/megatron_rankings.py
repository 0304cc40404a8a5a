"""The simulator on Megatron-LM's configuration sweeps (issue 38): does the estimate rank tensor
vs pipeline vs data splits of one model on 64 GPUs as the runs did?

    .venv/bin/python benchmarks/megatron_rankings.py   (or `make bench-megatron-rankings`;
    --no-write)

The sweeps: Narayanan et al. 2021 (arXiv 2104.04473), Section 5.4, on 64 A100 80GB (8 DGX A100
nodes), microbatches of one sequence, each sweep one model and batch size over five splits of
the 64 GPUs. What is compared is the ranking the paper's text states, not bar heights (the
stored references hold no copy of the figures' values):

- Figure 14, pipeline vs data (a 5.9B GPT: 32 layers, 32 heads, hidden 3840; t = 1;
  (p, d) = (2, 32) ... (32, 2)): "for each batch size, the throughput decreases as the
  pipeline-parallel size increases".
- Figure 15, tensor vs data (the same 5.9B GPT; p = 1, so gradient accumulation over
  microbatches of one sequence; (t, d) = (2, 32) ... (32, 2)): the throughput decreases as the
  tensor-parallel size grows (tensor parallelism's all-reduces every microbatch, across nodes
  beyond 8, and smaller matmuls).
- Figure 13, tensor vs pipeline (a 162.2B GPT: 32 layers, 128 heads, hidden 20480; d = 1;
  (t, p) = (2, 32) ... (32, 2)): "peak performance when the tensor-parallel size is equal to
  the number of GPUs in a single node (8)". Only the peak is stated, so only the peak is
  compared.

Each configuration is estimated as benchmarks/megatron_sweep.py estimates Table 1's (the
project's transformer at the sweep's sizes, `published_schedule` with per-layer
recomputation, `a100-80gb`); the estimated throughput of a split is the model's FLOPs over the
estimated step time (the same FLOPs for every split of a sweep, so the ranking is that of the
step times). Batch sizes: 32, 128 and 512 for Figures 14 and 15, 32 and 128 for Figure 13 (as
in the figures' legends). Spearman: rank correlation of the estimated throughputs with the
stated order (5, 4, 3, 2, 1 along the splits as listed).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
from datetime import UTC, datetime

import harness  # noqa: F401  (before jax; the repository root on sys.path)
import megatron_sweep
from simulator_accuracy import spearman

HEADING = "## Megatron-LM's configuration sweeps: estimated rankings (issue 38)"
COMMAND = ".venv/bin/python benchmarks/megatron_rankings.py"
GPUS = 64
SPLITS = (2, 4, 8, 16, 32)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One figure: a model, which two sizes vary (the third is 1), the batch sizes, and the
    order the paper states."""

    figure: str
    name: str
    heads: int
    hidden: int
    layers: int
    varies: tuple[str, str]  # ("pipeline", "data"): the first takes SPLITS, the second 64 / it
    batches: tuple[int, ...]
    stated: str  # "decreasing" along SPLITS, or "peak at 8"

    def run(self, split: int, batch: int) -> megatron_sweep.Run:
        sizes = {"tensor": 1, "pipeline": 1, "data": 1}
        sizes[self.varies[0]], sizes[self.varies[1]] = split, GPUS // split
        return megatron_sweep.Run(
            f"{self.name} {self.varies[0][0]}={split}", self.heads, self.hidden, self.layers,
            sizes["tensor"], sizes["pipeline"], GPUS, batch, float("nan"), accumulate=True)


SWEEPS = (
    Sweep("14", "5.9B", 32, 3840, 32, ("pipeline", "data"), (32, 128, 512), "decreasing"),
    Sweep("15", "5.9B", 32, 3840, 32, ("tensor", "data"), (32, 128, 512), "decreasing"),
    Sweep("13", "162.2B", 128, 20480, 32, ("tensor", "pipeline"), (32, 128), "peak at 8"),
)


@dataclasses.dataclass
class Result:
    sweep: Sweep
    batch: int
    seconds: list[float]  # estimated step time per split, in SPLITS order

    @property
    def throughputs(self) -> list[float]:
        return [1 / s for s in self.seconds]

    @property
    def peak(self) -> int:
        return SPLITS[max(range(len(SPLITS)), key=lambda i: self.throughputs[i])]

    @property
    def rho(self) -> float | None:
        """Spearman of the estimated throughputs with the stated decreasing order."""
        if self.sweep.stated != "decreasing":
            return None
        return spearman(self.throughputs, [-s for s in SPLITS])

    @property
    def matches(self) -> bool:
        if self.rho is not None:
            return self.rho >= 0.7
        return self.peak == 8


def estimate(sweep: Sweep, batch: int) -> Result:
    seconds = []
    for split in SPLITS:
        result, _ = megatron_sweep.simulate_run(sweep.run(split, batch), "full")
        seconds.append(result.runtime_s)
    return Result(sweep, batch, seconds)


def section(results: list[Result]) -> str:
    import jax

    matched = sum(r.matches for r in results)
    lines = [
        HEADING, "",
        f"`{COMMAND}` ({datetime.now(UTC):%Y-%m-%d}, jax {jax.__version__}, "
        f"{platform.machine()}; estimates only, nothing runs). Narayanan et al. 2021, "
        "Section 5.4: one model and batch size per sweep, five splits of 64 A100 80GB; the "
        "order compared is the one the paper's text states (benchmarks/megatron_rankings.py "
        "quotes it). Estimated with `[PP(stage, microbatches=B/d), BP(data), MP(model, GPT "
        "rule), RM(\"full\", modules=\"Block\")]` on `a100-80gb`, as benchmarks/"
        "megatron_sweep.py does Table 1. Columns: the estimated step time of each split "
        "(seconds); Spearman against the stated order where the text states one, else "
        "whether the estimated peak is the stated one.", "",
        "| figure | model | varies | B | " + " | ".join(f"{s}" for s in SPLITS)
        + " | stated | estimated peak | Spearman | matches |",
        "|---|---|---|---|" + "---|" * len(SPLITS) + "---|---|---|---|",
    ]
    for r in results:
        s = r.sweep
        rho = "-" if r.rho is None else f"{r.rho:.2f}"
        lines.append(
            f"| {s.figure} | {s.name} | {s.varies[0]} (x {s.varies[1]}) | {r.batch} | "
            + " | ".join(f"{t:.2f}" for t in r.seconds)
            + f" | {s.stated} | {s.varies[0][0]}={r.peak} | {rho} | "
            f"{'yes' if r.matches else 'no'} |")
    lines += ["", f"Sweeps whose estimated ranking matches the stated one: {matched} of "
              f"{len(results)}.", "", harness.ANALYSIS_MARKER, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--figures", nargs="*", default=[s.figure for s in SWEEPS])
    parser.add_argument("--batches", nargs="*", type=int, default=None,
                        help="only these batch sizes (default: each figure's)")
    harness.add_output_args(parser)
    args = parser.parse_args(argv)
    results = []
    for sweep in SWEEPS:
        if sweep.figure not in args.figures:
            continue
        for batch in sweep.batches:
            if args.batches and batch not in args.batches:
                continue
            r = estimate(sweep, batch)
            print(f"Figure {sweep.figure} B={batch}: "
                  + ", ".join(f"{sweep.varies[0][0]}={s}: {t:.2f} s"
                              for s, t in zip(SPLITS, r.seconds))
                  + f" -> peak {r.peak}, Spearman {r.rho}", flush=True)
            results.append(r)
    harness.publish(HEADING, section(results), args.output, write=not args.no_write)


if __name__ == "__main__":
    main()
