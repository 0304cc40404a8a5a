"""Issue 18: every TMR entry is a true equivalence, checked at the entry (`verify/tmr.py`), and
spatially tiled convolutions, windows and data movement give jax.jit's numbers.

The regression: Shardy's rule for a weight-gradient convolution (image x output gradient ->
kernel) has a "reduction" factor for each spatial dimension, which became an entry tiling the
image and the output gradient alike and summing: wrong with padding (each kernel row reads
image rows shifted across the tile boundary). `core/rules/shardy._window_reduction_halos` drops
such entries; the verifier finds the wrong one when it is put back.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from property_programs import build, example_args, recipes
from tmr_corpus import CASES, ELEMENTWISE, GENERATED, assert_none_wrong, ops_of

from partir_plugin.core.tmr import Sum, TileMappingRegistry, TMREntry
from partir_plugin.extend import verify_entry, verify_registry, verify_rule
from partir_plugin.plugin.manager import default_registry
from partir_plugin.verify.tmr import Split, splits_of, verify_op, verify_split


@pytest.fixture(scope="module")
def registry():
    return default_registry()


# -- the verifier over the corpus ------------------------------------------------------------

# The corpus's convolutions, pools, pads and windowed sums are ops the generated tables
# below cover through their attribute spaces: those cases run under `make test-all`.
_GENERATED_KINDS = ("conv_", "max_pool", "avg_pool", "pad_", "reduce_window")


@pytest.mark.slow  # probes every entry of the corpus's programs
@pytest.mark.parametrize("part", [
    "not generated", pytest.param("generated kinds", marks=pytest.mark.exhaustive)])
def test_every_entry_of_the_window_and_data_movement_table_is_true(part, registry):
    cases = [c for c in CASES if c.name.startswith(_GENERATED_KINDS) == (part != "not generated")]
    assert cases
    ops = [op for case in cases for op in ops_of(case.step(), *case.args())]
    assert_none_wrong(verify_registry(ops, registry))


@pytest.mark.slow  # probes every generated program's entries
@pytest.mark.parametrize("family", sorted(GENERATED))
def test_every_entry_of_the_generated_table_is_true(family, registry):
    """The property test's attribute spaces, one op each: pads of every sign and interior,
    windows with strides beyond them, convolutions, re-factoring reshapes, indexing with
    clamped, negative and dropped indices (`tmr_corpus.GENERATED`)."""
    ops = [op for case in GENERATED[family] for op in ops_of(case.step(), *case.args())]
    assert_none_wrong(verify_registry(ops, registry))


def test_every_elementwise_entry_is_true(registry):
    ops = []
    for _, fn, dtypes in ELEMENTWISE:
        args = [jnp.ones((4, 6), d) if d != jnp.bool_ else jnp.ones((4, 6), bool)
                for d in dtypes]
        ops += ops_of(fn, *args)
    assert_none_wrong(verify_registry(ops, registry))


@pytest.mark.slow  # hypothesis programs, each probed
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(recipe=recipes())
def test_every_entry_of_random_programs_is_true(recipe):
    args = example_args(recipe)
    report = verify_registry(ops_of(build(recipe), *args), default_registry())
    assert not report.wrong, str(report)


# -- the verifier catches wrong entries ------------------------------------------------------

def _weight_gradient_conv():
    case = next(c for c in CASES if c.name == "conv_same")
    for op in ops_of(case.step(), *case.args()):
        if op.name == "stablehlo.convolution" and op.results[0].type.shape == (3, 3, 4, 8):
            return op
    raise AssertionError("no weight-gradient convolution")


def test_shardy_window_reduction_entry_is_caught_and_absent(registry):
    op = _weight_gradient_conv()
    # Shardy's rule still claims the spatial reduction (factor j: image rows x gradient rows).
    assert "reduction={j, k, l}" in op.rule
    wrong = TMREntry((1, 1), (Sum("add"),), 16)
    verdict = verify_entry(op, wrong)
    assert not verdict.ok and "largest difference" in verdict.detail
    entries = registry.entries(op)
    assert wrong not in entries and TMREntry((2, 2), (Sum("add"),), 16) not in entries
    # What remains is true: batch (a plain contraction) and the feature dimensions (and the
    # halo entries, where 2 tiles keep their window geometry).
    assert TMREntry((0, 0), (Sum("add"),), 2) in entries
    verdicts = verify_op(op, entries)
    assert len(verdicts) >= 3 and all(v.ok for v in verdicts), verdicts


def test_a_deliberately_wrong_rule_is_caught():
    def reverse_rule(op):
        # Wrong on the reversed dimension: tile t of the result is the reverse of tile
        # k-1-t of the operand, not of tile t.
        shape = op.operands[0].type.shape
        return [TMREntry((d,), (d,), n) for d, n in enumerate(shape)]

    report = verify_rule(reverse_rule, lambda x: x[:, ::-1], jnp.arange(32.0).reshape(4, 8))
    assert [str(v.entry) for v in report.wrong] == ["(tile<1>) -> (tile<1>)"]
    assert [str(v.entry) for v in report.verdicts if v.ok] == ["(tile<0>) -> (tile<0>)"]


def test_a_wrong_sum_reduction_is_caught():
    registry = TileMappingRegistry()
    registry.register("stablehlo.dot_general",
                      lambda op: [TMREntry((1, 0), (Sum("max"),), op.operands[1].type.shape[0])])
    x, w = jnp.ones((4, 8)), jnp.ones((8, 2))
    report = verify_registry(ops_of(lambda a, b: a @ b, x, w), registry)
    assert len(report.wrong) == 1 and "sum<max>" in str(report.wrong[0])


# -- splits of an axis across a compound dimension (`core/splitting.py`) --------------------

def _reshapeops_of(fn, shape):
    """The reshapes of `fn` and of its gradient (a reshape's transpose is the inverse one)."""
    x = jnp.asarray(np.random.default_rng(0).normal(size=shape), jnp.float32)
    ops = ops_of(jax.value_and_grad(lambda x: jnp.sum(jnp.sin(fn(x)))), x)
    return [op for op in ops if op.name == "stablehlo.reshape"]


# (name, fn, operand shape, meshes (axis sizes, major first) whose axes tile the compound
# dimension and split)
RESHAPES = [
    ("16->4x4", lambda x: x.reshape(4, 4), (16,), [(8,), (2, 4), (2, 2, 2)]),
    ("256->4x64", lambda x: x.reshape(4, 64), (256,), [(8,), (2, 4)]),
    ("16->2x8", lambda x: x.reshape(2, 8), (16,), [(4,), (8,)]),
    # an axis of 4 on the major factor, one of 2 on the minor factor alone
    ("minor factor 16->4x4", lambda x: x.reshape(4, 4), (16,), [(4, 2)]),
    ("GQA [B,S,H*D]->[B,S,H,D], H=2", lambda x: x.reshape(2, 3, 2, 16), (2, 3, 32),
     [(4,), (8,)]),
    ("GQA queries [B,S,8*16]->[B,S,2,4,16]", lambda x: x.reshape(2, 8, 2, 4, 16),
     (2, 8, 128), [(4,), (8,), (2, 2)]),
    ("merge 4x64->256", lambda x: x.reshape(256), (4, 64), [(8,), (4, 2)]),
    ("merge [B,S,2,16]->[B,S,32]", lambda x: x.reshape(2, 3, 32), (2, 3, 2, 16), [(4,), (8,)]),
    ("merge of three 2x2x4->16", lambda x: x.reshape(16), (2, 2, 4), [(4,), (8,)]),
]


@pytest.mark.parametrize("case", RESHAPES, ids=[c[0] for c in RESHAPES])
def test_every_split_of_the_reshape_table_is_true(case, registry):
    """Each mesh splits an axis across the compound dimension (or runs a factor no entry
    offers alone) in the forward and gradient reshapes; every nest propagation derives, run
    on the sub-axes of one axis in its loops' places, gives the op's blocks."""
    _, fn, shape, meshes = case
    ops = _reshapeops_of(fn, shape)
    for sizes in meshes:
        assert any(splits_of(op, sizes, registry) for op in ops), f"nothing splits on {sizes}"
    report = verify_registry(ops, registry, parts=(2, 4), split_meshes=meshes)
    assert sum(isinstance(v.entry, Split) for v in report.verdicts) >= len(meshes)
    assert_none_wrong(report)


def test_a_deliberately_wrong_split_is_caught(registry):
    """`16 -> 4x4` on 8 devices: `model:(1)4` on the major factor, `model:(4)2` on the minor.
    The minor factor's entry alone, or the loops in the other order, give wrong blocks."""
    (op,) = [op for op in _reshapeops_of(lambda x: x.reshape(4, 4), (16,))
             if op.results[0].type.shape == (4, 4)]
    (split,) = splits_of(op, (8,), registry)
    major, minor = split.loops
    assert major == (4, TMREntry((0,), (0,), 4)) and minor == (2, TMREntry((0,), (1,), 4))
    assert str(split) == "axis:(1)4 (tile<0>) -> (tile<0>) x axis:(4)2 (tile<0>) -> (tile<1>)"
    assert verify_split(op, split).ok
    swapped = verify_split(op, Split(((2, minor[1]), (4, major[1]))))
    assert not swapped.ok and "largest difference" in swapped.detail
    # What the TMR never offers, for this reason: the minor factor's entry on a whole axis.
    assert minor[1] not in registry.entries(op)
    assert not verify_entry(op, minor[1], 2).ok
