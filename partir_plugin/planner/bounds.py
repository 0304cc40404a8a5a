"""Cheap figures for a candidate, from argument shapes and one simulation of the replicated
step, before any candidate is partitioned: a lower bound of its memory per device (to prune)
and a rough step time (to order the simulations, best first, within the time budget)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.actions import Leaf
from ..cost import HardwareSpec
from .space import DATA, MODEL, Candidate, Roles, Rule

# Compute the RM policies add (recomputing the forward pass, or all but the matmuls), for
# ordering only; the simulator charges what the rematerialized program does.
REMAT_COMPUTE = {"full": 4 / 3, "dots": 1.15}


@dataclass(frozen=True)
class Sizes:
    """What the bounds read of the step: each argument leaf's bytes, the outputs' bytes, and
    the replicated step's simulated compute time, kernels and temporaries (its activations,
    an upper figure)."""

    leaves: tuple[tuple[Leaf, int], ...]
    output_bytes: tuple[tuple[tuple[int, ...], int], ...]  # (shape, bytes) per output leaf
    compute_s: float  # the replicated step's simulated compute time
    kernels: int  # and its kernel count
    temp_bytes: int


@dataclass(frozen=True)
class Bounds:
    """Lower bounds per device and a rough time for candidates of one step."""

    sizes: Sizes
    roles: Roles
    layers: int | None
    model_rule: Rule | None
    expert_rule: Rule | None
    hardware: HardwareSpec

    def _divisor(self, leaf: Leaf, c: Candidate) -> int:
        """How many ways `c` splits `leaf` at best (a lower bound of its tile's bytes)."""
        lay, roles, shape = c.layout, self.roles, leaf.shape
        if leaf.arg == roles.batch:
            return lay.data * lay.expert
        div = 1
        if leaf.arg in (roles.params, roles.opt_state) and shape:
            if self.layers and lay.stage > 1 and shape[0] == self.layers:
                div *= lay.stage
            if lay.model > 1 and self._splits(self.model_rule, leaf, lay.model):
                div *= lay.model
            if lay.expert > 1 and self._splits(self.expert_rule, leaf, lay.expert):
                div *= lay.expert
            zero = c.zero >= (3 if leaf.arg == roles.params else 2)
            if zero and lay.data > 1 and math.prod(shape) >= lay.data * div:
                div *= lay.data
        return div

    @staticmethod
    def _splits(rule: Rule | None, leaf: Leaf, n: int) -> bool:
        """Does `rule` split `leaf` n ways (no rule: AutomaticPartition might, so yes for a
        leaf with a dimension n divides)?"""
        shape = leaf.shape
        if rule is None:
            return any(d % n == 0 for d in shape)
        try:
            dim = rule(leaf.path, shape)
        except Exception:  # noqa: BLE001 -- a rule for params asked about an optimizer leaf
            return False
        return isinstance(dim, int) and -len(shape) <= dim < len(shape) and shape[dim] % n == 0

    def memory(self, c: Candidate, model_splits_activations: bool = True) -> int:
        """Arguments + outputs (an output shaped like an argument laid out like it, others
        spread over every device) + activations (the replicated step's temporaries spread
        over every device; none with RM). Microbatches do not divide the activations: the
        pipelined loop keeps every microbatch's until the backward pass (GPipe), as gradient
        accumulation through PP on a stage axis of one does. Without
        `model_splits_activations` the model axis leaves the activations whole (Megatron
        splits only some of them): a likelier figure, for ordering, not for pruning."""
        by_shape: dict[tuple[int, ...], int] = {}
        args = 0
        for leaf, nbytes in self.sizes.leaves:
            tile = nbytes // self._divisor(leaf, c)
            args += tile
            by_shape[leaf.shape] = min(tile, by_shape.get(leaf.shape, tile))
        n = c.layout.devices
        outs = sum(by_shape.get(shape, nbytes // n) for shape, nbytes in self.sizes.output_bytes)
        return args + outs + self.activations(c, model_splits_activations)

    def activations(self, c: Candidate, model_splits_activations: bool = True) -> int:
        """The activations part of `memory`."""
        n = c.layout.devices
        split = n if model_splits_activations else n // c.layout.model
        return 0 if c.remat else self.sizes.temp_bytes // split

    def time(self, c: Candidate) -> float:
        """A rough step time: the replicated step's compute spread over the devices,
        stretched by the bubble and RM, its kernel launches repeated per pipeline iteration
        (M+S-1 iterations of L/S layers), plus ring traffic of gradients over `data` and of
        activations over `model`. Orders simulations only."""
        hw, lay, sizes = self.hardware, c.layout, self.sizes
        overhead = sizes.kernels * hw.kernel_overhead_s
        work = max(sizes.compute_s - overhead, 0.0) / lay.devices
        compute = work * REMAT_COMPUTE.get(c.remat or "", 1.0) / (1 - c.bubble)
        iterations = (c.microbatches * c.repeats + lay.stage - 1) / lay.stage
        compute += overhead * max(iterations, 1.0)
        params = sum(b for leaf, b in sizes.leaves if leaf.arg == self.roles.params)
        comm = 0.0
        if lay.data > 1:
            grads = params / (lay.model * lay.stage * lay.expert)
            factor = {0: 2.0, 2: 2.0, 3: 3.0}[c.zero]
            comm += factor * (lay.data - 1) / lay.data * grads / _bandwidth(hw, DATA)
        if lay.model > 1:
            activations = sizes.temp_bytes / (lay.data * lay.stage * lay.expert)
            comm += 2 * (lay.model - 1) / lay.model * activations / _bandwidth(hw, MODEL)
        return compute + comm


def _bandwidth(hw: HardwareSpec, axis: str) -> float:
    return hw.link_for_axes((axis,)).bandwidth_bytes_per_s
