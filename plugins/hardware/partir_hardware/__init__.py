"""Built-in hardware specs: tpu-v3, a100-40gb, h100-sxm, h200-sxm and the DGX nodes a100-80gb
and h100-dgx (datasheets), and host-cpu (measured by `partir calibrate`, re-read on every
lookup so a new calibration is seen).

Each spec declares the names people type as aliases ("a100", "H100", "TPUv3"; matched
case-insensitively by the kernel). This plugin also names the default spec (host-cpu: the one
estimates on this machine can be checked against) and adds the `partir calibrate` command.
"""

from __future__ import annotations

import argparse

from partir_plugin.extend import HardwareSpec, hookimpl

from .host import HOST_CPU, load_host_spec
from .specs import A100_40GB, A100_80GB, DATASHEET_SPECS, H100_DGX, H100_SXM, H200_SXM, TPU_V3

__all__ = ["A100_40GB", "A100_80GB", "H100_DGX", "H100_SXM", "H200_SXM", "HOST_CPU", "TPU_V3",
           "load_host_spec"]


@hookimpl
def partir_add_hardware() -> list[HardwareSpec]:
    return [*DATASHEET_SPECS, load_host_spec()]


@hookimpl
def partir_default_hardware() -> str:
    return HOST_CPU


@hookimpl
def partir_add_cli_commands(subparsers: argparse._SubParsersAction) -> None:
    from . import calibrate

    parser = subparsers.add_parser("calibrate", help="measure this host, save the host-cpu spec",
                                   description=calibrate.__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    calibrate.add_arguments(parser)
    parser.set_defaults(run=calibrate.run)
