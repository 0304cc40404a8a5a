"""The `partir` command line: one parser, subcommands registered by the kernel and by plugins.

Every subcommand is registered the same way (`partir_add_cli_commands`): a subparser whose
`run` default is `run(args) -> int`. The kernel's own are `report`, `plan`, `reshard-plan`,
`plugins` and `demo`; the hardware plugin adds `calibrate`. Each command's arguments live
beside the code it drives (`cli/report.py`, `cli/plan.py`, `spmd/redistribution/cli.py`);
`--mesh` is parsed by one function, `core.mesh.parse_mesh`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable


def _add(subparsers: argparse._SubParsersAction, name: str, help_text: str,
         add_arguments: Callable[[argparse.ArgumentParser], None] | None,
         run: Callable[[argparse.Namespace], int], description: str | None = None) -> None:
    parser = subparsers.add_parser(name, help=help_text, description=description or help_text,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    if add_arguments is not None:
        add_arguments(parser)
    parser.set_defaults(run=run)


def _run_report(args: argparse.Namespace) -> int:
    from . import report

    return report.run(args)


def _run_plan(args: argparse.Namespace) -> int:
    from . import plan

    return plan.run(args)


def _run_reshard_plan(args: argparse.Namespace) -> int:
    from ..spmd.redistribution import cli

    return cli.run(args)


def _run_plugins(args: argparse.Namespace) -> int:
    """List loaded plugins and what they contribute."""
    from ..plugin import manager

    for name, module in manager.loaded_plugins():
        print(f"{name:24s} {module}")
    print("tactics:    ", ", ".join(sorted(manager.tactic_factories())) or "-")
    print("hardware:   ", ", ".join(sorted(manager.hardware_specs())) or "-",
          f"(default: {manager.default_hardware_name() or '-'})")
    print("simulators: ", ", ".join(sorted(manager.simulators())) or "-",
          f"(default: {manager.default_simulator_name() or '-'})")
    print("searchers:  ", ", ".join(sorted(manager.searchers())) or "-")
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from ..examples import demo

    return demo.main()


def add_kernel_commands(subparsers: argparse._SubParsersAction) -> None:
    """The kernel's own subcommands (plugins add theirs through the same hook's signature)."""
    from ..spmd.redistribution import cli as reshard_cli
    from . import plan, report

    _add(subparsers, "report", "partition a function or StableHLO file, print the report",
         report.add_arguments, _run_report, report.__doc__)
    _add(subparsers, "plan", "the fastest schedules that fit N devices, estimated (a table)",
         plan.add_arguments, _run_plan, plan.__doc__)
    _add(subparsers, "reshard-plan", "print a redistribution plan", reshard_cli.add_arguments,
         _run_reshard_plan, reshard_cli.__doc__)
    _add(subparsers, "plugins", "list loaded plugins", None, _run_plugins)
    _add(subparsers, "demo", "run the README demo (T with [BP, MP, Z3] on 8 CPU devices)", None,
         _run_demo)


def build_parser() -> argparse.ArgumentParser:
    from ..plugin import manager

    parser = argparse.ArgumentParser(prog="partir", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_kernel_commands(sub)
    manager.add_cli_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = int(args.run(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # `partir ... | head`: the reader left; exit quietly as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return status


if __name__ == "__main__":
    sys.exit(main())
