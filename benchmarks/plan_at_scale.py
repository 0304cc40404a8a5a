"""Does `partir.plan` find, within 3 minutes on 2 cores, a plan that fits an 80 GiB A100 and is
estimated no slower than Megatron-LM's published configuration (issue 38's acceptance)?

    .venv/bin/python benchmarks/plan_at_scale.py   (or `make bench-plan-scale`;
    options: --rows 18.4B 145.6B --seconds 180 --no-write)

The models and the published configurations are benchmarks/megatron_sweep.py's (Narayanan et
al. 2021, Table 1: the GPT at 18.4B on 256 GPUs to 145.6B on 1536, `a100-80gb` with its
cluster). For each row: the estimate of the published configuration as Megatron ran it
(`[PP, BP, MP]` on `{stage: p, data: d, model: t}`, with and without recomputing each layer,
`RM("full", modules="Block")`, as Megatron did), then `partir.plan(step, *abstract_args,
devices=GPUs, hardware="a100-80gb", seconds=..., model_rule=gpt_rule)`, its best plan and
whether that plan fits 80 GiB in its own estimate and is estimated no slower than the
published configuration (the faster of its two estimates). Estimates only: nothing runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import harness  # noqa: F401  (before jax; the repository root on sys.path)
import megatron_sweep

HEADING = "## Planning at scale: partir.plan against Megatron-LM's configurations (issue 38)"
COMMAND = ".venv/bin/python benchmarks/plan_at_scale.py"
DEFAULT_ROWS = ("18.4B", "39.1B", "76.1B", "145.6B")


@dataclasses.dataclass
class Row:
    run: megatron_sweep.Run
    published: list  # the published configuration's estimates: without RM, with RM
    plans: object  # partir.Plans
    seconds: float  # the plan's wall time

    @property
    def published_best(self):
        return min(self.published, key=lambda e: e.step_time_s)

    @property
    def best(self):
        return self.plans[0] if len(self.plans) else None

    @property
    def accepted(self) -> bool:
        best = self.best
        return (best is not None and best.estimate.fits
                and best.estimate.step_time_s <= self.published_best.step_time_s)


def measure(run: megatron_sweep.Run, seconds: float) -> Row:
    import jax

    import partir_plugin as partir
    from partir_plugin.models import transformer

    cfg = megatron_sweep.config(run)
    args = jax.eval_shape(lambda key: transformer.init(cfg, key), jax.random.PRNGKey(0))
    step = transformer.make_train_step(cfg)
    published = []
    for rm in (None, "full"):
        schedule = megatron_sweep.published_schedule(run, rm)
        published.append(partir.estimate(step, *args, mesh=run.mesh, schedule=schedule,
                                         hardware="a100-80gb"))
    start = time.perf_counter()
    plans = partir.plan(step, *args, devices=run.gpus, hardware="a100-80gb", seconds=seconds,
                        model_rule=megatron_sweep.gpt_rule)
    return Row(run, published, plans, time.perf_counter() - start)


def table_line(r: Row) -> str:
    from partir_plugin.report.text import fmt_bytes

    plain, rm = r.published
    best = r.best
    return (f"| {r.run.name} | {r.run.gpus} | {r.run.tensor} x {r.run.pipeline} x "
            f"{r.run.data} | {plain.step_time_s:.2f} / {rm.step_time_s:.2f} s | "
            f"{fmt_bytes(plain.peak_memory_bytes)} / {fmt_bytes(rm.peak_memory_bytes)} | "
            + (f"{best.label} | {best.mesh} | {best.estimate.step_time_s:.2f} s | "
               f"{fmt_bytes(best.estimate.peak_memory_bytes)} | " if best else "none | | | | ")
            + f"{r.seconds:.0f} | {r.plans.stats.estimated} estimated of "
            f"{r.plans.stats.considered} | {'yes' if r.accepted else 'no'} |")


def section(rows: list[Row], seconds: float) -> str:
    import jax

    lines = [HEADING, "",
             f"`{COMMAND} --seconds {seconds:g}` (jax {jax.__version__}; estimates only, "
             "nothing runs). Benchmarks/megatron_sweep.py's GPT rows on `a100-80gb` (8 GPUs a "
             "node); the published configuration estimated as Megatron ran it, without and "
             "with recomputation; then `partir.plan(..., devices=GPUs, hardware=\"a100-80gb\", "
             f"seconds={seconds:g}, model_rule=gpt_rule)` and its best plan. Accepted: the plan "
             "fits 80 GiB in its own estimate and is estimated no slower than the faster "
             "estimate of the published configuration.", "",
             "| model | GPUs | published t x p x d | est. published (no RM / RM) | its peak "
             "(no RM / RM) | best plan | mesh | est. step | est. peak | plan s | searched | "
             "accepted |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [table_line(r) for r in rows]
    accepted = sum(r.accepted for r in rows)
    lines += ["", f"Accepted: {accepted} of {len(rows)}.", "", harness.ANALYSIS_MARKER, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS))
    parser.add_argument("--seconds", type=float, default=180.0)
    harness.add_output_args(parser)
    args = parser.parse_args(argv)
    known = {r.name: r for r in megatron_sweep.RUNS}
    unknown = [n for n in args.rows if n not in known]
    if unknown:
        parser.error(f"unknown rows {unknown} (known: {list(known)})")
    rows = []
    for name in args.rows:
        row = measure(known[name], args.seconds)
        print(table_line(row), flush=True)  # each row as it is measured
        rows.append(row)
    harness.publish(HEADING, section(rows, args.seconds), args.output, write=not args.no_write)
    return 0 if all(r.accepted for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
