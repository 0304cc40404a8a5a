"""The anatomy of a differentiated scan-over-layers train step, as partir_plugin imports it.

    .venv/bin/python benchmarks/pipeline_anatomy.py [--layers 8] [--batch 2] [--full]

Traces transformer T (``Config.small(layers=L, scan=True)``, Flax ``nn.scan`` over the blocks)
with abstract arguments (``jax.eval_shape``: nothing is allocated, no device is needed) through
``partir_plugin.frontend.trace.trace`` and prints, for every top-level ``stablehlo.while``: its trip
count and index expression, and each loop-carried value classified as

- ``induction``  the counter (``i = 0; i < L; i += 1``),
- ``stacked-in`` loop-invariant, read per layer by ``dynamic_slice`` at the layer index
  (the stacked ``[L, ...]`` parameters; in the backward loop also the forward's residuals),
- ``stacked-out`` written per layer by ``dynamic_update_slice`` at the layer index (the
  forward's residual buffers; the backward's per-layer gradients),
- ``invariant``  loop-invariant, read whole (rope tables, masks, broadcast constants),
- ``carry``      anything else (the activation and, backward, its cotangent),

then how the forward loop's results feed the backward loop, and the ops between them.
``--stage-tiling`` also partitions the step on ``{stage: 4, batch: 2}`` with ``[BP, stacked
dim 0 of params and opt_state on stage]`` (what a schedule can say today) and prints the
collectives in each loop body. Used by docs/pipeline_design.md (section 1); a few seconds.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses

import harness  # noqa: F401  (before jax: repository root on sys.path)
import jax

from partir_plugin.frontend.trace import trace
from partir_plugin.ir.graph import Op, Value, walk
from partir_plugin.models import transformer
from partir_plugin.options import PartitionOptions
from partir_plugin.stages import partition


def _short(op: Op) -> str:
    return op.name.split(".", 1)[-1]


def _const(v: Value) -> str | None:
    op = v.producer
    if op is None or _short(op) != "constant":
        return None
    text = op.attributes.get("value", "")
    return text.split("<", 1)[1].split(">", 1)[0] if "<" in text else text


def _expr(v: Value, names: dict[Value, str], depth: int = 0) -> str:
    """A small printer for scalar index arithmetic (`L - i - 1`)."""
    if v in names:
        return names[v]
    c = _const(v)
    if c is not None:
        return c
    op = v.producer
    if op is None or depth > 4:
        return "?"
    sym = {"add": "+", "subtract": "-", "multiply": "*"}.get(_short(op))
    if sym and len(op.operands) == 2:
        a, b = (_expr(x, names, depth + 1) for x in op.operands)
        return f"({a} {sym} {b})"
    if _short(op) in ("reshape", "convert", "broadcast_in_dim"):
        return _expr(op.operands[0], names, depth + 1)
    return f"{_short(op)}(...)"


@dataclasses.dataclass
class Carried:
    k: int
    kind: str
    type: str
    index: str = ""
    source: str = ""


def classify(loop: Op, arg_names: dict[Value, str]) -> tuple[list[Carried], str | None]:
    body = loop.regions[1].blocks[0]
    returns = body.ops[-1].operands
    users: dict[Value, list[Op]] = collections.defaultdict(list)
    for op in walk(body.ops):
        for v in op.operands:
            users[v].append(op)
    induction = None
    for k, (arg, ret) in enumerate(zip(body.args, returns)):
        p = ret.producer
        if (arg.type.rank == 0 and p is not None and _short(p) == "add"
                and arg in p.operands and any(_const(x) for x in p.operands)):
            induction = k
    names = {body.args[induction]: "i"} if induction is not None else {}
    index_exprs = set()
    out = []
    for k, (arg, ret) in enumerate(zip(body.args, returns)):
        operand = loop.operands[k]
        src = arg_names.get(operand, "")
        if not src and operand.producer is not None:
            p = operand.producer
            src = f"{_short(p)}#{operand.index}" if _short(p) == "while" else _short(p)
        item = Carried(k, "carry", str(arg.type), source=src)
        if k == induction:
            item.kind = "induction"
        elif ret is arg:
            slices = [u for u in users[arg]
                      if _short(u) == "dynamic_slice" and u.operands[0] is arg]
            if slices:
                item.kind = "stacked-in"
                item.index = _expr(slices[0].operands[1], names)
            else:
                item.kind = "invariant"
        elif (ret.producer is not None and _short(ret.producer) == "dynamic_update_slice"
              and ret.producer.operands[0] is arg):
            item.kind = "stacked-out"
            item.index = _expr(ret.producer.operands[2], names)
        if item.index:
            index_exprs.add(item.index)
        out.append(item)
    return out, " / ".join(sorted(index_exprs)) or None


def trip_count(loop: Op) -> str:
    cond = loop.regions[0].blocks[0]
    cmp = cond.ops[-1].operands[0].producer
    if cmp is None or _short(cmp) != "compare":
        return "?"
    limit = [_const(v) for v in cmp.operands if _const(v) is not None]
    k = next((cond.args.index(v) for v in cmp.operands if v in cond.args), None)
    start = _const(loop.operands[k]) if k is not None else None
    return f"{start}..{limit[0]}" if limit and start is not None else "?"


def nbytes(t) -> int:
    return t.num_elements * t.itemsize


def stage_tiling(traced, arg_names: dict[Value, str]) -> None:
    """Today's answer to "tile the stacked layer dimension over a stage axis"."""
    import partir_plugin as partir
    from partir_plugin.core.mesh import Mesh
    from partir_plugin.spmd.collectives import collective_kind

    def stacked(path, shape):
        return 0 if path.split("/")[0] == "blocks" or "/blocks/" in f"/{path}" else None

    layers = partir.ManualPartition(inputs={"params": stacked, "opt_state": stacked},
                                    axis="stage", name="stacked@stage")
    mesh = Mesh.of({"stage": 4, "batch": 2})
    done = partition(traced, mesh, [partir.tactic("BP", axis="batch"), layers],
                     PartitionOptions(scatter_sums=True))
    state = done.state
    print(f"\n== --stage-tiling on {dict(mesh.shape)}: [BP, stacked@stage]; "
          f"conflicts {len(state.conflicts)}")
    for op in traced.func.ops:
        if op.name == "stablehlo.while":
            items, _ = classify(op, arg_names)
            tiled = collections.Counter(
                (c.kind, "stage-tiled" if state.dim_of(op.results[c.k], "stage") is not None
                 else "replicated on stage") for c in items if c.kind.startswith("stacked"))
            print(f"   {op.location}: " + ", ".join(f"{k} {t}: {n}"
                                                  for (k, t), n in sorted(tiled.items())))
    top = done.program.func.ops
    for op in top:
        if op.name == "stablehlo.while":
            body = op.regions[1].blocks[0]
            kinds = collections.Counter(
                f"{collective_kind(o)} over {o.attributes.get('partir.axes')}"
                for o in walk(body.ops) if collective_kind(o))
            print(f"   device-local while, collectives per iteration: {dict(kinds)}")
    outside = collections.Counter(f"{collective_kind(o)} over {o.attributes.get('partir.axes')}"
                                  for o in top if collective_kind(o))
    print(f"   outside the loops: {dict(outside)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--full", action="store_true", help="list every carried value")
    parser.add_argument("--stage-tiling", action="store_true",
                        help="also partition with the stacked dimension tiled over a stage "
                             "axis (needs --batch divisible by 2)")
    opts = parser.parse_args()
    cfg = dataclasses.replace(transformer.Config.small(layers=opts.layers, scan=True),
                              batch=opts.batch)
    step = transformer.make_train_step(cfg)
    args = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
    traced = trace(step, args)
    func = traced.func
    arg_names = {lf.value: lf.qualified for lf in traced.leaves}
    top = func.ops
    loops = [i for i, op in enumerate(top) if op.name == "stablehlo.while"]
    print(f"T small, L={cfg.layers}, batch={cfg.batch}, seq={cfg.seq_len}, d_model={cfg.d_model}, "
          f"heads={cfg.heads}x{cfg.head_dim}, ffw={cfg.ffw}")
    print(f"imported: {len(top)} top-level ops, {sum(1 for _ in walk(top))} ops in all, "
          f"{len(loops)} top-level while loops at op positions {loops}")
    summaries = []
    for n, pos in enumerate(loops):
        loop = top[pos]
        items, index = classify(loop, arg_names)
        body = loop.regions[1].blocks[0]
        body_ops = collections.Counter(_short(o) for o in walk(body.ops))
        kinds = collections.Counter(c.kind for c in items)
        phase = "backward (transposed)" if "transpose" in (loop.location or "") else "forward"
        print(f"\n== while #{n} at op {pos}: {phase}; name stack {loop.location!r}")
        print(f"   trip count {trip_count(loop)}; layer index in the body: {index}")
        print(f"   {len(items)} carried values: " + ", ".join(f"{v} {k}" for k, v in kinds.items()))
        print(f"   body: {sum(body_ops.values())} ops; " + ", ".join(
            f"{k} {v}" for k, v in body_ops.most_common()
            if k in ("dot_general", "dynamic_slice", "dynamic_update_slice", "add", "reduce")))
        for kind in ("stacked-in", "stacked-out", "carry", "invariant", "induction"):
            group = [c for c in items if c.kind == kind]
            if not group:
                continue
            total = sum(nbytes(loop.operands[c.k].type) for c in group)
            print(f"   {kind:11s} {len(group):2d}  {total / 1024:8.1f} KiB")
            shown = group if opts.full or kind in ("carry", "induction") else group[:3]
            for c in shown:
                print(f"       [{c.k:2d}] {c.type:28s} {c.index:12s} from {c.source}")
            if len(shown) < len(group):
                print(f"       ... {len(group) - len(shown)} more (--full)")
        summaries.append((pos, loop, items))
    if len(summaries) == 2:
        (fpos, fwd, fitems), (bpos, bwd, bitems) = summaries
        fres = {r: i for i, r in enumerate(fwd.results)}
        fed = collections.Counter()
        for c in bitems:
            operand = bwd.operands[c.k]
            if operand in fres:
                fed[(fitems[fres[operand]].kind, c.kind)] += 1
        print("\n== forward results -> backward operands (forward kind -> backward kind): "
              + ", ".join(f"{a} -> {b}: {n}" for (a, b), n in sorted(fed.items())))
        direct = sum(1 for c in bitems if bwd.operands[c.k] in arg_names)
        print(f"   backward operands that are step arguments (stacked params read again): {direct}")
        between = collections.Counter(_short(o) for o in top[fpos + 1:bpos])
        print(f"== between the loops: {bpos - fpos - 1} ops (final norm, unembed, loss and its "
              f"gradient, zero-filled gradient buffers): " + ", ".join(
                  f"{k} {v}" for k, v in between.most_common(8)))
        before = collections.Counter(_short(o) for o in top[:fpos])
        after = collections.Counter(_short(o) for o in top[bpos + 1:])
        print(f"== before the forward loop: {fpos} ops ({before.most_common(4)}); after the "
              f"backward loop: {len(top) - bpos - 1} ops (embedding gradient, Adam): "
              f"{after.most_common(4)}")
    if opts.stage_tiling:
        stage_tiling(traced, arg_names)


if __name__ == "__main__":
    main()
