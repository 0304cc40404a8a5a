"""A tiny third-party plugin: a tactic preset and a hardware spec, found by entry point.

Like every plugin (the built-in ones included) it imports only `partir_plugin.extend`, the
plugin-author API.
"""

from partir_plugin.extend import HardwareSpec, LinkClass, ManualPartition, hookimpl


def shard_everything(axis: str = "batch") -> ManualPartition:
    """Tile dimension 0 of every argument named `x` on `axis`."""
    return ManualPartition({"x": 0}, axis=axis, name="ShardX")


EXAMPLE_ACCELERATOR = HardwareSpec(
    name="example-accelerator",
    aliases=("example",),
    flops_per_s={"f32": 1e12},
    memory_bytes=2**30,
    memory_bandwidth_bytes_per_s=1e11,
    links={"mesh": LinkClass("mesh", 1e10, 1e-6)},
    default_link="mesh",
    notes="made-up figures for the test suite",
)


@hookimpl
def partir_add_tactics() -> dict:
    return {"ShardX": shard_everything}


@hookimpl
def partir_add_hardware() -> list[HardwareSpec]:
    return [EXAMPLE_ACCELERATOR]
