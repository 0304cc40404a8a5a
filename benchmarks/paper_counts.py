"""Table 2 at the paper's sizes: collectives per schedule for T32 and IT32, with estimates.

    .venv/bin/python benchmarks/paper_counts.py [--no-write] [--models MoE32]

Traces the paper-size models abstractly (no weights are allocated: `jax.eval_shape`), applies
each schedule of appendix A.6 on the mesh {batch: 16, model: 2} (32 devices, Table 1's TPU
mesh; nothing runs, so no devices are needed) and prints, per schedule, the collectives of the
final device-local program next to the paper's Table 2, the partitioning time and the
simulator's runtime and peak-memory estimates on TPUv3. Counts are given statically (each
collective op once) and dynamically (a collective in IT's decode loop once per iteration,
which is how the paper counts IT32). MoE32, a mixture of experts of T32's size (not in the
paper), runs BP+EP and BP+EP+MP on 32-device meshes with an expert axis. Writes the section
"## Collective counts at the paper's sizes" of docs/BENCHMARKS.md. About 1 minute on 2 cores.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

import harness  # noqa: F401  (before jax: repository root on sys.path)
import jax

import partir_plugin as partir
from partir_plugin.core.mesh import Mesh
from partir_plugin.frontend.trace import trace
from partir_plugin.ir.graph import Op
from partir_plugin.models import inference_transformer, megatron, moe, transformer
from partir_plugin.options import PartitionOptions
from partir_plugin.spmd.collectives import COUNTED_KINDS, collective_kind
from partir_plugin.stages import partition

COMMAND = ".venv/bin/python benchmarks/paper_counts.py"
HEADING = "## Collective counts at the paper's sizes"
MESH = {"batch": 16, "model": 2}
# MoE32's schedules need an expert axis: 32 devices as well, 8 experts per device group.
MOE_MESHES = {"BP+EP": {"batch": 4, "expert": 8}, "BP+EP+MP": {"batch": 2, "expert": 8, "model": 2}}
HARDWARE = "tpu-v3"
KINDS = COUNTED_KINDS[:4]  # AG, AR, RS, A2A: Table 2's columns

# Table 2 of the paper: (AG, AR, RS, A2A).
PAPER = {
    ("T32", "BP"): (0, 290, 0, 0), ("T32", "MP"): (0, 128, 0, 0),
    ("T32", "BP+MP"): (0, 418, 0, 0), ("T32", "BP+MP+Z2"): (129, 289, 129, 0),
    ("T32", "BP+MP+Z3"): (259, 289, 129, 0), ("T32", "BP+MP+Z3+EMB"): (515, 354, 257, 0),
    ("IT32", "BP"): (0, 0, 0, 0), ("IT32", "MP"): (0, 98304, 0, 0),
    ("IT32", "BP+MP"): (0, 98304, 0, 0), ("IT32", "BP+MP+MQ"): (64, 98304, 0, 98240),
}


def schedules(model: str) -> dict[str, list]:
    if model == "MoE32":
        bp, ep = partir.tactic("BP", axis="batch"), partir.tactic("EP", megatron.expert_rule)
        return {"BP+EP": [bp, ep],
                "BP+EP+MP": [bp, ep, partir.tactic("MP", rule=megatron.moe_rule, axis="model")]}
    mp = partir.tactic("MP", rule=megatron.transformer_rule, axis="model")
    if model == "T32":
        bp, z2 = (partir.tactic(t, axis="batch") for t in ("BP", "Z2"))
        z3 = partir.tactic("Z3", axis="batch", regather=False)  # the paper gathers once
        emb = partir.tactic("EMB", axis="model")
        return {"BP": [bp], "MP": [mp], "BP+MP": [bp, mp], "BP+MP+Z2": [bp, mp, z2],
                "BP+MP+Z3": [bp, mp, z3], "BP+MP+Z3+EMB": [bp, mp, z3, emb]}
    bp = partir.ManualPartition({"batch": 0, "cache": megatron.multi_query_rule},
                                axis="batch", name="BP")
    mq = partir.tactic("MQ", axis="model")
    return {"BP": [bp], "MP": [mp], "BP+MP": [bp, mp], "BP+MP+MQ": [bp, mp, mq]}


def _runs(ops: list[Op], times: int, trips: int) -> Iterator[tuple[str, int]]:
    """(kind, times it runs) for every collective in `ops`, which run `times` times each; a
    while body runs `trips` times per run of the while."""
    for op in ops:
        kind = collective_kind(op)
        if kind in KINDS:
            yield kind, times
        inner = times * trips if op.name == "stablehlo.while" else times
        for region in op.regions:
            for block in region.blocks:
                yield from _runs(block.ops, inner, trips)


def counts(ops: list[Op], trips: int = 1) -> tuple[int, ...]:
    """AG, AR, RS, A2A: each op once (`trips=1`) or once per run of a while body."""
    total = dict.fromkeys(KINDS, 0)
    for kind, n in _runs(ops, 1, trips):
        total[kind] += n
    return tuple(total[k] for k in KINDS)


def models(names: list[str]):
    """(name, function, abstract args, decode-loop trips) of the models in `names`."""
    if "T32" in names:
        yield from _t32()
    if "IT32" in names:
        yield from _it32()
    if "MoE32" in names:
        cfg = moe.Config.paper()
        args = jax.eval_shape(lambda: moe.init(cfg, jax.random.PRNGKey(0)))
        yield "MoE32", moe.make_train_step(cfg), args, 1


def _t32():
    t_cfg = transformer.Config.paper()
    t_args = jax.eval_shape(lambda: transformer.init(t_cfg, jax.random.PRNGKey(0)))
    yield "T32", transformer.make_train_step(t_cfg), t_args, 1


IT32_TRIPS = inference_transformer.Config.paper().gen_len - 1
"""Iterations of IT32's decode loop (after the prompt pass)."""


def _it32():
    it_cfg = inference_transformer.Config.paper()
    it_args = jax.eval_shape(lambda: inference_transformer.init(it_cfg, jax.random.PRNGKey(0)))
    yield "IT32", inference_transformer.make_serve(it_cfg), it_args, IT32_TRIPS


MODELS = ("T32", "IT32", "MoE32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        help="only these models' rows (default all; use with --no-write)")
    args = parser.parse_args()
    rows = []
    for model, fn, fn_args, trips in models(args.models):
        traced = trace(fn, fn_args)
        for name, schedule in schedules(model).items():
            mesh = Mesh.of(MOE_MESHES[name] if model == "MoE32" else MESH)
            start = time.perf_counter()
            part = partition(traced, mesh, schedule,
                             PartitionOptions(hardware=HARDWARE, scatter_sums=True))
            seconds = time.perf_counter() - start
            start = time.perf_counter()
            final = part.reports[-1]  # the report's first read: every tactic's row is made
            report_s = time.perf_counter() - start
            ops = part.program.func.ops
            rows.append((model, name, counts(ops), counts(ops, trips), PAPER.get((model, name)),
                         seconds, report_s, final.estimated_runtime_s,
                         final.estimated_peak_memory_bytes))
            print(model, name, rows[-1][2:], flush=True)

    def fmt(c: tuple[int, ...] | None) -> str:
        return "-" if c is None else " / ".join(map(str, c))

    lines = [
        HEADING, "",
        f"Command: `{COMMAND}` (about 1 minute). T32 = `transformer.Config.paper()` "
        f"(train step: forward, backward, Adam), IT32 = `inference_transformer.Config.paper()` "
        f"(prompt pass of 512 tokens, then a decode loop of {IT32_TRIPS} iterations); "
        "MoE32 = `moe.Config.paper()` (T32's sizes, 8 experts per layer, top-2, batch 64; "
        f"train step); mesh {MESH}, for MoE32 {MOE_MESHES['BP+EP']} (BP+EP) and "
        f"{MOE_MESHES['BP+EP+MP']} (BP+EP+MP) "
        "(32 devices, not run: traced abstractly and partitioned); estimates on "
        f"`{HARDWARE}`. Counts are AG / AR / RS / A2A of the final program of each schedule; "
        "'dynamic' counts a collective in the decode loop once per iteration, as Table 2 does "
        "for IT32. Partitioning s: the schedule (every tactic with propagation) and the "
        "lowering of the final program; report s: the first read of the per-tactic report "
        "(each tactic's program lowered and simulated).",
        "",
        "| model | schedule | ours, static | ours, dynamic | paper Table 2 | partitioning s "
        "| report s | est. runtime s | est. peak GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model, name, static, dynamic, paper, seconds, report_s, runtime, peak in rows:
        lines.append(f"| {model} | {name} | {fmt(static)} | {fmt(dynamic)} | {fmt(paper)} | "
                     f"{seconds:.1f} | {report_s:.1f} | {runtime:.3g} | {peak / 2**30:.2f} |")
    lines += ["", harness.ANALYSIS_MARKER, ""]
    harness.publish(HEADING, "\n".join(lines), write=not args.no_write)


if __name__ == "__main__":
    main()
