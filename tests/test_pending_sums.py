"""The pending-sum rule is one rule (`accumulation.forwarded_sum`): what `PendingSums` predicts a
loop carries is what the lowering makes. A misprediction is never a wrong number (`convert`
keeps a value it cannot carry on one device of each group), but it costs a reduction or a
select-and-zero per iteration, so none is allowed on the corpus and the models."""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import pytest
from oracle import assert_matches_jax_jit
from tmr_corpus import CASES

import partir_plugin as partir
from partir_plugin.core.state import PartitionState
from partir_plugin.ir.graph import partitionable_ops, walk
from partir_plugin.models import megatron, transformer
from partir_plugin.options import PartitionOptions
from partir_plugin.spmd.layout import Layout
from partir_plugin.spmd.lowering import _Lowering
from partir_plugin.stages import partition_function


def _mispredicted(state: PartitionState) -> tuple[list[str], int]:
    """The loop-carried values predicted to keep a pending sum that the body does not return
    in the carried layout (each would be converted by the `keep_on_first` fallback), and how
    many carry one."""
    lowering = _Lowering(state)
    lowering.run()
    found, carrying = [], 0
    for loop in walk(state.func.ops):
        if loop.name != "stablehlo.while":
            continue
        returned = loop.regions[1].blocks[0].ops[-1].operands
        for k, v in enumerate(returned):
            carried = lowering.pending.carried(loop, k)
            want = Layout(lowering.declared(loop.results[k]).dims, carried)
            carrying += bool(carried)
            if carried and lowering.local[v][1] != want:
                found.append(f"{loop.location} #{k}: {lowering.local[v][1]} != {want}")
    return found, carrying


def _partitioned(fn, args, mesh: dict, schedule) -> PartitionState:
    return partition_function(fn, args, mesh, schedule,
                              PartitionOptions(scatter_sums=True))[1].state


def _tactics():
    return {"BP": lambda: partir.tactic("BP", axis="batch"),
            "MP": lambda: partir.tactic("MP", rule=megatron.transformer_rule, axis="model"),
            "Z3": lambda: partir.tactic("Z3", axis="batch"),
            "EMB": lambda: partir.tactic("EMB", axis="model"),
            "PP": lambda: partir.tactic("PP", axis="model", microbatches=4)}


@pytest.mark.parametrize("order", ["BP", "BP+MP", "BP+MP+Z3", "Z3+BP+MP+EMB", "PP+BP"])
def test_scanned_transformer_carries_the_predicted_sums(order):
    # 4 heads: ZeRO shards a stacked kernel's first dimension after the layers' (the heads),
    # and MP after it must still divide them.
    cfg = dataclasses.replace(transformer.Config.small(layers=2, scan=True), batch=8, heads=4)
    args = jax.eval_shape(lambda: transformer.init(cfg, jax.random.PRNGKey(0)))
    tactics = _tactics()
    state = _partitioned(transformer.make_train_step(cfg), args, {"batch": 2, "model": 2},
                         [tactics[t]() for t in order.split("+")])
    mispredicted, carrying = _mispredicted(state)
    assert not mispredicted
    # The layers' weight gradients are carried sums, except where ZeRO tiles them on the axis
    # they are summed over (then each iteration reduce-scatters).
    assert bool(carrying) == ("Z3" not in order)


SPATIAL = [(c, arg, dim) for c in CASES for arg, dim in c.spatial]


def test_corpus_carries_the_predicted_sums():
    for case, arg, dim in SPATIAL:
        names = list(inspect.signature(case.loss).parameters)
        shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in case.args())
        state = _partitioned(case.step(), shapes, {"m": 4},
                             [partir.ManualPartition({names[arg]: dim}, axis="m")])
        assert not _mispredicted(state)[0], case.name


def test_an_exchanged_scatter_is_predicted_as_lowered_and_its_sum_carried():
    """Review 6c-4. An embedding gradient scattered in every iteration of a loop and added
    to an accumulator tiled on the vocabulary over `a`: the scatter exchanges its updates over
    `a` (`rules/embedding.py`), so it leaves only the sum over `b` pending. The prediction
    asks the rule (`LoweringRule.layouts`): every value's predicted pending sum is the one
    lowered, and the accumulator carries the sum over `b`, reduced once after the loop, not
    in every iteration (where the prediction said `a` and `b`, the loop reduced `b` each
    time)."""
    vocab, d, steps, tokens = 32, 16, 3, 4

    def step(w, ids, updates):
        def body(acc, xs):
            i, u = xs
            return acc + jnp.zeros((vocab, d)).at[i].add(u), None

        acc, _ = jax.lax.scan(body, jnp.zeros((vocab, d)), (ids, updates))
        return acc * w

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    args = (jax.random.normal(k1, (vocab, d)), jax.random.randint(k2, (steps, tokens), 0, vocab),
            jax.random.normal(k3, (steps, tokens, d)))
    mp = partir.ManualPartition
    schedule = [mp({"w": 0, "ids": 1, "updates": 1}, axis="a"),
                mp({"ids": 1, "updates": 1}, axis="b")]
    mesh = {"a": 2, "b": 2}
    assert_matches_jax_jit(step, args, mesh, schedule, scatter_sums=True)
    state = _partitioned(step, args, mesh, schedule)
    lowering = _Lowering(state)
    program = lowering.run()
    (scatter,) = [op for op in walk(state.func.ops) if op.name == "stablehlo.scatter"]
    assert lowering.local[scatter.results[0]][1].partial == (("b", "add"),)  # exchanged on a
    for op in partitionable_ops(state.func.ops):
        for r in op.results:
            if r in lowering.local:
                assert lowering.pending.of(r) == lowering.local[r][1].partial, op.name
    (loop,) = [op for op in program.func.ops if op.name == "stablehlo.while"]
    assert not [op for op in walk(loop.regions[1].blocks[0].ops)
                if op.name == "stablehlo.all_reduce"]
    assert program.counts["all_reduce"] == 1
