"""The `partir` command line. Each subcommand lives beside the code it drives."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, help). The module has `add_arguments(parser)` and `run(args) -> int`.
COMMANDS = {
    "report": ("partir_plugin.report_cli",
               "partition a function or StableHLO file, print the report"),
    "reshard-plan": ("partir_plugin.spmd.redistribution.cli", "print a redistribution plan"),
    "calibrate": ("partir_plugin.plugins.hardware.calibrate", "measure this host, save a spec"),
    "plugins": ("partir_plugin.plugins_cli", "list loaded plugins"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="partir", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(_module=module)
        try:
            importlib.import_module(module).add_arguments(p)
        except ModuleNotFoundError as e:  # a command whose module is not installed
            p.set_defaults(_missing=str(e))
    args = parser.parse_args(argv)
    if getattr(args, "_missing", None):
        parser.error(f"command {args.command!r} is unavailable: {args._missing}")
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
