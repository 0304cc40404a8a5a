"""RM on the present device: a scanned LM's train step (partir_plugin.models.transformer,
`scan=True`, no remat in its code) under [BP], [BP, RM(full)], [BP, RM(dots)] and, where the
backend lowers moves to host memory, [BP, RM(dots, offload)], on a `{batch: n}` mesh of the
present devices: measured step time (median of `--steps`), XLA's memory analysis of the
compiled step, and the simulator's estimate for `--hardware`; every result checked against
jax.jit's (loss and updated parameters).

    python -m benchmarks.rematerialization --hardware h100           # on a GPU
    python -m benchmarks.rematerialization --small                   # on CPU, a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

import partir_plugin as partir
from partir_plugin.models import transformer
from partir_plugin.tactics.host_offload import backend_offloads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default=None)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--small", action="store_true")
    a = parser.parse_args()
    cfg = (transformer.Config(layers=4, batch=8, seq_len=64, d_model=64, heads=4, head_dim=16,
                              ffw=256, vocab=256, scan=True) if a.small else
           transformer.Config(layers=8, batch=16, seq_len=512, d_model=1024, heads=16,
                              head_dim=64, ffw=4096, vocab=8192, scan=True))
    args = transformer.init(cfg, jax.random.key(0))
    step = transformer.make_train_step(cfg)
    want = jax.jit(step)(*args)
    n = len(jax.devices())
    bp = partir.tactic("BP", axis="batch")
    schedules = {"BP": [bp], "BP,RM(full)": [bp, partir.tactic("RM")],
                 "BP,RM(dots)": [bp, partir.tactic("RM", policy="dots")]}
    if backend_offloads():
        schedules["BP,RM(dots,offload)"] = [bp, partir.tactic("RM", policy="dots",
                                                             offload=True)]
    print(f"{jax.devices()[0].device_kind} x{n}, jax {jax.__version__}, {cfg}")
    print(f"{'schedule':22} {'step ms':>9} {'est ms':>9} {'XLA temp MiB':>13} "
          f"{'est peak MiB':>13} {'XLA peak MiB':>13} {'max rel err':>12}")
    for name, schedule in schedules.items():
        fn, meta = partir.jit(step, {"batch": n}, schedule, hardware=a.hardware)
        compiled = fn.lower(*args).compile()
        got = fn(*args)
        err = max(float(np.max(np.abs(np.asarray(g) - np.asarray(w))) /
                        (np.max(np.abs(np.asarray(w))) + 1e-30))
                  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
        times = []
        for _ in range(a.steps):
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - t)
        mem = compiled.memory_analysis()
        xla_peak = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                    - mem.alias_size_in_bytes + mem.temp_size_in_bytes)
        row = meta.tactics[-1]
        est_ms = (row.estimated_runtime_s or 0) * 1e3
        est_peak = (row.estimated_peak_memory_bytes or 0) / 2**20
        print(f"{name:22} {statistics.median(times) * 1e3:9.2f} {est_ms:9.2f} "
              f"{mem.temp_size_in_bytes / 2**20:13.1f} {est_peak:13.1f} "
              f"{xla_peak / 2**20:13.1f} {err:12.2e}")
        if row.rematerialization is not None:
            print(f"  {row.rematerialization.describe()}")


if __name__ == "__main__":
    main()
