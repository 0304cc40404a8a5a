"""From a user's program to ours: jax tracing with the schedule's hooks (`trace`) and the
markers a model writes into its program (`markers`: tag, roll, interleave)."""
