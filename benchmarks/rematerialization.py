"""RM on the present devices: scanned models' train steps (no remat in their code) under [BP],
[BP, RM(full)], [BP, RM(dots)] and, where the backend lowers moves to host memory,
[BP, RM(dots, offload)], on a `{batch: n}` mesh of the present devices: measured step time
(median of `--steps`, jax.jit's beside it), XLA's memory analysis of the compiled step, and
the simulator's estimate for `--hardware`; every result checked against jax.jit's (each
output leaf; for the transformer, whose step is Adam's first, the loss and gradients: Adam's
first update is lr * sign(gradient), which turns any rounding difference in a gradient near
zero, as recomputation in other kernels gives, into a difference of 2 lr).

Models: the project's transformer (`partir_plugin.models.transformer`, `scan=True`) and
benchmarks/memory_estimates.py's families written as their libraries' users write them (a
plain-JAX residual MLP, the Flax linen LM recipe, an NNX MLP, an Equinox conv net) at
`--size` ("gpu": large enough for one accelerator's step to be more than kernel launches).

    JAX_PLATFORMS=cuda python benchmarks/rematerialization.py --hardware h100    # on a GPU
    python benchmarks/rematerialization.py --small --models transformer         # CPU smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import harness  # before jax (JAX_PLATFORMS=cuda keeps a GPU)
import memory_estimates


@dataclasses.dataclass
class Result:
    model: str
    schedule: str
    step_ms: float  # median of the measured steps
    jax_jit_ms: float  # jax.jit(step), unpartitioned, timed the same way (per model)
    estimate_ms: float
    xla_temp_mib: float
    estimate_peak_mib: float
    xla_peak_mib: float
    max_rel_err: float
    rm: str  # the RM row of the report ("" without RM)


def _transformer_config(size: str):
    from partir_plugin.models import transformer as t

    return (t.Config(layers=4, batch=8, seq_len=64, d_model=64, heads=4, head_dim=16, ffw=256,
                     vocab=256, scan=True) if size == "small" else
            t.Config(layers=8, batch=16, seq_len=512, d_model=1024, heads=16, head_dim=64,
                     ffw=4096, vocab=8192, scan=True))


def transformer(remat, size: str):
    """The project's scanned transformer's Adam step; `remat` is ignored (RM comes from the
    schedule)."""
    import jax

    from partir_plugin.models import transformer as t

    cfg = _transformer_config(size)
    return t.make_train_step(cfg), t.init(cfg, jax.random.key(0))


def transformer_gradients(size: str):
    """The transformer's loss and gradients, `(params, batch) -> (loss, grads)`."""
    import jax

    from partir_plugin.models import transformer as t

    cfg = _transformer_config(size)
    params, _, batch = t.init(cfg, jax.random.key(0))
    return (lambda params, batch: jax.value_and_grad(
        lambda p: t.loss_fn(cfg, p, batch))(params)), (params, batch)


@dataclasses.dataclass(frozen=True)
class Model:
    make: Callable  # (remat, size) -> (step, args)
    batch: dict  # BP's selectors
    checked: Callable | None = None  # size -> (fn, args) checked in place of the step


MODELS: dict[str, Model] = {
    "transformer": Model(transformer, {"batch": 0}, transformer_gradients),
    **{name: Model(family.make, family.batch)
       for name, family in memory_estimates.FAMILIES.items()},
}


def median_step_s(fn: Callable, args: tuple, steps: int) -> float:
    return statistics.median(harness.step_times(fn, args, steps))


def schedules(batch: dict, offload: bool | None = None) -> dict[str, list]:
    """The schedules, with RM's offload where `offload` (None: where this backend offloads)."""
    import partir_plugin as partir
    from partir_plugin.tactics.host_offload import backend_offloads

    bp = partir.ManualPartition(batch, axis="batch", name="BP")
    out = {"[BP]": [bp], "[BP, RM full]": [bp, partir.tactic("RM")],
           "[BP, RM dots]": [bp, partir.tactic("RM", policy="dots")]}
    if backend_offloads() if offload is None else offload:
        out["[BP, RM dots offload]"] = [bp, partir.tactic("RM", policy="dots", offload=True)]
    return out


def relative_error(got, want) -> float:
    """The largest |got - want| / max |want| over the output leaves."""
    import jax
    import numpy as np

    return max(float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)))
                     / (np.max(np.abs(np.asarray(w, np.float64))) + 1e-30))
               for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


def run_model(model: str, size: str, hardware: str | None, steps: int) -> list[Result]:
    import jax

    import partir_plugin as partir

    spec = MODELS[model]
    step, args = spec.make(None, size)
    checked, checked_args = spec.checked(size) if spec.checked else (step, args)
    reference = jax.jit(step)
    want = jax.jit(checked)(*checked_args)
    jit_ms = median_step_s(reference, args, steps) * 1e3
    n = len(jax.devices())
    results = []
    for name, schedule in schedules(spec.batch).items():
        fn, meta = partir.jit(step, {"batch": n}, schedule, hardware=hardware)
        mem = fn.lower(*args).compile().memory_analysis()
        if spec.checked:
            got = partir.jit(checked, {"batch": n}, schedule)[0](*checked_args)
        else:
            got = fn(*args)
        err = relative_error(got, want)
        step_ms = median_step_s(fn, harness.placed(args, meta), steps) * 1e3
        xla_peak = memory_estimates.xla_bytes(mem)
        row = meta.tactics[-1]
        results.append(Result(
            model, name, step_ms, jit_ms, (row.estimated_runtime_s or 0) * 1e3,
            mem.temp_size_in_bytes / 2**20, (row.estimated_peak_memory_bytes or 0) / 2**20,
            xla_peak / 2**20, err,
            row.rematerialization.describe() if row.rematerialization is not None else ""))
        del fn, got
    return results


def main(argv: list[str] | None = None) -> int:
    import jax

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default=None, help="the spec the simulator estimates")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--small", action="store_true", help="the tests' sizes")
    parser.add_argument("--size", choices=memory_estimates.SIZES, default="gpu")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, of: {', '.join(MODELS)}")
    parser.add_argument("--json", type=Path, default=None, help="append each row, as JSON")
    a = parser.parse_args(argv)
    size = "small" if a.small else a.size
    print(f"{jax.devices()[0].device_kind} x{len(jax.devices())}, jax {jax.__version__}, "
          f"size {size}, estimates for {a.hardware or 'the default spec'}", flush=True)
    print(f"{'model':26} {'schedule':22} {'step ms':>9} {'jax.jit':>9} {'est ms':>9} "
          f"{'XLA temp':>9} {'est peak':>9} {'XLA peak':>9} {'rel err':>9}", flush=True)
    worst = 0.0
    for model in a.models.split(","):
        for r in run_model(model.strip(), size, a.hardware, a.steps):
            worst = max(worst, r.max_rel_err)
            print(f"{r.model:26} {r.schedule:22} {r.step_ms:9.2f} {r.jax_jit_ms:9.2f} "
                  f"{r.estimate_ms:9.2f} {r.xla_temp_mib:9.1f} {r.estimate_peak_mib:9.1f} "
                  f"{r.xla_peak_mib:9.1f} {r.max_rel_err:9.1e}", flush=True)
            if r.rm:
                print(f"  {r.rm}", flush=True)
            if a.json:
                with a.json.open("a") as f:
                    f.write(json.dumps(dataclasses.asdict(r)) + "\n")
    return 0 if worst < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
