"""Clusters in the cost model (issue 38): a spec's nodes and links, each collective on the
links its device groups span in the mesh, so tensor parallelism across nodes costs what it
costs."""

from __future__ import annotations

import dataclasses
import json

import jax
import pytest

import partir_plugin as partir
from partir_plugin.core.mesh import Mesh
from partir_plugin.cost import HardwareSpec
from partir_plugin.frontend.trace import trace
from partir_plugin.models import megatron, transformer
from partir_plugin.plugin import manager
from partir_plugin.plugin.resolve import simulate
from partir_plugin.stages import partition


def _spec(name: str) -> HardwareSpec:
    return manager.hardware_specs()[name]


def test_dgx_specs_describe_their_nodes():
    a100, h100 = _spec("a100-80gb"), _spec("h100-dgx")
    for spec, nvlink, nic in ((a100, 300e9, 25e9), (h100, 450e9, 50e9)):
        assert spec.devices_per_node == 8 and spec.memory_bytes == 80 * 2**30
        assert spec.links[spec.intra_node_link].bandwidth_bytes_per_s == nvlink
        assert spec.links[spec.inter_node_link].bandwidth_bytes_per_s == nic
        assert HardwareSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert a100.matrix_flops_for("bf16") == 312e12 and a100.memory_bandwidth_bytes_per_s == 2039e9
    assert h100.matrix_flops_for("bf16") == _spec("h100-sxm").matrix_flops_for("bf16")
    assert manager.hardware_specs()["a100-80gb"] is a100


def test_axes_run_on_the_links_their_groups_span():
    """Row-major device order, 8 devices a node: the minor axis of 8 stays in a node (NVLink);
    the major axis crosses nodes with one member per node (one NIC, 25 GB/s); an axis of 16
    spans two nodes with 8 members in each (their 8 NICs, at most NVLink's rate); a sub-axis
    is placed by its own groups; `axis_links` still overrides."""
    a100 = _spec("a100-80gb")
    small, big = Mesh.of({"data": 4, "model": 8}), Mesh.of({"data": 4, "model": 16})
    assert a100.link_for_axes(["model"], small).name == "nvlink"
    data = a100.link_for_axes(["data"], small)
    assert (data.name, data.bandwidth_bytes_per_s, data.latency_s) == ("infiniband", 25e9, 5e-6)
    across = a100.link_for_axes(["model"], big)
    assert (across.name, across.bandwidth_bytes_per_s) == ("infiniband x8", 200e9)
    assert a100.link_for_axes(["model:(2)8"], big).name == "nvlink"  # the minor 8 of 16
    assert a100.link_for_axes(["model:(1)2"], big).bandwidth_bytes_per_s == 25e9
    # Over every device: 8 members in each of 4 nodes, all 8 NICs of a node.
    assert a100.link_for_axes(["data", "model"], small).bandwidth_bytes_per_s == 200e9
    assert a100.with_axis_links({"data": "nvlink"}).link_for_axes(["data"], small).name == \
        "nvlink"
    # Without a mesh (or a cluster) the static mapping, as before.
    assert a100.link_for_axes(["data"]).name == "nvlink"
    assert _spec("a100-40gb").link_for_axes(["data"], small).name == "nvlink"
    with pytest.raises(ValueError, match="inter_node_link 'ib' is not one of its links"):
        dataclasses.replace(a100, inter_node_link="ib")
    with pytest.raises(ValueError, match="devices_per_node must be >= 1"):
        dataclasses.replace(a100, devices_per_node=0)


def _mp_estimates(model: int, *specs: HardwareSpec):
    cfg = dataclasses.replace(transformer.Config.small(layers=2, scan=True), batch=16,
                              seq_len=512, d_model=2048, heads=32, head_dim=64, ffw=8192,
                              vocab=1024, dtype="bfloat16")
    args = jax.eval_shape(lambda key: transformer.init(cfg, key), jax.random.PRNGKey(0))
    mesh = Mesh.of({"model": model})
    schedule = [partir.tactic("MP", rule=megatron.transformer_rule, axis="model")]
    part = partition(trace(transformer.make_train_step(cfg), args, schedule, mesh), mesh,
                     schedule)
    return [simulate(part.program.func, mesh, spec) for spec in specs]


def test_tensor_parallelism_across_nodes_costs_the_network():
    """MP on 16 devices of 8-device nodes: every collective on InfiniBand, communication about
    twice what one node of 16 would take, and the device time per step far above MP on 8 (16
    devices barely faster than 8)."""
    a100 = _spec("a100-80gb")
    one_node = dataclasses.replace(a100, devices_per_node=None)
    [mp8], (mp16, mp16_one_node) = _mp_estimates(8, a100), _mp_estimates(16, a100, one_node)
    assert {c.link for c in mp8.per_collective} == {"nvlink"}
    assert {c.link for c in mp16.per_collective} == {"infiniband x8"}
    assert mp16.communication_s > 1.6 * mp16_one_node.communication_s
    assert mp16.runtime_s > 1.08 * mp16_one_node.runtime_s
    assert 16 * mp16.runtime_s > 1.7 * 8 * mp8.runtime_s
