"""`partir reshard-plan`: print the redistribution plan for one problem.

    partir reshard-plan --mesh a=2,b=2,c=2 --shape 8,16 --dtype f32 \\
        --src "a,(b,c)" --dst "(c,a),None"
"""

from __future__ import annotations

import argparse
import sys

from ...core.mesh import parse_mesh
from ...errors import PartitionError
from .plan import plan_redistribution

SPEC_HELP = (
    "PartitionSpec, one comma-separated entry per dimension (missing trailing ones are "
    "replicated): None (or -) for a replicated dimension, an axis name, or (a,b) for axes "
    'listed MAJOR to MINOR as in jax, e.g. "a,(b,c)" or "(c,a),None"'
)


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.replace("x", ",").split(",") if t.strip())
    except ValueError as e:
        raise PartitionError(f"shape {text!r} is not a comma-separated list of sizes") from e


def parse_spec(text: str) -> tuple:
    """`"a,(b,c),None"` -> `("a", ("b", "c"), None)`."""
    entries, depth, cur = [], 0, ""
    for ch in text.strip() + ",":
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            entries.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if depth:
        raise PartitionError(f"unbalanced parentheses in spec {text!r}")
    if entries == [""]:
        return ()
    out: list = []
    for e in entries:
        if e in ("None", "-", "", "()"):
            out.append(None)
        elif e.startswith("("):
            axes = tuple(a.strip() for a in e[1:-1].split(",") if a.strip())
            out.append(axes if len(axes) > 1 else axes[0] if axes else None)
        else:
            out.append(e)
    return tuple(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mesh", required=True, help="mesh axes major to minor, e.g. a=2,b=2,c=2")
    parser.add_argument("--shape", required=True, help="global shape, e.g. 8,16")
    parser.add_argument("--dtype", default="f32", help="element type, e.g. f32, bf16 (default f32)")
    parser.add_argument("--src", required=True, help="source " + SPEC_HELP)
    parser.add_argument("--dst", required=True, help="target " + SPEC_HELP)
    parser.add_argument(
        "--groups", action="store_true", help="also print replica groups, slice indices and pairs"
    )


def run(args: argparse.Namespace) -> int:
    try:
        plan = plan_redistribution(
            parse_mesh(args.mesh),
            parse_shape(args.shape),
            args.dtype,
            parse_spec(args.src),
            parse_spec(args.dst),
        )
    except PartitionError as e:
        print(f"partir reshard-plan: error: {e}", file=sys.stderr)
        return 2
    print(plan.pretty(groups=args.groups))
    return 0
