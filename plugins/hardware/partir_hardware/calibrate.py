"""`partir calibrate`: measure one virtual CPU device of this host and save the host-cpu spec;
with `--accelerator`, measure one GPU/TPU and save a calibrated copy of its datasheet spec.

Every measurement runs on all N virtual devices at once (a `shard_map` over an N-device mesh),
because that is how a partitioned program runs here: the devices share the host's cores and
memory bus, so a device's figure is what it gets while the others are busy too.

- matmul FLOP/s: each device multiplies two n x n matrices (f32 and bf16);
- memory bandwidth: each device streams a large array (8 MiB, beyond the cache and below
  the size the allocator maps afresh on every call) through one fused read + write;
  the same on arrays that fit a device's share of the last-level cache gives the cache's
  bandwidth, used for kernels moving at most that share (`HardwareSpec.cache_bytes`);
- collectives: a loop whose iterations each run a small kernel and then a small `psum` over
  groups of two or of every device (as a step runs its collectives: after compute, not
  back to back; medians), and a `psum` of a large array, fitted to the ring model
  t = overhead + 2(k-1) * latency + 2(k-1)/k * N / bandwidth after subtracting a
  no-communication run (overhead: once per collective);
- kernel overhead: a chain of tiny dependent matmuls, per link of the chain;
- rendezvous waits, where the devices outnumber the cores: a loop of stretches of compute,
  each followed by a small `psum` over groups of 2, 4 and every device, against the same
  loop without it; what the psum takes beyond its link cost, per stretch of compute.

On an accelerator (`--accelerator`, one device) it measures the GPU cost structure the
simulator uses (`docs/simulator.md`): GEMMs at several sizes fitted to t = (f + half) / rate
(the large-GEMM rate and the size at half of it), a streaming kernel's bandwidth, and the time
per kernel of a chain of tiny kernels. Links cannot be measured on one device: they stay the
datasheet spec's.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from partir_plugin.extend import HardwareSpec, LinkClass

from .host import BACKEND, DEFAULT_DEVICES, HOST_CPU, calibration_path, physical_memory_bytes

DEVICE_FLAG = "--xla_force_host_platform_device_count"
_CHILD_ENV = "PARTIR_CALIBRATE_CHILD"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", type=float, default=20.0,
                        help="seconds to spend measuring (default 20; under 5 uses small sizes)")
    parser.add_argument("--devices", type=int, default=DEFAULT_DEVICES,
                        help=f"virtual CPU devices to measure across (default {DEFAULT_DEVICES})")
    parser.add_argument("--output", type=Path, default=None,
                        help="where to save (default $PARTIR_CALIBRATION_FILE or "
                             "~/.cache/partir_plugin/host_cpu.json; with --accelerator "
                             "~/.cache/partir_plugin/<spec>-calibrated.json)")
    parser.add_argument("--accelerator", action="store_true",
                        help="measure jax's default device (a GPU or TPU) instead of the host")
    parser.add_argument("--base", default=None,
                        help="with --accelerator: the datasheet spec to calibrate (default: "
                             "from the device kind, e.g. 'H100' -> h100-sxm)")


def _set_device_flag(devices: int) -> None:
    """Ask XLA for `devices` host devices; only effective before jax creates its CPU client."""
    flags = os.environ.get("XLA_FLAGS", "")
    if DEVICE_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {DEVICE_FLAG}={devices}".strip()


def _backends_initialised() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return "jax" in sys.modules


def run(args: argparse.Namespace) -> int:
    """Measure, save and print. A process whose jax already has fewer CPU devices than asked
    (a test session, a notebook) measures in a fresh interpreter instead."""
    if getattr(args, "accelerator", False):
        return run_accelerator(args)
    output = Path(args.output) if args.output else calibration_path()
    if not _backends_initialised():
        _set_device_flag(args.devices)
    import jax

    if len(jax.devices("cpu")) < args.devices and not os.environ.get(_CHILD_ENV):
        # jax's CPU client already exists with fewer devices: measure in a fresh interpreter.
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if DEVICE_FLAG not in f]
        env = {**os.environ, _CHILD_ENV: "1",
               "XLA_FLAGS": " ".join([*flags, f"{DEVICE_FLAG}={args.devices}"])}
        cmd = [sys.executable, "-m", "partir_plugin.cli", "calibrate",
               "--budget", str(args.budget),
               "--devices", str(args.devices), "--output", str(output)]
        proc = subprocess.run(cmd, env=env)
        return proc.returncode
    data = measure(args.budget, args.devices)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2))
    print(f"saved to {output}", file=sys.stderr)
    warning = busy_host(data["measurements"]["load_average"], data["measurements"]["cores"])
    if warning:
        print(warning, file=sys.stderr)
    return 0


def busy_host(load_average: float, cores: int | None) -> str | None:
    """A warning when the host was busy while it was measured (a 1-minute load average above
    half its cores): the figures then describe the share of the host other work left (a
    calibration taken beside a test run measured a quarter of the idle memory bandwidth)."""
    if not cores or load_average <= cores / 2:
        return None
    return (f"warning: the host was busy while measured (load average {load_average:.1f} on "
            f"{cores} cores): the saved figures are slower than this host is idle; rerun "
            f"`partir calibrate` when it is idle")


def last_level_cache_bytes() -> int:
    """The largest CPU cache of this host (Linux sysfs), 0 where it is not known."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * scale)
        except ValueError:
            continue
    return max(sizes, default=0)


def _best_time(fn, *args, budget_s: float, max_reps: int = 20) -> float:
    """Minimum wall time of `fn(*args)` after one warm-up (compile) call."""
    import jax

    jax.block_until_ready(fn(*args))
    best = float("inf")
    deadline = time.perf_counter() + budget_s
    for _ in range(max_reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() > deadline:
            break
    return best


def measure(budget_s: float, devices: int) -> dict:
    """Run the measurements on `devices` CPU devices; return the spec as a JSON-ready dict."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    start = time.perf_counter()
    load = os.getloadavg()[0]
    quick = budget_s < 5
    cpus = jax.devices("cpu")[:devices]
    k = len(cpus)
    mesh = Mesh(np.array(cpus), ("d",))
    sharding = NamedSharding(mesh, P("d"))
    share = budget_s / 6  # about six timed phases

    def per_device(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("d"), out_specs=P("d")))

    def per_device2(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("d"), P("d")),
                                     out_specs=P("d")))

    def put(shape, dtype):
        return jax.device_put(jnp.ones((k * shape[0], *shape[1:]), dtype), sharding)

    flops: dict[str, float] = {}
    matmul = per_device2(lambda a, b: a @ b)
    for element, dtype, n in (("f32", jnp.float32, 256 if quick else 1024),
                              ("bf16", jnp.bfloat16, 128 if quick else 512)):
        a, b = put((n, n), dtype), put((n, n), dtype)
        flops[element] = 2.0 * n**3 / _best_time(matmul, a, b, budget_s=share)

    # f32 elements per device: 4 MiB or 8 MiB, read and written by every device at once, well
    # beyond the last-level cache. Not more: a step's kernels write into memory the allocator
    # recycles from the step before, while an output of 32 MiB or more is a fresh mapping on
    # every call (glibc maps an allocation that large, and its threshold stops at 32 MiB), and
    # faulting its pages in took 3x the streaming here (0.74-0.86 GB/s per device against
    # 2.0-2.6 at 1-16 MiB; the calibration measured 32 MiB until 2026-11-28).
    elems = (1 if quick else 2) * 2**20
    x = put((elems,), jnp.float32)
    stream = per_device(lambda v: v * 1.0001 + 1.0)
    mem_bw = 2.0 * 4 * elems / _best_time(stream, x, budget_s=share)
    # The same kernel on arrays whose read and write fit in a device's share of the
    # last-level cache: the devices' kernels interleave on the cores, so a kernel finds its
    # inputs still cached only where every device's kernels fit together. A training step's
    # tensors on 8 virtual devices mostly do, and stream several times faster than from memory.
    cache_bytes = last_level_cache_bytes() // k
    cache_bw = None
    if cache_bytes:
        in_cache = cache_bytes // 16  # f32 elements moving half the share, read and written
        dispatch = _best_time(stream, put((8,), jnp.float32), budget_s=share / 4)
        took = _best_time(stream, put((in_cache,), jnp.float32), budget_s=share / 2)
        cache_bw = 2.0 * 4 * in_cache / max(took - dispatch, 1e-9)
        if cache_bw <= mem_bw:  # no faster than memory here: one bandwidth
            cache_bytes, cache_bw = 0, None

    psum = per_device(lambda v: jax.lax.psum(v, "d"))
    noop = per_device(lambda v: v + 1.0)
    small = put((8,), jnp.float32)
    t_small = _best_time(psum, small, budget_s=share)
    t_small0 = _best_time(noop, small, budget_s=share / 2)
    steps = max(2 * (k - 1), 1)
    latency = max(t_small - t_small0, 1e-7) / steps
    rendezvous, latency = _collective_overhead_and_latency(latency, budget_s=share / 2, k=k)
    big_elems = (1 if quick else 4) * 2**20 // 4
    big = put((big_elems,), jnp.float32)
    nbytes = 4 * big_elems
    t_big = _best_time(psum, big, budget_s=share * 1.5)
    # Bandwidth from the slope between the two sizes: dispatch and latency cancel out.
    ring_factor = 2.0 * (k - 1) / k if k > 1 else 1.0
    moved = ring_factor * (nbytes - 4 * 8)
    link_bw = moved / max(t_big - t_small, moved / 1e12)

    chain = 32

    def chained(v, n):
        w = v[:8, :8]
        y = v[:8, :8]
        for _ in range(n):
            y = jnp.tanh(y @ w)
        return y

    tiny = put((8, 8), jnp.float32)
    t_long = _best_time(per_device(lambda v: chained(v, chain)), tiny, budget_s=share / 2)
    t_short = _best_time(per_device(lambda v: chained(v, 1)), tiny, budget_s=share / 2)
    overhead = max(t_long - t_short, 0.0) / (chain - 1)

    link = LinkClass("host", link_bw, latency, rendezvous)
    waits, wait_times = _rendezvous_waits(link, budget_s=share, k=k)
    spec = HardwareSpec(
        name=HOST_CPU, flops_per_s=flops,
        memory_bytes=physical_memory_bytes() // max(k, 1),
        memory_bandwidth_bytes_per_s=mem_bw,
        cache_bytes=cache_bytes, cache_bandwidth_bytes_per_s=cache_bw,
        links={"host": link}, default_link="host", rendezvous_wait=waits,
        kernel_overhead_s=overhead,
        notes=f"measured by `partir calibrate` across {k} virtual CPU devices",
        **BACKEND,
    )
    data = spec.to_dict()
    data["measurements"] = {
        "devices": k, "quick": quick, "matmul_n": {"f32": 256 if quick else 1024,
                                                   "bf16": 128 if quick else 512},
        "stream_bytes_per_device": 4 * elems, "psum_small_s": t_small,
        "noop_small_s": t_small0, "psum_large_s": t_big,
        "psum_large_bytes_per_device": nbytes, "chain_long_s": t_long, "chain_short_s": t_short,
        "rendezvous": wait_times,
        "seconds": round(time.perf_counter() - start, 3), "jax": jax.__version__,
        "load_average": round(load, 2), "cores": os.cpu_count(),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    return data


LOOP = 32  # iterations of the timed loop, each a small kernel and then a collective


def _median_times(calls: list, budget_s: float, max_rounds: int = 40) -> list[float]:
    """Median wall time of each of `calls` (no arguments), the calls interleaved round by
    round (one warm-up call each first), so that a drift in the host's load falls on all of
    them."""
    import statistics

    import jax

    for call in calls:
        jax.block_until_ready(call())
    times: list[list[float]] = [[] for _ in calls]
    deadline = time.perf_counter() + budget_s
    for _ in range(max_rounds):
        for call, t in zip(calls, times):
            t0 = time.perf_counter()
            jax.block_until_ready(call())
            t.append(time.perf_counter() - t0)
        if time.perf_counter() > deadline and len(times[0]) >= 5:
            break
    return [statistics.median(t) for t in times]


def _collective_overhead_and_latency(latency: float, budget_s: float,
                                     k: int) -> tuple[float, float]:
    """(per-collective overhead, per-ring-step latency) of this backend's collectives, as a
    step runs them: a loop of `LOOP` iterations, each a small kernel and then a small
    all-reduce over groups of two (2 ring steps) or over all k devices (2(k - 1)), minus the
    same loop without the all-reduce; medians of interleaved calls; t = overhead + steps x
    latency. XLA:CPU's collectives rendezvous the group's threads, a cost per collective
    that the per-step latency alone charged too little for groups of two (an all-gather
    measured 3x its estimate). Collectives issued back to back, their threads already
    together, cost less: measured that way (until 2026-11-28, the minimum of chains of 10
    all-reduces), overhead and latency were 26 and 4.4 us on a host where this loop
    measures 33-41 and 5.9-7.2 (docs/simulator.md). With fewer than 4 devices: no overhead,
    `latency` as given."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    if k < 4:
        return 0.0, latency
    mesh = Mesh(np.array(jax.devices("cpu")[:k]).reshape(k // 2, 2), ("rest", "pair"))
    spec = P(("rest", "pair"))

    def loop(axes):
        def iteration(v, _):
            v = jnp.tanh(v) * 0.5 + 0.25  # the compute a collective follows in a step
            return (v + jax.lax.psum(v, axes) * (1.0 / k) if axes else v), None

        def body(v):
            return jax.lax.scan(iteration, v, None, length=LOOP)[0]
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))

    x = jax.device_put(jnp.ones((k * 1024,), jnp.float32), NamedSharding(mesh, spec))
    base, pair, every = _median_times(
        [functools.partial(loop(axes), x) for axes in ((), "pair", ("rest", "pair"))], budget_s)
    return fit_overhead_and_latency(max(pair - base, 0.0) / LOOP,
                                    max(every - base, 0.0) / LOOP, k)


WAIT_LOOP = 8  # iterations of the timed loop, each a stretch of compute and then a collective
STRETCH_KERNELS = 320  # small kernels per stretch: about 3 ms of 8 devices on 2 cores


def _rendezvous_waits(link: LinkClass, budget_s: float, k: int) -> tuple[dict[int, float],
                                                                           dict[str, float]]:
    """`HardwareSpec.rendezvous_wait` of this host, and the raw times: for groups of 2, 4 and
    k devices, a loop of `WAIT_LOOP` iterations, each a stretch of `STRETCH_KERNELS` small
    kernels and then a 4 KiB `psum` over the group, against the same loop without the psum
    (medians of interleaved calls). The wait is what the psum takes beyond its link cost, as
    a fraction of the stretch. Threads that share cores drift apart in a stretch of a few
    milliseconds, the scheduler's time slices, and rejoin at each collective: measured here,
    the wait grew from a flat cost below about 2 ms of stretch to 15-25% of it for all 8
    devices from 2.4 ms up, less for smaller groups (docs/simulator.md). With one device per
    core no thread waits: no entries."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    if k < 4 or (os.cpu_count() or k) >= k:
        return {}, {}
    groups = sorted({2, 4, k})
    devices = np.array(jax.devices("cpu")[:k])

    def loop(g: int | None):
        mesh = Mesh(devices.reshape(k // (g or 2), g or 2), ("rest", "group"))
        spec = P(("rest", "group"))

        def iteration(v, _):
            v = jax.lax.fori_loop(0, STRETCH_KERNELS, lambda i, x: jnp.tanh(x) * 0.5 + 0.25, v)
            if g:
                v = v.at[:1024].add(jax.lax.psum(v[:1024], "group") * (1.0 / k))
            return v, None

        def body(v):
            return jax.lax.scan(iteration, v, None, length=WAIT_LOOP)[0]
        fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
        return fn, jax.device_put(jnp.ones((k * 4096,), jnp.float32),
                                  NamedSharding(mesh, spec))

    built = [loop(None), *(loop(g) for g in groups)]
    times = _median_times([functools.partial(f, x) for f, x in built], budget_s)
    stretch = times[0] / WAIT_LOOP
    waits = {}
    for g, t in zip(groups, times[1:]):
        link_cost = (link.overhead_s + 2 * (g - 1) * link.latency_s  # the ring's all-reduce
                     + 2 * (g - 1) / g * 4096 / link.bandwidth_bytes_per_s)
        extra = (t - times[0]) / WAIT_LOOP - link_cost
        waits[g] = round(max(extra, 0.0) / stretch, 4)
    raw = {"stretch_s": stretch, **{f"psum_{g}_s": t for g, t in zip(groups, times[1:])}}
    return waits, raw


def fit_overhead_and_latency(pair_s: float, every_s: float, k: int) -> tuple[float, float]:
    """(overhead, latency) with pair_s = overhead + 2 latency (an all-reduce over two
    devices) and every_s = overhead + 2(k - 1) latency (over k); neither below 0, the
    latency at least 0.1 us."""
    latency = max((every_s - pair_s) / (2 * (k - 1) - 2), 1e-7)
    return max(pair_s - 2 * latency, 0.0), latency



# ----------------------------------------------------------------------------- accelerators

def base_spec_for(device_kind: str, base: str | None = None) -> HardwareSpec:
    """The datasheet spec a device is calibrated from: `base` by name, else by device kind."""
    from .specs import DATASHEET_SPECS

    by_name = {s.name: s for s in DATASHEET_SPECS}
    if base is None:  # the first spec one of whose names the device kind contains
        kind = device_kind.lower()
        base = next((s.name for s in DATASHEET_SPECS
                     if any(n in kind for n in (s.name, *s.aliases))), None)
        if base is None:
            raise SystemExit(f"no datasheet spec for device kind {device_kind!r}; pass --base "
                             f"(one of {sorted(by_name)})")
    if base not in by_name:
        raise SystemExit(f"unknown --base {base!r}; known: {sorted(by_name)}")
    return by_name[base]


def fit_gemm(flops: list[float], seconds: list[float]) -> tuple[float, float]:
    """(rate, half): least squares of t = (f + half) / rate over the measured GEMMs; the rate a
    large GEMM reaches and the size (flops) at which a GEMM reaches half of it."""
    import numpy as np

    slope, intercept = np.polyfit(np.asarray(flops), np.asarray(seconds), 1)
    rate = 1.0 / slope if slope > 0 else max(f / t for f, t in zip(flops, seconds))
    return float(rate), float(max(intercept, 0.0) * rate)


def measure_accelerator(budget_s: float, device, base: HardwareSpec) -> dict:
    """Measure `device` (one accelerator): the spec `base` with its GEMM rates, GEMM half size,
    achievable bandwidth and kernel overhead replaced by measured values."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    start = time.perf_counter()
    quick = budget_s < 5
    share = budget_s / 5

    def put(shape, dtype):
        return jax.device_put(jnp.ones(shape, dtype), device)

    matmul = jax.jit(lambda a, b: a @ b)
    sizes = (128, 256, 512) if quick else (256, 512, 1024, 2048, 4096)
    rates: dict[str, float] = {}
    gemms: dict[str, list[tuple[int, float]]] = {}
    half = 0.0
    for element, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
        times = [(n, _best_time(matmul, put((n, n), dtype), put((n, n), dtype),
                                budget_s=share / len(sizes))) for n in sizes]
        gemms[element] = times
        rate, h = fit_gemm([2.0 * n**3 for n, _ in times], [t for _, t in times])
        rates[element] = rate
        if element == "f32":
            half = h

    elems = (4 if quick else 64) * 2**20
    x = put((elems,), jnp.float32)
    stream = jax.jit(lambda v: v * 1.0001 + 1.0)
    bandwidth = 2.0 * 4 * elems / _best_time(stream, x, budget_s=share)

    chain = 64

    def chained(v, n):
        y = v
        for _ in range(n):
            y = jnp.tanh(y @ v)  # a matmul per link: nothing fuses across links
        return y

    tiny = put((8, 8), jnp.float32)
    t_long = _best_time(jax.jit(lambda v: chained(v, chain)), tiny, budget_s=share / 2)
    t_short = _best_time(jax.jit(lambda v: chained(v, 1)), tiny, budget_s=share / 2)
    overhead = max(t_long - t_short, 0.0) / (chain - 1)

    flops = {**base.flops_per_s, **rates}
    spec = dataclasses.replace(
        base, name=f"{base.name}-calibrated", aliases=(), flops_per_s=flops,
        matrix_efficiency=1.0, matrix_half_flops=half,
        memory_bandwidth_bytes_per_s=bandwidth, memory_efficiency=1.0,
        kernel_overhead_s=overhead,
        notes=f"{base.name} calibrated by `partir calibrate --accelerator` on "
              f"{device.device_kind} (jax {jax.__version__}): measured GEMM rates, GEMM half "
              f"size, bandwidth and kernel overhead; links from the datasheet spec")
    data = spec.to_dict()
    data["measurements"] = {
        "device_kind": device.device_kind, "platform": device.platform, "quick": quick,
        "gemm_seconds": {el: {str(n): t for n, t in ts} for el, ts in gemms.items()},
        "stream_bytes": 8 * elems, "chain_long_s": t_long, "chain_short_s": t_short,
        "seconds": round(time.perf_counter() - start, 3), "jax": jax.__version__,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    return data


def run_accelerator(args: argparse.Namespace) -> int:
    """`partir calibrate --accelerator`: measure jax's default device, save and print."""
    import jax

    device = jax.devices()[0]
    if device.platform == "cpu" and not os.environ.get("PARTIR_CALIBRATE_ALLOW_CPU"):
        raise SystemExit("--accelerator needs a GPU or TPU; jax's default device is a CPU "
                         "(for the host, run `partir calibrate` without --accelerator)")
    base = base_spec_for(device.device_kind, args.base)
    data = measure_accelerator(args.budget, device, base)
    output = (Path(args.output) if args.output else
              calibration_path().parent / f"{data['name']}.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2))
    print(f"saved to {output}; use it with partir.jit(..., hardware="
          f"HardwareSpec.from_dict(json.load(open({str(output)!r}))))", file=sys.stderr)
    return 0
