"""Snapshot what partitioning produces on the benchmark set, to show a refactor changes nothing.

    .venv/bin/python benchmarks/golden_programs.py --out /tmp/before      # on the old code
    .venv/bin/python benchmarks/golden_programs.py --out /tmp/after       # on the new code
    .venv/bin/python benchmarks/golden_programs.py --compare /tmp/before /tmp/after

For every case of the benchmark set (the step-time models under their schedules, the paper-size
T32 / IT32 / MoE32 under Table 2's schedules, the pipeline benchmark's scanned transformer and
Flax recipe under PP, the context-parallel transformer under both conflict policies) it goes
through the public API only (`partir.jit(fn, mesh, schedule)`, `step.lower(*abstract_args)`,
`meta.to_json()`), so it runs unchanged on both sides of a refactor that moves the internals,
and writes per case the device-local program text (`<case>.mlir`) and the report JSON with its
collective records (`<case>.json`, measured durations removed). Nothing is compiled or run: the
arguments are `jax.ShapeDtypeStruct`s; the checkout's path in source locations is written
`<repo>`, so two checkouts (git worktrees) compare. `--compare` prints the first differing
line of each case that differs and exits 1 if any does (a snapshot of some `--groups` is
compared with the files of a full one it covers; `--without-locations` leaves the
programs' source locations out). About 3 minutes on 2 cores.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=32").strip()

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import harness  # noqa: E402  (repository root on sys.path)

# Report fields that are measurements of this run, not results of partitioning.
VOLATILE = {"seconds", "elapsed_s", "search_seconds", "wall_s", "time_s"}

Case = tuple[str, Callable, tuple, dict, list, str | None, dict]


def _step_time_cases() -> Iterator[Case]:
    import step_time

    for make in (step_time.transformer_model, step_time.mlp_model, step_time.moe_model,
                 step_time.decoder_model, step_time.unet_model):
        model, _, build = make()
        names = (tuple(step_time.MOE_MESHES) if model == "moe"
                 else ("BP+SP",) if model == "unet" else step_time.SCHEDULES)
        for name in names:
            fn, args, rules = build()
            mesh = (step_time.MOE_MESHES[name] if model == "moe"
                    else (("batch", 2), ("space", 4)) if model == "unet" else step_time.MESH)
            yield (f"{model}-{name}", fn, args, dict(mesh), step_time.schedule_for(name, rules),
                   None, {})


def _paper_cases() -> Iterator[Case]:
    import paper_counts

    for model, fn, args, _ in paper_counts.models(list(paper_counts.MODELS)):
        for name, schedule in paper_counts.schedules(model).items():
            mesh = paper_counts.MOE_MESHES[name] if model == "MoE32" else paper_counts.MESH
            yield f"{model}-{name}", fn, args, dict(mesh), schedule, paper_counts.HARDWARE, {}


def _pipeline_cases() -> Iterator[Case]:
    import jax
    import pipeline

    from partir_plugin.models import transformer

    cfg = pipeline.config()
    args = jax.eval_shape(lambda: transformer.init(cfg, jax.random.PRNGKey(0)))
    for name, (mesh, schedule) in pipeline.schedules().items():
        yield (f"pipeline-{name}", transformer.make_train_step(cfg), args, mesh, schedule,
               None, {})
    for name, (mesh, schedule) in pipeline.recipe_schedules().items():
        step, args = pipeline.recipe()
        yield f"pipeline-{name}", step, args, mesh, schedule, None, {}


def _context_parallel_cases() -> Iterator[Case]:
    import context_parallel
    import jax

    from partir_plugin.models import transformer

    for setups in context_parallel.SETUPS.values():
        for setup in setups:
            cfg = context_parallel.config(setup.model)
            args = jax.eval_shape(lambda cfg=cfg: transformer.init(cfg, jax.random.PRNGKey(0)))
            for policy in context_parallel.POLICIES:
                yield (f"cp-{setup.model}-{setup.schedule_name}-{policy}",
                       transformer.make_train_step(cfg), args, dict(setup.mesh),
                       context_parallel.schedule(setup), context_parallel.HARDWARE,
                       {"conflicts": policy})


GROUPS = {"step_time": _step_time_cases, "paper": _paper_cases,
          "pipeline": _pipeline_cases, "context_parallel": _context_parallel_cases}


def _stable(x):
    """The report JSON without this run's measured durations."""
    if isinstance(x, dict):
        return {k: _stable(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_stable(v) for v in x]
    return x


def _file_name(case: str) -> str:
    return "".join(c if c.isalnum() or c in "-_+" else "_" for c in case)


def _portable(text: str) -> str:
    """`text` with this checkout's path (in source locations) written as `<repo>`, so
    snapshots taken in two checkouts compare."""
    return text.replace(f"{harness.ROOT}/", "<repo>/")


def snapshot(out: Path, groups: list[str]) -> None:
    import jax

    import partir_plugin as partir

    out.mkdir(parents=True, exist_ok=True)
    for group in groups:
        for case, fn, args, mesh, schedule, hardware, options in GROUPS[group]():
            abstract = jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
            step, meta = partir.jit(fn, mesh, schedule, hardware=hardware, **options)
            text = step.lower(*abstract).as_text()
            name = _file_name(case)
            (out / f"{name}.mlir").write_text(_portable(text))
            (out / f"{name}.json").write_text(_portable(
                json.dumps(_stable(meta.to_json()), indent=1, sort_keys=True, default=str)))
            print(f"{case}: {len(text.splitlines())} lines", flush=True)


_LOCATION_REF = re.compile(r"loc\(#loc\d+\)")


def _without_locations(lines: list[str]) -> list[str]:
    """The program's lines without its location definitions and references: jax records
    the caller's frames above the traced function too, so a move of the driver's own code
    changes locations and nothing else."""
    return [_LOCATION_REF.sub("loc(...)", x) for x in lines if not x.startswith("#loc")]


def compare(a: Path, b: Path, locations: bool = True) -> int:
    """Every file of `b` against its namesake in `a` (a snapshot of some groups is compared
    with the part of a full one it covers); `locations=False` leaves programs' source
    locations out."""
    names = sorted(p.name for p in b.iterdir())
    differing = 0
    for name in names:
        pa, pb = a / name, b / name
        if not pa.exists():
            print(f"{name}: not in {a}")
            differing += 1
            continue
        la, lb = pa.read_text().splitlines(), pb.read_text().splitlines()
        if not locations and name.endswith(".mlir"):
            la, lb = _without_locations(la), _without_locations(lb)
        if la == lb:
            continue
        differing += 1
        line = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
        print(f"{name}: differs from line {line + 1} ({len(la)} vs {len(lb)} lines)\n"
              f"  - {la[line] if line < len(la) else '<end>'}\n"
              f"  + {lb[line] if line < len(lb) else '<end>'}")
    print(f"{len(names) - differing} of {len(names)} files identical")
    return 1 if differing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write the snapshot to this directory")
    parser.add_argument("--groups", nargs="+", choices=sorted(GROUPS), default=list(GROUPS))
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--without-locations", action="store_true",
                        help="compare programs without their source locations")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare, locations=not args.without_locations)
    if args.out is None:
        parser.error("give --out DIR or --compare BEFORE AFTER")
    snapshot(args.out, args.groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
