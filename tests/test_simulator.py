"""Cost formulas of the analytical simulator and its lookup through the plugin manager."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from partir_simulators.analytical import trip_count
from partir_simulators.comm import ring_time

from partir_plugin.core.mesh import Mesh
from partir_plugin.cost import HardwareSpec, LinkClass
from partir_plugin.ir.graph import Block, Func, Op
from partir_plugin.ir.importer import import_lowered
from partir_plugin.ir.types import TensorType
from partir_plugin.plugin import manager
from partir_plugin.plugin.resolve import simulate
from partir_plugin.spmd.collectives import mark

FAST = LinkClass("fast", 100e9, 2e-6)
SLOW = LinkClass("slow", 10e9, 20e-6)
HW = HardwareSpec(name="test-hw", flops_per_s={"f32": 1e12, "bf16": 2e12}, memory_bytes=2**30,
                  memory_bandwidth_bytes_per_s=1e11, links={"fast": FAST, "slow": SLOW},
                  default_link="fast", axis_links={"M": "slow"})
MESH = Mesh.of({"B": 4, "M": 2})


def imported(fn, *args) -> Func:
    return import_lowered(jax.jit(fn).lower(*args))


def one_collective(kind: str, axes, in_shape, out_shape, op_name=None) -> Func:
    body = Block()
    x = body.add_arg(TensorType(in_shape, "f32"))
    op = Op(op_name or f"stablehlo.{kind}", [x], [TensorType(out_shape, "f32")])
    mark(op, kind, axes)
    body.ops.append(op)
    return Func("main", body, [op.results[0]])


def test_ring_all_reduce_formula():
    n, k = 4 * 2**20, 4
    expected = 2 * (k - 1) * FAST.latency_s + 2 * (k - 1) / k * n / FAST.bandwidth_bytes_per_s
    assert ring_time("all_reduce", n, k, FAST) == pytest.approx(expected)
    assert ring_time("all_reduce", n, 1, FAST) == 0.0

    res = simulate(one_collective("all_reduce", ["B"], (2**20,), (2**20,)), MESH, HW)
    (c,) = res.per_collective
    assert (c.kind, c.group_size, c.link, c.bytes) == ("all_reduce", 4, "fast", n)
    assert c.time_s == pytest.approx(expected)
    assert res.communication_s == pytest.approx(expected) == res.runtime_s
    assert res.communication_bytes == pytest.approx(2 * 3 / 4 * n)
    assert res.collective_counts == {"all_reduce": 1}


def test_a_links_overhead_is_paid_once_per_collective_whatever_the_group():
    """A host link's rendezvous (`LinkClass.overhead_s`) costs the same for a group of two
    as of eight, on top of the ring: the all-gather of ZeRO over a pair of devices is not a
    single ring step's latency."""
    host = dataclasses.replace(FAST, overhead_s=50e-6)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for k in (2, 8):
            assert ring_time(kind, 4096, k, host) == pytest.approx(
                50e-6 + ring_time(kind, 4096, k, FAST))
    assert ring_time("all_gather", 4096, 1, host) == 0.0


def test_collective_over_several_axes_uses_the_slowest_link():
    res = simulate(one_collective("all_reduce", ["B", "M"], (1024,), (1024,)), MESH, HW)
    (c,) = res.per_collective
    assert (c.group_size, c.link) == (8, "slow")
    assert c.time_s == pytest.approx(14 * SLOW.latency_s + 14 / 8 * 4096 / 10e9)


@pytest.mark.parametrize("kind,axes,in_shape,out_shape,k,steps,sent", [
    ("all_gather", ["B"], (256,), (1024,), 4, 3, 3 / 4 * 4096),      # N = the gathered result
    ("reduce_scatter", ["B"], (1024,), (256,), 4, 3, 3 / 4 * 4096),  # N = the full operand
    ("all_to_all", ["M"], (1024,), (1024,), 2, 1, 1 / 2 * 4096),
    ("all_permute", ["B"], (1024,), (1024,), 4, 1, 4096),
])
def test_other_collective_formulas(kind, axes, in_shape, out_shape, k, steps, sent):
    op_name = "stablehlo.collective_permute" if kind == "all_permute" else None
    res = simulate(one_collective(kind, axes, in_shape, out_shape, op_name), MESH, HW)
    (c,) = res.per_collective
    link = HW.link_for_axes(axes)
    assert c.group_size == k and c.sent_bytes == pytest.approx(sent)
    assert c.time_s == pytest.approx(steps * link.latency_s + sent / link.bandwidth_bytes_per_s)


def test_matmul_flops_and_roofline_from_a_real_program():
    a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
    res = simulate(imported(lambda a, b: a @ b, a, b), MESH, HW)
    assert res.flops == 2 * 64 * 16 * 32
    nbytes = 4 * (64 * 32 + 32 * 16 + 64 * 16)
    assert res.bytes_accessed == nbytes
    assert res.runtime_s == pytest.approx(max(res.flops / 1e12, nbytes / 1e11))
    bf16 = simulate(imported(lambda a, b: a @ b, a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)),
                    MESH, HW.__class__(**{**HW.__dict__, "memory_bandwidth_bytes_per_s": 1e20}))
    assert bf16.runtime_s == pytest.approx(bf16.flops / 2e12)  # the bf16 peak applies


def test_batched_dot_and_convolution_flops():
    res = simulate(imported(lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
                            jnp.ones((3, 4, 5)), jnp.ones((3, 5, 6))), MESH, HW)
    assert res.flops == 2 * 3 * 4 * 6 * 5
    conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "VALID")
    res = simulate(imported(conv, jnp.ones((2, 3, 8, 8)), jnp.ones((5, 3, 3, 3))), MESH, HW)
    assert res.flops == 2 * (2 * 5 * 6 * 6) * (3 * 3 * 3)


def test_batch_parallel_divides_per_device_flops():
    mlp = lambda x, w1, w2: jnp.tanh(x @ w1) @ w2
    w1, w2 = jnp.ones((64, 128)), jnp.ones((128, 32))
    full = simulate(imported(mlp, jnp.ones((256, 64)), w1, w2), {"B": 1}, HW)
    local = simulate(imported(mlp, jnp.ones((32, 64)), w1, w2), {"B": 8}, HW)
    assert full.flops / local.flops == pytest.approx(8)


def xla_memory(fn, *args) -> tuple[int, int, int]:
    m = jax.jit(fn).lower(*args).compile().memory_analysis()
    return m.argument_size_in_bytes, m.output_size_in_bytes, m.temp_size_in_bytes


def test_live_range_peak_of_a_small_program():
    # Three dependent matmuls of 64x64 f32 (16 KiB each): a and b are temporaries; c the output.
    # a and b are both live while b = a @ w runs, but a dies before c is written, so (as in
    # XLA's buffer assignment) a lives in c's output buffer: only b is a temporary.
    x = w = jnp.ones((64, 64))
    fn = lambda x, w: ((x @ w) @ w) @ w
    res = simulate(imported(fn, x, w), MESH, HW)
    kib16 = 64 * 64 * 4
    assert res.argument_bytes == 2 * kib16 and res.output_bytes == kib16
    assert res.temp_peak_bytes == kib16
    assert res.peak_memory_bytes == 4 * kib16
    assert xla_memory(fn, x, w) == (2 * kib16, kib16, kib16)


def test_elementwise_kernel_reuses_only_inputs_it_reads_elementwise():
    # sort's result feeds an elementwise kernel producing the output: read elementwise, the
    # output takes over its buffer (no temporary); read through a transpose it cannot (XLA's
    # CanShareOperandBufferWithUser), so the sorted array is a temporary.
    x = jnp.ones((64, 64))
    kib16 = 64 * 64 * 4
    for fn, temp in ((lambda x: jnp.sort(x, axis=0) * 2.0, 0),
                     (lambda x: jnp.sort(x, axis=0).T * 2.0, kib16)):
        assert simulate(imported(fn, x), MESH, HW).temp_peak_bytes == temp
        assert xla_memory(fn, x)[2] == temp


@pytest.mark.parametrize("dim, copies", [(0, 0), (1, 1)])
def test_reduce_scatter_over_an_inner_dimension_copies_its_operand(dim, copies):
    # XLA gives a reduce_scatter's operand a layout with the scattered dimension major; over an
    # inner dimension the producer's result is copied into it (both live at once).
    body = Block()
    x = body.add_arg(TensorType((64, 64), "f32"))
    y = Op("stablehlo.sine", [x], [TensorType((64, 64), "f32")])
    shape = (16, 64) if dim == 0 else (64, 16)
    rs = Op("stablehlo.reduce_scatter", [y.results[0]], [TensorType(shape, "f32")],
            {"scatter_dimension": f"{dim} : i64"})
    mark(rs, "reduce_scatter", ["B"])
    body.ops += [y, rs]
    res = simulate(Func("main", body, [rs.results[0]]), MESH, HW)
    assert res.kernels == 1 + copies
    assert res.temp_peak_bytes == (1 + copies) * 64 * 64 * 4


def _gathers(dim: int, count: int) -> Func:
    """`count` all_gathers over B (4 devices) of [64, 64] tiles on `dim`, summed."""
    body = Block()
    tile = (16, 64) if dim == 0 else (64, 16)
    gathered = []
    for _ in range(count):
        x = body.add_arg(TensorType(tile, "f32"))
        ag = Op("stablehlo.all_gather", [x], [TensorType((64, 64), "f32")],
                {"all_gather_dim": f"{dim} : i64"})
        mark(ag, "all_gather", ["B"])
        body.ops.append(ag)
        gathered.append(ag.results[0])
    total = gathered[0]
    for g in gathered[1:]:
        add = Op("stablehlo.add", [total, g], [TensorType((64, 64), "f32")])
        body.ops.append(add)
        total = add.results[0]
    return Func("main", body, [total])


@pytest.mark.parametrize("dim, copies", [(0, 0), (1, 2)])
def test_all_gather_over_an_inner_dimension_copies_its_operand_and_its_result(dim, copies):
    """XLA gathers contiguous chunks: over an inner dimension its layout assignment copies the
    tile into a layout with that dimension major and the gathered array back to row-major
    (XLA:CPU measured 11 ms against 3.5 ms for six such gathers of a scanned transformer's
    Z2 parameters). Both copies are kernels, and the gathered array in the collective's
    layout is a temporary beside the result."""
    res = simulate(_gathers(dim, 1), MESH, HW)
    assert res.kernels == copies
    gathered, tile = 64 * 64 * 4, 64 * 16 * 4
    assert res.bytes_accessed == (2 * tile + 2 * gathered if copies else 0)
    assert (res.temp_peak_bytes >= gathered) if copies else res.temp_peak_bytes == 0


def test_all_gathers_with_copies_back_are_still_combined():
    """A backend that combines all_gathers (XLA:GPU) sends gathers issued together as one,
    copies or not: each copy back waits for the gather's first reader."""
    combining = dataclasses.replace(HW, combined_collectives=("all_gather",),
                                    combine_threshold_bytes=2**30)
    for dim in (0, 1):
        one = simulate(_gathers(dim, 1), MESH, combining).communication_s
        three = simulate(_gathers(dim, 3), MESH, combining)
        expected = ring_time("all_gather", 3 * 64 * 64 * 4, 4, FAST)
        assert three.communication_s == pytest.approx(expected)
        assert expected < 3 * one


def test_kernels_that_fit_the_cache_stream_at_its_bandwidth():
    """`cache_bytes` / `cache_bandwidth_bytes_per_s` (a CPU's last-level cache, measured by
    `partir calibrate`): a kernel moving at most `cache_bytes` streams at the cache's
    bandwidth, a larger one at memory bandwidth; the figures survive a JSON round trip."""
    cached = dataclasses.replace(HW, cache_bytes=2**20, cache_bandwidth_bytes_per_s=4e11)
    assert cached.memory_seconds(2**20) == pytest.approx(2**20 / 4e11)
    assert cached.memory_seconds(2**20 + 1) == pytest.approx((2**20 + 1) / 1e11)
    assert HW.memory_seconds(2**20) == pytest.approx(2**20 / 1e11)
    assert HardwareSpec.from_dict(cached.to_dict()) == cached
    small = imported(lambda x: jnp.tanh(x) * 2.0, jnp.ones((128, 128)))  # 128 KiB moved
    assert (simulate(small, MESH, cached).runtime_s < simulate(small, MESH, HW).runtime_s)


def test_fusion_keeps_elementwise_chains_out_of_memory():
    chain = lambda x: jnp.sum(jnp.tanh(x * 2.0 + 1.0) * 3.0)
    func = imported(chain, jnp.ones((256, 256)))
    fused = simulate(func, MESH, HW)
    unfused = simulate(func, MESH, HW, fusion=False)
    assert fused.temp_peak_bytes == 0
    assert unfused.temp_peak_bytes >= 256 * 256 * 4
    assert fused.peak_memory_bytes < unfused.peak_memory_bytes
    assert fused.bytes_accessed == 256 * 256 * 4 + 4  # read x once, write the scalar
    assert fused.kernels == 1 and fused.flops == unfused.flops



def _exp_read_twice(x, y):  # a softmax's numerator, read elementwise and by its sum
    e = jnp.exp(x)
    return e + y, jnp.sum(e * y, axis=0)


def _tanh_read_twice(x, y):  # a GELU's tanh, read by the forward and the backward kernel
    t = jnp.tanh(x)
    return t + y, (t * y).T


@pytest.mark.parametrize("fn", [_exp_read_twice, _tanh_read_twice])
def test_expensive_op_read_by_two_kernels_is_materialised_on_xla_cpu(fn):
    # XLA:CPU's instruction fusion does not duplicate an expensive op (exp, tanh, divide, ...)
    # into a second fusion: it runs once and its 1 MiB result is a temporary. A spec that
    # duplicates (the GPU default) fuses it into both kernels: no temporary, 25% less.
    x = y = jnp.ones((512, 512))
    mib = 512 * 512 * 4
    cpu = dataclasses.replace(HW, duplicates_expensive_ops=False)
    func = imported(fn, x, y)
    arguments, outputs, temp = xla_memory(fn, x, y)
    assert temp == mib
    xla = arguments + outputs + temp
    res = simulate(func, MESH, cpu)
    assert res.temp_peak_bytes == mib
    assert abs(res.peak_memory_bytes - xla) <= 0.1 * xla
    assert simulate(func, MESH, HW).peak_memory_bytes <= 0.8 * xla  # duplicated: no temporary


def _norm_scale_read_twice(r, x, y):
    # The broadcast of a norm's rsqrt, as a train step uses it: JAX emits it once for the
    # forward product and once for the scale's gradient sum; XLA's CSE makes it one value.
    forward = x * jnp.broadcast_to(r, x.shape) + 1.0
    scale_grad = jnp.sum(y * jnp.broadcast_to(r, x.shape), axis=(0, 1))
    return forward, scale_grad


def test_producer_of_a_library_reduction_read_by_another_kernel_is_materialised():
    # XLA:CPU runs the sum as a YNNPACK fusion, which takes in only producers nothing else
    # reads; the (CSE-merged) broadcast also feeds the forward kernel, so it is materialised:
    # a 128 KiB temporary. Without either mechanism the broadcast fuses into both kernels.
    r, x, y = jnp.ones((4, 64, 1)), jnp.ones((4, 64, 128)), jnp.ones((4, 64, 128))
    kib128 = 4 * 64 * 128 * 4
    arguments, outputs, temp = xla_memory(_norm_scale_read_twice, r, x, y)
    assert temp == kib128
    xla = arguments + outputs + temp
    func = imported(_norm_scale_read_twice, r, x, y)
    cpu = dataclasses.replace(HW, library_reductions=True)
    res = simulate(func, MESH, cpu)
    assert res.temp_peak_bytes == kib128
    assert abs(res.peak_memory_bytes - xla) <= 0.1 * xla
    assert simulate(func, MESH, HW).temp_peak_bytes == 0  # fused into both

def test_donated_argument_aliases_an_output():
    update = lambda p, g: p - 0.1 * g
    func = imported(update, jnp.ones((128,)), jnp.ones((128,)))
    plain = simulate(func, MESH, HW)
    donated = simulate(func, MESH, HW, donated_args=[0])
    assert donated.alias_bytes == 512
    assert plain.peak_memory_bytes - donated.peak_memory_bytes == 512


def test_overlap_hides_communication_behind_independent_compute():
    body = Block()
    x = body.add_arg(TensorType((4096,), "f32"))
    w = body.add_arg(TensorType((512, 512), "f32"))
    ar = mark(Op("stablehlo.all_reduce", [x], [TensorType((4096,), "f32")]), "all_reduce", ["B"])
    dot = Op("stablehlo.dot_general", [w, w], [TensorType((512, 512), "f32")],
             {"dot_dimension_numbers": "#stablehlo.dot<lhs_contracting_dimensions = [1], "
                                       "rhs_contracting_dimensions = [0]>"})
    body.ops += [ar, dot]
    func = Func("main", body, [ar.results[0], dot.results[0]])
    serial = simulate(func, MESH, HW)
    overlapped = simulate(func, MESH, HW, overlap=True)
    assert serial.runtime_s == pytest.approx(serial.compute_s + serial.communication_s)
    assert overlapped.runtime_s == pytest.approx(max(serial.compute_s, serial.communication_s))


def test_while_loops_count_their_body_times_the_trip_count():
    body = lambda i, v: jnp.tanh(v @ v)
    once = simulate(imported(lambda v: jnp.tanh(v @ v), jnp.ones((32, 32))), MESH, HW)
    func = imported(lambda v: jax.lax.fori_loop(0, 7, body, v), jnp.ones((32, 32)))
    loop = next(op for op in func.ops if op.name == "stablehlo.while")
    assert trip_count(loop) == 7
    res = simulate(func, MESH, HW)
    assert res.unknown_trip_counts == 0
    assert res.flops == pytest.approx(7 * (once.flops + 2))  # + the counter's add and compare

    data_dependent = lambda v: jax.lax.while_loop(lambda c: c.sum() < 100.0, lambda c: c * 2, v)
    res = simulate(imported(data_dependent, jnp.ones((8,))), MESH, HW)
    assert res.unknown_trip_counts == 1


def test_simulate_resolves_plugins_by_name_and_explains_unknown_names():
    assert "analytical" in manager.simulators()
    res = simulate(one_collective("all_reduce", ["B"], (16,), (16,)), {"B": 4}, "a100-40gb")
    assert res.hardware == "a100-40gb" and res.simulator == "analytical"
    assert res.per_collective[0].link == "nvlink"
    with pytest.raises(KeyError, match="available: .*'h100-sxm'"):
        simulate(one_collective("all_reduce", ["B"], (16,), (16,)), {"B": 4}, "tpu-v9")
    with pytest.raises(KeyError, match="available: .*'analytical'"):
        simulate(one_collective("all_reduce", ["B"], (16,), (16,)), {"B": 4}, HW,
                 simulator="oracle")


def test_result_serialises_and_checks_the_memory_limit():
    res = simulate(imported(lambda a: a * 2, jnp.ones((1024,))), MESH, HW)
    data = res.to_dict()
    assert data["fits_in_memory"] and data["peak_memory_bytes"] == res.peak_memory_bytes
    tiny = HardwareSpec(**{**HW.__dict__, "memory_bytes": 1024})
    assert not simulate(imported(lambda a: a * 2, jnp.ones((1024,))), MESH, tiny).fits_in_memory


def _all_reduces(n: int, axes=("B",), chain: bool = False) -> Func:
    """n all-reduces of 1024 floats over `axes`: independent, or each reading the previous."""
    body = Block()
    xs = [body.add_arg(TensorType((1024,), "f32")) for _ in range(n)]
    ops = []
    for x in xs:
        source = ops[-1].results[0] if chain and ops else x
        ops.append(mark(Op("stablehlo.all_reduce", [source], [TensorType((1024,), "f32")]),
                        "all_reduce", list(axes)))
    body.ops += ops
    return Func("main", body, [op.results[0] for op in ops])


def test_independent_all_reduces_run_as_one_where_the_backend_combines_them():
    """XLA's all-reduce combiner: independent all-reduces over the same devices are one ring
    (one latency), up to the spec's threshold; one that reads another's result is not
    combined with it; the program's collectives are still counted as written."""
    combining = dataclasses.replace(HW, combined_collectives=("all_reduce",),
                                    combine_threshold_bytes=2**30)
    one = ring_time("all_reduce", 4096, 4, FAST)
    func = _all_reduces(8)
    assert simulate(func, MESH, HW).runtime_s == pytest.approx(8 * one)
    combined = simulate(func, MESH, combining)
    assert combined.runtime_s == pytest.approx(ring_time("all_reduce", 8 * 4096, 4, FAST))
    assert combined.communication_s == pytest.approx(combined.runtime_s)
    assert combined.collective_counts == {"all_reduce": 8}
    # The threshold: groups of at most 4 x 4 KiB.
    quarter = dataclasses.replace(combining, combine_threshold_bytes=4 * 4096)
    assert simulate(func, MESH, quarter).runtime_s == pytest.approx(
        2 * ring_time("all_reduce", 4 * 4096, 4, FAST))
    # Dependent all-reduces, or all-reduces of a kind the spec does not combine, stay apart.
    assert simulate(_all_reduces(3, chain=True), MESH, combining).runtime_s == \
        pytest.approx(3 * one)
    gathers_only = dataclasses.replace(combining, combined_collectives=("all_gather",))
    assert simulate(func, MESH, gathers_only).runtime_s == pytest.approx(8 * one)


def test_all_reduces_over_different_axes_are_not_combined():
    combining = dataclasses.replace(HW, combined_collectives=("all_reduce",),
                                    combine_threshold_bytes=2**30)
    body = Block()
    x, y = (body.add_arg(TensorType((1024,), "f32")) for _ in range(2))
    a = mark(Op("stablehlo.all_reduce", [x], [TensorType((1024,), "f32")]), "all_reduce", ["B"])
    b = mark(Op("stablehlo.all_reduce", [y], [TensorType((1024,), "f32")]), "all_reduce", ["M"])
    body.ops += [a, b]
    func = Func("main", body, [a.results[0], b.results[0]])
    assert simulate(func, MESH, combining).runtime_s == pytest.approx(
        simulate(func, MESH, HW).runtime_s)


def _scanned_residual_mlp(remat):
    """Issue 37's model, small: `h + tanh(h @ w)` over 8 stacked layers under `lax.scan`,
    the step `value_and_grad` of the mean square; `remat` wraps the body in
    `jax.checkpoint` with that policy."""
    def loss(w, x):
        body = lambda h, wl: (h + jnp.tanh(h @ wl), None)  # noqa: E731
        if remat is not None:
            body = jax.checkpoint(body, policy=remat)
        return (jax.lax.scan(body, x, w)[0] ** 2).mean()

    return jax.value_and_grad(loss), (jnp.ones((8, 32, 32)) / 32, jnp.ones((64, 32)))


@pytest.mark.parametrize("remat", [None, jax.checkpoint_policies.nothing_saveable,
                                   jax.checkpoint_policies.dots_saveable],
                         ids=["scan", "remat-full", "remat-dots"])
def test_scan_residuals_are_counted_once(remat):
    # The forward scan writes its residual stacks (8 x 8 KiB each) by in-place updates of
    # carried values: a while's operand, body argument, body result and result share one
    # buffer in XLA, so the stacks are the loop's (counted outside the body), not also
    # temporaries of the body (the estimate was 1.7x XLA's before).
    step, args = _scanned_residual_mlp(remat)
    cpu = dataclasses.replace(HW, duplicates_expensive_ops=False, library_reductions=True)
    arguments, outputs, temp = xla_memory(step, *args)
    res = simulate(imported(step, *args), MESH, cpu)
    assert 0.8 <= res.peak_memory_bytes / (arguments + outputs + temp) <= 1.25
    assert 0.8 <= res.temp_peak_bytes / temp <= 1.25


def test_loop_invariants_and_unread_carries_take_no_buffer():
    # A while that passes a 1 MiB weight through unchanged (read-only: XLA copies nothing
    # into the loop, the result is the operand's buffer) and carries a 1 MiB zero nothing
    # reads (XLA's while-loop simplifier removes it, and its broadcast): only the 1 MiB
    # accumulator is a temporary of the top level, as in XLA.
    def fn(w, x):
        def body(i, carry):
            w, acc, unused = carry
            return w, acc + jnp.tanh(x @ w[i % 4]), unused
        zeros = jnp.zeros((512, 512))
        return jax.lax.fori_loop(0, 4, body, (w, zeros, zeros))[:2]

    w, x = jnp.ones((4, 512, 512)) / 512, jnp.ones((512, 512))
    cpu = dataclasses.replace(HW, duplicates_expensive_ops=False, library_reductions=True)
    arguments, outputs, temp = xla_memory(fn, w, x)
    res = simulate(imported(fn, w, x), MESH, cpu)
    assert 0.8 <= res.peak_memory_bytes / (arguments + outputs + temp) <= 1.25
    assert res.temp_peak_bytes <= 1.25 * temp


def _scan_with_cast_outputs(w, x):
    # A scan whose per-step output is computed elementwise from the step's matmul (a bf16 copy
    # of an activation, as a mixed-precision scan stacks its residuals).
    def body(c, wi):
        y = c @ wi
        return y, (y * 2.0 + 1.0).astype(jnp.bfloat16)

    c, ys = jax.lax.scan(body, x, w)
    return c, ys


def test_a_scan_output_is_computed_in_its_in_place_update():
    # XLA (CPU and GPU) fuses the elementwise producers of a dynamic_update_slice's update into
    # the update's kernel, written in place (`dynamic-update-slice_convert_fusion`): the bf16
    # slice is never materialised on its own. Before, the simulator charged a convert kernel
    # writing it and the update kernel reading it back (a third of a scanned LM's time at
    # 1.7B parameters was such writes of residual stacks).
    w, x = jnp.ones((6, 64, 64)) / 64, jnp.ones((32, 64))
    hlo = jax.jit(_scan_with_cast_outputs).lower(w, x).compile().as_text()
    assert "dynamic-update-slice_convert_fusion" in hlo  # what the model mirrors
    res = simulate(imported(_scan_with_cast_outputs, w, x), MESH, HW, timeline=True)
    body = {e.name.split(".")[0]: e for e in res.timeline if e.loops}
    assert "dynamic_update_slice" in body
    elementwise = [name for name, e in body.items()
                   if name in ("convert", "multiply", "add") and e.ops[0].results[0].type.shape]
    assert not elementwise, elementwise  # (the loop counter's scalar add is a kernel)
    # The update's kernel reads the matmul's f32 product itself, not a bf16 copy of it.
    read = [(v.type.shape, v.type.element) for v in body["dynamic_update_slice"].inputs
            if v.type.shape]
    assert ((32, 64), "f32") in read and not any(e == "bf16" for _, e in read[1:]), read


def test_a_transpose_of_unit_dimensions_is_a_bitcast():
    # [1, L, n] -> [L, 1, n] keeps every element in place (a pipeline's stage axis swapped with
    # a layer stack): XLA makes it a bitcast, so no kernel and no buffer; a real transpose is a
    # kernel and a temporary.
    x, w, v = jnp.ones((1, 64, 256)), jnp.ones((256, 8)), jnp.ones((64, 8))
    unit = simulate(imported(lambda x, w: jnp.transpose(x, (1, 0, 2)) @ w, x, w), MESH, HW)
    real = simulate(imported(lambda x, v: jnp.transpose(x[0], (1, 0)) @ v, x, v), MESH, HW)
    assert unit.kernels == 1 and unit.temp_peak_bytes == 0
    assert real.kernels == 2 and real.temp_peak_bytes == 64 * 256 * 4


def test_chlo_square_is_an_elementwise_op_that_fuses():
    """jax 0.10 lowers `jnp.square` (a norm's variance) to `chlo.square`, which XLA expands
    to a multiply: one fused kernel with the add, no op the simulator does not know."""
    x = jnp.ones((64, 256), jnp.float32)
    square = simulate(imported(lambda x: jnp.square(x) + 1.0, x), MESH, HW)
    multiply = simulate(imported(lambda x: x * x + 1.0, x), MESH, HW)
    assert "chlo.square" in [op.name for op in imported(lambda x: jnp.square(x), x).body.ops]
    assert not square.unknown_ops and square.kernels == multiply.kernels == 1
    assert square.runtime_s == pytest.approx(multiply.runtime_s)


def _compute_then_all_reduce(axes) -> tuple[Func, Func]:
    """(a 256x256 matmul, then an all-reduce of its result over `axes` and a second matmul
    of that; the first matmul alone)."""
    dims = {"dot_dimension_numbers": "#stablehlo.dot<lhs_contracting_dimensions = [1], "
                                     "rhs_contracting_dimensions = [0]>"}
    t = TensorType((256, 256), "f32")
    body = Block()
    w = body.add_arg(t)
    first = Op("stablehlo.dot_general", [w, w], [t], dict(dims))
    ar = mark(Op("stablehlo.all_reduce", [first.results[0]], [t]), "all_reduce", list(axes))
    second = Op("stablehlo.dot_general", [ar.results[0], w], [t], dict(dims))
    body.ops += [first, ar, second]
    alone = Block()
    w2 = alone.add_arg(t)
    only = Op("stablehlo.dot_general", [w2, w2], [t], dict(dims))
    alone.ops.append(only)
    return (Func("main", body, [second.results[0]]),
            Func("main", alone, [only.results[0]]))


@pytest.mark.parametrize("axes, fraction", [(("M",), 0.1), (("B",), 0.3), (("B", "M"), 0.3)])
def test_a_collective_of_devices_sharing_cores_waits_a_fraction_of_the_compute_before_it(
        axes, fraction):
    """`HardwareSpec.rendezvous_wait`: threads sharing cores drift apart while they compute,
    and a collective waits for its group's last: the fraction listed for its group size (a
    group of 8 takes the largest listed below it) of the compute since the last collective.
    The compute after it is not charged, and a spec listing none pays nothing."""
    shared = dataclasses.replace(HW, rendezvous_wait={2: 0.1, 4: 0.3})
    func, before = _compute_then_all_reduce(axes)
    plain = simulate(func, MESH, HW)
    waited = simulate(func, MESH, shared)
    stretch = simulate(before, MESH, HW).compute_s
    assert stretch > 0
    assert waited.runtime_s - plain.runtime_s == pytest.approx(fraction * stretch)
    assert waited.communication_s - plain.communication_s == pytest.approx(fraction * stretch)
    assert waited.compute_s == pytest.approx(plain.compute_s)
    assert shared.wait_fraction(1) == 0.0 and shared.wait_fraction(3) == 0.1


def test_rendezvous_waits_of_a_scanned_step_scale_with_the_fraction_and_survive_json():
    """A data-parallel gradient of a scanned stack: its collectives wait in proportion to the
    fraction (twice the fraction, twice the wait). The calibration file stores group sizes
    as JSON's string keys."""
    import json

    import partir_plugin as partir

    def step(w, x):
        def layer(h, wi):
            return jnp.tanh(h @ wi), None
        return jax.lax.scan(layer, x, w)[0].sum()

    w, x = jnp.ones((6, 64, 64)), jnp.ones((64, 64))
    grads = jax.grad(step)

    def run(waits):
        spec = dataclasses.replace(HW, rendezvous_wait=waits)
        return partir.estimate(grads, w, x, mesh={"B": 8},
                               schedule=[partir.ManualPartition({"x": 0}, axis="B")],
                               hardware=spec)

    base, small, large = run({}), run({8: 0.2}), run({8: 0.4})
    assert small.step_time_s > base.step_time_s
    assert large.step_time_s - base.step_time_s == pytest.approx(
        2 * (small.step_time_s - base.step_time_s))
    spec = dataclasses.replace(HW, rendezvous_wait={2: 0.05, 8: 0.2})
    again = HardwareSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again.rendezvous_wait == {2: 0.05, 8: 0.2} and again.wait_fraction(8) == 0.2


def test_a_collective_in_a_loop_waits_for_the_whole_body_each_iteration():
    """A loop whose body ends in a collective: every iteration's collective follows the
    body's compute since the iteration before (the compute after it wraps around), so the
    wait is the trip count x the fraction x the body's compute."""
    func = imported(lambda v: jax.lax.fori_loop(0, 7, lambda i, v: jnp.tanh(v @ v), v),
                    jnp.ones((64, 64)))
    loop = next(op for op in func.ops if op.name == "stablehlo.while")
    body = loop.regions[1].blocks[0]
    ret = body.ops[-1]
    i = next(j for j, v in enumerate(ret.operands) if v.type.shape == (64, 64))
    ar = mark(Op("stablehlo.all_reduce", [ret.operands[i]], [ret.operands[i].type]),
              "all_reduce", ["B"])
    body.ops.insert(len(body.ops) - 1, ar)
    ret.operands[i] = ar.results[0]
    plain = simulate(func, MESH, HW)
    waited = simulate(func, MESH, dataclasses.replace(HW, rendezvous_wait={4: 0.5}))
    assert waited.runtime_s - plain.runtime_s == pytest.approx(0.5 * plain.compute_s, rel=1e-3)
