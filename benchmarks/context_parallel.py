"""Context parallelism (tiling the transformer's sequence dimension) before and after issue 19.

    .venv/bin/python benchmarks/context_parallel.py [--no-write] [--models small]
    (or `make bench-context-parallel`)

The schedule `[ManualPartition({"batch": 1}, axis="seq", name="CP")]` tiles dimension 1 (the
sequence) of every leaf of the train step's `batch` argument (tokens and targets) on the axis
`seq`. The transformer (`partir_plugin/models/transformer.py`) is traced abstractly
(`jax.eval_shape`: nothing is allocated) at two sizes, `Config.small()` and T32
(`Config.paper()`), and partitioned with
`stages.partition(..., PartitionOptions(conflicts=policy))` for both conflict policies:
"stop" (PartIR's strict semantics: an op whose operands carry incompatible tilings stays
unpartitioned on the axis, its operands gathered) and
"redistribute" (the default since issue 19: the op stays partitioned along the cheapest entry
and what does not fit is moved). Per case: the collectives of the final device-local program
(AG / AR / RS / A2A), the conflicts and resolutions the final report row lists, the simulator's
runtime and peak-memory estimates and the partitioning time. For `Config.small()` the step is
also run on 4 of 8 virtual CPU devices, both policies against `jax.jit` from the same inputs.

Writes the section "## Context parallelism: conflicts stopped vs redistributed" of
docs/BENCHMARKS.md. About 1 minute on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import harness  # noqa: F401  (before jax: 8 CPU devices, repository root on sys.path)

COMMAND = ".venv/bin/python benchmarks/context_parallel.py"
HEADING = "## Context parallelism: conflicts stopped vs redistributed"
HARDWARE = "a100-40gb"
POLICIES = ("stop", "redistribute")
KINDS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all")
SHORT = {"all_gather": "AG", "all_reduce": "AR", "reduce_scatter": "RS", "all_to_all": "A2A"}


@dataclasses.dataclass(frozen=True)
class Setup:
    """One model size on one mesh: `bp` puts batch parallelism on the `batch` axis first."""

    model: str
    mesh: tuple[tuple[str, int], ...]
    bp: bool = False

    @property
    def schedule_name(self) -> str:
        return "BP+CP" if self.bp else "CP"


SETUPS: dict[str, tuple[Setup, ...]] = {
    "small": (Setup("small", (("seq", 4),)),),
    "T32": (Setup("T32", (("seq", 4),)), Setup("T32", (("batch", 8), ("seq", 4)), bp=True)),
}


@dataclasses.dataclass
class Row:
    """What one policy gives on one setup."""

    setup: Setup
    policy: str
    counts: dict[str, int]
    conflicts: list[str]
    resolutions: list[str]
    runtime_s: float | None
    peak_bytes: int | None
    seconds: float
    loss_vs_jax: float | None = None  # |loss - jax.jit's loss| / |jax.jit's loss|, when run


def config(model: str):
    from partir_plugin.models import transformer

    return transformer.Config.small() if model == "small" else transformer.Config.paper()


def schedule(setup: Setup) -> list:
    import partir_plugin as partir

    cp = partir.ManualPartition({"batch": 1}, axis="seq", name="CP")
    return [partir.tactic("BP", axis="batch"), cp] if setup.bp else [cp]


def partition(setup: Setup, policy: str, traced=None, hardware: str = HARDWARE) -> Row:
    """Partition the abstract train step of `setup` under `policy` (trace it unless `traced`
    is given) and read the final report row."""
    import jax

    from partir_plugin.core.mesh import Mesh
    from partir_plugin.frontend.trace import trace
    from partir_plugin.models import transformer
    from partir_plugin.options import PartitionOptions
    from partir_plugin.stages import partition

    cfg = config(setup.model)
    if traced is None:
        args = jax.eval_shape(lambda: transformer.init(cfg, jax.random.PRNGKey(0)))
        traced = trace(transformer.make_train_step(cfg), args)
    start = time.perf_counter()
    part = partition(traced, Mesh.of(dict(setup.mesh)), schedule(setup),
                     PartitionOptions(hardware=hardware, conflicts=policy, scatter_sums=True))
    seconds = time.perf_counter() - start
    final = part.reports[-1]
    counts = {k: int(part.program.counts.get(k, 0)) for k in KINDS}
    return Row(setup, policy, counts, list(final.conflicts), list(final.resolutions),
               final.estimated_runtime_s, final.estimated_peak_memory_bytes, seconds)


def loss_vs_jax(setup: Setup, policy: str) -> float:
    """Run one step of `setup` (a small model) under `policy` on real devices and return its
    loss's relative difference from jax.jit's."""
    import jax
    import numpy as np

    import partir_plugin as partir
    from partir_plugin.models import transformer

    cfg = config(setup.model)
    args = transformer.init(cfg, jax.random.PRNGKey(0))
    step, _ = partir.jit(transformer.make_train_step(cfg), dict(setup.mesh), schedule(setup),
                         conflicts=policy)
    ours = float(np.asarray(step(*args)[2]))
    ref = float(np.asarray(jax.jit(transformer.make_train_step(cfg))(*args)[2]))
    return abs(ours - ref) / max(abs(ref), 1e-30)


def run(models: list[str], execute: bool = True, hardware: str = HARDWARE) -> list[Row]:
    """Every setup of `models` under both policies (traced once per model); the small model's
    steps also run against jax.jit when `execute`."""
    import jax

    from partir_plugin.frontend.trace import trace
    from partir_plugin.models import transformer

    rows = []
    for model in models:
        cfg = config(model)
        args = jax.eval_shape(lambda cfg=cfg: transformer.init(cfg, jax.random.PRNGKey(0)))
        traced = trace(transformer.make_train_step(cfg), args)
        for setup in SETUPS[model]:
            for policy in POLICIES:
                row = partition(setup, policy, traced, hardware)
                if execute and model == "small":
                    row.loss_vs_jax = loss_vs_jax(setup, policy)
                rows.append(row)
                print(f"{model:6s} {setup.schedule_name:6s} {policy:12s} AG/AR/RS/A2A "
                      f"{fmt(row.counts)}  "
                      f"conflicts {len(row.conflicts)}  resolutions {len(row.resolutions)}  "
                      f"{row.seconds:.1f} s", flush=True)
    return rows


def fmt(counts: dict[str, int]) -> str:
    """AG / AR / RS / A2A."""
    return " / ".join(str(counts[k]) for k in KINDS)


def section(rows: list[Row], hardware: str) -> str:
    from partir_plugin.report.text import fmt_bytes, fmt_time  # the report's own formats

    def mesh(s: Setup) -> str:
        return "{" + ", ".join(f"{a}: {n}" for a, n in s.mesh) + "}"

    lines = [
        HEADING, "",
        f"Command: `{COMMAND}` (or `make bench-context-parallel`; about 1 minute). Schedule "
        '`CP = ManualPartition({"batch": 1}, axis="seq", name="CP")` (the sequence dimension '
        "of tokens and targets tiled on `seq`), after `BP = tactic(\"BP\", axis=\"batch\")` "
        "where the mesh has a batch axis. Models: `transformer.Config.small()` (L2 d16 "
        "h2x8 f32 v32 b2 s8) and T32 = `transformer.Config.paper()` (b48 s2048), train step "
        "(forward, backward, Adam), traced abstractly and partitioned with "
        "`stages.partition(..., PartitionOptions(conflicts=policy))`: \"stop\" is PartIR's strict "
        "semantics (`partir.jit(..., conflicts=\"stop\")`), \"redistribute\" the default since "
        "issue 19. Counts are the final device-local program's collectives, each op once; "
        "conflicts and resolutions are those the final report row lists; estimates on "
        f"`{hardware}`. Loss vs jax.jit: the small model's step run on 4 of 8 virtual CPU "
        "devices, relative difference of the loss from `jax.jit`'s (same inputs).",
        "",
        "| model | schedule | mesh | conflicts= | AG / AR / RS / A2A | conflicts "
        "| resolutions | est. runtime | est. peak memory | partitioning s | loss vs jax.jit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        loss = "-" if r.loss_vs_jax is None else f"{r.loss_vs_jax:.0e}"
        lines.append(
            f"| {r.setup.model} | {r.setup.schedule_name} | {mesh(r.setup)} | {r.policy} | "
            f"{fmt(r.counts)} | {len(r.conflicts)} | {len(r.resolutions)} | "
            f"{fmt_time(r.runtime_s)} | {fmt_bytes(r.peak_bytes)} | {r.seconds:.1f} | "
            f"{loss} |")
    lines += ["", harness.ANALYSIS_MARKER, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(SETUPS), default=list(SETUPS),
                        help="only these models' rows (default all; use with --no-write)")
    parser.add_argument("--hardware", default=HARDWARE, help=f"simulator spec ({HARDWARE})")
    harness.add_output_args(parser)
    args = parser.parse_args(argv)
    if "small" in args.models and not harness.has_devices(4):
        return 1
    rows = run(args.models, hardware=args.hardware)
    harness.publish(HEADING, section(rows, args.hardware), args.output,
                    write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
