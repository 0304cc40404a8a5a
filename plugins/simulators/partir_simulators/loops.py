"""Loops: how many times a `while` body runs, when the loop is a counted loop (`i = c0; i <
c1; i += c2`, as `fori_loop` and `scan` emit; None when the count depends on data: the
simulator then costs one iteration and reports it), and which of its carried values XLA
removes before it runs (`unread_carries`)."""

from __future__ import annotations

import math
import re

from partir_plugin.extend import Op, Value

from .opcost import placement, short_name


def _const_int(v: Value) -> int | None:
    op = v.producer
    if op is None or short_name(op) != "constant":
        return None
    m = re.match(r"\s*dense<(-?\d+)>", op.attributes.get("value", ""))
    return int(m.group(1)) if m else None


def trip_count(op: Op) -> int | None:
    """Iterations of a counted `while` (`i = c0; i <op> c1; i += c2`), None if not one."""
    if len(op.regions) < 2:
        return None
    cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
    if not cond.ops or not cond.ops[-1].operands:
        return None
    cmp = cond.ops[-1].operands[0].producer
    if cmp is None or short_name(cmp) != "compare":
        return None
    m = re.search(r"comparison_direction\s+(\w+)", cmp.attributes.get("comparison_direction", ""))
    if not m:
        return None
    direction = m.group(1)
    a, b = cmp.operands
    if b in cond.args and _const_int(a) is not None:
        a, b = b, a
        direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction, direction)
    if a not in cond.args or _const_int(b) is None:
        return None
    i = cond.args.index(a)
    limit, init = _const_int(b), _const_int(op.operands[i])
    if init is None or not body.ops or i >= len(body.ops[-1].operands):
        return None
    upd = body.ops[-1].operands[i].producer
    if upd is None or short_name(upd) not in ("add", "subtract"):
        return None
    x, c = upd.operands
    if short_name(upd) == "add" and x is not body.args[i]:
        x, c = c, x
    step = _const_int(c)
    if x is not body.args[i] or not step:
        return None
    step = -step if short_name(upd) == "subtract" else step
    span = limit - init
    if direction == "LT" and step > 0:
        n = math.ceil(span / step)
    elif direction == "LE" and step > 0:
        n = span // step + 1
    elif direction == "GT" and step < 0:
        n = math.ceil(span / step)
    elif direction == "GE" and step < 0:
        n = span // step + 1
    elif direction == "NE" and span % step == 0 and span / step >= 0:
        n = span // step
    else:
        return None
    return max(int(n), 0)


def unread_carries(op: Op, unused_results: set[int]) -> set[int]:
    """Indices of a `while`'s carried values that XLA's while-loop simplifier removes
    (`TryRemoveDeadWhileParams`): the body returns its argument unchanged, nothing in the
    body or the condition reads it, and the loop's result is unused (`unused_results`). JAX
    emits such carries for e.g. the zero cotangents of a pipelined scan's inputs; XLA never
    allocates them, nor the broadcast that initialises them."""
    if len(op.regions) < 2 or not unused_results:
        return set()
    cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
    if not body.ops:
        return set()
    returned = body.ops[-1].operands
    read: set[Value] = set()
    for block, skip in ((cond, None), (body, body.ops[-1])):
        for o in block.ops:
            if o is not skip:
                read.update(o.inputs)
    dead = set()
    for i in unused_results:
        if (i < len(returned) and i < len(body.args) and returned[i] is body.args[i]
                and body.args[i] not in read and cond.args[i] not in read
                and sum(v is body.args[i] for v in returned) == 1):
            dead.add(i)
    return dead


def _carried(op: Op) -> list[tuple[Value, Value]]:
    """A `while`'s carried values as (the body's argument, what the body returns for it);
    none for a loop without a body."""
    if len(op.regions) < 2 or not op.regions[1].blocks[0].ops:
        return []
    body = op.regions[1].blocks[0]
    return list(zip(body.args, body.ops[-1].operands))


def passed_through(op: Op) -> set[int]:
    """Indices of a `while`'s carried values that its body returns unchanged (loop
    invariants: a scan's weights, its inputs read by index). XLA's copy insertion copies no
    read-only value into the loop, so the loop's result there is its operand's buffer."""
    return {i for i, (a, r) in enumerate(_carried(op)) if a is r}


# Ops through which a moved value keeps its memory kind (a view of it, or of its elements).
_KIND_VIEWS = frozenset({"reshape", "broadcast_in_dim", "bitcast_convert", "convert"})


def host_carries(op: Op) -> set[int]:
    """Indices of a `while`'s carried values that live in host memory: those its body
    updates in place (`dynamic_update_slice` into the carried value) with a value moved to
    host memory (RM's offloaded residuals, stacked by a scan). XLA's host offloading places
    such a stack, and the buffer it starts as, in host memory, so it is no device buffer."""
    found = set()
    for i, (arg, new) in enumerate(_carried(op)):
        update = new.producer
        if (update is None or short_name(update) != "dynamic_update_slice"
                or update.operands[0] is not arg):
            continue
        v = update.operands[1]
        while v.producer is not None and short_name(v.producer) in _KIND_VIEWS:
            v = v.producer.operands[0]
        if v.producer is not None and placement(v.producer) == "pinned_host":
            found.add(i)
    return found
