"""Verifying TMR entries by running them: the paper's "temporal interpretation" of loops.

A TMR entry claims an equivalence: slicing the op's inputs as the entry names and running the
op on each tile gives the tiles of the whole op's results (or partial results whose reduction
is the whole result, for `Sum`). A wrong entry gives wrong numbers silently, wherever
propagation chooses it, so entries are checked here, at the entry, before any program is
partitioned: for an op, every entry is lowered exactly as a partitioned program would lower it
(the lowering's local shapes, attribute rewrites, iota offsets and vocabulary masks), the tiles
are run one after the other on one device, and their results are compared with the op run
whole, in plain jax.

Each entry gets a mesh axis of its own, so one probe program holds the whole op and one copy
per entry: the device whose coordinate is `t` on every axis runs tile `t` of every entry, and
its partition id is an argument of the probe (a "temporal" loop over t on one device). One
compile per op, `parts` runs.

The loops propagation derives where an axis splits across a compound dimension
(`core/splitting.py`: `[256] -> [4, 64]` on 8 devices loops over `model:(1)4` with the entry
of the major factor and `model:(4)2` with the minor one's) are no TMR entries: an entry alone
is wrong there (the minor factor's is only true inside the major one's loop). Such a `Split`
is checked as a whole, on one axis of the probe split into the same sub-axes: each of its
devices' tiles must be the block of the whole result that the produced layout names.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.mesh import Mesh
from ..core.propagation import propagate
from ..core.rules.halo import HaloEntry
from ..core.rules.prefix_scan import ScanEntry
from ..core.splitting import compound_dims
from ..core.state import PartitionState
from ..core.subaxis import SubAxis
from ..core.tmr import Rule, Sum, TileMappingRegistry, TMREntry
from ..ir.graph import Block, Func, Op, Value, clone_region, walk
from ..ir.types import TensorType, numpy_dtype_of
from ..spmd.collectives import count_collectives
from ..spmd.layout import Layout
from ..spmd.lowering import lower_to_spmd

_RULE = re.compile(r"#sdy\.op_sharding_rule<(\(.*?\)->\(.*?\))")
# Reductions of partial results, as numpy folds over the tiles' partials.
_COMBINE: dict[str, Callable] = {
    "add": np.add, "max": np.maximum, "min": np.minimum, "mul": np.multiply,
    "and": np.logical_and, "or": np.logical_or}
# Inputs made by these producers are part of the op's meaning for its rule (a reduction's
# identity init, a scatter into zeros): the probe keeps them as constants, not arguments.
_KEPT_PRODUCERS = frozenset({"stablehlo.constant", "stablehlo.iota"})
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
# Integer operands of these ops divide: the probe's random integers avoid zero.
_DIVIDING = frozenset({"stablehlo.divide", "stablehlo.remainder"})


@dataclass(frozen=True)
class Split:
    """Nested loops over parts of one axis, major first, as (part size, entry): how an op runs
    where an axis of `prod(sizes)` splits across a compound dimension (`core/splitting.py`)."""

    loops: tuple[tuple[int, TMREntry], ...]

    @property
    def size(self) -> int:
        return int(np.prod([n for n, _ in self.loops]))

    def axes(self, axis: str) -> list[str]:
        """The sub-axes of an `axis` of `size` devices the loops run over, major first."""
        names, pre = [], 1
        for n, _ in self.loops:
            names.append(SubAxis(axis, pre, n).spelling(self.size))
            pre *= n
        return names

    def __str__(self) -> str:
        return " x ".join(f"{a} {e}" for a, (_, e) in zip(self.axes("axis"), self.loops))


@dataclass(frozen=True)
class EntryVerdict:
    """The check of one entry (or split) of one op: `ok`, or what differs (`detail`)."""

    op_name: str
    entry: TMREntry | Split
    parts: int
    ok: bool
    detail: str = ""
    location: str | None = None

    def __str__(self) -> str:
        where = f" at {self.location}" if self.location else ""
        state = "ok" if self.ok else f"WRONG: {self.detail}"
        return f"{self.op_name}{where} {self.entry} in {self.parts} tiles: {state}"


@dataclass
class VerificationReport:
    """Verdicts over a corpus of ops; `skipped` names ops that could not be probed, and why."""

    verdicts: list[EntryVerdict] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def wrong(self) -> list[EntryVerdict]:
        return [v for v in self.verdicts if not v.ok]

    def __str__(self) -> str:
        lines = [f"{len(self.verdicts)} entries verified, {len(self.wrong)} wrong, "
                 f"{len(self.skipped)} ops skipped"]
        lines += [f"  {v}" for v in self.wrong]
        lines += [f"  skipped {k}: {why}" for k, why in self.skipped.items()]
        return "\n".join(lines)


class NotProbeable(Exception):
    """The op cannot be run alone (opaque types, side effects): nothing to verify."""


def verify_op(op: Op, entries: Sequence[TMREntry], parts: int = 2, *, seed: int = 0
              ) -> list[EntryVerdict]:
    """Check each of `op`'s `entries` (those the tiled dimensions allow in `parts` tiles).

    Raises `NotProbeable` for ops that cannot run alone."""
    usable = [e for e in entries if _splits(op, e, parts)]
    halos = [_verify_side_by_side(op, e, parts, seed) for e in usable if _communicates(e)]
    usable = [e for e in usable if not _communicates(e)]
    return (_run([_Probe.of_entries(op, usable, parts, seed)]) if usable else []) + halos


def verify_entry(op: Op, entry: TMREntry, parts: int = 2) -> EntryVerdict:
    """Check one entry of `op`: for plugin authors testing their own TMR rules."""
    verdicts = verify_op(op, [entry], parts)
    if not verdicts:
        raise ValueError(f"entry {entry} cannot split {op.name}'s dimensions in {parts} tiles")
    return verdicts[0]


def verify_split(op: Op, split: Split, *, seed: int = 0) -> EntryVerdict:
    """Check `op` run in the nested loops of `split`."""
    return _run([_Probe.of_split(op, split, seed)])[0]


def splits_of(op: Op, sizes: Sequence[int], registry: TileMappingRegistry) -> list[Split]:
    """The loop nests propagation gives `op` (`propagate`, with `split_loops` where no entry
    fits) when one of its compound dimensions arrives tiled on axes of `sizes` devices (major
    first), where some loop runs over part of an axis or a factor no entry offers alone (the
    minor factor of a compound dimension), each once. Such a nest runs as a `Split` on one axis
    whose sub-axes take the loops' places, major first."""
    if op.captures or len(op.results) != 1:
        return []
    names = [f"e{i}" for i in range(len(sizes))]
    mesh = Mesh(tuple(zip(names, sizes)))
    offered = set(registry.entries(op))
    found: dict[Split, None] = {}
    for k, d in compound_dims(op):
        body, env, _ = _probe_inputs(op)
        copy = _copy_op(op, body, env)
        state = PartitionState(Func("probe", body, list(copy.results)), mesh, registry)
        v = [*copy.operands, *copy.results][k]
        if any(state.can_tile(v, d, a, padding=False) is not None
               or not state.tile_value(v, d, a) for a in names):
            continue  # the axes do not divide the dimension
        propagate(state)
        nest = state.nest_of(copy)
        covered = {mesh.sub_axis(a).parent: 1 for a in names}
        for a, _ in nest:
            covered[mesh.sub_axis(a).parent] *= mesh.axis_size(a)
        if covered != dict(zip(names, sizes)) or all(
                a in names and e in offered for a, e in nest):
            continue  # not looped over every axis, or only with the registry's entries
        def rank(loop: tuple[str, TMREntry]) -> tuple[int, int]:
            sub = mesh.sub_axis(loop[0])
            return names.index(sub.parent), sub.pre

        found[Split(tuple((mesh.axis_size(a), e) for a, e in sorted(nest, key=rank)))] = None
    return list(found)


def verify_registry(ops: Iterable[Op], registry: TileMappingRegistry, parts: Sequence[int] = (2,),
                    *, batch: int = 8, split_meshes: Sequence[Sequence[int]] | None = None
                    ) -> VerificationReport:
    """Check every entry `registry` gives for each distinct op of `ops` (ops repeated with the
    same signature, as a model's layers repeat them, are probed once), and every split that
    propagation derives for it where its compound dimensions arrive tiled on axes of the
    sizes of each of `split_meshes` (`splits_of`; default: one axis of each size in `parts`).
    Probes run `batch` at a time in one program: compiling costs more than running."""
    report = VerificationReport()
    seen: set = set()
    probes: dict[int, list[_Probe]] = {p: [] for p in parts}
    for op in ops:
        entries = registry.entries(op)
        if not entries:
            continue
        key = _signature(op, entries)
        if key in seen:
            continue
        seen.add(key)
        for p in parts:
            usable = [e for e in entries if _splits(op, e, p)]
            report.verdicts += [_verify_side_by_side(op, e, p, len(seen)) for e in usable
                                if _communicates(e)]
            usable = [e for e in usable if not _communicates(e)]
            try:
                if usable:
                    probes[p].append(_Probe.of_entries(op, usable, p, seed=len(seen)))
            except NotProbeable as e:
                report.skipped[op.name] = str(e)
        for sizes in split_meshes if split_meshes is not None else [(p,) for p in parts]:
            for split in splits_of(op, sizes, registry):
                try:
                    probe = _Probe.of_split(op, split, seed=len(seen))
                except NotProbeable as e:
                    report.skipped[op.name] = str(e)
                    continue
                probes.setdefault(probe.parts, []).append(probe)
    for group in probes.values():
        for i in range(0, len(group), batch):
            report.verdicts += _run(group[i:i + batch])
    return report


def _run(probes: list[_Probe]) -> list[EntryVerdict]:
    """Run `probes` (of one tile count) in one program; compare each with its op run whole."""
    parts = probes[0].parts
    run = _compile([p.func for p in probes])
    inputs = [x for p in probes for x in (np.uint32(0), *p.inputs)]
    starts = np.cumsum([0] + [1 + len(p.inputs) for p in probes])
    tiles = []
    for t in range(parts):
        for p, s in zip(probes, starts):
            inputs[s] = np.uint32(p.device_of_tile(t))
        tiles.append([np.asarray(o) for o in run(*inputs)])
    verdicts, offset = [], 0
    for p in probes:
        n = len(p.op.results)
        whole = tiles[0][offset: offset + n]
        for i, item in enumerate(p.items):
            lo = offset + n * (i + 1)
            runs = [(p.device_of_tile(t), outs[lo: lo + n]) for t, outs in enumerate(tiles)]
            detail = _compare(p.mesh, p.layouts[lo - offset: lo - offset + n], whole, runs)
            verdicts.append(EntryVerdict(p.op.name, item, parts, detail is None, detail or "",
                                         p.op.location))
        offset += n * (1 + len(p.items))
    return verdicts


def verify_rule(rule: Rule, fn: Callable, *args, parts: Sequence[int] = (2,)
                ) -> VerificationReport:
    """Check the entries `rule` gives for the ops of `jax.jit(fn).lower(*args)`: how a plugin
    author tests a TMR rule before registering it (ops the rule returns None for are not
    checked)."""
    import jax

    from ..ir.importer import import_lowered

    func = import_lowered(jax.jit(fn).lower(*args))
    registry = TileMappingRegistry()
    for name in {op.name for op in walk(func.ops)}:
        registry.register(name, rule)
    return verify_registry(walk(func.ops), registry, parts)


def ops_of(func: Func) -> Iterable[Op]:
    """Every op of a function, regions included: the corpus a model contributes."""
    return walk(func.ops)


# -- the probe -----------------------------------------------------------------------------

def _splits(op: Op, entry: TMREntry, parts: int) -> bool:
    if isinstance(entry, HaloEntry) and entry.factor_size == 1:
        return entry.halo.fits([parts])  # a window that keeps its geometry on padded tiles only
    if entry.factor_size % parts:
        return False
    dims = [(v, d) for v, d in zip(op.inputs, entry.operands) if d is not None]
    dims += [(r, d) for r, d in zip(op.results, entry.results) if not isinstance(d, Sum)]
    return all(v.type.shape[d] % parts == 0 for v, d in dims)


def _kept(v: Value) -> bool:
    """Is `v` made by a producer the probe keeps (a constant, possibly broadcast)?"""
    p = v.producer
    if p is not None and p.name == "stablehlo.broadcast_in_dim":
        p = p.operands[0].producer
    return p is not None and p.name in _KEPT_PRODUCERS and not p.operands


class _Probe:
    """`op` whole plus one copy per item (an entry or a split), each copy looped over its own
    `loops` on `mesh`, whose axes all have `parts` devices."""

    def __init__(self, op: Op, items: list[TMREntry | Split],
                 loops: list[list[tuple[str, TMREntry]]], mesh: Mesh, seed: int = 0):
        for v in (*op.inputs, *op.results):
            if not v.type.is_tensor:
                raise NotProbeable("an operand or result is not a tensor")
            try:
                numpy_dtype_of(v.type.element)
            except TypeError as e:
                raise NotProbeable(str(e)) from None
        self.op, self.items, self.mesh = op, items, mesh
        self.parts = mesh.axes[0][1]
        body, env, self.arg_sources = _probe_inputs(op)
        copies = [_copy_op(op, body, env) for _ in range(1 + len(items))]
        returns = [r for c in copies for r in c.results]
        func = Func("probe", body, returns)
        state = PartitionState(func, self.mesh, TileMappingRegistry())
        for copy, nest in zip(copies[1:], loops):
            for axis, entry in nest:
                state.add_loop(copy, axis, entry)
        program = lower_to_spmd(state, as_produced=True)
        self.func, self.layouts = program.func, program.out_layouts
        if any(count_collectives(self.func.ops).values()):
            raise NotProbeable("its tiles need communication when run alone")
        _partition_id_as_argument(self.func)
        self.inputs = _random_inputs(op, self.arg_sources, seed)

    @classmethod
    def of_entries(cls, op: Op, entries: list[TMREntry], parts: int, seed: int = 0) -> _Probe:
        """Each entry looped on a mesh axis of its own."""
        mesh = Mesh(tuple((f"e{i}", parts) for i in range(len(entries))))
        return cls(op, list(entries), [[(f"e{i}", e)] for i, e in enumerate(entries)], mesh,
                   seed)

    @classmethod
    def of_split(cls, op: Op, split: Split, seed: int = 0) -> _Probe:
        """The split's loops on the sub-axes of one mesh axis."""
        mesh = Mesh((("e", split.size),))
        loops = [(a, e) for a, (_, e) in zip(split.axes("e"), split.loops)]
        return cls(op, [split], [loops], mesh, seed)

    def device_of_tile(self, t: int) -> int:
        """The device whose coordinate is `t` on every axis: it runs tile t of every entry."""
        return sum(t * self.mesh.stride(a) for a in self.mesh.names)



def _probe_inputs(op: Op) -> tuple[Block, dict[Value, Value], list[Value]]:
    """A probe body with an argument per input of `op` (constants kept), the map from op
    inputs to probe values, and the original value behind each argument."""
    body, env, sources = Block(), {}, []
    for v in op.inputs:
        if v in env:
            continue
        if _kept(v):
            env[v] = _clone_chain(v, body, env)
        else:
            env[v] = body.add_arg(v.type)
            sources.append(v)
    return body, env, sources


def _copy_op(op: Op, body: Block, env: dict[Value, Value]) -> Op:
    inner = dict(env)
    regions = [clone_region(r, inner) for r in op.regions]
    new = Op(op.name, [env[v] for v in op.operands], [r.type for r in op.results],
             dict(op.attributes), regions)
    new.rule, new.captures = op.rule, [env[v] for v in op.captures]
    body.ops.append(new)
    return new


def _communicates(entry: TMREntry) -> bool:
    """Does the entry's lowering communicate inside the op: a halo entry's tiles read their
    neighbours' rows, a scan gathers the tile totals, an own-reducer Sum its partials?"""
    return isinstance(entry, (HaloEntry, ScanEntry)) or any(
        isinstance(r, Sum) and not r.pending for r in entry.results)


def _verify_side_by_side(op: Op, entry: TMREntry, parts: int, seed: int) -> EntryVerdict:
    """An entry that communicates inside the op (`_communicates`), which the temporal probe,
    one tile at a time on one device, cannot run: its tiles run side by side on `parts`
    devices, lowered as a partitioned program is (partial sums reduced), and the assembled
    results are compared with the op run whole."""
    import jax

    from ..runtime.executable import DeviceLocalFunction, jax_mesh_for

    body, env, sources = _probe_inputs(op)
    copy = _copy_op(op, body, env)
    func = Func("probe", body, list(copy.results))
    mesh = Mesh((("e0", parts),))
    state = PartitionState(func, mesh, TileMappingRegistry())
    state.add_loop(copy, "e0", entry)
    program = lower_to_spmd(state)
    avals = [jax.core.ShapedArray(r.type.shape, numpy_dtype_of(r.type.element))
             for r in op.results]
    tiled = DeviceLocalFunction("tmr_halo_probe", program.text(), jax_mesh_for({"e0": parts}),
                                program.in_layouts, program.out_layouts, avals)
    inputs = _random_inputs(op, sources, seed)
    got = [np.asarray(x) for x in jax.jit(tiled)(*inputs)]
    # The op whole, lowered too: ops the importer fuses (a padded select_and_scatter) only
    # exist as StableHLO once lowered.
    alone = PartitionState(func, Mesh((("e0", 1),)), TileMappingRegistry())
    whole = [np.asarray(x) for x in
             _compile([lower_to_spmd(alone, as_produced=True).func])(*inputs)]
    detail = next((d for j, (g, w) in enumerate(zip(got, whole))
                   if (d := _difference(j, g, w))), None)
    return EntryVerdict(op.name, entry, parts, detail is None, detail or "", op.location)


def _compile(funcs: list[Func]) -> Callable:
    """One jitted function running `funcs` side by side on one device: their arguments and
    results concatenated."""
    import jax

    from ..ir.printer import print_func
    from ..runtime.executable import DeviceLocalFunction, jax_mesh_for

    body = Block()
    for f in funcs:
        for a in f.body.args:
            a.owner, a.index = body, len(body.args)
            body.args.append(a)
        body.ops += f.body.ops
    merged = Func("probe", body, [v for f in funcs for v in f.returns])
    out_avals = [jax.core.ShapedArray(v.type.shape, numpy_dtype_of(v.type.element))
                 for v in merged.returns]
    fn = DeviceLocalFunction(
        "tmr_probe", print_func(merged), jax_mesh_for({"probe": 1}),
        [Layout.replicated(a.type.rank) for a in body.args],
        [Layout.replicated(v.type.rank) for v in merged.returns], out_avals)
    # The probes are run a few times on small arrays: XLA's backend optimisations cost more
    # than they save.
    args = [jax.ShapeDtypeStruct(a.type.shape, numpy_dtype_of(a.type.element))
            for a in body.args]
    return jax.jit(fn).lower(*args).compile(compiler_options=_FAST_COMPILE)


def _clone_chain(v: Value, body: Block, env: dict[Value, Value]) -> Value:
    """Clone the (constant, maybe broadcast) producer chain of `v` into `body`."""
    p = v.producer
    operands = [env[u] if u in env else _clone_chain(u, body, env) for u in p.operands]
    new = Op(p.name, operands, [r.type for r in p.results], dict(p.attributes))
    new.rule = p.rule
    body.ops.append(new)
    env[v] = new.results[v.index]
    return env[v]


def _partition_id_as_argument(func: Func) -> None:
    """Replace the program's partition id by a new first argument (ui32): the tile to run."""
    device = Value(TensorType((), "ui32"), func.body, 0)
    func.body.args.insert(0, device)
    for i, a in enumerate(func.body.args):
        a.index = i
    pids = [op for op in func.ops if op.name == "stablehlo.partition_id"]
    for op in walk(func.ops):
        if op.name == "stablehlo.partition_id" and op not in pids:
            raise NotProbeable("a partition id inside a region")
    gone = {p.results[0] for p in pids}
    for op in walk(func.ops):
        op.operands = [device if v in gone else v for v in op.operands]
    func.body.ops[:] = [op for op in func.ops if op not in pids]


# -- inputs and comparison -------------------------------------------------------------------

def _random_inputs(op: Op, sources: list[Value], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    bound = max([2, *(s for v in op.inputs for s in v.type.shape)])
    out = []
    for v in sources:
        dtype = numpy_dtype_of(v.type.element)
        shape = v.type.shape
        if dtype == np.bool_:
            out.append(rng.random(shape) < 0.5)
        elif np.issubdtype(dtype, np.integer):
            low = 1 if op.name in _DIVIDING else 0
            high = min(bound, np.iinfo(dtype).max)
            out.append(rng.integers(low, max(high, low + 1), shape).astype(dtype))
        elif np.issubdtype(dtype, np.complexfloating):
            out.append((rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype))
        else:
            out.append(rng.normal(size=shape).astype(dtype))
    return out


def _compare(mesh: Mesh, layouts: Sequence[Layout], whole: list[np.ndarray],
             runs: list[tuple[int, list[np.ndarray]]]) -> str | None:
    """What differs between the whole results and the tiles the devices of `runs` produced
    in `layouts`, or None: each device's tile must be the block of the whole result that
    its layout names, once the partial results of the devices holding it are combined."""
    for j, (layout, want) in enumerate(zip(layouts, whole)):
        counts = [mesh.product(axes) for axes in layout.dims]
        if any(n % k for n, k in zip(want.shape, counts)):
            return f"result {j}: layout {layout} does not divide shape {want.shape}"
        extents = [n // k for n, k in zip(want.shape, counts)]
        held: dict[tuple[int, ...], list[np.ndarray]] = {}
        for r, outs in runs:
            held.setdefault(_block_of(mesh, layout, r), []).append(outs[j])
        reductions = {reduction for _, reduction in layout.partial}
        for block, parts in held.items():
            if reductions:
                (reduction,) = reductions
                parts = [functools.reduce(_COMBINE[reduction], parts)]
            index = tuple(slice(b * n, (b + 1) * n) for b, n in zip(block, extents))
            detail = next((d for p in parts if (d := _difference(j, p, want[index]))), None)
            if detail:
                return detail
    return None


def _block_of(mesh: Mesh, layout: Layout, r: int) -> tuple[int, ...]:
    """The block of a value in `layout` that device `r` holds: per dimension, the device's
    coordinates along the dimension's axes as one mixed-radix number (major first)."""
    block = []
    for axes in layout.dims:
        b = 0
        for a in axes:
            b = b * mesh.axis_size(a) + mesh.coord(r, a)
        block.append(b)
    return tuple(block)


def _difference(j: int, got: np.ndarray, want: np.ndarray) -> str | None:
    if got.shape != want.shape:
        return f"result {j}: tiles make shape {got.shape}, the op {want.shape}"
    if not _close(got, want):
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        return (f"result {j}: largest difference {np.nanmax(diff):.4g} where the largest "
                f"value is {np.nanmax(np.abs(want.astype(np.float64))):.4g}")
    return None


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    if not np.issubdtype(b.dtype, np.inexact):
        return bool(np.array_equal(a, b))
    a64, b64 = a.astype(np.complex128 if np.iscomplexobj(b) else np.float64), \
        b.astype(np.complex128 if np.iscomplexobj(b) else np.float64)
    finite = np.abs(b64[np.isfinite(b64)]) if b64.size else np.zeros(1)
    scale = max(1.0, float(finite.max()) if finite.size else 1.0)
    eps = float(np.finfo(b.dtype).eps) if b.dtype.kind == "f" else 1e-6
    return bool(np.allclose(a64, b64, rtol=64 * eps, atol=64 * eps * scale, equal_nan=True))


def _pointwise(op: Op) -> bool:
    """Does Shardy's rule give every operand and result the same factors, dimension by
    dimension (an elementwise op)?"""
    m = _RULE.match(op.rule or "")
    return bool(m) and not op.regions and len(set(re.findall(r"\[[^\]]*\]", m.group(1)))) == 1

def _signature(op: Op, entries: Sequence[TMREntry]) -> tuple:
    """What makes two ops the same probe: types, attributes, region ops, kept constants."""
    def producers(v: Value) -> tuple:
        if not _kept(v):
            return ()
        p = v.producer
        return ((p.name, tuple(sorted(p.attributes.items()))),
                *(producers(u) for u in p.operands))

    body = tuple((o.name, tuple(sorted(o.attributes.items())))
                 for r in op.regions for b in r.blocks for o in walk(b.ops))
    types = [v.type for v in (*op.inputs, *op.results)]
    if _pointwise(op):  # what holds for one shape holds for all: keep ranks and elements
        types = [(t.rank, t.element) for t in types]
        entries = tuple(str(e) for e in entries)
    return (op.name, tuple(types),
            tuple(sorted(op.attributes.items())), tuple(producers(v) for v in op.inputs),
            tuple(entries), body)
