"""A partitioned step is a jax function: inside a user's jax.jit and lax.scan, exported with
jax.export, staged as jax stages (lower -> compile), fed what jax.jit accepts; and its
collectives are written so that XLA reads them as SPMD (cross-partition) collectives."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from oracle import assert_close

import partir_plugin as partir
from partir_plugin.examples import mlp
from partir_plugin.runtime.embed import DeviceLocalModule

MESH = {"batch": 4, "model": 2}


def _mlp(batch_size=64):
    model, optimizer = mlp.MLP(hidden=32, layers=3, classes=8), optax.sgd(0.1)
    params, opt_state, batch = mlp.init(model, optimizer, batch_size=batch_size, features=16)
    return mlp.make_train_step(model, optimizer), params, opt_state, batch


def _bp_mp():
    return [partir.ManualPartition({"batch": 0}, axis="batch", name="BP"),
            partir.ManualPartition({"params": mlp.megatron_rule}, axis="model", name="MP")]


@pytest.mark.slow  # compiles two train steps in one jit
def test_two_chained_steps_and_postprocessing_inside_a_users_jit():
    train_step, params, opt_state, batch = _mlp()
    step, _ = partir.jit(train_step, MESH, _bp_mp())

    def two_steps(step_fn, params, opt_state, batch):
        params, opt_state, loss1 = step_fn(params, opt_state, batch)
        params, opt_state, loss2 = step_fn(params, opt_state, batch)
        norm = sum(jnp.sum(p ** 2) for p in jax.tree.leaves(params))
        return params, (loss1 + loss2) / 2, jnp.sqrt(norm)

    ours = jax.jit(lambda *a: two_steps(step, *a))(params, opt_state, batch)
    ref = jax.jit(lambda *a: two_steps(train_step, *a))(params, opt_state, batch)
    assert_close(ours, ref)


def test_step_inside_lax_scan():
    train_step, params, opt_state, batch = _mlp()
    step, _ = partir.jit(train_step, MESH, _bp_mp())

    def loop(step_fn, params, opt_state):
        def body(carry, _):
            p, o = carry
            p, o, loss = step_fn(p, o, batch)
            return (p, o), loss
        return jax.lax.scan(body, (params, opt_state), None, length=3)

    (p, _), losses = jax.jit(lambda *a: loop(step, *a))(params, opt_state)
    (p_ref, _), losses_ref = jax.jit(lambda *a: loop(train_step, *a))(params, opt_state)
    # Three Adam steps turn rounding noise in near-zero gradients into lr-sized steps.
    assert_close((p, losses), (p_ref, losses_ref), rtol=1e-4)
    assert losses.shape == (3,) and float(losses[2]) < float(losses[0])


_BLOCK_PARTIR = """
import sys
class _NoPartir:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "partir_plugin":
            raise ImportError("partir_plugin must not be needed to run an exported step")
sys.meta_path.insert(0, _NoPartir())
"""


def _sgd_step(params, batch):
    """A train step whose pytrees are plain dicts (jax.export serializes those; optax's state
    classes would need `jax.export.register_pytree_node_serialization` first)."""
    model = mlp.MLP(hidden=32, layers=3, classes=8)

    def loss_fn(p):
        logits = model.apply({"params": p}, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


@pytest.mark.slow  # a subprocess
def test_export_round_trip_in_a_fresh_process(tmp_path):
    _, params, _, batch = _mlp()
    step, meta = partir.jit(_sgd_step, MESH, _bp_mp())
    step.lower(params, batch)
    exported = jax.export.export(jax.jit(step, in_shardings=meta.in_shardings,
                                         out_shardings=meta.out_shardings))(params, batch)
    (tmp_path / "step.bin").write_bytes(exported.serialize())
    leaves = jax.tree.leaves((params, batch))
    np.savez(tmp_path / "args.npz", *[np.asarray(x) for x in leaves])
    ref = jax.jit(_sgd_step)(params, batch)
    np.savez(tmp_path / "ref.npz", *[np.asarray(x) for x in jax.tree.leaves(ref)])
    script = _BLOCK_PARTIR + textwrap.dedent(f"""
        import jax, numpy as np
        from jax import export
        exp = export.deserialize(open({str(tmp_path / "step.bin")!r}, "rb").read())
        args = list(np.load({str(tmp_path / "args.npz")!r}).values())
        ref = list(np.load({str(tmp_path / "ref.npz")!r}).values())
        mesh = jax.make_mesh((4, 2), ("batch", "model"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 2)
        call = jax.jit(exp.call, in_shardings=jax.tree.unflatten(
            exp.in_tree, exp.in_shardings_jax(mesh))[0], out_shardings=jax.tree.unflatten(
            exp.out_tree, exp.out_shardings_jax(mesh)))
        out = jax.tree.leaves(call(*jax.tree.unflatten(exp.in_tree, args)[0]))
        assert len(out) == len(ref)
        err = max(float(np.max(np.abs(np.asarray(o) - r))) for o, r in zip(out, ref))
        assert err < 2e-5, err
        assert "partir_plugin" not in sys.modules
        print("OK", err)
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0 and "OK" in run.stdout, run.stderr[-3000:]


def test_staged_api_with_shape_dtype_structs():
    train_step, params, opt_state, batch = _mlp()
    step, meta = partir.jit(train_step, MESH, _bp_mp())
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                            (params, opt_state, batch))
    lowered = step.lower(*abstract)
    assert "func.func public @main" in lowered.as_text()
    assert lowered.as_text() == meta.device_local_stablehlo
    compiled = lowered.compile()
    assert "all-reduce" in compiled.as_text()
    assert compiled.memory_analysis().argument_size_in_bytes > 0
    assert compiled.cost_analysis()["flops"] > 0
    assert_close(compiled(params, opt_state, batch), jax.jit(train_step)(params, opt_state, batch))


def _keyed(x, w, key, scale, offsets):
    noise = jax.random.normal(key, x.shape)
    next_key, _ = jax.random.split(key)
    return jnp.tanh(x @ w) * scale + noise @ w + offsets[0] - offsets[1], next_key


@pytest.mark.parametrize("axis_types", ["explicit", "auto", "dict"])
def test_accepts_what_jax_jit_accepts(axis_types):
    """Typed PRNG keys in and out, Python scalars, a list, numpy arrays, keyword arguments,
    on meshes from jax.make_mesh (Explicit axes by default) and Auto ones."""
    if axis_types == "dict":
        mesh = MESH
    else:
        kind = jax.sharding.AxisType.Explicit if axis_types == "explicit" else \
            jax.sharding.AxisType.Auto
        mesh = jax.make_mesh((4, 2), ("batch", "model"), axis_types=(kind, kind))
    x = np.linspace(-1, 1, 16 * 8, dtype=np.float32).reshape(16, 8)
    w = np.arange(32, dtype=np.float32).reshape(8, 4) / 32
    key = jax.random.key(3)
    step, meta = partir.jit(_keyed, mesh, [partir.ManualPartition({"x": 0}, axis="batch"),
                                           partir.ManualPartition({"w": 1}, axis="model")])
    out, next_key = step(x, w, key=key, scale=2.0, offsets=[3.0, 1])
    ref, ref_key = jax.jit(_keyed)(x, w, key, 2.0, [3.0, 1])
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-5)
    assert jax.dtypes.issubdtype(next_key.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(next_key), jax.random.key_data(ref_key))
    assert out.sharding.spec == P("batch", "model")
    assert meta.in_shardings[0].spec == P("batch")


def test_python_scalars_keep_jax_weak_typing():
    def scale(x, s):
        return x * s

    x = jnp.ones((8, 4), jnp.bfloat16)
    step, _ = partir.jit(scale, {"batch": 8}, [partir.ManualPartition({"x": 0}, axis="batch")])
    assert step(x, 0.5).dtype == jax.jit(scale)(x, 0.5).dtype == jnp.bfloat16


def test_grad_and_vmap_of_a_partitioned_step_say_what_to_do():
    def f(x, w):
        return jnp.sum(x @ w)

    x, w = jnp.ones((16, 8)), jnp.ones((8, 4))
    step, _ = partir.jit(f, MESH, [partir.ManualPartition({"x": 0}, axis="batch")])
    with pytest.raises(partir.PartitionError, match=r"jax.grad.*'f.*differentiat|jax.grad.*'f"):
        jax.grad(step)(x, w)
    with pytest.raises(partir.PartitionError, match=r"jax.vmap of the partitioned function 'f"):
        jax.vmap(step, in_axes=(0, None))(jnp.ones((2, 16, 8)), w)


# ---- collectives written as SPMD collectives -------------------------------------------------

_COLLECTIVE = re.compile(r'"stablehlo\.(all_reduce|all_gather|reduce_scatter|all_to_all|'
                         r'collective_permute)"\([^)]*\) <\{([^\n]*?)\}>')


def assert_spmd_collectives(text: str) -> None:
    """Every collective carries a channel (and the grouped ones global device ids); device
    offsets come from partition_id. Without a channel XLA reads the groups as replica ids,
    and replica_id is 0 on every device of an SPMD program: both give wrong numbers."""
    found = _COLLECTIVE.findall(text)
    assert found
    for kind, attrs in found:
        assert "channel_handle = #stablehlo.channel_handle<handle =" in attrs, (kind, attrs)
        if kind in ("all_reduce", "all_gather", "reduce_scatter"):
            assert "use_global_device_ids" in attrs, (kind, attrs)
    assert "stablehlo.replica_id" not in text


def _all_kinds_program():
    """A schedule whose program has every collective kind and per-device offsets (iota,
    all_slice): the multi-axis edge goes through the planner (an all_permute). PartIR's strict
    conflicts keep the gather at `x + y.T` (x and y tiled alike on "a"), which would
    otherwise be resolved by an all_to_all."""
    def fn(x, y):
        rows = jax.lax.broadcasted_iota(jnp.float32, x.shape, 0)
        return jnp.tanh(x + y.T) * rows, jnp.sum(x, axis=0)

    x = jnp.arange(16 * 16, dtype=jnp.float32).reshape(16, 16) / 256
    y = jnp.cos(x)
    mp = partir.ManualPartition
    schedule = [mp({"x": 0, "y": 0}, axis="a"), mp({"x": 0}, axis="b"), mp({"x": 1}, axis="c")]
    step, meta = partir.jit(fn, {"a": 2, "b": 2, "c": 2}, schedule, conflicts="stop")
    return fn, step, meta, (x, y)


def test_every_collective_is_an_spmd_collective_and_numbers_match():
    fn, step, meta, args = _all_kinds_program()
    assert_close(step(*args), jax.jit(fn)(*args))
    text = meta.device_local_stablehlo
    assert_spmd_collectives(text)
    assert "stablehlo.partition_id" in text
    counts = meta.tactics[-1].collectives
    assert counts["all_permute"] >= 1 and counts["all_gather"] >= 1


@pytest.mark.parametrize("mutation", ["replica_id", "no_channel"])
def test_the_numeric_check_catches_replica_ids_and_missing_channels(mutation):
    """What the structural check above guards against does give wrong numbers: the same
    program with `replica_id` offsets, or a collective_permute without a channel, differs
    from jax.jit. (If XLA ever read both right, this test would say so.)"""
    fn, step, meta, args = _all_kinds_program()
    partition = step.partition(args)
    module = partition.function.module
    text = module.text
    if mutation == "replica_id":
        assert "stablehlo.partition_id" in text
        text = text.replace("stablehlo.partition_id", "stablehlo.replica_id")
    else:
        text = re.sub(r'("stablehlo\.collective_permute"\([^)]*\) <\{[^\n]*?), channel_handle = '
                      r'#stablehlo\.channel_handle<handle = 1, type = 1>', r"\1", text)
        assert text != module.text
    object.__setattr__(partition.function, "module",
                       DeviceLocalModule(module.name + "_mutant", text, module.out_avals))
    got = jax.jit(lambda *a: partition(a))(*args)
    ref = jax.jit(fn)(*args)
    assert any(not np.allclose(np.asarray(g), np.asarray(r), atol=1e-4)
               for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref)))


def test_reshard_runs_as_an_spmd_program():
    mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
    x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    xs = jax.device_put(x, NamedSharding(mesh, P("a", ("b", "c"))))
    target = NamedSharding(mesh, P(("c", "a"), None))
    y = partir.reshard(xs, target)
    assert y.sharding == target
    np.testing.assert_array_equal(np.asarray(y), x)
    from partir_plugin.runtime.reshard import program_for
    from partir_plugin.spmd.redistribution.types import normalize_spec

    program = program_for(mesh, x.shape, xs.dtype, normalize_spec(xs.sharding.spec, 2),
                          normalize_spec(target.spec, 2), target)
    assert_spmd_collectives(program.function_text())


def _python_frames(fn, args) -> list[str]:
    frames: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            frames.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        out = fn(*args)
    finally:
        sys.setprofile(None)
    jax.block_until_ready(out)
    return frames


def test_a_warm_call_runs_no_python_but_the_wrapper():
    """Warm calls dispatch in jax's C++ path: beside what jax.jit itself runs for the same
    call (optax's namedtuple states are rebuilt in Python), the only Python frame is our
    `__call__`."""
    train_step, params, opt_state, batch = _mlp()
    step, meta = partir.jit(train_step, MESH, _bp_mp())
    step.lower(params, opt_state, batch)
    placed = jax.device_put((params, opt_state, batch), meta.in_shardings)
    peer = jax.jit(train_step, in_shardings=meta.in_shardings,
                   out_shardings=meta.out_shardings)
    for fn in (step, peer):
        for _ in range(2):
            jax.block_until_ready(fn(*placed))
    ours, theirs = _python_frames(step, placed), _python_frames(peer, placed)
    assert ours[0].endswith("api.py:__call__"), ours
    assert ours[1:] == theirs
