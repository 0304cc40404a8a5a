"""The `host-cpu` spec: one virtual CPU device of this host, as `partir calibrate` measured it.

Without a calibration file the spec uses deliberately slow defaults, so an uncalibrated estimate
errs towards "too slow" rather than promising speed the host does not have.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from partir_plugin.extend import HardwareSpec, LinkClass

CALIBRATION_ENV = "PARTIR_CALIBRATION_FILE"
HOST_CPU = "host-cpu"
HOST_ALIASES = ("cpu", "host")
DEFAULT_DEVICES = 8  # the project runs SPMD programs on 8 virtual CPU devices
# How XLA:CPU fuses (not measured, so not in the calibration file): its instruction fusion
# computes an expensive elementwise op read by several kernels once and materialises it
# (xla/service/instruction_fusion.cc), and it runs float add/max/min reductions as YNNPACK
# fusions that take in only producers no other kernel reads (`__ynn_fusion` in its HLO). Its
# CpuAllReduceCombiner merges independent all-reduces with no byte limit (cpu_compiler.cc).
BACKEND = {"platform": "cpu", "duplicates_expensive_ops": False, "library_reductions": True,
           "combined_collectives": ("all_reduce",), "combine_threshold_bytes": 2**62}


def calibration_path() -> Path:
    """`$PARTIR_CALIBRATION_FILE`, else `~/.cache/partir_plugin/host_cpu.json`."""
    env = os.environ.get(CALIBRATION_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "partir_plugin" / "host_cpu.json"


def physical_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def default_host_spec(devices: int = DEFAULT_DEVICES) -> HardwareSpec:
    """Conservative figures for one of `devices` virtual devices sharing this host."""
    return HardwareSpec(
        name=HOST_CPU,
        aliases=HOST_ALIASES,
        flops_per_s={"f32": 5e9, "f64": 2.5e9, "bf16": 1e9},
        memory_bytes=physical_memory_bytes() // max(devices, 1),
        memory_bandwidth_bytes_per_s=1e9,
        links={"host": LinkClass("host", 0.5e9, 50e-6)},
        default_link="host",
        kernel_overhead_s=10e-6,
        notes="uncalibrated defaults; run `partir calibrate`",
        **BACKEND,
    )


def load_host_spec(path: Path | str | None = None) -> HardwareSpec:
    """The calibrated spec from `path` (default `calibration_path()`), else the defaults.

    A malformed file only warns: a broken cache must not stop every other spec from loading.
    """
    path = Path(path) if path is not None else calibration_path()
    if not path.exists():
        return default_host_spec()
    try:
        data = json.loads(path.read_text())
        return HardwareSpec.from_dict({**data, "name": HOST_CPU, "aliases": HOST_ALIASES,
                                       **BACKEND})
    except (OSError, ValueError, KeyError, TypeError) as e:
        warnings.warn(f"ignoring calibration file {path}: {e}; using default host-cpu figures",
                      stacklevel=2)
        return default_host_spec()
