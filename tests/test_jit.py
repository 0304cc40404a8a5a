"""End-to-end: partir_plugin.jit on the paper's matmul chain and a Flax/Optax train step."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from oracle import assert_close, hlo_collective_counts

import partir_plugin as partir
from partir_plugin.examples import mlp


def matmul_chain(x, w1, w2):
    return (x @ w1) @ w2


@pytest.fixture(scope="module")
def chain_args():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    return (jax.random.normal(k[0], (256, 8)), jax.random.normal(k[1], (8, 16)),
            jax.random.normal(k[2], (16, 8)))


def _listing6():
    return [partir.ManualPartition({"x": 0}, axis="B", name="BP"),
            partir.ManualPartition({"w1": 1}, axis="M", name="MP"),
            partir.ManualPartition({"w1": 0, "w2": 1}, axis="B", name="Z3")]


def _local_arg_shapes(text: str) -> list[tuple[int, ...]]:
    sig = re.search(r"func\.func public @main\((.*?)\) ->", text).group(1)
    return [tuple(int(d) for d in m.split("x")[:-1])
            for m in re.findall(r"tensor<([0-9x]+[a-z0-9]+)>", sig)]


def test_matmul_chain_listing_3_to_5(chain_args):
    step, meta = partir.jit(matmul_chain, {"B": 4, "M": 2}, _listing6())
    out = step(*chain_args)
    expected = jax.jit(matmul_chain)(*chain_args)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5, atol=1e-5)
    counts = [t.collectives for t in meta.tactics]
    assert [t.name for t in meta.tactics] == ["BP", "MP", "Z3"]
    # Listing 3: no collective; Listing 4: one all_reduce over M; Listing 5: two all_gathers.
    assert counts[0] == dict(all_gather=0, all_reduce=0, reduce_scatter=0, all_to_all=0,
                             all_permute=0)
    assert counts[1]["all_reduce"] == 1 and counts[1]["all_gather"] == 0
    assert counts[2]["all_reduce"] == 1 and counts[2]["all_gather"] == 2
    assert sum(counts[2].values()) == 3
    # Listing 5's device-local argument shapes.
    assert _local_arg_shapes(meta.device_local_stablehlo) == [(64, 8), (2, 8), (8, 2)]
    assert '"stablehlo.all_reduce"' in meta.device_local_stablehlo
    ag_axes = re.findall(r'partir.collective = "all_gather", partir.axes = \["(\w)"\]',
                         meta.device_local_stablehlo)
    assert ag_axes == ["B", "B"]
    assert out.sharding.spec == jax.sharding.PartitionSpec("B")
    assert meta.in_shardings[1].spec == jax.sharding.PartitionSpec("B", "M")


def test_report_is_a_table(chain_args):
    step, meta = partir.jit(matmul_chain, {"B": 4, "M": 2}, _listing6())
    assert "not partitioned yet" in meta.report()
    step.lower(*chain_args)
    lines = meta.report().splitlines()
    assert any(line.startswith("BP") for line in lines)
    row = next(line for line in lines if line.startswith("Z3")).split()
    assert row[1:3] == ["2", "1"]  # AG, AR columns


def _mlp_setup(batch_size=64):
    model, optimizer = mlp.MLP(hidden=32, layers=3, classes=8), optax.adam(1e-2)
    params, opt_state, batch = mlp.init(model, optimizer, batch_size=batch_size, features=16)
    return mlp.make_train_step(model, optimizer), params, opt_state, batch


@pytest.mark.parametrize("mesh", [{"batch": 8}, {"batch": 4, "model": 2}])
def test_mlp_train_step_batch_parallel(mesh):
    train_step, params, opt_state, batch = _mlp_setup()
    step, meta = partir.jit(train_step,  mesh,
                            [partir.ManualPartition({"batch": 0}, axis="batch", name="BP")])
    new = step(params, opt_state, batch)
    ref = jax.jit(train_step)(params, opt_state, batch)
    assert_close(new, ref)
    n_params = len(jax.tree.leaves(params))
    # One all_reduce per parameter gradient plus one for the loss, nothing else.
    assert meta.tactics[0].collectives == dict(all_gather=0, all_reduce=n_params + 1,
                                               reduce_scatter=0, all_to_all=0, all_permute=0)
    assert meta.tactics[0].conflicts == []
    for leaf in jax.tree.leaves(new[0]):
        assert leaf.sharding.is_fully_replicated
    # Three steps in a loop, outputs fed back, one partitioning.
    p, o, p_ref, o_ref = params, opt_state, params, opt_state
    for _ in range(3):
        p, o, loss = step(p, o, batch)
        p_ref, o_ref, loss_ref = jax.jit(train_step)(p_ref, o_ref, batch)
    # Three Adam steps turn rounding noise in near-zero gradients into lr-sized steps.
    assert_close((p, loss), (p_ref, loss_ref), rtol=1e-4)
    assert len(step._cache) == 1


def test_mlp_bp_mp_z3_schedule():
    train_step, params, opt_state, batch = _mlp_setup()
    schedule = [partir.ManualPartition({"batch": 0}, axis="batch", name="BP"),
                partir.ManualPartition({"params": mlp.megatron_rule}, axis="model", name="MP"),
                partir.ManualPartition({"params": partir.FIRST_DIVISIBLE_DIM,
                                        "opt_state": partir.FIRST_DIVISIBLE_DIM},
                                       axis="batch", name="Z3")]
    step, meta = partir.jit(train_step, {"batch": 4, "model": 2}, schedule, scatter_sums=True)
    new = step(params, opt_state, batch)
    assert_close(new, jax.jit(train_step)(params, opt_state, batch))
    n = len(jax.tree.leaves(params))
    bp, mp, z3 = (t.collectives for t in meta.tactics)
    assert bp["all_reduce"] == n + 1
    # 3 layers: pair (0, 1) is Megatron: one forward all_reduce (no gradient for the input).
    # Layer 2 splits its outputs, so the logits are tiled on classes: the log-sum-exp reduces
    # them (max, then sum: two all_reduces), the label lookup gathers them (one all_gather),
    # and the backward matmul into layer 2's input contracts over classes (one all_reduce).
    assert mp["all_reduce"] == bp["all_reduce"] + 4
    assert mp["all_gather"] == 1
    # Z3 turns every parameter gradient all_reduce over batch into a reduce_scatter and
    # gathers every parameter before use.
    assert z3["reduce_scatter"] == n
    assert z3["all_gather"] == n + 1
    assert z3["all_reduce"] == mp["all_reduce"] - n
    for leaf in jax.tree.leaves(meta.in_shardings[0]):
        assert "batch" in jax.tree.leaves(tuple(leaf.spec))


def test_compiled_collectives_are_exactly_ours():
    """XLA's own partitioner adds nothing: the compiled HLO of the step, and of the step
    inside a user's jax.jit, has our collectives only."""
    train_step, params, opt_state, batch = _mlp_setup()
    schedule = [partir.ManualPartition({"batch": 0}, axis="batch", name="BP"),
                partir.ManualPartition({"params": mlp.megatron_rule}, axis="model", name="MP")]
    step, meta = partir.jit(train_step, {"batch": 4, "model": 2}, schedule)
    step.lower(params, opt_state, batch)
    ours = meta.tactics[-1].collectives
    # Combiner passes merge collectives into tuple ones; disable them for this count only.
    combiners = ("all-reduce-combiner,cpu-all-reduce-combiner,all-gather-combiner,"
                 "reduce-scatter-combiner")
    options = {"xla_disable_hlo_passes": combiners}
    own = step.lower(params, opt_state, batch).jax_lowered.compile(options).as_text()
    assert hlo_collective_counts(own) == ours

    def outer(params, opt_state, batch):
        new_params, new_opt, loss = step(params, opt_state, batch)
        return new_params, new_opt, loss * 2.0

    enclosing = jax.jit(outer, in_shardings=tuple(meta.in_shardings),
                        out_shardings=(*meta.out_shardings[:2], None))
    hlo = enclosing.lower(params, opt_state, batch).compile(options).as_text()
    assert hlo_collective_counts(hlo) == ours


def test_new_shapes_repartition_and_lowered_checks_inputs(chain_args):
    step, meta = partir.jit(matmul_chain, {"B": 4, "M": 2}, _listing6())
    compiled = step.lower(*chain_args).compile()
    x, w1, w2 = chain_args
    with pytest.raises(partir.InputMismatchError, match=r"argument 'x' has shape \(128, 8\)"):
        compiled(x[:128], w1, w2)
    with pytest.raises(partir.InputMismatchError, match="dtype"):
        compiled(x.astype(jnp.float16), w1, w2)
    out = step(x[:128], w1, w2)  # a new shape: partitioned again
    assert out.shape == (128, 8) and len(step._cache) == 2
    assert meta.device_local_stablehlo.count("tensor<32x8xf32>") >= 1
    # `.lower` of shapes seen before sets the metadata back to their program.
    step.lower(*chain_args)
    assert meta.device_local_stablehlo.count("tensor<32x8xf32>") == 0
    assert meta.in_shardings[0].shard_shape(x.shape)[0] == x.shape[0] // 4


def test_donation_consumes_inputs_and_aliases_buffers():
    def update(w, g):
        return w - 0.1 * g, jnp.sum(g)

    w = jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8)
    g = jnp.ones((64, 8), jnp.float32)
    step, meta = partir.jit(update, {"B": 4, "M": 2},
                            [partir.ManualPartition({"w": 0, "g": 0}, axis="B")],
                            donate_argnums=(0,))
    compiled = step.lower(w, g).compile()
    # The compiled module writes the new weights into the donated buffer.
    assert re.search(r"input_output_alias=\{ \{0\}: \(0, \{\}", compiled.as_text())
    assert compiled.memory_analysis().alias_size_in_bytes == w.nbytes // 4
    ws = jax.device_put(w, meta.in_shardings[0])
    new_w, total = step(ws, g)
    assert ws.is_deleted()
    ref_w, ref_total = jax.jit(update)(w, g)
    np.testing.assert_allclose(np.asarray(new_w), np.asarray(ref_w), rtol=1e-6)
    assert float(total) == float(ref_total)


def test_arguments_committed_elsewhere_are_moved_or_named(chain_args):
    """An argument committed to the mesh's devices in another order (a Mesh built over a
    permutation of them) is moved to the program's input sharding, as jax.jit with
    in_shardings does; jax's own error blamed a "shard_map inside jit" the user never wrote.
    One committed to other devices is refused, naming it, as jax.jit refuses it."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    x, w1, w2 = chain_args
    step, _ = partir.jit(matmul_chain, {"B": 4, "M": 2}, _listing6())
    reversed_mesh = Mesh(np.array(jax.devices()[::-1]).reshape(4, 2), ("B", "M"))
    xs = jax.device_put(x, NamedSharding(reversed_mesh, PartitionSpec(None, "B")))
    ref = jax.jit(matmul_chain)(x, w1, w2)
    np.testing.assert_allclose(np.asarray(step(xs, w1, w2=w2)), np.asarray(ref), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(ValueError, match=r"argument 'w1' is committed to devices \[3\]"):
        step(x, jax.device_put(w1, jax.devices()[3]), w2)


def test_keyword_arguments_bind_like_jax_jit(chain_args):
    x, w1, w2 = chain_args
    step, meta = partir.jit(matmul_chain, {"B": 4, "M": 2}, _listing6())
    out = step(x, w2=w2, w1=w1)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(matmul_chain)(x, w1, w2)),
                               rtol=1e-5, atol=1e-5)
    assert len(step._cache) == 1 and step(x, w1, w2).shape == (256, 8)
    with pytest.raises(TypeError, match="matmul_chain: missing a required argument: .w2."):
        step(x, w1, w3=w2)


def test_z3_on_cpu_all_reduces_then_slices_and_can_regather():
    """On CPU (`scatter_sums` by platform) ZeRO-3's gradients are all-reduced and sliced, not
    reduce-scattered (XLA:CPU combines all-reduces and runs them faster); `regather=True`
    gathers each parameter again for each use (the backward pass's among them). Both give
    jax.jit's numbers."""
    train_step, params, opt_state, batch = _mlp_setup()
    n = len(jax.tree.leaves(params))
    want = jax.jit(train_step)(params, opt_state, batch)
    counts = {}
    for regather in (False, True):
        schedule = [partir.tactic("BP", axis="batch"),
                    partir.tactic("Z3", axis="batch", regather=regather)]
        step, meta = partir.jit(train_step, {"batch": 8}, schedule)
        assert_close(step(params, opt_state, batch), want)
        counts[regather] = meta.tactics[-1].collectives
        assert counts[regather]["reduce_scatter"] == 0
        # The report says where the paper's reduce_scatters went.
        assert [note for note in meta.tactics[-1].notes
                if note.startswith(f"{n} sums are all-reduced and sliced")], meta.tactics[-1]
        compiled = hlo_collective_counts(step.lower(params, opt_state, batch).compile().as_text())
        assert compiled["reduce_scatter"] == 0
    # Every parameter is gathered once without regather; a kernel used by the forward and the
    # backward pass (its input gradient) is gathered once more with it.
    assert counts[False]["all_gather"] == n
    assert counts[True]["all_gather"] > n
    # With reduce_scatter asked for, each of those all_reduces is one.
    step, meta = partir.jit(train_step, {"batch": 8}, [partir.tactic("BP", axis="batch"),
                                                       partir.tactic("Z3", axis="batch")],
                            scatter_sums=True)
    step.lower(params, opt_state, batch)
    scattered = meta.tactics[-1].collectives
    assert scattered["reduce_scatter"] == n
    assert not any("all-reduced and sliced" in note for note in meta.tactics[-1].notes)
    assert scattered["all_reduce"] + n == counts[False]["all_reduce"]
