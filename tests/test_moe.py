"""The MoE model (partir_plugin/models/moe.py) and the EP preset: routing is GShard's, the rules
pick the documented tensors, and BP+EP, BP+EP+MP and BP+EP+Z3 give jax.jit's numbers."""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import numpy as np
import pytest
from oracle import assert_close, hlo_collective_counts

import partir_plugin as partir
from partir_plugin.core.mesh import Mesh
from partir_plugin.frontend.trace import trace
from partir_plugin.models import megatron, moe, transformer
from partir_plugin.models.common import param_paths
from partir_plugin.options import PartitionOptions
from partir_plugin.stages import partition

pytestmark = pytest.mark.slow  # compiles MoE train steps per schedule

CONFIG = moe.Config.small(layers=1)
EP_MESH = {"batch": 2, "expert": 4}
BP = partir.tactic("BP", axis="batch")
EP = partir.tactic("EP", megatron.expert_rule, axis="expert")
SCHEDULES = {
    "BP+EP": (EP_MESH, [BP, EP]),
    "BP+EP+MP": ({"batch": 2, "expert": 2, "model": 2},
                 [BP, EP, partir.tactic("MP", megatron.moe_rule, axis="model")]),
    "BP+EP+Z3": (EP_MESH, [BP, EP, partir.tactic("Z3", axis="batch")]),
}


@pytest.fixture(scope="module")
def step_and_reference():
    """The train step, its inputs and the unpartitioned jax.jit's outputs (compiled once)."""
    train_step = moe.make_train_step(CONFIG)
    args = moe.init(CONFIG, jax.random.key(0))
    return train_step, args, jax.jit(train_step)(*args)


@functools.cache
def _traced():
    """The train step traced once on abstract inputs (partitioning needs only shapes)."""
    args = jax.eval_shape(lambda: moe.init(CONFIG, jax.random.key(0)))
    return trace(moe.make_train_step(CONFIG), args)


def _counts(schedule: list, mesh: dict[str, int]) -> list[tuple[dict[str, int], int]]:
    """(collectives, number of conflicts) of every tactic's row, without compiling."""
    traced = _traced()
    part = partition(traced, Mesh.of(mesh), schedule, PartitionOptions(scatter_sums=True))
    return [(r.collectives, len(r.conflicts)) for r in part.reports]


def test_routing_is_top2_within_capacity() -> None:
    """Every token goes to at most two experts, each expert slot holds at most one token, the
    slots used are 0..n-1, and a token's combine weights are its renormalised gates."""
    logits = jax.random.normal(jax.random.key(1), (3, 16, 4))
    capacity = 5
    dispatch, combine, aux = jax.jit(moe.route, static_argnums=1)(logits, capacity)
    assert dispatch.shape == combine.shape == (3, 16, 4, capacity)
    assert set(np.unique(np.asarray(dispatch))) <= {0.0, 1.0}
    per_token = dispatch.sum(axis=(2, 3))
    assert float(per_token.max()) == 2.0 and float(per_token.min()) >= 0.0
    per_slot = np.asarray(dispatch.sum(axis=1))  # [G, E, C]
    assert per_slot.max() == 1.0
    used = per_slot.sum(axis=-1)  # tokens per expert, filled from slot 0 up
    np.testing.assert_array_equal(per_slot, np.arange(capacity) < used[..., None])
    full = per_token == 2  # tokens that kept both experts: gates sum to 1
    np.testing.assert_allclose(np.asarray(combine.sum(axis=(2, 3)))[np.asarray(full)], 1.0,
                               rtol=1e-6)
    assert float(aux) >= 1.0 - 1e-6  # E * sum(f * p) is 1 when balanced, larger otherwise


def test_parameter_tensors_and_rules() -> None:
    """P = 9 L + 3; EP picks the expert dim of the two expert kernels, Megatron picks heads and
    the expert hidden dim; under nn.scan every block tensor gains [L] and the dims shift by 1."""
    for scan in (False, True):
        cfg = moe.Config.small(layers=2, scan=scan)
        params = jax.eval_shape(lambda c=cfg: moe.init(c, jax.random.key(0)))[0]
        paths = param_paths(params)
        assert len(paths) == cfg.num_param_tensors == (12 if scan else 21)
        prefixes = ["blocks"] if scan else ["Block_0", "Block_1"]
        shift = int(scan)
        experts = {f"{b}/moe/{k}/kernel": shift for b in prefixes for k in ("up", "down")}
        assert megatron.sharded_dims(megatron.expert_rule, params) == experts
        hidden = {f"{b}/moe/up/kernel": 2 + shift for b in prefixes}
        hidden |= {f"{b}/moe/down/kernel": 1 + shift for b in prefixes}
        hidden |= {f"{b}/attn/{n}/kernel": 1 + shift for b in prefixes
                   for n in ("query", "key", "value")}
        hidden |= {f"{b}/attn/out/kernel": shift for b in prefixes}
        assert megatron.sharded_dims(megatron.moe_rule, params) == hidden


def test_scan_variant_matches_unrolled(step_and_reference) -> None:
    """The blocks stacked for nn.scan (as `init` stacks them) give the unrolled loss."""
    _, (params, _, batch), _ = step_and_reference
    scan_cfg = dataclasses.replace(CONFIG, scan=True)

    def both(params: dict, batch: dict) -> tuple[jax.Array, jax.Array]:
        stacked = transformer.stack_blocks(params, CONFIG.layers)
        return moe.loss_fn(CONFIG, params, batch), moe.loss_fn(scan_cfg, stacked, batch)

    unrolled, scanned = jax.jit(both)(params, batch)
    np.testing.assert_allclose(unrolled, scanned, rtol=1e-6)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedules_match_jax_jit(step_and_reference, name: str) -> None:
    """Loss, Adam state (the gradients and their squares after one step) and the updated
    parameters equal the unpartitioned jax.jit's, to float reassociation."""
    train_step, args, reference = step_and_reference
    mesh, schedule = SCHEDULES[name]
    step, meta = partir.jit(train_step, mesh, schedule)
    assert_close(step(*args), reference)
    assert [t.name for t in meta.tactics] == name.split("+")
    assert meta.tactics[-1].unsupported_ops == {}


def test_ep_preset_is_the_manual_partition_it_documents() -> None:
    """`tactic("EP", rule)` plans exactly what the ManualPartition spelling plans. BP before it
    has one all_reduce per parameter gradient plus two for the loss: the cross-entropy and the
    load-balancing loss are each a mean over the tiled token batch."""
    manual = partir.ManualPartition({"batch": 0, "params": megatron.expert_rule},
                                    axis="expert", name="EP")
    preset = _counts([BP, EP], EP_MESH)
    assert preset == _counts([BP, manual], EP_MESH)
    assert preset[0] == ({"all_gather": 0, "all_reduce": CONFIG.num_param_tensors + 2,
                          "reduce_scatter": 0, "all_to_all": 0, "all_permute": 0}, 0)


def test_bp_ep_moves_tokens_not_experts(step_and_reference) -> None:
    """GShard's plan: one all_to_all carries the dispatched tokens to their experts and one
    brings them back, per layer, and the backward pass mirrors them; no all_gather (BP alone
    has none, so any would be EP's, on the expert axis), in our report and in the HLO XLA
    compiles, and jax.jit's numbers."""

    (bp, _), (ep, conflicts) = _counts([BP, EP], EP_MESH)
    assert ep["all_gather"] == 0 and conflicts == 0
    assert ep["all_to_all"] == 4 * CONFIG.layers  # 2 forward + their 2 transposes
    assert ep["all_reduce"] == bp["all_reduce"]  # expert weights' gradients stay local
    train_step, args, reference = step_and_reference
    step, meta = partir.jit(train_step, EP_MESH, [BP, EP])
    assert_close(step(*args), reference)
    options = {"xla_disable_hlo_passes": "all-reduce-combiner,cpu-all-reduce-combiner,"
                                         "all-gather-combiner,reduce-scatter-combiner"}
    hlo = step.lower(*args).jax_lowered.compile(options).as_text()
    assert hlo_collective_counts(hlo) == meta.tactics[-1].collectives
    # Each resolution is a line of the report: the op, where, the entry and what moved.
    report = meta.report()
    assert "resolved after EP: stablehlo.dot_general at " in report
    assert "moe/up/egcd,edf->egcf" in report and "all_to_all" in report
    # The records name the decision and the model's line behind each all_to_all.
    moved = [r for r in meta.tactics[-1].records if str(r.kind) == "all_to_all"]
    assert len(moved) == 4 and {str(r.reason) for r in moved} == {"conflict resolved"}
    assert all(r.source is not None and r.source.file.endswith("moe.py") for r in moved)
    assert {str(r.phase) for r in moved} == {"forward", "backward"}


def test_two_layers_two_all_to_alls_each() -> None:
    config = dataclasses.replace(CONFIG, layers=2)
    args = jax.eval_shape(lambda: moe.init(config, jax.random.key(0)))
    traced = trace(moe.make_train_step(config), args)
    part = partition(traced, Mesh.of(EP_MESH), [BP, EP], PartitionOptions(scatter_sums=True))
    ep = part.reports[-1]
    assert ep.collectives["all_to_all"] == 8 and ep.collectives["all_gather"] == 0
    assert not ep.conflicts


def test_strict_conflicts_restore_partirs_plan(step_and_reference) -> None:
    """conflicts="stop" is PartIR's semantics: propagation stops at the conflicts and the
    expert FFN's operands are gathered (today's plan before issue 19), same numbers."""
    train_step, args, reference = step_and_reference
    step, meta = partir.jit(train_step, EP_MESH, [BP, EP], conflicts="stop")
    assert_close(step(*args), reference)
    row = meta.tactics[-1]
    assert row.conflicts and not row.resolutions
    assert row.collectives["all_gather"] > 0 and row.collectives["all_to_all"] == 0
    with pytest.raises(ValueError, match="conflicts='gather'"):
        partir.jit(train_step, EP_MESH, [BP, EP], conflicts="gather")


def test_expert_rule_that_decides_nothing_warns_or_raises() -> None:
    """As for MP: a rule matching no parameter is a path mistake, named in the message."""
    def nothing(path: str, shape: tuple[int, ...]) -> None:
        return None

    with pytest.warns(partir.PartitionWarning, match="EP.*'params'.*'expert'"):
        _counts([partir.tactic("EP", nothing, axis="expert")], EP_MESH)
    with pytest.raises(partir.PartitionError, match="EP.*'params'"), warnings.catch_warnings():
        warnings.simplefilter("error")
        _counts([partir.tactic("EP", nothing, axis="expert", strict=True)], EP_MESH)


def test_automatic_partition_after_bp_finds_expert_parallelism() -> None:
    """AutomaticPartition on the expert axis after BP finds a plan the simulator rates at least
    as fast as BP+EP (GShard's), on the same hardware spec."""
    traced = _traced()
    auto = partir.AutomaticPartition(["expert"], budget=60, searcher="beam")

    def runtime(schedule):
        part = partition(traced, Mesh.of(EP_MESH), schedule,
                         PartitionOptions(hardware="a100-40gb", scatter_sums=True))
        return part.reports[-1]

    found, manual = runtime([BP, auto]), runtime([BP, EP])
    assert found.estimated_runtime_s <= manual.estimated_runtime_s * 1.001, (
        found.actions, found.collectives, manual.collectives)


def test_scan_over_layers_keeps_gshards_plan() -> None:
    """Under nn.scan the expert FFN sits in the forward and the backward loop bodies: the
    tokens still move by all_to_all inside them, nothing is gathered, no conflict is left,
    and the numbers are jax.jit's."""
    config = moe.Config.small(layers=2, scan=True)
    train_step = moe.make_train_step(config)
    args = moe.init(config, jax.random.key(0))
    step, meta = partir.jit(train_step, EP_MESH, [BP, EP])
    assert_close(step(*args), jax.jit(train_step)(*args))
    bp, ep = meta.tactics
    assert ep.collectives["all_gather"] == 0 and ep.collectives["all_to_all"] > 0
    assert ep.collectives["all_reduce"] == bp.collectives["all_reduce"]
    assert not ep.conflicts and ep.resolutions
