"""The README demo: partition a train step on 8 devices, check it against `jax.jit`, and print
the per-tactic report.

Run with `make demo` (which sets XLA_FLAGS for 8 virtual CPU devices).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")


def main() -> int:
    import jax
    import numpy as np
    import optax

    import partir_plugin as partir
    from partir_plugin.examples import mlp

    model, optimizer = mlp.MLP(hidden=64, layers=4, classes=16), optax.adam(1e-3)
    train_step = mlp.make_train_step(model, optimizer)
    params, opt_state, batch = mlp.init(model, optimizer, batch_size=64)

    mesh = jax.make_mesh((4, 2), ("batch", "model"), devices=jax.devices()[:8])
    schedule = [
        partir.ManualPartition({"batch": 0}, axis="batch", name="BP"),
        partir.ManualPartition({"params": mlp.megatron_rule}, axis="model", name="MP"),
        partir.ManualPartition({"params": partir.FIRST_DIVISIBLE_DIM,
                                "opt_state": partir.FIRST_DIVISIBLE_DIM}, axis="batch",
                               name="Z3"),
    ]
    start = time.perf_counter()
    step, meta = partir.jit(train_step, mesh, schedule, hardware="host-cpu")
    step.lower(params, opt_state, batch)
    partition_s = time.perf_counter() - start

    reference = jax.jit(train_step)
    p, o, p_ref, o_ref = params, opt_state, params, opt_state
    for i in range(3):
        p, o, loss = step(p, o, batch)
        p_ref, o_ref, loss_ref = reference(p_ref, o_ref, batch)
        print(f"step {i}: loss partitioned {float(loss):.6f}   jax.jit {float(loss_ref):.6f}")
    worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(p_ref)))
    print(f"\npartitioned + compiled in {partition_s:.2f} s on {len(mesh.devices.flat)} "
          f"{jax.devices()[0].platform} devices; max |param - jax.jit param| = {worst:.2e}\n")
    print(meta.report())
    ok = worst < 1e-4 and abs(float(loss) - float(loss_ref)) < 1e-5
    print("\nnumerics check:", "OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
