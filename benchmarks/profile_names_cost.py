"""Partition + compile CPU seconds of the transformer L=16 (BP+MP+Z3), one run per process
(issue 36's cost check; run from each worktree, alternating sides):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python \
        benchmarks/profile_names_cost.py
"""

from __future__ import annotations

import os
import time

import harness  # noqa: F401  (before jax: 8 CPU devices, repo root on sys.path)
import jax
import partition_time

import partir_plugin as partir


def main() -> None:
    step, args, schedule = partition_time._transformer(16, False)
    mesh = jax.make_mesh((4, 2), ("batch", "model"), devices=jax.devices()[:8])
    c0, w0 = time.process_time(), time.perf_counter()
    fn, _ = partir.jit(step, mesh, schedule, hardware="tpu-v3")
    lowered = fn.lower(*args)
    c1, w1 = time.process_time(), time.perf_counter()
    lowered.compile()
    c2, w2 = time.process_time(), time.perf_counter()
    print(f"{partir.__file__}: lower cpu {c1 - c0:.2f} s (wall {w1 - w0:.2f}), compile cpu "
          f"{c2 - c1:.2f} s (wall {w2 - w1:.2f}), total cpu {c2 - c0:.2f} s, load "
          f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
