"""Lowering rules: each feature's device-local lowering of the ops it matches, one module per
feature (as jax's `mlir.register_lowering`, Shardy's rewrite patterns, XLA's per-op-family
handlers). `registry.RULES` lists them; an op's rules are chosen once per op plan."""
