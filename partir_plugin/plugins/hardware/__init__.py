"""Built-in hardware specs: tpu-v3, a100-40gb, h100-sxm, h200-sxm (datasheets) and host-cpu
(measured by `partir calibrate`, re-read on every lookup so a new calibration is seen)."""

from __future__ import annotations

from ...hookspecs import hookimpl
from .host import load_host_spec
from .specs import A100_40GB, DATASHEET_SPECS, H100_SXM, H200_SXM, TPU_V3

__all__ = ["A100_40GB", "H100_SXM", "H200_SXM", "TPU_V3", "load_host_spec"]


@hookimpl
def partir_add_hardware():
    return [*DATASHEET_SPECS, load_host_spec()]
