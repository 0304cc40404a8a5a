"""The README demo: partition the transformer train step (paper's T, small) with the schedule
[BP, MP, Z3] on 8 devices, check it against `jax.jit`, and print the per-tactic report.

Run with `make demo` or `partir demo` from any directory: the models ship in the package
(`partir_plugin.models`). Without XLA_FLAGS, the demo asks XLA for 8 virtual CPU devices
itself (effective only before jax starts its CPU client).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

DEVICE_FLAG = "--xla_force_host_platform_device_count"


def _ask_for_cpu_devices(n: int = 8) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if DEVICE_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {DEVICE_FLAG}={n}".strip()


def demo_config():
    """The demo's transformer: the paper's T, small (4 layers, d_model 64)."""
    from partir_plugin.models import transformer

    return dataclasses.replace(transformer.Config.small(layers=4), batch=8, seq_len=16,
                               d_model=64, heads=4, head_dim=16, ffw=256, vocab=128)


def main() -> int:
    _ask_for_cpu_devices()
    import jax
    import numpy as np

    import partir_plugin as partir
    from partir_plugin.models import megatron, transformer

    config = demo_config()
    train_step = transformer.make_train_step(config)
    params, opt_state, batch = transformer.init(config, jax.random.PRNGKey(0))

    if len(jax.devices()) < 8:
        print(f"the demo needs 8 devices, jax has {len(jax.devices())}: set XLA_FLAGS="
              f"{DEVICE_FLAG}=8 before jax starts", file=sys.stderr)
        return 2
    mesh = jax.make_mesh((4, 2), ("batch", "model"), devices=jax.devices()[:8])
    schedule = [
        partir.tactic("BP", axis="batch"),
        partir.tactic("MP", rule=megatron.transformer_rule, axis="model"),
        partir.tactic("Z3", axis="batch"),
    ]
    start = time.perf_counter()
    step, meta = partir.jit(train_step, mesh, schedule)  # estimates on the default spec
    step.lower(params, opt_state, batch)
    partition_s = time.perf_counter() - start

    reference = jax.jit(train_step)
    p, o, p_ref, o_ref = params, opt_state, params, opt_state
    loss_ok = True
    for i in range(3):
        p, o, loss = step(p, o, batch)
        p_ref, o_ref, loss_ref = reference(p_ref, o_ref, batch)
        loss_ok &= abs(float(loss) - float(loss_ref)) <= 1e-5 * abs(float(loss_ref))
        print(f"step {i}: loss partitioned {float(loss):.6f}   jax.jit {float(loss_ref):.6f}")

    # Gradients under the same schedule (Z3 on the parameters) against jax.jit's: Adam turns
    # rounding noise in near-zero gradient entries into whole learning-rate steps, so the
    # parameters after a few steps are not the place to compare.
    def gradients(params, batch):
        return jax.grad(lambda q: transformer.loss_fn(config, q, batch))(params)

    grad_schedule = [*schedule[:2], partir.ManualPartition(
        {"params": partir.FIRST_DIVISIBLE_DIM}, axis="batch", name="Z3")]
    grad_step, _ = partir.jit(gradients, mesh, grad_schedule)
    worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(b)))
                for a, b in zip(jax.tree.leaves(grad_step(params, batch)),
                                jax.tree.leaves(jax.jit(gradients)(params, batch))))
    n_params = len(jax.tree.leaves(params))
    print(f"\ntransformer: {config.layers} layers, {n_params} parameter tensors; partitioned "
          f"and lowered in {partition_s:.2f} s on {len(mesh.devices.flat)} "
          f"{jax.devices()[0].platform} devices; largest gradient error relative to the "
          f"leaf's scale: {worst:.1e}\n")
    print(meta.report())
    ok = loss_ok and worst < 1e-4
    print("\nnumerics check against jax.jit (losses, gradients):", "OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
