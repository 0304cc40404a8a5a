"""The redistribution planner (paper 2): worked examples, properties, CLI."""

from __future__ import annotations

import time
from math import lcm, prod

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paper_examples import FIG_13

from partir_plugin.cli.main import main as partir_main
from partir_plugin.errors import PartitionError
from partir_plugin.spmd.redistribution import (
    AllGather,
    AllPermute,
    AllSlice,
    AllToAll,
    RedistributionPlan,
    parse_paper_type,
    plan_redistribution,
)
from partir_plugin.spmd.redistribution.emulate import verify

MESHES = [{"a": 2, "b": 2, "c": 2}, {"a": 4, "b": 2}, {"x": 4, "y": 6}]


def paper_plan(mesh, src: str, dst: str, dtype="f32") -> RedistributionPlan:
    shape, src_spec = parse_paper_type(src)
    shape2, dst_spec = parse_paper_type(dst)
    assert shape == shape2
    return plan_redistribution(mesh, shape, dtype, src_spec, dst_spec)


def kinds(plan: RedistributionPlan) -> list[str]:
    return [s.kind for s in plan.steps]


def check_well_typed(plan: RedistributionPlan) -> None:
    """Every step obeys its typing rule (Fig. 8/10), types chain, the height stays in bound."""
    ty = plan.src_type
    assert tuple(plan.src_local_shape) == ty.local_shape
    bound = max(prod(plan.src_local_shape), prod(plan.dst_local_shape))
    permutes = 0
    for s in plan.steps:
        assert s.in_type == ty and tuple(s.in_local_shape) == ty.local_shape
        fm = ty.fmesh
        label_id = {f.label: i for i, f in enumerate(fm.factors)}
        ids = tuple(label_id[a] for a in s.factor_axes)
        if isinstance(s, AllGather):
            assert s.out_type == ty.allgather(s.dim, ids)
            assert s.bytes_per_device == s.out_type.localsize * plan.itemsize
        elif isinstance(s, AllToAll):
            assert s.out_type == ty.alltoall(s.concat_dim, s.split_dim, ids)
            assert s.bytes_per_device == ty.localsize * plan.itemsize
        elif isinstance(s, AllSlice):
            assert s.out_type == ty.dynslice(s.dim, ids)
            assert s.bytes_per_device == 0 and s.num_blocks == prod(fm.sizes()[f] for f in ids)
        else:
            assert isinstance(s, AllPermute)
            permutes += 1
            assert s.out_type.local_shape == ty.local_shape  # T-PERMUTE
        s.out_type.check()
        assert tuple(s.out_local_shape) == s.out_type.local_shape
        assert prod(s.out_local_shape) <= bound
        ty = s.out_type
    assert ty == plan.dst_type
    assert permutes <= 1
    if permutes:  # the permutation comes last or just before the trailing allgathers
        k = kinds(plan).index("all_permute")
        assert all(kd == "all_gather" for kd in kinds(plan)[k + 1 :])
    assert plan.peak_bytes <= plan.bound_bytes
    assert plan.cost_bytes == sum(s.bytes_per_device for s in plan.steps)


def check(plan: RedistributionPlan) -> None:
    check_well_typed(plan)
    verify(plan)


# ---- paper examples -----------------------------------------------------------------------


def test_example_3_1_factor_decomposition_never_replicates():
    plan = paper_plan({"x": 4, "y": 6}, "[3{x}12, 2{y}12]", "[2{y}12, 3{x}12]")
    check(plan)
    assert "all_gather" not in kinds(plan)
    assert plan.peak_bytes == 6 * 4 == plan.bound_bytes
    assert kinds(plan).count("all_to_all") == 2
    assert plan.cost_bytes <= 3 * 6 * 4  # two alltoalls and at most one permutation


def test_example_4_9_and_7_1_single_alltoall():
    plan = paper_plan({"a": 8}, "[1{a}8, 8]", "[8, 1{a}8]")
    check(plan)
    assert kinds(plan) == ["all_to_all"]
    (step,) = plan.steps
    assert step.groups == [list(range(8))] and step.axes == ("a",)
    assert plan.cost_bytes == 8 * 4


@pytest.mark.parametrize(
    "src, dst, expected",
    [
        # Fig. 5 on {x:4, y:4}: one alltoall (plus a permutation, cheaper than two alltoalls)
        ("[32{x, y}512, 128]", "[128{x}512, 32{y}128]", {"all_to_all": 1}),
        # two alltoalls into the same dimension
        ("[32{x}128, 512, 32{y}128]", "[128, 32{y, x}512, 128]", {"all_to_all": 2}),
        # alltoall then allgather: normal form, the gather last
        ("[32{x}128, 512, 32{y}128]", "[128, 128{y}512, 128]", {"all_to_all": 1, "all_gather": 1}),
    ],
)
def test_fig_5_rows(src, dst, expected):
    plan = paper_plan({"x": 4, "y": 4}, src, dst)
    check(plan)
    counted = {k: kinds(plan).count(k) for k in expected}
    assert counted == expected
    if "all_gather" in expected:
        assert kinds(plan)[-1] == "all_gather"
    local = prod(plan.src_local_shape) * 4
    assert plan.cost_bytes <= sum(expected.values()) * plan.bound_bytes + local




@pytest.mark.parametrize("name", sorted(FIG_13))
def test_fig_13_problems(name):
    mesh = {"a": 2, "b": 2, "c": 2}
    src, dst = FIG_13[name]
    plan = paper_plan(mesh, src, dst)
    check_well_typed(plan)
    # Every dimension is a multiple of 8, so the plan only depends on partition counts: run the
    # same problem with each dimension scaled down to 8 and compare plans and data.
    shape, src_spec = parse_paper_type(src)
    _, dst_spec = parse_paper_type(dst)
    small = plan_redistribution(mesh, (8,) * len(shape), "f32", src_spec, dst_spec)
    assert kinds(small) == kinds(plan)
    verify(small)
    if name == "P4":  # no dearer than gathering dims 0 and 3 (2x then 4x the source tile)
        assert kinds(plan)[-1] == "all_gather"
        assert plan.cost_bytes <= (2 + 4) * prod(plan.src_local_shape) * 4


# ---- properties -----------------------------------------------------------------------------


@st.composite
def problems(draw):
    mesh = draw(st.sampled_from(MESHES))
    rank = draw(st.integers(1, 4))
    names = list(mesh)

    def spec():
        dims: list[list[str]] = [[] for _ in range(rank)]
        for a in draw(st.permutations(names)):
            d = draw(st.integers(-1, rank - 1))
            if d >= 0:
                dims[d].append(a)
        return tuple(tuple(d) if len(d) > 1 else (d[0] if d else None) for d in dims)

    src, dst = spec(), spec()

    def parts(entry):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        return prod(mesh[a] for a in axes)

    shape = tuple(
        lcm(parts(s), parts(d)) * draw(st.sampled_from([1, 1, 2, 3])) for s, d in zip(src, dst)
    )
    return mesh, shape, src, dst


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_random_plans_are_well_typed_bounded_and_correct(problem):
    mesh, shape, src, dst = problem
    plan = plan_redistribution(mesh, shape, "f32", src, dst)
    check(plan)
    if src == dst:
        assert plan.steps == ()


def test_synthesis_time_is_well_under_200ms():
    """This process's CPU time, not wall time: the suite's other worker shares the 2 cores
    (a wall-clock maximum once read 206 ms on a loaded machine)."""
    rng = np.random.default_rng(0)
    times = []
    for _ in range(200):
        mesh = MESHES[rng.integers(len(MESHES))]
        rank = int(rng.integers(1, 7))
        dims: list[list[list[str]]] = [[[] for _ in range(rank)] for _ in range(2)]
        for which in range(2):
            for a in rng.permutation(list(mesh)):
                d = int(rng.integers(-1, rank))
                if d >= 0:
                    dims[which][d].append(str(a))
        specs = [tuple(tuple(d) or None for d in s) for s in dims]
        shape = tuple(
            lcm(prod(mesh[a] for a in (s or ())), prod(mesh[a] for a in (d or ()))) * 4
            for s, d in zip(*specs)
        )
        t0 = time.process_time()
        plan_redistribution(mesh, shape, "f32", specs[0], specs[1])
        times.append(time.process_time() - t0)
    assert max(times) < 0.2, max(times)
    assert float(np.median(times)) < 0.02


# ---- errors, conventions, CLI -------------------------------------------------------------


def test_errors_name_dimension_axis_and_sizes():
    mesh = {"a": 2, "b": 3}
    with pytest.raises(PartitionError, match=r"dimension 1 of size 4 is not divisible by 3.*b"):
        plan_redistribution(mesh, (4, 4), "f32", ("a", "b"), (None, None))
    with pytest.raises(PartitionError, match=r"dimension 0: axis 'z' is not in the mesh"):
        plan_redistribution(mesh, (4, 6), "f32", ("z",), (None, None))
    with pytest.raises(PartitionError, match=r"axis 'a' is used in dimension 0 and in dimension 1"):
        plan_redistribution(mesh, (6, 6), "f32", (None, None), ("a", "a"))
    with pytest.raises(PartitionError, match=r"axis 'a' is used twice in dimension 0"):
        plan_redistribution(mesh, (6, 6), "f32", (("a", "a"), None), (None, None))


def test_order_convention_paper_is_minor_to_major():
    shape, spec = parse_paper_type("[8{x, y}32]")
    assert shape == (32,) and spec == (("y", "x"),)
    plan = plan_redistribution({"x": 2, "y": 2}, shape, "f32", spec, ("x",))
    assert str(plan.src_type) == "[8{x, y}32]"
    check(plan)


def test_identity_and_dtype_sizes():
    plan = plan_redistribution({"a": 2}, (4,), "bf16", ("a",), ("a",))
    assert plan.steps == () and plan.cost_bytes == 0 and plan.peak_bytes == 2 * 2
    assert plan_redistribution({"a": 2}, (4,), np.float64, (None,), ("a",)).itemsize == 8


def test_cli_prints_plan(capsys):
    argv = [
        "reshard-plan",
        "--mesh",
        "a=2,b=2,c=2",
        "--shape",
        "8,16",
        "--dtype",
        "f32",
        "--src",
        "a,(b,c)",
        "--dst",
        "(c,a),None",
    ]
    assert partir_main(argv) == 0
    out = capsys.readouterr().out
    assert "P('a', ('b', 'c'))" in out and "P(('c', 'a'), None)" in out
    assert "all_" in out and "peak" in out
    assert partir_main([*argv[:-1], "(c,a,a),None"]) == 2
    assert "used twice" in capsys.readouterr().err
