"""What a collective costs on this host between compute, against alone (issue 38's bench-plan).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python \
        benchmarks/collective_barriers.py

On the 8 virtual CPU devices of a 2-core host, a scan of 40 iterations, each a matmul of
[n, n] per device, with and without a tiny all-reduce over groups of 4 (the data axis of a
{data: 4, model: 2} mesh) after the matmul; the difference per all-reduce against the
calibrated host link's charge for it (`partir calibrate`: overhead + 6 ring steps). Each
time the fastest of 10 calls after a warm-up. Prints a table; writes nothing.
"""

from __future__ import annotations

import harness  # before jax: 8 CPU devices
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

ITERATIONS = 40


def fastest_s(fn, *args, reps: int = 10) -> float:
    return min(harness.step_times(fn, args, reps))


def main() -> None:
    from partir_simulators.comm import ring_time

    from partir_plugin.plugin.resolve import resolve_hardware

    spec = resolve_hardware("host-cpu")
    link = spec.links[spec.default_link]
    charged = ring_time("all_reduce", 4, 4, link)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    rows = P(("data", "model"))
    print(f"host link: {link.overhead_s * 1e6:.1f} us per collective, {link.latency_s * 1e6:.1f}"
          f" us per ring step: a tiny all-reduce over 4 devices charged {charged * 1e6:.0f} us")
    print("| n | compute per iteration | per all-reduce, between compute | charged |")
    print("|---|---|---|---|")
    for n in (64, 128, 256):
        def step(w, v, reduce):
            def body(h, _):
                h = jnp.tanh(h @ w)
                if reduce:
                    h = h + jax.lax.psum(h[:1, :8].sum(), "data") * 1e-9
                return h, None
            return jax.lax.scan(body, v, None, length=ITERATIONS)[0]

        fns = {r: jax.jit(jax.shard_map(lambda w, v, r=r: step(w, v, r), mesh=mesh,
                                        in_specs=(P(), rows), out_specs=rows))
               for r in (False, True)}
        w = jnp.ones((n, n), jnp.float32) / n
        v = jax.device_put(jnp.ones((8 * n, n), jnp.float32), NamedSharding(mesh, rows))
        without, with_ = fastest_s(fns[False], w, v), fastest_s(fns[True], w, v)
        print(f"| {n} | {without / ITERATIONS * 1e6:.0f} us | "
              f"{(with_ - without) / ITERATIONS * 1e6:.0f} us | {charged * 1e6:.0f} us |")


if __name__ == "__main__":
    main()
