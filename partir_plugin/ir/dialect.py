"""partir's own vocabulary in StableHLO, defined once: the ops the markers and the importer
make, the named scope a tag travels in, and the attributes that mark the lowering's
collectives.

Only strings and two small functions: the markers (`partir_plugin.markers`) import it under
plain jax, without MLIR's bindings.
"""

from __future__ import annotations

import re

# What `partir_plugin.tag` lowers to: an identity (a reduce_precision to the value's own
# precision) inside the named scope `tag_scope(name)`.
TAG_OP = "stablehlo.reduce_precision"
# The composite `partir_plugin.roll` lowers to: imported as one op of this name (attributes
# `shift`, `axis`), which the lowering turns into collective_permutes where the axis is tiled.
ROLL_OP = "partir.roll"
# The composite `partir_plugin.markers.interleave` lowers to (attributes `repeats`, `stages`,
# `inverse`): the circular pipeline's layer order, chunks moved by collective_permutes.
INTERLEAVE_OP = "partir.interleave"
# Composites the importer keeps whole (not inlined), with the attributes they keep.
KEPT_COMPOSITES = {ROLL_OP: ("shift", "axis"), INTERLEAVE_OP: ("repeats", "stages", "inverse")}
# A max-pool's gradient (pad, select_and_scatter, slice) as the importer fuses it
# (`ir/passes/padded_scatter.py`); the lowering expands it again on local shapes.
PADDED_SCATTER_OP = "partir.padded_select_and_scatter"

# The attributes the lowering puts on each collective it emits: its kind and its mesh axes
# (`spmd/collectives.py` writes and reads them).
KIND_ATTR = "partir.collective"
AXES_ATTR = "partir.axes"

# An op jax placed on one device (a host callback: `jax.debug.print`, `pure_callback`,
# `io_callback`, with Shardy's maximal sharding): that device's partition id. It runs there
# once, as under jax.jit (`spmd/rules/one_device.py`).
ON_DEVICE_ATTR = "partir.on_device"

# A `jax.shard_map` body: Shardy's manual computation, its code per device. The importer adds
# the text of the `sdy.mesh` its shardings name (`spmd/rules/manual_body.py` checks it is the
# partitioned program's mesh).
MANUAL_COMPUTATION = "sdy.manual_computation"
MESH_ATTR = "partir.mesh"

_TAG = re.compile(r"partir_tag\[([^\]]+)\]")


def tag_scope(name: str) -> str:
    """The named scope `partir_plugin.tag(x, name)` lowers its identity in."""
    return f"partir_tag[{name}]"


def tag_name(location: str | None) -> str | None:
    """The tag name a `TAG_OP`'s location (its named-scope path) carries, if any."""
    m = _TAG.search(location or "")
    return m.group(1) if m else None
