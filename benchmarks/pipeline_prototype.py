"""Prototype of design B (docs/pipeline_design.md): a one-program pipeline over a `stage` mesh
axis, written in plain jax (`shard_map` + `ppermute`) *before* autodiff, then differentiated.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python \
        benchmarks/pipeline_prototype.py [--steps 5]

A stacked residual MLP (``w1: [L, D, F]``, ``w2: [L, F, D]``, a head ``[D, D]`` outside the
layer stack) on a mesh ``{stage: S, data: 8/S}``. Stage s holds chunk c of ``L / (S·R)``
layers for c = s, s+S, ... (GPipe: R = 1; circular: R repeats). The loop runs
``M·R + S − 1`` iterations; at iteration t, stage s works on k = t − s (microbatch k mod M,
repeat k div M) when 0 ≤ k < M·R, else on a bubble slot whose input is masked to zero (so
nothing computed there reaches a result or a gradient, even if the slot holds NaN). After each
iteration every stage sends its output to s+1 (a ring: stage S−1 -> 0 carries the circular
schedule's next repeat; stage 0 parks it in a buffer of M microbatches). After the loop the
last stage's outputs are reduce-scattered over `stage` so that the head and the loss run with
`stage` as data parallelism. `jax.value_and_grad` of the whole gives the backward pipeline
(the transposed loop, permutes reversed). Checked against `jax.jit` of the unpipelined model:
loss and gradients, the NaN-poisoned bubble, the loop trip counts and the collective_permutes
in the compiled HLO, and the bubble counted from the schedule against the closed form.
"""

from __future__ import annotations

import argparse
import collections
import re
import time
from functools import partial

import harness  # noqa: F401  (before jax: repository root on sys.path)
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

L, D, F = 8, 32, 64


def init(key: jax.Array, batch: int) -> tuple[dict, jax.Array, jax.Array]:
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    params = {"w1": jax.random.normal(k1, (L, D, F)) / np.sqrt(D),
              "w2": jax.random.normal(k2, (L, F, D)) / np.sqrt(F),
              "head": jax.random.normal(k3, (D, D)) / np.sqrt(D)}
    return params, jax.random.normal(k4, (batch, D)), jax.random.normal(k5, (batch, D))


def _layer(h, w):
    a, b = w
    return h + jax.nn.gelu(h @ a) @ b, None


def reference_loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    """The unpipelined model: a scan over the stacked layers, then the head and the loss."""
    h, _ = lax.scan(_layer, x, (params["w1"], params["w2"]))
    return jnp.sum((h @ params["head"] - y) ** 2) / y.size


def schedule(stages: int, microbatches: int, repeats: int) -> np.ndarray:
    """work[t, s] = k (microbatch k mod M of repeat k div M) or -1 for a bubble slot."""
    total = microbatches * repeats + stages - 1
    t = np.arange(total)[:, None] - np.arange(stages)[None, :]
    return np.where((t >= 0) & (t < microbatches * repeats), t, -1)


def interleave(w: jax.Array, stages: int, repeats: int) -> jax.Array:
    """Stacked layers in the order stage-major (stage s: chunks s, s+S, ...), so that tiling
    dimension 0 over `stage` gives each stage its chunks. Identity for GPipe (R = 1)."""
    chunk = w.shape[0] // (stages * repeats)
    w = w.reshape(repeats, stages, chunk, *w.shape[1:]).swapaxes(0, 1)
    return w.reshape(-1, *w.shape[3:])


def pipelined_loss(params: dict, x: jax.Array, y: jax.Array, *, mesh, microbatches: int,
                   repeats: int = 1, mask: bool = True, poison: float = 0.0) -> jax.Array:
    S, M, R = mesh.shape["stage"], microbatches, repeats
    if L % (S * R) or M % S or (R > 1 and M < S):
        raise ValueError(f"need L % (S·R) == 0, M % S == 0 (and M >= S when circular): "
                         f"L={L} S={S} R={R} M={M}")
    w1, w2 = interleave(params["w1"], S, R), interleave(params["w2"], S, R)

    def stage_program(w1, w2, head, x, y):
        s = lax.axis_index("stage")
        chunk = w1.shape[0] // R
        w1, w2 = w1.reshape(R, chunk, D, F), w2.reshape(R, chunk, F, D)
        mb = x.shape[0] // M
        xs, ys = x.reshape(M, mb, D), y.reshape(M, mb, D)
        ring = [(i, (i + 1) % S) for i in range(S)]

        def run_chunk(h, r):
            h, _ = lax.scan(_layer, h, (w1[r], w2[r]))
            return h

        def step(carry, t):
            received, circ, outs = carry
            k = t - s
            valid = (k >= 0) & (k < M * R)
            kc = jnp.clip(k, 0, M * R - 1)
            r, m = kc // M, kc % M
            first = jnp.where(r == 0, xs[m], circ[m])
            inp = jnp.where(s == 0, first, received)
            if mask:
                inp = jnp.where(valid, inp, 0.0)  # a bubble computes on zeros, never on garbage
            out = run_chunk(inp, r)
            done = valid & (s == S - 1) & (r == R - 1)
            outs = outs.at[m].set(jnp.where(done, out, outs[m]))
            sent = lax.ppermute(out, "stage", ring)
            # What stage 0 received is the last stage's output of k2; park it for repeat r2 + 1.
            k2 = t - (S - 1)
            keep = (s == 0) & (k2 >= 0) & (k2 < M * (R - 1))
            m2 = jnp.clip(k2, 0, M * R - 1) % M
            circ = circ.at[m2].set(jnp.where(keep, sent, circ[m2]))
            return (sent, circ, outs), None

        fill = jnp.full((M, mb, D), poison, x.dtype)
        carry = (jnp.full((mb, D), poison, x.dtype), fill, fill)
        carry = jax.tree.map(lambda c: lax.pcast(c, ("stage", "data"), to="varying"), carry)
        (_, _, outs), _ = lax.scan(step, carry, jnp.arange(M * R + S - 1))
        # Outside the loop `stage` acts as data parallelism: stage s takes M/S microbatches.
        outs = lax.psum_scatter(jnp.where(s == S - 1, outs, 0.0), "stage",
                                scatter_dimension=0, tiled=True)
        mine = lax.dynamic_slice_in_dim(ys, s * (M // S), M // S)
        local = jnp.sum((outs @ head - mine) ** 2)
        return lax.psum(local, ("stage", "data")) / (y.shape[0] * mesh.shape["data"] * D)

    return jax.shard_map(stage_program, mesh=mesh,
                         in_specs=(P("stage"), P("stage"), P(), P("data"), P("data")),
                         out_specs=P())(w1, w2, params["head"], x, y)


def global_pipelined_loss(params: dict, x: jax.Array, y: jax.Array, *, stages: int,
                          microbatches: int) -> jax.Array:
    """The same GPipe schedule in the praxis/GSPMD form: global semantics, no shard_map. An
    explicit `[S]` stage dimension (weights reshaped `[L] -> [S, L/S]`), the stage body
    vmapped over it, the state `[S, mb, D]` shifted to the next stage by a roll. This is the
    program design B substitutes at trace time for partir to partition (the roll on a
    `stage`-tiled dimension becomes a collective_permute)."""
    S, M = stages, microbatches
    w1 = params["w1"].reshape(S, L // S, D, F)
    w2 = params["w2"].reshape(S, L // S, F, D)
    mb = x.shape[0] // M
    xs = x.reshape(M, mb, D)
    stage = jnp.arange(S)

    def run(h, a, b):
        h, _ = lax.scan(_layer, h, (a, b))
        return h

    def step(carry, t):
        state, outs = carry
        k = t - stage
        valid = (k >= 0) & (k < M)
        m = jnp.clip(k, 0, M - 1)
        inp = jnp.where((stage == 0)[:, None, None], xs[m[0]][None], state)
        inp = jnp.where(valid[:, None, None], inp, 0.0)
        out = jax.vmap(run)(inp, w1, w2)
        last = m[S - 1]
        outs = outs.at[last].set(jnp.where(valid[S - 1], out[S - 1], outs[last]))
        return (jnp.roll(out, 1, axis=0), outs), None

    carry = (jnp.zeros((S, mb, D), x.dtype), jnp.zeros((M, mb, D), x.dtype))
    (_, outs), _ = lax.scan(step, carry, jnp.arange(M + S - 1))
    return jnp.sum((outs.reshape(-1, D) @ params["head"] - y) ** 2) / y.size


def global_form_facts(params, x, y, ref, mesh) -> dict:
    """The global form against jax.jit, how partir imports it, and what XLA's own partitioner
    makes of it given only the stacked weights' sharding."""
    from partir_plugin.frontend.trace import trace
    from partir_plugin.ir.graph import walk

    fn = partial(global_pipelined_loss, stages=mesh.shape["stage"], microbatches=4)
    loss, grads = jax.jit(jax.value_and_grad(fn))(params, x, y)
    args = jax.eval_shape(lambda: (params, x, y))
    traced = trace(jax.value_and_grad(fn), args)
    kinds = ("while", "slice", "concatenate", "dynamic_slice", "dynamic_update_slice", "gather",
             "scatter", "manual_computation")
    imported = collections.Counter(op.name.split(".")[-1] for op in walk(traced.func.ops))
    stacked = NamedSharding(mesh, P("stage"))
    shardings = ({"w1": stacked, "w2": stacked, "head": NamedSharding(mesh, P())},
                 NamedSharding(mesh, P("data")), NamedSharding(mesh, P("data")))
    compiled = jax.jit(jax.value_and_grad(fn), in_shardings=shardings).lower(
        params, x, y).compile().as_text()
    manual = trace(jax.value_and_grad(partial(pipelined_loss, mesh=mesh, microbatches=4)), args)
    return {"dloss": abs(float(loss) - float(ref[0])), "dgrad": max_diff(grads, ref[1]),
            "partir import": {k: imported[k] for k in kinds if imported[k]},
            "shard_map form imports as": [op.name for op in manual.func.ops
                                          if not op.name.startswith("stablehlo.")],
            "XLA-partitioned HLO": hlo_facts(compiled)}


def hlo_facts(compiled_text: str) -> dict:
    """Loop trip counts and collectives of XLA's compiled HLO (each op once)."""
    whiles = re.findall(r"known_trip_count\":\{\"n\":\"(\d+)\"", compiled_text)
    facts = {"while trip counts": sorted((int(n) for n in whiles), reverse=True)}
    for kind in ("collective-permute", "all-gather", "all-reduce", "reduce-scatter"):
        facts[kind] = len(re.findall(rf"\s{kind}(?:-start)?\(", compiled_text))
    return facts


def timed(fn, *args, steps: int) -> float:
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))  # block each call: see DESIGN.md §2.3 (rendezvous)
        best = min(best, time.perf_counter() - t0)
    return best


def max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(u - v))) for u, v in
               zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def run_case(mesh, params, x, y, ref, *, microbatches, repeats, steps) -> dict:
    S = mesh.shape["stage"]
    fn = partial(pipelined_loss, mesh=mesh, microbatches=microbatches, repeats=repeats)
    grad = jax.jit(jax.value_and_grad(fn))
    loss, g = grad(params, x, y)
    poisoned = jax.jit(jax.value_and_grad(partial(fn, poison=float("nan"))))(params, x, y)
    leaked = jax.jit(jax.value_and_grad(partial(fn, poison=float("nan"), mask=False)))(
        params, x, y)
    work = schedule(S, microbatches, repeats)
    facts = hlo_facts(grad.lower(params, x, y).compile().as_text())
    t = timed(grad, params, x, y, steps=steps)
    return {"loss": float(loss), "dloss": abs(float(loss) - float(ref[0])),
            "dgrad": max_diff(g, ref[1]),
            "nan-poisoned dgrad": max_diff(poisoned[1], g),
            "unmasked poisoned finite": bool(all(jnp.all(jnp.isfinite(v))
                                                 for v in jax.tree.leaves(leaked[1]))),
            "iterations": work.shape[0], "expected iterations": microbatches * repeats + S - 1,
            "bubble (schedule)": float(np.mean(work < 0)),
            "bubble (closed form)": (S - 1) / (repeats * microbatches + S - 1),
            **facts, "step ms": 1e3 * t}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    opts = parser.parse_args()
    devices = jax.devices()
    assert len(devices) >= 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    params, x, y = init(jax.random.key(0), opts.batch)
    ref_grad = jax.jit(jax.value_and_grad(reference_loss))
    ref = ref_grad(params, x, y)
    t_ref = timed(ref_grad, params, x, y, steps=opts.steps)
    print(f"stacked MLP L={L} D={D} F={F}, batch {opts.batch}; unpipelined jax.jit "
          f"value_and_grad on one device: loss {float(ref[0]):.6f}, {1e3 * t_ref:.2f} ms")
    mesh = jax.make_mesh((4, 2), ("stage", "data"), devices=devices[:8],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    print("\nglobal (praxis) form, gpipe S=4, M=4 (no shard_map):")
    for k, v in global_form_facts(params, x, y, ref, mesh).items():
        print(f"  {k:26s} {v:.3g}" if isinstance(v, float) else f"  {k:26s} {v}")
    cases = [((4, 2), 4, 1), ((4, 2), 8, 1), ((4, 2), 4, 2), ((4, 2), 8, 2), ((2, 4), 4, 1)]
    for (stages, data), m, r in cases:
        mesh = jax.make_mesh((stages, data), ("stage", "data"), devices=devices[:8],
                             axis_types=(jax.sharding.AxisType.Auto,) * 2)
        # Stacked layers live stage-sharded (GPipe: a contiguous block of L/S layers each).
        p = {k: jax.device_put(v, NamedSharding(mesh, P("stage" if k != "head" else None)))
             for k, v in params.items()}
        xx = jax.device_put(x, NamedSharding(mesh, P("data")))
        yy = jax.device_put(y, NamedSharding(mesh, P("data")))
        out = run_case(mesh, p, xx, yy, ref, microbatches=m, repeats=r, steps=opts.steps)
        name = "gpipe" if r == 1 else f"circular R={r}"
        print(f"\n{name}, S={stages} (data {data}), M={m}:")
        for k, v in out.items():
            print(f"  {k:26s} {v:.3g}" if isinstance(v, float) else f"  {k:26s} {v}")


if __name__ == "__main__":
    main()
