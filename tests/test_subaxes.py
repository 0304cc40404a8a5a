"""Reshapes across sharded dimensions: an axis split into sub-axes (PartIR paper 1 §8).

Every program is compared with the unpartitioned `jax.jit(fn)`, values and gradients."""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import assert_matches_jax_jit, hlo_collective_counts

import partir_plugin as partir
from partir_plugin.core.mesh import Mesh
from partir_plugin.core.subaxis import SubAxis, parse
from partir_plugin.errors import PartitionError

pytestmark = pytest.mark.slow  # hypothesis examples, each compiled


def _check(fn, args, schedule, mesh, *, rtol=None):
    """Run `fn` partitioned; compare every output with the unpartitioned jit. Returns the
    metadata and the compiled HLO text of the partitioned program."""
    matched = assert_matches_jax_jit(fn, args, mesh, schedule, rtol=rtol)
    hlo = matched.step.lower(*args).jax_lowered.compile().as_text()
    return matched.meta, hlo


def _all_gathers(meta, hlo) -> int:
    """all_gathers in our device-local program and in XLA's compiled one."""
    ours = meta.tactics[-1].collectives["all_gather"]
    assert hlo_collective_counts(hlo)["all_gather"] == ours
    return ours


# -- the mesh: sub-axes' sizes, strides, coordinates and collective groups -----------------

def test_sub_axis_spelling_is_shardys():
    assert parse("model:(1)4") == SubAxis("model", 1, 4)
    assert parse("model:(4)2") == SubAxis("model", 4, 2)
    assert parse("model") is None
    mesh = Mesh.of({"batch": 2, "model": 8})
    assert mesh.split("model", 4) == ("model:(1)4", "model:(4)2")
    assert mesh.fold(("model:(1)4", "model:(4)2")) == ("model",)
    assert mesh.fold(("model:(1)2", "model:(2)2")) == ("model:(1)4",)
    assert mesh.fold(("model:(4)2", "model:(1)4")) == ("model:(4)2", "model:(1)4")
    with pytest.raises(PartitionError):
        mesh.axis_size("model:(4)4")  # 4 * 4 does not divide 8
    with pytest.raises(PartitionError):
        mesh.split("model", 3)


def test_sub_axis_groups_follow_the_row_major_split():
    """`model` of 8 = `model:(1)4` (major) x `model:(4)2` (minor): device coordinate c along
    model has c // 2 along the major sub-axis and c % 2 along the minor one."""
    mesh = Mesh.of({"batch": 2, "model": 8})
    for r in range(mesh.size):
        c = mesh.coord(r, "model")
        assert mesh.coord(r, "model:(1)4") == c // 2
        assert mesh.coord(r, "model:(4)2") == c % 2
        assert mesh.coord(r, "batch") == r // 8
    assert mesh.stride("model:(1)4") == 2 and mesh.stride("model:(4)2") == 1
    assert mesh.groups(("model:(1)4",)) == [[0, 2, 4, 6], [1, 3, 5, 7],
                                            [8, 10, 12, 14], [9, 11, 13, 15]]
    assert mesh.groups(("model:(4)2",)) == [[2 * i, 2 * i + 1] for i in range(8)]
    # Both sub-axes together are the whole axis, in the same order.
    assert mesh.groups(("model:(1)4", "model:(4)2")) == mesh.groups(("model",))
    # Minor sub-axis first: members ordered by it.
    assert mesh.groups(("model:(4)2", "model:(1)4"))[0] == [0, 2, 4, 6, 1, 3, 5, 7]
    assert mesh.groups(("batch", "model:(4)2"))[0] == [0, 1, 8, 9]
    assert mesh.overlaps("model", "model:(4)2")
    assert not mesh.overlaps("model:(1)4", "model:(4)2")
    with pytest.raises(PartitionError):
        mesh.groups(("model", "model:(1)4"))


def test_collectives_over_a_sub_axis_use_its_groups():
    """A result tiled on two sub-axes on different dimensions is gathered at the boundary:
    one all_gather per sub-axis, each with that sub-axis's replica groups."""
    def f(x):
        return jnp.tanh(x.reshape(4, 4))

    x = np.linspace(-1, 1, 16, dtype=np.float32)
    meta, _ = _check(f, (x,), [partir.ManualPartition({"x": 0}, axis="model")],
                     {"model": 8})
    mesh = Mesh.of({"model": 8})
    found = {}
    for line in meta.device_local_stablehlo.splitlines():
        if '"stablehlo.all_gather"' in line:
            axes = re.search(r'partir.axes = \["([^"]+)"\]', line).group(1)
            groups = re.search(r"replica_groups = dense<(\[\[.*?\]\])>", line).group(1)
            found[axes] = eval(groups)
    assert found == {"model:(1)4": mesh.groups(("model:(1)4",)),
                     "model:(4)2": mesh.groups(("model:(4)2",))}


# -- the state refuses overlapping uses -------------------------------------------------

def test_a_value_is_never_tiled_on_an_axis_and_its_part():
    def f(x):
        y = x.reshape(4, 4)
        return y.reshape(16)

    from partir_plugin.core.state import PartitionState
    from partir_plugin.ir.importer import import_lowered
    from partir_plugin.plugin.manager import default_registry

    func = import_lowered(jax.jit(f).lower(jax.ShapeDtypeStruct((16,), jnp.float32)))
    state = PartitionState(func, Mesh.of({"model": 8}), default_registry())
    (x,) = func.args
    state.tile_value(x, 0, "model")
    assert "overlaps" in state.can_tile(x, 0, "model:(4)2")
    state2 = PartitionState(func, Mesh.of({"model": 8}), default_registry())
    state2.atomic.add((x, "model"))
    assert "atomic" in state2.can_tile(x, 0, "model:(1)4")


# -- reshapes across a tiled dimension need no communication ------------------------------

def _split_merge_16(x):
    """16 -> 4x4 on 8 devices (split), work on the 4x4, and back (merge)."""
    y = x.reshape(4, 4)
    y = jnp.sin(y) * jnp.arange(1.0, 5.0)[:, None]
    return y.reshape(16)


def _split_merge_heads(x):
    """[B, S, 256] -> [B, S, 4, 64] with the 256 tiled 8 ways, a per-head op, and back."""
    b, s, _ = x.shape
    y = x.reshape(b, s, 4, 64)
    y = jnp.tanh(y) * jnp.arange(1.0, 5.0)[:, None]  # per-head scale
    return y.reshape(b, s, 256)


CASES = {
    "16->4x4": (_split_merge_16, (16,), 0),
    "BxSx256->BxSx4x64": (_split_merge_heads, (2, 3, 256), 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_reshape_across_a_tiled_dimension_forward(case):
    fn, shape, dim = CASES[case]
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(0), shape))
    meta, hlo = _check(fn, (x,), [partir.ManualPartition({"x": dim}, axis="model")],
                       {"model": 8})
    assert sum(meta.tactics[-1].collectives.values()) == 0
    assert _all_gathers(meta, hlo) == 0
    # The result folds back to the whole axis: the user's sharding names it.
    assert meta.out_shardings.spec[dim] == "model"
    assert not meta.tactics[-1].notes


@pytest.mark.parametrize("case", list(CASES))
def test_reshape_across_a_tiled_dimension_gradient(case):
    fn, shape, dim = CASES[case]

    def grad(x):
        return jax.grad(lambda x: jnp.sum(fn(x) ** 2))(x)

    x = np.asarray(jax.random.normal(jax.random.PRNGKey(1), shape))
    meta, hlo = _check(grad, (x,), [partir.ManualPartition({"x": dim}, axis="model")],
                       {"model": 8})
    assert _all_gathers(meta, hlo) == 0
    assert meta.tactics[-1].collectives["all_to_all"] == 0
    assert meta.out_shardings.spec[dim] == "model"


def test_merge_of_dimensions_tiled_on_sub_axes():
    """The merge direction on its own: `[B, S, 4, 64]` made inside the program (tiled on the
    sub-axes `model:(1)4` x `model:(4)2`) merged to `[B, S, 256]` tiled on `model`, then a
    matmul contracting it: one all_reduce, no all_gather."""
    def f(x, w):
        b, s, _ = x.shape
        y = jnp.tanh(x.reshape(b, s, 4, 64)) + 1.0
        return y.reshape(b, s, 256) @ w

    x = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (2, 3, 256)))
    w = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (256, 8)))
    for fn in (f, lambda x, w: jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2),
                                        argnums=(0, 1))(x, w)):
        meta, hlo = _check(fn, (x, w), [partir.ManualPartition({"x": 2}, axis="model")],
                           {"model": 8})
        assert _all_gathers(meta, hlo) == 0
        assert meta.in_shardings[1].spec[0] == "model"  # w tiled by inference


# -- sub-axes at the boundary --------------------------------------------------------------

def test_sub_axes_at_the_boundary_are_gathered_and_reported():
    """A result tiled on `model:(1)4` and `model:(4)2` on different dimensions cannot be named
    by a sharding: it is returned replicated (gathered), and the report says so; an argument
    the program wants tiled so arrives replicated and is sliced locally."""
    def f(x, w):
        return jnp.tanh(x.reshape(4, 64)) * w

    x = np.asarray(jax.random.normal(jax.random.PRNGKey(4), (256,)))
    w = np.asarray(jax.random.normal(jax.random.PRNGKey(5), (4, 64)))
    meta, _ = _check(f, (x, w), [partir.ManualPartition({"x": 0}, axis="model")],
                     {"model": 8})
    assert meta.out_shardings.spec == jax.sharding.PartitionSpec()
    assert meta.in_shardings[1].spec == jax.sharding.PartitionSpec()
    assert meta.tactics[-1].collectives["all_gather"] == 2
    notes = meta.tactics[-1].notes
    assert any(n.startswith("argument 'w'") and "sliced" in n for n in notes)
    assert any(n.startswith("result 0") and "gathered" in n for n in notes)
    assert "model:(1)4" in meta.report()


# -- grouped-query attention ----------------------------------------------------------------

B, S, D, H, KV, HD = 4, 8, 32, 8, 2, 16


def _gqa(x, wq, wk, wv, wo):
    """Attention with 8 query heads in 2 groups sharing a key/value head each."""
    q = (x @ wq).reshape(B, S, KV, H // KV, HD)  # (kv groups, queries per group)
    k = (x @ wk).reshape(B, S, KV, HD)
    v = (x @ wv).reshape(B, S, KV, HD)
    s = jnp.einsum("bsgqh,btgh->bgqst", q, k) / np.sqrt(HD)
    o = jnp.einsum("bgqst,btgh->bsgqh", jax.nn.softmax(s, axis=-1), v)
    return o.reshape(B, S, H * HD) @ wo


def _gqa_grads(x, wq, wk, wv, wo):
    return jax.grad(lambda *a: jnp.sum(_gqa(*a) ** 2), argnums=(1, 2, 3, 4))(x, wq, wk, wv, wo)


GQA_ARGS = tuple(np.asarray(jax.random.normal(k, s)) / 4 for k, s in zip(
    jax.random.split(jax.random.PRNGKey(6), 5),
    [(B, S, D), (D, H * HD), (D, KV * HD), (D, KV * HD), (H * HD, D)]))
# Megatron: query projection column-split, output projection row-split, over `model`.
MEGATRON = [partir.ManualPartition({"x": 0}, axis="batch"),
            partir.ManualPartition({"wq": 1, "wo": 0}, axis="model")]


def test_gqa_keeps_query_heads_partitioned():
    """2 KV heads on a model axis of 4: the query heads' reshape `[.., 8*16] -> [.., 2, 4, 16]`
    splits `model` into `model:(1)2` (KV groups) and `model:(2)2` (queries per group). Each
    device computes 2 of the 8 query heads; keys and values are sliced to its group locally.
    The forward pass has Megatron's one all_reduce and no all_gather."""
    meta, hlo = _check(_gqa, GQA_ARGS, MEGATRON, {"batch": 2, "model": 4})
    assert _all_gathers(meta, hlo) == 0
    assert meta.tactics[-1].collectives["all_reduce"] == 1
    assert meta.tactics[-1].collectives["all_to_all"] == 0
    text = meta.device_local_stablehlo
    # Local query heads: 2 groups / 2 x 4 queries / 2 = 1 x 2 heads of 16 per device.
    assert "tensor<2x8x1x2x16xf32>" in text
    assert meta.in_shardings[1].spec == jax.sharding.PartitionSpec(None, "model")


def test_gqa_gradient_gathers_no_activation():
    """The gradient: activations stay partitioned; the only all_gathers are of the key and
    value projections' gradients (replicated parameters, tiled on `model:(1)2` inside),
    gathered at the boundary and reported."""
    meta, hlo = _check(_gqa_grads, GQA_ARGS, MEGATRON, {"batch": 2, "model": 4})
    gathered = re.findall(r"= f32\[([\d,]+)\][^ ]* all-gather(?:-start)?\(", hlo)
    assert gathered and all(s == f"{D},{KV * HD}" for s in gathered), gathered
    notes = meta.tactics[-1].notes
    assert any(n.startswith("result 1") for n in notes)  # d wk
    assert meta.out_shardings[0].spec == jax.sharding.PartitionSpec(None, "model")  # d wq


# -- the redistribution planner names sub-axes by their prime factors ------------------------

def test_planner_moves_sub_axes():
    """`model:(1)4` is the planner's `(model/0, model/1)`, `model:(4)2` its `(model/2)`: a
    plan between specs naming sub-axes is found and emulated exactly."""
    from jax.sharding import PartitionSpec as P

    from partir_plugin.spmd.redistribution import plan_redistribution
    from partir_plugin.spmd.redistribution.emulate import verify

    plan = plan_redistribution({"model": 8}, (4, 64), "f32",
                               P("model:(1)4", "model:(4)2"), P(None, "model"))
    assert [type(s).__name__ for s in plan.steps][0] == "AllToAll"
    # The step moves the major sub-axis and says so (not `model`, which would be all 8).
    assert plan.steps[0].axes == ("model:(1)4",) and len(plan.steps[0].groups[0]) == 4
    assert "axes (model:(1)4 = model/1,model/0)" in plan.pretty()
    verify(plan)
    verify(plan_redistribution({"b": 2, "model": 8}, (8, 64), "f32",
                               P("model:(1)4", ("b", "model:(4)2")), P("b", "model")))
    verify(plan_redistribution({"m": 6}, (6, 6), "f32", P("m:(1)2", "m:(2)3"), P("m")))
    with pytest.raises(PartitionError, match="cuts a prime factor"):
        plan_redistribution({"m": 6}, (6, 6), "f32", P("m:(1)3", "m:(3)2"), P("m"))
    with pytest.raises(PartitionError, match="used"):
        plan_redistribution({"m": 8}, (8, 8), "f32", P("m", "m:(4)2"), P("m"))


def test_a_sub_axis_collective_runs_on_its_parents_link():
    from partir_plugin.plugin.resolve import resolve_hardware

    spec = resolve_hardware(None)
    spec = spec.with_axis_links({"hosts": min(spec.links, key=lambda n: spec.links[
        n].bandwidth_bytes_per_s)})
    assert spec.link_for_axes(["hosts:(1)2"]) == spec.link_for_axes(["hosts"])


# -- random reshapes across a tiled dimension -----------------------------------------------

@settings(max_examples=int(os.environ.get("PARTIR_SUBAXIS_EXAMPLES", "24")), deadline=None,
          derandomize=True, suppress_health_check=list(HealthCheck))
@given(n=st.sampled_from([2, 4, 8]), width=st.sampled_from([8, 16, 32, 64]),
       major=st.sampled_from([2, 4, 8]), reduce_minor=st.booleans(), merge=st.booleans(),
       grad=st.booleans())
def test_random_split_reshapes_match_jit(n, width, major, reduce_minor, merge, grad):
    """`[3, width]` tiled `n` ways on dimension 1, reshaped to `[3, major, width // major]`,
    a per-group op (and maybe a reduction over the minor factor), and maybe merged back:
    jax.jit's numbers, values or gradients. Where the axis divides the factors exactly
    (the major factor and the axis divide one another, the rest divides the minor factor)
    and the result is merged back, nothing is gathered."""
    if width % major or width // major < 2 or width % n:
        return
    minor = width // major

    def f(x):
        y = x.reshape(3, major, minor)
        y = jnp.sin(y) * jnp.arange(1.0, major + 1.0)[:, None]
        if reduce_minor:
            return jnp.sum(y, axis=-1)
        return y.reshape(3, width) if merge else y

    fn = (lambda x: jax.grad(lambda x: jnp.sum(jnp.cos(f(x))))(x)) if grad else f
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(n * width + major), (3, width)))
    meta, _ = _check(fn, (x,), [partir.ManualPartition({"x": 1}, axis="m")],
                     {"m": n, "o": 8 // n})
    fits = (major % n == 0) or (n % major == 0 and minor % (n // major) == 0)
    if fits and (merge or grad) and not reduce_minor:
        assert meta.tactics[-1].collectives["all_gather"] == 0


def test_gqa_under_the_megatron_preset():
    """The same with the plugin's presets on a params dict: BP on the batch, MP with a
    Megatron rule (query projection on its columns, output projection on its rows; the key
    and value projections left to propagation). Loss and gradients match; query heads stay
    partitioned; nothing but the key/value projections' gradients is gathered."""
    def megatron(path: str, shape: tuple) -> int | None:
        return {"wq": 1, "wo": 0}.get(path)

    def step(params, x):
        return jax.value_and_grad(
            lambda p: jnp.sum(_gqa(x, p["wq"], p["wk"], p["wv"], p["wo"]) ** 2))(params)

    x, wq, wk, wv, wo = GQA_ARGS
    params = {"wq": wq, "wk": wk, "wv": wv, "wo": wo}
    meta, hlo = _check(step, (params, x),
                       [partir.tactic("BP", axis="batch", inputs=("x",)),
                        partir.tactic("MP", megatron, axis="model")],
                       {"batch": 2, "model": 4})
    assert "tensor<2x8x1x2x16xf32>" in meta.device_local_stablehlo
    gathered = re.findall(r"= f32\[([\d,]+)\][^ ]* all-gather(?:-start)?\(", hlo)
    assert all(s == f"{D},{KV * HD}" for s in gathered), gathered
    assert meta.tactics[-1].collectives["all_to_all"] == 0


def test_planned_collectives_over_a_sub_axis_are_labelled_with_it():
    """An edge the lowering hands to the planner (`[model:(1)4, model:(4)2] -> [-, model]`):
    the all_to_all it emits runs over `model:(1)4`, and its `partir.axes` mark (what records,
    traces and the report read) names that sub-axis, with its groups of 4."""
    from partir_plugin.ir.graph import Block
    from partir_plugin.ir.types import TensorType
    from partir_plugin.spmd.collectives import collective_axes, collective_kind
    from partir_plugin.spmd.convert import convert
    from partir_plugin.spmd.emitter import Emitter
    from partir_plugin.spmd.layout import Layout

    mesh = Mesh.of({"batch": 2, "model": 8})
    src, dst = Layout((("model:(1)4",), ("model:(4)2",))), Layout(((), ("model",)))
    block = Block()
    em = Emitter(mesh, block)
    x = block.add_arg(src.local_type(TensorType((4, 64), "f32"), mesh))
    y = convert(em, x, src, dst)
    assert y.type.shape == (4, 8) and em.plans
    marked = [(str(collective_kind(op)), collective_axes(op), op) for op in block.ops
              if collective_kind(op)]
    assert [(k, a) for k, a, _ in marked] == [("all_to_all", ("model:(1)4",)),
                                               ("all_permute", ("batch", "model"))]
    groups = re.match(r"dense<(.*?)>", marked[0][2].attributes["replica_groups"]).group(1)
    assert eval(groups) == mesh.groups(("model:(1)4",))


# -- splits next to slices --------------------------------------------------------------------

def _scan_over_layers(x):
    """Each layer reads its slice of a stacked `[L, 256]` (a dynamic slice in the loop body)
    and splits it `256 -> 4x64`."""
    def body(carry, i):
        w = jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)
        return carry + jnp.tanh(w.reshape(4, 64)).reshape(256) * carry, None
    return jax.lax.scan(body, jnp.ones(256), jnp.arange(x.shape[0]))[0]


SLICE_CASES = {
    # a reshape whose operand comes from a slice (of an untiled dimension)
    "slice then split": lambda x: jnp.tanh(x[1].reshape(4, 64)).reshape(256) + x[0],
    # ops reading slices of a split value (on the untiled dimension) and a merge
    "split then slices": lambda x: jnp.tanh((lambda y: y[0] * y[1])(x.reshape(2, 4, 64)))
    .reshape(256),
    "split, slice, merge": lambda x: jnp.tanh(x.reshape(2, 4, 64)[0]).reshape(256),
    "per-layer slices in a scan": _scan_over_layers,
}


@pytest.mark.parametrize("case", list(SLICE_CASES))
@pytest.mark.parametrize("grad", [False, True])
def test_splits_next_to_slices_communicate_nothing(case, grad):
    """`[2, 256]` tiled 8 ways on its 256: slices of the other dimension keep the tiling, so a
    split before or after them (and its merge) runs on the tiles, values and gradients."""
    fn = SLICE_CASES[case]
    if grad:
        fn = (lambda f: lambda x: jax.grad(lambda x: jnp.sum(jnp.sin(f(x))))(x))(fn)
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(7), (2, 256))) / 2
    meta, hlo = _check(fn, (x,), [partir.ManualPartition({"x": 1}, axis="model")],
                       {"model": 8})
    assert _all_gathers(meta, hlo) == 0
    assert sum(meta.tactics[-1].collectives.values()) == 0
    assert meta.out_shardings.spec[-1] == "model"
    # The split happened: each device holds 1 of the 4 groups, 32 of the 64 (model:(1)4 x
    # model:(4)2).
    assert re.search(r"tensor<(\d+x)?1x32xf32>", meta.device_local_stablehlo)


# -- a later op that reads a split result in slices ------------------------------------------

MICRO = 2  # microbatches


def _accumulated_grads(w, x):
    """Gradient accumulation: the batch `[16, 32]` as 2 microbatches of 8, scanned, with the
    gradients of both arguments."""
    def loss(w, x):
        def body(total, xb):
            return total + jnp.sum(jnp.tanh(xb @ w) ** 2), None
        return jax.lax.scan(body, 0.0, x.reshape(MICRO, -1, x.shape[-1]))[0]
    return jax.grad(loss, argnums=(0, 1))(w, x)


def _accumulate_w(w, x):
    """The same, accumulating the weight gradient in the scan's carry."""
    def body(g, xb):
        return g + jax.grad(lambda w: jnp.sum(jnp.tanh(xb @ w) ** 2))(w), None
    return jax.lax.scan(body, jnp.zeros_like(w), x.reshape(MICRO, -1, x.shape[-1]))[0]


ACCUMULATION_ARGS = (np.asarray(jax.random.normal(jax.random.PRNGKey(8), (32, 4))) / 4,
                     np.asarray(jax.random.normal(jax.random.PRNGKey(9), (16, 32))))


@pytest.mark.parametrize("fn", [_accumulate_w, _accumulated_grads])
@pytest.mark.parametrize("mesh", [{"batch": 8}, {"batch": 4, "model": 2}])
def test_microbatch_slices_of_a_split_batch_are_local(fn, mesh):
    """`x.reshape(2, 8, 32)` with the batch over `batch` splits it into `batch:(1)2` on the
    microbatches and the rest on the rows, but the scan reads one microbatch per step: tiled so,
    each step would gather it over `batch:(1)2` and compute each row twice. The reshape's
    result is redistributed once instead, every microbatch over all of `batch`: no collective
    inside the loop, each device computes its own rows, one all_reduce of the gradient."""
    schedule = [partir.ManualPartition({"x": 0}, axis="batch")]
    if "model" in mesh:
        schedule.append(partir.ManualPartition({"w": 1}, axis="model"))
    meta, hlo = _check(fn, ACCUMULATION_ARGS, schedule, mesh)
    text = meta.device_local_stablehlo
    rows = 16 // MICRO // mesh["batch"]
    for start in (m.start() for m in re.finditer('"stablehlo.while"', text)):  # each scan
        loop = text[start:text.index("\n    }) ", start)]  # indented as a top-level op
        # Nothing moves the microbatches inside (a scalar loss may be all-reduced per step).
        assert not re.search(r'partir.collective = "all_(gather|to_all|permute)"', loop)
        assert f"tensor<{MICRO}x{rows}x32xf32>" in loop  # each device: its rows of each one
    counts = meta.tactics[-1].collectives
    # The weight gradient: one reduction over the batch. The input gradient's merge back to
    # `[16, 32]` (its rows tiled on the minor factor) is gathered.
    assert counts["all_gather"] == (fn is _accumulated_grads) + ("model" in mesh)
    assert any(r.axes == ("batch",) and r.kind == "all_reduce" for r in meta.tactics[-1].records)


def test_static_slices_of_a_split_batch_are_local():
    """The same with two `slice`s: the microbatches come out tiled on all of `batch` (so the
    result leaves as `P('batch')`, nothing gathered), and the report calls the one
    redistribution after the reshape a reshard."""
    def f(x):
        mb = x.reshape(MICRO, -1, x.shape[-1])
        return jnp.tanh(mb[0]) * jnp.tanh(mb[1])

    schedule = [partir.ManualPartition({"x": 0}, axis="batch")]
    meta, hlo = _check(f, ACCUMULATION_ARGS[1:], schedule, {"batch": 8})
    assert meta.out_shardings.spec[0] == "batch"
    assert _all_gathers(meta, hlo) == 0
    assert {(str(r.kind), r.reason) for r in meta.tactics[-1].records} == {
        ("all_to_all", "reshard"), ("all_permute", "reshard")}
    # The gradient (its rows tiled on the minor factor are merged back to [16, 32]).
    _check(lambda x: jax.grad(lambda x: jnp.sum(f(x)))(x), ACCUMULATION_ARGS[1:], schedule,
           {"batch": 8})
