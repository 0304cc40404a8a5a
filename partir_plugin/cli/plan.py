"""`partir plan`: the fastest schedules that fit, for a step on N devices of a cluster, as a
table; nothing runs (`partir.plan`).

    partir plan --function mypkg.model:train_step --args mypkg.model:abstract_args \\
        --devices 256 --hardware a100-80gb --model-rule mypkg.model:megatron_rule \\
        --memory-limit 80GiB --seconds 60 --top 5

`--args` returns the example arguments (arrays or `jax.ShapeDtypeStruct`s, e.g. from
`jax.eval_shape`); the step's arguments named `batch`, `params`, `opt_state` are the batch,
the parameters and the optimizer state (`--batch`, `--params`, `--opt-state` rename them).
Without `--model-rule` AutomaticPartition searches the model axis.
"""

from __future__ import annotations

import argparse
import re
import sys

from ..errors import PartitionError
from .report import ReportInputError, function_and_args, load_object

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """"80GiB", "40e9", "512 MiB" -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ReportInputError(f"--memory-limit: expected bytes such as 80GiB or 40e9, got "
                               f"{text!r}")
    try:
        return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    except ValueError:
        raise ReportInputError(f"--memory-limit: {text!r} is not a number of bytes") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--function", required=True, metavar="MODULE:FUNCTION",
                        help="the step (MODULE may also be a path to a .py file)")
    parser.add_argument("--args", required=True, metavar="MODULE:FUNCTION",
                        help="a callable returning the tuple of example arguments (arrays or "
                             "jax.ShapeDtypeStructs)")
    parser.add_argument("--devices", required=True, type=int, help="how many devices")
    parser.add_argument("--hardware", default=None,
                        help="hardware spec name or alias (default: the plugins' default)")
    parser.add_argument("--memory-limit", type=parse_bytes, default=None, metavar="BYTES",
                        help="per device, e.g. 80GiB (default: the spec's memory)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="time budget of the search (default 60)")
    parser.add_argument("--model-rule", metavar="MODULE:FUNCTION",
                        help="a Megatron-style rule (path, shape) -> dim | None for the model "
                             "axis (default: AutomaticPartition searches it)")
    parser.add_argument("--expert-rule", metavar="MODULE:FUNCTION",
                        help="a rule (path, shape) -> expert dim | None: offers an expert axis")
    parser.add_argument("--batch", default="batch", help="the batch argument's name")
    parser.add_argument("--params", default="params", help="the parameters' argument name")
    parser.add_argument("--opt-state", default="opt_state",
                        help="the optimizer state's argument name")
    parser.add_argument("--top", type=int, default=5, help="plans to print (default 5)")


def table(plans, top: int) -> str:
    """The top plans: rank, mesh, schedule, estimated step time and peak memory, why."""
    from ..report.text import fmt_bytes, fmt_time

    rows = [("#", "mesh", "schedule", "est. step", "est. peak / device", "why")]
    for i, p in enumerate(plans[:top]):
        mesh = ",".join(f"{a}={n}" for a, n in p.mesh.items())
        rows.append((str(i + 1), mesh, p.label, fmt_time(p.estimate.step_time_s),
                     fmt_bytes(p.estimate.peak_memory_bytes), p.why))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5]
             for r in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths) + "  ---", *lines[1:]])


def run(args: argparse.Namespace) -> int:
    from ..planner import plan

    try:
        fn, example = function_and_args(args.function, args.args)
        model_rule = load_object(args.model_rule, "--model-rule") if args.model_rule else None
        expert_rule = (load_object(args.expert_rule, "--expert-rule") if args.expert_rule
                       else None)
    except ReportInputError as e:
        print(f"partir plan: error: {e}", file=sys.stderr)
        return 2
    try:
        plans = plan(fn, *example, devices=args.devices, hardware=args.hardware,
                     memory_limit=args.memory_limit, seconds=args.seconds,
                     model_rule=model_rule, expert_rule=expert_rule, batch=args.batch,
                     params=args.params, opt_state=args.opt_state)
    except PartitionError as e:
        print(f"partir plan: {e}", file=sys.stderr)
        return 1
    hardware = plans[0].estimate.hardware
    print(f"{len(plans)} plans for {args.devices} devices of {hardware} "
          f"({plans.stats.summary()}); the top {min(args.top, len(plans))}:")
    print(table(plans, args.top))
    for note in plans.stats.notes:
        print(f"note: {note}")
    return 0
