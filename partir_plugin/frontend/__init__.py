"""From a user's program to ours: jax tracing with the schedule's trace hooks (`trace`). The
markers a model writes into its program (tag, roll, interleave) are `partir_plugin.markers`,
a layer below the tactics that write them too (PP)."""
