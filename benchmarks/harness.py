"""What every benchmark script shares. Import it before jax: it asks for 8 virtual CPU
devices (unless XLA_FLAGS already sets a count), puts the repository root on sys.path (for
`partir_plugin.models`), and writes one section of docs/BENCHMARKS.md."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BENCHMARKS_MD = ROOT / "docs" / "BENCHMARKS.md"
ANALYSIS_MARKER = "<!-- analysis -->"


def write_section(heading: str, text: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace the section starting at `heading` (or append it), re-reading the file just
    before writing since other benchmarks write other sections. A hand-written analysis after
    `<!-- analysis -->` in the existing section is kept."""
    current = path.read_text() if path.exists() else "# Benchmarks\n\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    old = pattern.search(current)
    block = text.rstrip("\n") + "\n"
    if old and ANALYSIS_MARKER in old.group(0) and ANALYSIS_MARKER in block:
        block = (block.split(ANALYSIS_MARKER)[0] + ANALYSIS_MARKER
                 + old.group(0).split(ANALYSIS_MARKER, 1)[1].rstrip("\n") + "\n")
    block += "\n"
    if old:
        new = current[: old.start()] + block + current[old.end():]
    else:
        new = current.rstrip("\n") + "\n\n" + block
    path.write_text(new.rstrip("\n") + "\n")


def publish(heading: str, text: str, path: Path = BENCHMARKS_MD, write: bool = True) -> None:
    """Print a benchmark's section (without a trailing per-problem <details> table) and, unless
    `write` is False, replace it in docs/BENCHMARKS.md."""
    print()
    print(text.split("<details>")[0])
    if write:
        write_section(heading, text, path)
        print(f"wrote the {heading!r} section of {path}")


def add_output_args(parser) -> None:
    """`--no-write` and `--output`, as every benchmark that writes a section takes them."""
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/BENCHMARKS.md")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)


@contextlib.contextmanager
def compiles_compile():
    """jax's persistent compilation cache off while compiles are timed or read (a hit skips
    XLA's passes, and returns the executable of whichever equal program compiled first: its
    metadata too, since the cache key leaves locations out); as it was afterwards."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    # jax decides once per process whether the cache is used: reset, it decides again.
    was = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
        compilation_cache.reset_cache()


def fresh() -> None:
    """Before a timed compile or partitioning: jax's in-memory caches cleared, and the garbage
    of the one before collected (a partitioning's IR is cyclic: left to the collector, it is
    walked, and paid for, inside the next measurement, whichever side that is)."""
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


def has_devices(n: int = 8) -> bool:
    """Whether jax sees `n` devices; says how to get them when it does not."""
    import jax

    if len(jax.devices()) >= n:
        return True
    print(f"needs {n} devices: run as a script (it sets XLA_FLAGS before jax starts)",
          file=sys.stderr)
    return False


def placed(args: tuple, meta) -> tuple:
    """`args` where the partitioned step wants them (`meta.in_shardings`, known once the step
    is lowered or called), as a training loop feeds back its outputs: called on host arrays,
    every step would first copy them onto the mesh (30-45 ms of a 120-200 ms step here)."""
    import jax

    if meta.in_shardings is None:
        raise ValueError("placed: lower or call the step first (its input shardings are "
                         "not known before)")
    return jax.device_put(args, meta.in_shardings)


def step_times(fn, args: tuple, runs: int) -> list[float]:
    """Wall times (s) of `runs` blocking calls `fn(*args)`, after one warm-up (compile) call."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def interleaved_rounds(calls: list[tuple], rounds: int, block: int,
                       seed: int = 0) -> list[list[float]]:
    """Per call `(fn, args)`, its median step time in each of `rounds` rounds. A round runs
    every call once, in a fresh random order: one unrecorded step (the switch from another
    program costs a cold cache) and then `block` recorded steps. Step times of neighbouring
    programs drift together on a shared host (the same plan measured 99-134 ms in five runs
    of bench-plan), so a comparison should pair rounds (`faster_in_rounds`), not runs."""
    import random
    import statistics

    order = list(range(len(calls)))
    rng = random.Random(seed)
    medians: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        rng.shuffle(order)
        for i in order:
            medians[i].append(statistics.median(step_times(*calls[i], runs=block)))
    return medians


def faster_in_rounds(a: list[float], b: list[float], alpha: float = 0.05) -> int:
    """-1 if `a` is faster than `b` in enough of their paired rounds that chance would do so
    with probability under `alpha` (a two-sided sign test), 1 if `b` is, 0 if the rounds do
    not tell them apart."""
    from math import comb

    wins = sum(x < y for x, y in zip(a, b))
    losses = sum(x > y for x, y in zip(a, b))
    n = wins + losses
    if not n:
        return 0
    tail = sum(comb(n, k) for k in range(max(wins, losses), n + 1)) / 2**n
    if 2 * tail >= alpha:
        return 0
    return -1 if wins > losses else 1
