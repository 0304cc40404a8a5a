"""IR import/export: jax programs and .mlir files round-trip through the real MLIR parser."""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
from jaxlib.mlir import ir
from oracle import assert_matches_jax_jit

import partir_plugin as partir
from partir_plugin._gc import gc_paused
from partir_plugin.ir import import_lowered, import_stablehlo, print_module
from partir_plugin.ir.graph import captures_of, walk
from partir_plugin.ir.importer import make_context
from partir_plugin.ir.passes import IMPORT_PIPELINE
from partir_plugin.runtime import compile_overlap


def _verify(text: str) -> None:
    with make_context():
        module = ir.Module.parse(text)
        assert module.operation.verify()


def program(x, w):
    y = jax.nn.relu(x @ w)  # relu lowers to a private func: inlined
    z = jax.lax.fori_loop(0, 3, lambda i, c: c * 2.0 + y, y)  # while with regions
    zz = jax.lax.cond(z.sum() > 0, lambda: z + 1, lambda: z - 1)  # case, implicit captures
    return jnp.argmax(zz, 1), jnp.sort(zz, 0), jnp.cumsum(zz, 1)


def test_round_trip_verifies_and_inlines_calls():
    lowered = jax.jit(program).lower(jnp.ones((32, 8)), jnp.ones((8, 16)))
    func = import_lowered(lowered)
    names = {op.name for op in func.ops}
    assert "func.call" not in names
    assert {"stablehlo.while", "stablehlo.case", "stablehlo.sort"} <= names
    case = next(op for op in func.ops if op.name == "stablehlo.case")
    assert case.captures, "branches use outer values implicitly"
    text = print_module(func)
    _verify(text)
    again = import_stablehlo(text)
    assert [op.name for op in again.ops] == [op.name for op in func.ops]


@jax.jit
def _layer(x, w):
    return partir.tag(jnp.tanh(x @ w), "h")


def _calls_in_regions(x, w):
    def body(c, _):
        return _layer(c, w) + _layer(c, 2 * w), None

    c, _ = jax.lax.scan(body, x, None, length=2)
    c = jax.lax.cond(c.sum() > 0, lambda: _layer(c, w + 1), lambda: c)  # a call in a branch
    return _layer(c, w)


def test_calls_are_inlined_by_a_pass_with_their_tags_and_captures():
    """`InlineCalls` (the pipeline's first pass) copies each callee, imported once, into
    every call site, in loop bodies and branches too: the tags inside come once per call site
    in program order, a branch that held a call captures what its copy reads, and a tactic on
    the tags partitions the program as jax.jit computes it."""
    assert IMPORT_PIPELINE.names[0] == "inline-calls"
    x, w = jnp.ones((8, 16)) / 4, jnp.eye(16) / 2
    func = import_lowered(jax.jit(_calls_in_regions).lower(x, w))
    assert not [op for op in walk(func.ops) if op.name in ("func.call", "stablehlo.composite")]
    assert not func.callees
    tagged = func.tags["h"]
    assert len(tagged) == 4  # two in the loop body, one in a branch, one after
    order = {r: i for i, r in enumerate(r for op in walk(func.ops) for r in op.results)}
    assert [order[v] for v in tagged] == sorted(order[v] for v in tagged)
    case = next(op for op in func.ops if op.name == "stablehlo.case")
    assert case.captures and case.captures == captures_of(case)
    assert_matches_jax_jit(_calls_in_regions, (x, w), {"m": 2},
                           [partir.ManualPartition({"x": 0}, axis="m", tags={"h": 0})])


def test_import_from_mlir_file(tmp_path):
    lowered = jax.jit(lambda a, b: jnp.tanh(a) @ b).lower(jnp.ones((4, 8)), jnp.ones((8, 2)))
    path = tmp_path / "prog.mlir"
    path.write_text(lowered.as_text())
    func = import_stablehlo(path.read_text())
    assert [a.type.shape for a in func.args] == [(4, 8), (8, 2)]
    assert func.returns[0].type.shape == (4, 2)
    dot = next(op for op in func.ops if op.name == "stablehlo.dot_general")
    assert dot.rule.startswith("#sdy.op_sharding_rule")


def test_import_is_linear_enough():
    """A 2k-op program imports in well under a few seconds."""
    import time

    def deep(x):
        for _ in range(400):
            x = jnp.tanh(x) * 1.01 + 0.5
        return x

    lowered = jax.jit(deep).lower(jnp.ones((8, 8)))
    start = time.perf_counter()
    func = import_lowered(lowered)
    elapsed = time.perf_counter() - start
    assert len(func.ops) >= 1200
    assert elapsed < 5.0


class _Node:
    """A gc-tracked object that can sit in a reference cycle."""

    def __init__(self) -> None:
        self.other: _Node | None = None


def _generation_of(obj: object) -> int | None:
    return next((g for g in range(3) if any(o is obj for o in gc.get_objects(g))), None)


def test_gc_paused_tenures_what_the_pass_built_and_frees_its_cycles_later():
    """The collector is off inside, nested pauses leave it off, and afterwards what was
    allocated sits in the oldest generation unwalked; a cycle dropped meanwhile is freed by
    the next full collection, not leaked."""
    compile_overlap.wait()  # no report being made on another thread meanwhile
    gc.collect()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            kept = _Node()
        assert not gc.isenabled()  # the inner pause does not resume it
        dropped = _Node()
        dropped.other = _Node()
        dropped.other.other = dropped
        probe = weakref.ref(dropped)
        del dropped
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    assert gc.get_count()[0] < 50  # the young generation was emptied, not walked
    assert _generation_of(kept) == 2
    assert probe() is not None  # the cycle waits for a full collection...
    gc.collect()
    assert probe() is None  # ...which frees it


def test_gc_paused_leaves_someone_elses_frozen_objects_frozen():
    compile_overlap.wait()
    theirs = _Node()
    gc.collect()
    gc.freeze()
    try:
        with gc_paused():
            kept = _Node()
        assert gc.get_freeze_count() > 0
        assert _generation_of(theirs) is None  # still in the permanent generation
        assert _generation_of(kept) == 2  # promoted by one middle collection instead
    finally:
        gc.unfreeze()


def test_sharding_constraints_are_read_through():
    """jax's sharding annotations are dropped (`ir/passes/sharding_constraints.py`): each use
    of one reads its operand, captured by a while body included."""
    func = import_stablehlo("""
module {
  sdy.mesh @mesh = <["x"=2]>
  func.func @main(%arg0: tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xf32>) {
    %0 = sdy.sharding_constraint %arg0 <@mesh, [{"x"}, {}]> : tensor<8x4xf32>
    %1 = sdy.sharding_constraint %0 <@mesh, [{}, {"x"}]> : tensor<8x4xf32>
    %2 = stablehlo.add %1, %arg0 : tensor<8x4xf32>
    %3 = stablehlo.while(%iterArg = %2) : tensor<8x4xf32>
     cond {
      %c = stablehlo.constant dense<true> : tensor<i1>
      stablehlo.return %c : tensor<i1>
    } do {
      %4 = stablehlo.add %iterArg, %1 : tensor<8x4xf32>
      stablehlo.return %4 : tensor<8x4xf32>
    }
    return %3, %1 : tensor<8x4xf32>, tensor<8x4xf32>
  }
}
""")
    (x,) = func.args
    add, loop = func.ops
    assert add.name == "stablehlo.add" and add.operands == [x, x]
    assert list(loop.captures) == [x]
    assert func.returns[1] is x


def test_complex_constants_import_and_partition():
    """MLIR's Python bindings cannot type a dense attribute of complex elements (reading it
    raised TypeError, so a step with `* 1j` crashed at import): its text comes from the op's
    generic form, and the step partitions with jax.jit's numbers, complex partial sums and
    gradients included."""
    text = jax.jit(lambda x: x.astype(jnp.complex64) * (1 + 2j)).lower(jnp.ones(3)).as_text()
    func = import_stablehlo(text)
    constants = [op.attributes["value"] for op in walk(func.ops)
                 if op.name == "stablehlo.constant" and "complex" in op.attributes["value"]]
    assert constants and "(1.000000e+00,2.000000e+00)" in constants[0], constants
    _verify(print_module(func))

    def loss(w, x):  # complex values tiled by the batch, summed over it, differentiated
        z = (x @ w).astype(jnp.complex64) * (1 + 2j)
        return jnp.sum(jnp.abs(jnp.fft.fft(z, axis=1)) ** 2) + jnp.real(jnp.sum(z, axis=0)).sum()

    args = (jax.random.normal(jax.random.PRNGKey(0), (32, 32)) * 0.1,
            jax.random.normal(jax.random.PRNGKey(1), (16, 32)))
    def step(w, x):
        return jax.value_and_grad(loss)(w, x)

    assert_matches_jax_jit(step, args, {"data": 4, "model": 2},
                           [partir.ManualPartition({"x": 0}, axis="data"),
                            partir.ManualPartition({"w": 1}, axis="model")])
