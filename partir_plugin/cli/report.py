"""`partir report`: partition a function or a StableHLO file with a schedule and print the
per-tactic report, without compiling or running anything.

    partir report --function mypkg.model:train_step --args mypkg.model:example_args \\
        --schedule schedule.py --mesh batch=4,model=2 --hardware a100-40gb --plot out.png
    partir report --stablehlo step.mlir --arg-names x,w1,w2 --mesh B=4,M=2 \\
        --schedule-json '[{"name": "BP", "axis": "B", "inputs": {"x": 0}}]'

A schedule file is Python defining `schedule = [...]` (tactics such as
`partir_plugin.ManualPartition`). The JSON form is a list of
`{"name": ..., "axis": ..., "inputs": {arg: selector}}` where a selector is a dimension, `null`,
"REPLICATED", "FIRST_DIVISIBLE_DIM", "UNKNOWN" or a nested object over the argument's keys;
`--schedule-json` takes the JSON text or a path to a file holding it.

`--detail` adds, per tactic, the collectives it added with their source lines; `--trace` writes
the simulated timeline for Perfetto, `--html` a self-contained HTML report. A StableHLO file
keeps its source locations when printed with them (`.as_text(debug_info=True)`).

The first row, "(replicated)", is the unpartitioned program (every tactic's Δ is relative to the
row above it); `--no-baseline` leaves it out.
"""

from __future__ import annotations

import argparse
import importlib
import json
import runpy
import sys
from pathlib import Path
from typing import Any

from ..errors import PartitionError
from ..frontend.trace import ArgumentNamesError, Traced
from ..options import PartitionOptions
from ..report.metadata import Metadata
from ..report.text import GroupBy
from ..stages import report, report_for_function
from ..tactics.base import as_tactic


class ReportInputError(ValueError):
    """Bad command-line input: printed as `partir report: error: ...`, exit status 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("program (one of)")
    src.add_argument("--function", metavar="MODULE:FUNCTION",
                     help="the function to partition (MODULE may also be a path to a .py file)")
    src.add_argument("--args", metavar="MODULE:FUNCTION",
                     help="with --function: a callable returning the tuple of example arguments "
                          "(arrays or jax.ShapeDtypeStructs)")
    src.add_argument("--stablehlo", metavar="FILE",
                     help="a StableHLO module (text or bytecode); its entry function is used")
    src.add_argument("--entry", default="main", help="entry function of --stablehlo (main)")
    src.add_argument("--arg-names", metavar="A,B,C",
                     help="names of the --stablehlo entry's arguments (default arg0, arg1, ...)")
    sched = parser.add_argument_group("schedule (one of; none = the replicated program only)")
    sched.add_argument("--schedule", metavar="FILE.py",
                       help="a Python file defining `schedule = [...]`")
    sched.add_argument("--schedule-json", metavar="JSON|FILE",
                       help='e.g. \'[{"name": "BP", "axis": "batch", "inputs": {"x": 0}}]\'')
    parser.add_argument("--mesh", required=True, metavar="AXIS=SIZE,...",
                        help="mesh axes, major to minor, e.g. batch=4,model=2")
    parser.add_argument("--hardware", default=None,
                        help="hardware spec name or alias for the estimates (default: the spec "
                             "the hardware plugins name, host-cpu); see `partir plugins`")
    parser.add_argument("--no-baseline", action="store_true",
                        help="omit the first row, the unpartitioned program")
    parser.add_argument("--plot", metavar="OUT.png", help="write a plot of the report")
    parser.add_argument("--json", metavar="OUT.json", help="write Metadata.to_json()")
    parser.add_argument("--detail", action="store_true",
                        help="per tactic, the collectives it added, with source line, op, "
                             "reason and bytes (Metadata.report(detail=True))")
    parser.add_argument("--group-by", choices=[str(g) for g in GroupBy], default="line",
                        help="group --detail's collectives by source line (default) or layer")
    parser.add_argument("--trace", metavar="OUT.json",
                        help="write the simulated timeline as Chrome trace-event JSON "
                             "(open in https://ui.perfetto.dev)")
    parser.add_argument("--html", metavar="OUT.html",
                        help="write a self-contained HTML report")


# --- parsing inputs ------------------------------------------------------------------------

def load_object(spec: str, what: str) -> Any:
    """`module:attr` (or `path/to/file.py:attr`) -> the object."""
    module_name, colon, attr = spec.rpartition(":")
    if not colon or not module_name or not attr:
        raise ReportInputError(f"{what}: expected MODULE:NAME, got {spec!r}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ReportInputError(f"{what}: no such file {module_name!r}")
        namespace = runpy.run_path(str(path))
        if attr not in namespace:
            raise ReportInputError(f"{what}: {module_name} defines no {attr!r}")
        return namespace[attr]
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ReportInputError(f"{what}: cannot import module {module_name!r}: {e}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ReportInputError(f"{what}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _selector(value: Any, where: str) -> Any:
    from ..tactics import manual

    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        named = {"REPLICATED": manual.REPLICATED, "FIRST_DIVISIBLE_DIM":
                 manual.FIRST_DIVISIBLE_DIM, "UNKNOWN": manual.UNKNOWN}
        if value.upper() in named:
            return named[value.upper()]
    if isinstance(value, dict):
        return {k: _selector(v, f"{where}/{k}") for k, v in value.items()}
    raise ReportInputError(f"schedule: selector for {where!r} must be a dimension (int), null, "
                           f'"REPLICATED", "FIRST_DIVISIBLE_DIM", "UNKNOWN" or an object; got '
                           f"{value!r}")


def _preset(i: int, name: str, kwargs: dict) -> Any:
    """A preset tactic named in a JSON schedule (`"BP"`, `{"preset": "MP", ...}`)."""
    from ..plugin.manager import tactic_factories
    from ..tactics import tactic

    presets = tactic_factories()
    if name not in presets:
        raise ReportInputError(f"schedule: tactic {i}: no preset {name!r} (presets: "
                               f"{sorted(presets)}); a ManualPartition needs \"axis\" and "
                               f"\"inputs\"")
    try:
        return tactic(name, **kwargs)
    except (TypeError, PartitionError) as e:
        raise ReportInputError(f"schedule: tactic {i} (preset {name!r}): {e}") from None


def schedule_from_json(data: Any) -> list:
    """`[{"name": "BP", "axis": "batch", "inputs": {"x": 0}}, ...]` -> ManualPartitions.

    A preset runs by name: `"BP"`, `{"preset": "BP", "axis": "data"}` (other keys are the
    preset's keyword arguments), or `{"name": "Z3", "axis": "batch"}` without `inputs` when
    the name is a preset's. Anything else without `inputs` is rejected, never run as nothing.
    """
    from ..tactics.manual import ManualPartition

    if not isinstance(data, list):
        raise ReportInputError("schedule: the JSON schedule must be a list of tactics")
    out = []
    for i, entry in enumerate(data):
        if isinstance(entry, str):
            out.append(_preset(i, entry, {}))
            continue
        if not isinstance(entry, dict):
            raise ReportInputError(f"schedule: tactic {i} must be an object with name, axis and "
                                   f"inputs, or a preset name; got {entry!r}")
        if "preset" in entry:
            out.append(_preset(i, str(entry["preset"]),
                               {k: v for k, v in entry.items() if k != "preset"}))
            continue
        if "inputs" not in entry and "tags" not in entry:
            out.append(_preset(i, str(entry.get("name")),
                               {k: v for k, v in entry.items() if k != "name"}))
            continue
        unknown = set(entry) - {"name", "axis", "inputs", "tags"}
        if unknown:
            raise ReportInputError(f"schedule: tactic {i} has unknown keys {sorted(unknown)} "
                                   "(allowed: name, axis, inputs, tags)")
        if not isinstance(entry.get("axis"), str):
            raise ReportInputError(f"schedule: tactic {i} needs an \"axis\" (a mesh axis name)")
        inputs, tags = entry.get("inputs", {}), entry.get("tags", {})
        if not isinstance(inputs, dict) or not isinstance(tags, dict):
            raise ReportInputError(f"schedule: tactic {i}: \"inputs\" and \"tags\" must be "
                                   "objects mapping names to selectors")
        name = entry.get("name")
        out.append(ManualPartition({k: _selector(v, k) for k, v in inputs.items()},
                                   axis=entry["axis"], name=None if name is None else str(name),
                                   tags={k: _selector(v, k) for k, v in tags.items()}))
    return out


def load_schedule(args: argparse.Namespace) -> list:
    if args.schedule and args.schedule_json:
        raise ReportInputError("give --schedule or --schedule-json, not both")
    if args.schedule:
        path = Path(args.schedule)
        if not path.is_file():
            raise ReportInputError(f"--schedule: no such file {args.schedule!r}")
        try:
            namespace = runpy.run_path(str(path))
        except Exception as e:  # the user's file failed to run: say where
            raise ReportInputError(f"--schedule: running {path} failed: "
                                   f"{type(e).__name__}: {e}") from None
        if "schedule" not in namespace:
            raise ReportInputError(f"--schedule: {path} must define `schedule = [...]`")
        schedule = namespace["schedule"]
        if not isinstance(schedule, (list, tuple)):
            raise ReportInputError(f"--schedule: `schedule` in {path} must be a list, got "
                                   f"{type(schedule).__name__}")
        for i, t in enumerate(schedule):
            try:
                as_tactic(t)
            except PartitionError:
                raise ReportInputError(f"--schedule: entry {i} of `schedule` is not a tactic "
                                       f"(ManualPartition, AutomaticPartition or a callable): "
                                       f"{t!r}") from None
        return list(schedule)
    if args.schedule_json:
        text = args.schedule_json
        if not text.lstrip().startswith("[") and Path(text).is_file():
            text = Path(text).read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ReportInputError(f"--schedule-json: not valid JSON ({e})") from None
        return schedule_from_json(data)
    return []


def _stablehlo(source: str | bytes, entry: str, names: list[str] | None) -> Traced:
    try:
        return Traced.from_stablehlo(source, entry, names)
    except ArgumentNamesError as e:
        raise ReportInputError(f"--arg-names: {e}") from None
    except ValueError as e:
        raise ReportInputError(f"--stablehlo: {e}") from None


def _resolve_hardware(name: str | None):
    """The spec for `--hardware` (None: the plugins' default; still None when no hardware
    plugin is installed, and the report has no estimates)."""
    from ..errors import UnknownNameError
    from ..plugin.resolve import resolve_hardware_option

    try:
        return resolve_hardware_option(name)
    except UnknownNameError as e:
        raise ReportInputError(f"--hardware: {e}") from None


def _metadata_from_args(args: argparse.Namespace) -> Metadata:
    if bool(args.function) == bool(args.stablehlo):
        raise ReportInputError("give either --function MODULE:FUNCTION (with --args) or "
                               "--stablehlo FILE")
    from ..core.mesh import parse_mesh

    try:
        mesh = parse_mesh(args.mesh)
    except PartitionError as e:
        raise ReportInputError(str(e)) from None
    schedule = load_schedule(args)
    options = PartitionOptions(hardware=_resolve_hardware(args.hardware))
    baseline = not args.no_baseline
    if args.stablehlo:
        if args.args:
            raise ReportInputError("--args goes with --function, not --stablehlo")
        path = Path(args.stablehlo)
        if not path.is_file():
            raise ReportInputError(f"--stablehlo: no such file {args.stablehlo!r}")
        data = path.read_bytes()
        try:
            source: str | bytes = data.decode()
        except UnicodeDecodeError:
            source = data  # bytecode
        names = [n.strip() for n in args.arg_names.split(",")] if args.arg_names else None
        return report(lambda _schedule: _stablehlo(source, args.entry, names), mesh, schedule,
                      options, baseline=baseline)
    if args.arg_names:
        raise ReportInputError("--arg-names goes with --stablehlo; a function's arguments are "
                               "named by its signature")
    if not args.args:
        raise ReportInputError("--function needs --args MODULE:FUNCTION returning the example "
                               "arguments")
    fn, example = function_and_args(args.function, args.args)
    return report_for_function(fn, example, mesh, schedule, options, baseline=baseline)


def function_and_args(function: str, args: str) -> tuple[Any, tuple]:
    """`--function MODULE:FUNCTION` and `--args MODULE:FUNCTION` (a callable returning the
    example arguments, arrays or ShapeDtypeStructs, or the tuple itself) loaded."""
    fn = load_object(function, "--function")
    if not callable(fn):
        raise ReportInputError(f"--function: {function} is not callable")
    make_args = load_object(args, "--args")
    example = make_args() if callable(make_args) else make_args
    if not isinstance(example, (tuple, list)):
        raise ReportInputError(f"--args: {args} must return a tuple of example arguments, "
                               f"got {type(example).__name__}")
    return fn, tuple(example)


def run(args: argparse.Namespace) -> int:
    try:
        meta = _metadata_from_args(args)
    except ReportInputError as e:
        print(f"partir report: error: {e}", file=sys.stderr)
        return 2
    except PartitionError as e:
        print(f"partir report: partitioning failed: {e}", file=sys.stderr)
        return 1
    print(meta.report(detail=args.detail, group_by=args.group_by))
    if args.trace:
        meta.write_trace(args.trace)
        print(f"wrote {args.trace}", file=sys.stderr)
    if args.html:
        meta.write_html(args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(meta.to_json(), indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        meta.plot(args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
