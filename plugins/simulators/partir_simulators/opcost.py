"""Per-op work: flops, transcendentals, and which ops a backend would fuse.

Counting follows XLA's HloCostAnalysis where it has a convention (one flop per output element
of an elementwise op, 2*M*N*K for a matmul) so totals can be checked against
`compiled.cost_analysis()`.
"""

from __future__ import annotations

import math
import re

from partir_plugin.extend import Op

ELEMENTWISE = frozenset({
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "negate", "abs",
    "sign", "compare", "select", "clamp", "and", "or", "xor", "not", "shift_left",
    "shift_right_arithmetic", "shift_right_logical", "floor", "ceil", "round_nearest_afz",
    "round_nearest_even", "is_finite", "popcnt", "count_leading_zeros", "real", "imag", "complex",
    "reduce_precision", "next_after", "square",  # chlo.square (jax 0.10 lowers lax.square to it)
})
TRANSCENDENTAL = frozenset({
    "exponential", "exponential_minus_one", "log", "log_plus_one", "logistic", "tanh", "sqrt",
    "rsqrt", "cbrt", "power", "sine", "cosine", "tan", "atan2", "erf", "erf_inv", "erfc", "lgamma",
    "digamma", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "bessel_i1e",
    "polygamma", "zeta", "igamma", "igammac",
})
# Data movement a loop fusion absorbs (no flops).
MOVEMENT = frozenset({
    "broadcast_in_dim", "broadcast", "reshape", "transpose", "convert", "bitcast_convert", "slice",
    "dynamic_slice", "concatenate", "pad", "reverse", "iota", "constant", "copy",
})
FUSIBLE = ELEMENTWISE | TRANSCENDENTAL | MOVEMENT
# Ops that absorb fused producers: loop fusions plus reductions (XLA's input fusion).
FUSION_CONSUMERS = FUSIBLE | {"reduce", "reduce_window"}
# Ops that only rename a buffer (a bitcast in XLA): no kernel, no new allocation.
VIEWS = frozenset({"reshape", "bitcast_convert", "get_tuple_element", "optimization_barrier"})
# No work and no buffer of their own.
FREE = frozenset({"return", "tuple", "after_all", "create_token", "partition_id", "replica_id"})
# Ops whose read of operand 0 touches only the part they produce.
PARTIAL_READS = frozenset({"slice", "dynamic_slice", "gather"})
# Ops updating operand 0 in place (XLA buffer reuse): read and write only the update.
IN_PLACE = frozenset({"dynamic_update_slice", "scatter"})
# Recognised ops with no flops of their own beyond what is counted here.
ZERO_FLOP = MOVEMENT | VIEWS | FREE | {
    "gather", "dynamic_update_slice", "custom_call", "rng", "rng_bit_generator", "infeed",
    "outfeed", "send", "recv", "while", "case", "if", "all_reduce", "all_gather", "reduce_scatter",
    "all_to_all", "collective_permute", "collective_broadcast", "uniform_quantize",
    "uniform_dequantize",
}

# The custom call of a move between memory kinds (jax's `device_put` to a memory kind: RM's
# offload to `pinned_host` and back) and the attribute naming where its result lives.
PLACEMENT_TARGET = "annotate_device_placement"
# A host callback's custom call (`jax.debug.print`, `pure_callback`, `io_callback`): its
# operands' bytes are charged; the Python function's time is not modeled.
_HOST_CALLBACK = re.compile(r"python_(?:cpu|gpu|tpu)?_?callback")
_PLACEMENT = re.compile(r'_xla_buffer_placement\s*=\s*"([^"]*)"')


def placement(op: Op) -> str | None:
    """The memory kind a move between memory kinds puts its result in ("pinned_host",
    "device"), or None for any other op."""
    if (SHORT_NAMES[op.name] != "custom_call"
            or PLACEMENT_TARGET not in op.attributes.get("call_target_name", "")):
        return None
    m = _PLACEMENT.search(op.attributes.get("mhlo.frontend_attributes", ""))
    return m.group(1) if m else None


# Transcendentals cost several vector flops; the compute time charges this many per element.
TRANSCENDENTAL_FLOPS = 4.0


class _ShortNames(dict):
    """Full op name -> short name, filled on first sight. The simulator asks every op's short
    name a dozen times per simulation: hot loops subscript `SHORT_NAMES[op.name]` (a dict
    lookup, not a call)."""

    def __missing__(self, name: str) -> str:
        short = name
        for prefix in ("stablehlo.", "chlo.", "mhlo.", "func."):
            if name.startswith(prefix):
                short = name[len(prefix):]
                break
        self[name] = short
        return short


SHORT_NAMES = _ShortNames()


def short_name(op: Op) -> str:
    """`stablehlo.add` -> `add` (chlo/mhlo ops too)."""
    return SHORT_NAMES[op.name]


def int_list(text: str, key: str) -> list[int]:
    """Parse `key = [1, 2]` out of an attribute's MLIR text."""
    m = re.search(re.escape(key) + r"\s*=\s*\[([^\]]*)\]", text)
    if not m or not m.group(1).strip():
        return []
    return [int(x) for x in m.group(1).split(",")]


def dot_flops(op: Op) -> float:
    """2 * prod(result) * prod(contracting dims): one multiply and one add per MAC."""
    lhs = op.operands[0].type.shape
    dims = int_list(op.attributes.get("dot_dimension_numbers", ""), "lhs_contracting_dimensions")
    k = math.prod(lhs[d] for d in dims)
    return 2.0 * op.results[0].type.num_elements * k


def convolution_flops(op: Op) -> float:
    """2 * prod(result) * (kernel elements / output features): each output element is a dot of
    one kernel slice (input features per group x window) with the input."""
    kernel = op.operands[1].type
    text = op.attributes.get("dimension_numbers", "")
    m = re.search(r"x\[([^\]]*)\]", text)
    out_features = 1
    if m:
        labels = [s.strip() for s in m.group(1).split(",")]
        if "o" in labels:
            out_features = kernel.shape[labels.index("o")]
    per_output = kernel.num_elements / max(out_features, 1)
    return 2.0 * op.results[0].type.num_elements * per_output


def _region_op_count(op: Op) -> int:
    """Ops applied per element by a reducer body (its terminator excluded), at least one."""
    n = 0
    for region in op.regions:
        for block in region.blocks:
            n += sum(1 for o in block.ops if short_name(o) not in FREE | {"constant"})
    return max(n, 1)


def _window_size(op: Op) -> int:
    m = re.search(r"array<i64:\s*([^>]*)>", op.attributes.get("window_dimensions", ""))
    return math.prod(int(x) for x in m.group(1).split(",")) if m else 1


def op_work(op: Op) -> tuple[float, float, bool]:
    """(flops, transcendentals, known) of one op, regions excluded. `known` is False for ops
    this model has no formula for (counted as zero flops but still moving their bytes)."""
    name = SHORT_NAMES[op.name]
    out = op.results[0].type.num_elements if op.results and op.results[0].type.is_tensor else 0
    # The common kinds first (the name sets tested here are disjoint: order is speed only).
    if name in ELEMENTWISE:
        return float(out), 0.0, True
    if name in TRANSCENDENTAL:
        return float(out), float(out), True
    if name in ZERO_FLOP:  # a move between memory kinds is costed as one (RM's offload)
        return 0.0, 0.0, name != "custom_call" or placement(op) is not None or bool(
            _HOST_CALLBACK.search(op.attributes.get("call_target_name", "")))
    if name == "dot_general" or name == "dot":
        return dot_flops(op), 0.0, True
    if name == "convolution":
        return convolution_flops(op), 0.0, True
    if name == "reduce":
        n_inputs = max(len(op.operands) // 2, 1)
        return float(op.operands[0].type.num_elements * _region_op_count(op) / n_inputs), 0.0, True
    if name == "reduce_window":
        return float(out * _window_size(op) * _region_op_count(op)), 0.0, True
    if name == "select_and_scatter":
        return float(2 * op.operands[0].type.num_elements), 0.0, True
    if name == "scatter":
        updates = op.operands[-1].type.num_elements
        return float(updates * _region_op_count(op)), 0.0, True
    if name == "sort":
        m = re.match(r"\s*(\d+)", op.attributes.get("dimension", "0"))
        dim = int(m.group(1)) if m else 0
        shape = op.operands[0].type.shape
        n = shape[dim] if shape else 1
        return float(op.operands[0].type.num_elements * max(math.log2(max(n, 2)), 1.0)), 0.0, True
    if name == "fft":
        n = max(op.operands[0].type.num_elements, 2)
        return 5.0 * n * math.log2(n), 0.0, True
    if name == "triangular_solve":
        a, b = op.operands[0].type.shape, op.operands[1].type.shape
        m = a[-1] if a else 1
        return float(math.prod(b) * m), 0.0, True
    if name == "cholesky":
        a = op.operands[0].type.shape
        n = a[-1] if a else 1
        return float(math.prod(a[:-2]) * n**3 / 3.0), 0.0, True
    if name == "batch_norm_training" or name == "batch_norm_inference":
        return float(8 * op.operands[0].type.num_elements), 0.0, True
    if name == "batch_norm_grad":
        return float(12 * op.operands[0].type.num_elements), 0.0, True
    return 0.0, 0.0, False


# (flops, transcendentals, known, compute element, matrix op): what costing one op needs.
Work = tuple[float, float, bool, str, bool]


# Ops whose work is a function of their name and result type alone.
_BY_RESULT = ELEMENTWISE | TRANSCENDENTAL | (ZERO_FLOP - {"custom_call"})


def work(op: Op, memo: dict | None = None) -> Work:
    """`op_work`, `compute_element` and `is_matrix_op` of one op, together, kept in `memo` (a
    dict the caller keeps across programs): an elementwise or flop-free op with one result
    under its name and result type, which determine its work (unrolled layers and the
    programs after each tactic repeat those signatures thousands of times), any other op
    under the op itself."""
    if memo is None:
        return (*op_work(op), compute_element(op), is_matrix_op(op))
    results = op.results
    if len(results) == 1 and SHORT_NAMES[op.name] in _BY_RESULT:
        t = results[0].type
        key: object = (op.name, t.shape, t.element, t.opaque)
    else:
        key = op
    found = memo.get(key)
    if found is None:
        found = memo[key] = (*op_work(op), compute_element(op), is_matrix_op(op))
    return found


_MATRIX = frozenset({"dot_general", "dot", "convolution"})


def compute_element(op: Op) -> str:
    """The element type whose peak applies: the inputs' for a matmul, else the result's."""
    vals = op.operands if SHORT_NAMES[op.name] in _MATRIX else op.results
    for v in vals or op.operands:
        if v.type.is_tensor:
            return v.type.element
    return "f32"


def is_matrix_op(op: Op) -> bool:
    return SHORT_NAMES[op.name] in _MATRIX
