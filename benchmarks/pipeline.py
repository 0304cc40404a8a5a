"""Pipeline parallelism (issue 22): [PP, BP] against [BP] and [BP, Z3] on 8 CPU devices, and
the simulator's estimate at the paper's size.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python benchmarks/pipeline.py
    (or `make bench-pipeline`; options: --reps 5 --steps 10 --no-write)

Measured: the transformer of `partir_plugin/models/transformer.py`, scanned over 8 layers
(d_model 128, 4 heads of 32, ffw 512, vocabulary 256, batch 16, sequence 32; a train step
with Adam), under [PP, BP] on {stage: 4, batch: 2} with M = 4 and 8 microbatches, and under
[BP] and [BP, Z3] on {batch: 8}, all through `partir_plugin.jit`. Per schedule: partition +
compile time (`partir.jit(step).lower(*args).compile()`, a fresh step function each time,
jax's caches cleared), step time (the median of `--steps` steps, repeated `--reps` times with
the schedules alternating; minimum of the medians), XLA's memory analysis of the compiled
step (arguments + temporaries per device), and the loss against the unpartitioned jax.jit.
No speed claim is expected: 8 virtual devices share 2 cores, so a pipeline's bubble and its
sequential iterations cost here what they would on real hardware, while the parallelism they
buy does not exist.

Estimated: T32 (the paper's 32-layer transformer, batch 48, scanned) on 64 devices, by the
analytical simulator on `--hardware` (default h100-sxm): [BP, MP, Z3] on {batch: 8, model:
8}, [PP, BP] on {stage: 8, batch: 8} and [PP, BP, MP] on {stage: 4, batch: 8, model: 2}
with M = 6 (48 = 6 microbatches of 8, one row per data shard), and the first and last with RM
(full rematerialization of each layer, or with PP of each pipeline iteration), nothing run.
The estimate charges the bubble (idle stages compute on zeros in the pipelined program),
every permute on the critical path of each iteration, and the recomputation.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import harness  # before jax: 8 CPU devices, repo root on sys.path

COMMAND = ("XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python "
           "benchmarks/pipeline.py")
HEADING = "## Pipeline parallelism"


def config():
    from partir_plugin.models import transformer

    return dataclasses.replace(transformer.Config.small(layers=8, scan=True), batch=16,
                               seq_len=32, vocab=256, d_model=128, heads=4, head_dim=32,
                               ffw=512)


def schedules() -> dict[str, tuple[dict, list]]:
    import partir_plugin as partir

    bp = lambda: partir.tactic("BP", axis="batch")  # noqa: E731
    return {
        "[PP, BP] M=4": ({"stage": 4, "batch": 2},
                         [partir.tactic("PP", axis="stage", microbatches=4), bp()]),
        "[PP, BP] M=8": ({"stage": 4, "batch": 2},
                         [partir.tactic("PP", axis="stage", microbatches=8), bp()]),
        "[BP]": ({"batch": 8}, [bp()]),
        "[BP, Z3]": ({"batch": 8}, [bp(), partir.tactic("Z3", axis="batch")]),
    }


@dataclasses.dataclass
class Row:
    name: str
    compile_s: list = dataclasses.field(default_factory=list)
    step_s: list = dataclasses.field(default_factory=list)
    memory: int = 0
    loss_error: float = 0.0
    bubble: float | None = None
    permutes: int = 0


def measure(rows: dict[str, Row], reps: int, steps: int) -> None:
    import jax
    import numpy as np

    import partir_plugin as partir
    from partir_plugin.models import transformer

    cfg = config()
    args = transformer.init(cfg, jax.random.PRNGKey(0))
    want = float(jax.jit(transformer.make_train_step(cfg))(*args)[2])
    names = list(rows)
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            mesh, schedule = schedules()[name]
            jax.clear_caches()
            start = time.perf_counter()
            fn, meta = partir.jit(transformer.make_train_step(cfg), mesh, schedule)
            compiled = fn.lower(*args).compile()
            row = rows[name]
            row.compile_s.append(time.perf_counter() - start)
            on_mesh = harness.placed(args, meta)
            jax.block_until_ready(fn(*on_mesh))  # warm
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                out = jax.block_until_ready(fn(*on_mesh))
                times.append(time.perf_counter() - t0)
            row.step_s.append(statistics.median(times))
            analysis = compiled.memory_analysis()
            row.memory = analysis.argument_size_in_bytes + analysis.temp_size_in_bytes
            row.loss_error = abs(float(out[2]) - want) / abs(want)
            pp = schedule[0]
            row.bubble = getattr(pp, "bubble", None)
            row.permutes = meta.tactics[-1].collectives.get("all_permute", 0)
            print(f"  {name:14s} rep {rep}: compile {row.compile_s[-1]:.2f} s, step "
                  f"{row.step_s[-1] * 1e3:.1f} ms", flush=True)
    del np


def estimate(hardware: str) -> list[tuple]:
    """T32 on 64 devices, five schedules, by the simulator (nothing runs)."""
    import jax

    import partir_plugin as partir
    from partir_plugin.core.mesh import Mesh
    from partir_plugin.models import megatron, transformer
    from partir_plugin.options import PartitionOptions
    from partir_plugin.stages import partition_function

    cfg = transformer.Config.paper(scan=True)
    args = jax.eval_shape(lambda: transformer.init(cfg, jax.random.PRNGKey(0)))
    mp = lambda: partir.tactic("MP", rule=megatron.transformer_rule, axis="model")  # noqa
    bp = lambda: partir.tactic("BP", axis="batch")  # noqa: E731
    cases = [
        ("[BP, MP, Z3]", {"batch": 8, "model": 8},
         [bp(), mp(), partir.tactic("Z3", axis="batch")]),
        ("[PP, BP] M=6", {"stage": 8, "batch": 8},
         [partir.tactic("PP", axis="stage", microbatches=6), bp()]),
        ("[PP, BP, MP] M=6", {"stage": 4, "batch": 8, "model": 2},
         [partir.tactic("PP", axis="stage", microbatches=6), bp(), mp()]),
        ("[BP, MP, Z3, RM]", {"batch": 8, "model": 8},
         [bp(), mp(), partir.tactic("Z3", axis="batch"), partir.tactic("RM")]),
        ("[PP, BP, MP, RM] M=6", {"stage": 4, "batch": 8, "model": 2},
         [partir.tactic("PP", axis="stage", microbatches=6), bp(), mp(), partir.tactic("RM")]),
    ]
    out = []
    for name, mesh, schedule in cases:
        mesh = Mesh.of(mesh)
        _, part = partition_function(transformer.make_train_step(cfg), args, mesh, schedule,
                                     PartitionOptions(hardware=hardware, scatter_sums=True))
        final = part.reports[-1]
        bubble = getattr(schedule[0], "bubble", None)
        out.append((name, dict(mesh.shape), final.estimated_runtime_s,
                    final.estimated_peak_memory_bytes, final.collectives, bubble))
        print(f"  T32 {name}: {final.estimated_runtime_s:.3f} s, "
              f"{final.estimated_peak_memory_bytes / 2**30:.1f} GiB", flush=True)
    return out


def section(rows: dict[str, Row], estimates: list[tuple], hardware: str, reps: int,
            steps: int, total_s: float) -> str:
    from partir_plugin.report.text import fmt_bytes, fmt_time

    base = rows["[BP]"]
    lines = [HEADING, "",
             f"Command: `make bench-pipeline` (runs `{COMMAND}`; {total_s / 60:.1f} min). "
             f"The scanned transformer of 8 layers (d_model 128, ffw 512, batch 16, sequence "
             f"32, Adam) on 8 virtual CPU devices sharing 2 cores; {reps} repetitions with the "
             f"schedules alternating, each the median of {steps} steps; minimum shown. "
             "Partition + compile: `partir.jit(step).lower(*args).compile()` with a fresh "
             "step function and jax's caches cleared. Memory: XLA's memory analysis of the "
             "compiled step, arguments + temporaries per device.", "",
             "| schedule | mesh | partition + compile | step | step / [BP] | memory / device "
             "| memory / [BP] | bubble | permutes | loss vs jax.jit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        mesh = schedules()[name][0]
        lines.append(
            f"| {name} | {mesh} | {fmt_time(min(row.compile_s))} | "
            f"{fmt_time(min(row.step_s))} | {min(row.step_s) / min(base.step_s):.2f} | "
            f"{fmt_bytes(row.memory)} | {row.memory / base.memory:.2f} | "
            f"{'-' if row.bubble is None else f'{row.bubble:.1%}'} | {row.permutes} | "
            f"{row.loss_error:.1e} |")
    lines += ["", f"Estimated by the analytical simulator on `{hardware}`: T32 (32 layers, "
                  "batch 48, d_model 4096, scanned) on 64 devices, nothing run.", "",
              "| schedule | mesh | est. step | est. peak memory / device | collectives "
              "(AG/AR/RS/A2A/AP) | bubble |", "|---|---|---|---|---|---|"]
    for name, mesh, runtime, memory, counts, bubble in estimates:
        c = "/".join(str(counts.get(k, 0)) for k in ("all_gather", "all_reduce",
                                                      "reduce_scatter", "all_to_all",
                                                      "all_permute"))
        lines.append(f"| {name} | {mesh} | {fmt_time(runtime)} | {fmt_bytes(memory)} | {c} | "
                     f"{'-' if bubble is None else f'{bubble:.1%}'} |")
    lines += ["", harness.ANALYSIS_MARKER, ""]
    return "\n".join(lines)


# -- issue 34: the scanned-LM recipe users write -----------------------------------------------

RECIPE_HEADING = "## Pipeline parallelism: the scanned Flax decoder recipe (issue 34)"
RECIPE_COMMAND = COMMAND + " --recipe"


def recipe(remat: bool = True, policy=None, size: str = "cpu"):
    """A Flax linen decoder as users write it: `nn.scan(nn.remat(Block), split_rngs={"params":
    True, "dropout": True}, in_axes=nn.broadcast)` over 8 blocks with dropout 0.1, a causal
    mask built in the block and a padding mask passed to every layer; the step is
    `value_and_grad` of the masked cross-entropy (the same rng for every run). For
    benchmarks/memory_estimates.py: `remat=False` drops `nn.remat`, `policy` is its
    `jax.checkpoint` policy (None: save nothing), `size` "small" makes 4 blocks of 32 on
    16 x 16, "gpu" 8 blocks of 512 on 64 x 512 (vocabulary 8192)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    B, T, D, L, V = {"small": (16, 16, 32, 4, 64), "cpu": (16, 32, 128, 8, 256),
                     "gpu": (64, 512, 512, 8, 8192)}[size]

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h, mask):
            a = nn.Dense(D)(nn.LayerNorm()(h))
            causal = jnp.tril(jnp.ones((T, T)))
            att = jnp.einsum("btd,bsd->bts", a, a) / jnp.sqrt(D)
            att = jnp.where((causal[None] * mask[:, None, :]) > 0, att, -1e9)
            a = jnp.einsum("bts,bsd->btd", jax.nn.softmax(att, -1), a)
            h = h + nn.Dropout(0.1)(a, deterministic=False)
            m = nn.Dense(D)(nn.gelu(nn.Dense(4 * D)(nn.LayerNorm()(h))))
            return h + nn.Dropout(0.1)(m, deterministic=False), None

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, tokens, mask):
            h = nn.Embed(V, D)(tokens)
            block = nn.remat(Block, policy=policy) if remat else Block
            stack = nn.scan(block, variable_axes={"params": 0},
                            split_rngs={"params": True, "dropout": True},
                            in_axes=nn.broadcast, length=L)
            h, _ = stack()(h, mask)
            return nn.Dense(V)(nn.LayerNorm()(h))

    model = Decoder()
    tokens = jax.random.randint(jax.random.PRNGKey(0), (B, T), 0, V)
    lengths = jax.random.randint(jax.random.PRNGKey(1), (B, 1), T // 2, T + 1)
    mask = (jnp.arange(T)[None] < lengths).astype(jnp.float32)
    params = model.init({"params": jax.random.PRNGKey(2), "dropout": jax.random.PRNGKey(3)},
                        tokens, mask)

    def step(params, tokens, mask, rng):
        def loss(p):
            logits = model.apply(p, tokens, mask, rngs={"dropout": rng})
            ll = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1)
            return -(ll[..., 0] * mask).sum() / mask.sum()

        return jax.value_and_grad(loss)(params)

    return step, (params, tokens, mask, jax.random.PRNGKey(4))


def recipe_schedules() -> dict[str, tuple[dict, list]]:
    import partir_plugin as partir

    bp = lambda: partir.ManualPartition({"tokens": 0, "mask": 0}, axis="batch")  # noqa: E731
    return {"recipe [PP, BP] M=4": ({"stage": 2, "batch": 4},
                                    [partir.tactic("PP", axis="stage", microbatches=4), bp()]),
            "recipe [BP]": ({"batch": 8}, [bp()])}


def measure_recipe(rows: dict[str, Row], reps: int, steps: int) -> float:
    """Like `measure` on the recipe; returns the largest gradient error against jax.jit."""
    import jax
    import numpy as np

    import partir_plugin as partir

    step, args = recipe()
    want = jax.jit(step)(*args)
    worst = 0.0
    names = list(rows)
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            mesh, schedule = recipe_schedules()[name]
            harness.fresh()
            start = time.perf_counter()
            fn, meta = partir.jit(step, mesh, schedule)
            compiled = fn.lower(*args).compile()
            row = rows[name]
            row.compile_s.append(time.perf_counter() - start)
            on_mesh = harness.placed(args, meta)
            jax.block_until_ready(fn(*on_mesh))
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                out = jax.block_until_ready(fn(*on_mesh))
                times.append(time.perf_counter() - t0)
            row.step_s.append(statistics.median(times))
            analysis = compiled.memory_analysis()
            row.memory = analysis.argument_size_in_bytes + analysis.temp_size_in_bytes
            row.loss_error = abs(float(out[0]) - float(want[0])) / abs(float(want[0]))
            worst = max([worst] + [float(np.abs(np.asarray(a) - np.asarray(b)).max())
                                   for a, b in zip(jax.tree.leaves(out[1]),
                                                   jax.tree.leaves(want[1]))])
            row.bubble = getattr(schedule[0], "bubble", None)
            row.permutes = meta.tactics[-1].collectives.get("all_permute", 0)
            print(f"  {name:20s} rep {rep}: compile {row.compile_s[-1]:.2f} s, step "
                  f"{row.step_s[-1] * 1e3:.1f} ms", flush=True)
    return worst


def recipe_section(rows: dict[str, Row], worst: float, reps: int, steps: int,
                   total_s: float) -> str:
    from partir_plugin.report.text import fmt_bytes, fmt_time

    base = rows["recipe [BP]"]
    lines = [RECIPE_HEADING, "",
             f"Command: `make bench-pipeline` (its second part, `{RECIPE_COMMAND}`; run here "
             f"with `--reps {reps} --steps {steps}`; "
             f"{total_s / 60:.1f} min). The Flax decoder of `benchmarks/pipeline.py:recipe` "
             "(8 blocks `nn.scan(nn.remat(Block), split_rngs={params, dropout}, "
             "in_axes=nn.broadcast)`, d_model 128, batch 16, sequence 32, dropout 0.1, causal "
             "and padding masks; `value_and_grad` of the masked cross-entropy) on 8 virtual CPU "
             f"devices sharing 2 cores; {reps} repetitions alternating, each the median of "
             f"{steps} steps, minimum shown; memory: XLA's memory analysis of the compiled "
             f"step, arguments + temporaries per device. Largest gradient difference from "
             f"jax.jit (same rng) over all runs: {worst:.1e}.", "",
             "| schedule | mesh | partition + compile | step | step / [BP] | memory / device "
             "| memory / [BP] | bubble | permutes | loss vs jax.jit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        mesh = recipe_schedules()[name][0]
        lines.append(
            f"| {name} | {mesh} | {fmt_time(min(row.compile_s))} | "
            f"{fmt_time(min(row.step_s))} | {min(row.step_s) / min(base.step_s):.2f} | "
            f"{fmt_bytes(row.memory)} | {row.memory / base.memory:.2f} | "
            f"{'-' if row.bubble is None else f'{row.bubble:.1%}'} | {row.permutes} | "
            f"{row.loss_error:.1e} |")
    return "\n".join(lines + [""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--no-estimate", action="store_true",
                        help="skip the T32 estimate (it traces the 5B-parameter step)")
    parser.add_argument("--recipe", action="store_true",
                        help="only the scanned Flax decoder recipe (issue 34), its own section")
    harness.add_output_args(parser)
    args = parser.parse_args(argv)
    if not harness.has_devices(8):
        return 1
    t0 = time.perf_counter()
    if args.recipe:
        rows = {name: Row(name) for name in recipe_schedules()}
        worst = measure_recipe(rows, args.reps, args.steps)
        harness.publish(RECIPE_HEADING, recipe_section(rows, worst, args.reps, args.steps,
                                                       time.perf_counter() - t0),
                        args.output, write=not args.no_write)
        return 0
    rows = {name: Row(name) for name in schedules()}
    measure(rows, args.reps, args.steps)
    estimates = [] if args.no_estimate else estimate(args.hardware)
    text = section(rows, estimates, args.hardware, args.reps, args.steps,
                   time.perf_counter() - t0)
    harness.publish(HEADING, text, args.output, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
