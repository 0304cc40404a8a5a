"""A tiny third-party plugin: a tactic preset and a hardware spec, found by entry point."""

from partir_plugin import ManualPartition, hookimpl


def shard_everything(axis: str = "batch"):
    """Tile dimension 0 of every argument named `x` on `axis`."""
    return ManualPartition({"x": 0}, axis=axis, name="ShardX")


@hookimpl
def partir_add_tactics():
    return {"ShardX": shard_everything}
