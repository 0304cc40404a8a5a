"""Loop trip counts: how many times a `while` body runs, when the loop is a counted loop
(`i = c0; i < c1; i += c2`, as `fori_loop` and `scan` emit); None when the count depends on
data (the simulator then costs one iteration and reports it)."""

from __future__ import annotations

import math
import re

from partir_plugin.extend import Op, Value

from .opcost import short_name


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
