"""Dense array attributes (`array<i64: 1, 2>`, `array<i1: true, false>`) and windows' padding
(`dense<[[lo, hi], ...]>`) read from and written to the MLIR text the IR keeps attributes as."""

from __future__ import annotations

import re

_ARRAY = re.compile(r"array<\w+(?::\s*(.*))?>")


def parse_array(text: str) -> list[str]:
    """The elements of a dense array attribute as text (empty for `array<i64>` or no text)."""
    m = _ARRAY.match(text.strip())
    return [x.strip() for x in m.group(1).split(",")] if m and m.group(1) else []


def parse_i64_array(text: str) -> list[int]:
    return [int(x) for x in parse_array(text)]


def dimension_list(numbers: str, key: str) -> list[int] | None:
    """A list field of a gather's, scatter's or convolution's dimension numbers
    (`start_index_map = [1, 2]` in `#stablehlo.gather<...>`), or None where it is absent."""
    m = re.search(key + r" = \[([0-9, ]*)\]", numbers)
    return None if m is None else [int(x) for x in m.group(1).split(",") if x.strip()]


def i64_array(values) -> str:
    return "array<i64" + (": " + ", ".join(map(str, values)) if values else "") + ">"


def parse_scalar(text: str) -> int | bool:
    """An integer or boolean attribute (`3 : i64`, `true`), as the IR keeps it."""
    value = text.split(":")[0].strip()
    if value in ("true", "false"):
        return value == "true"
    return int(value)


def parse_padding(text: str, rows: int) -> list[list[int]]:
    """A `dense<[[lo, hi], ...]>` (or splat `dense<p>`) padding attribute as `rows` pairs."""
    if not text:
        return [[0, 0] for _ in range(rows)]
    values = [int(x) for x in re.findall(r"-?\d+", text.split(":")[0])]
    if len(values) == 1:
        return [[values[0], values[0]] for _ in range(rows)]
    return [values[2 * i: 2 * i + 2] for i in range(rows)]


def format_padding(pads: list[list[int]]) -> str:
    body = ", ".join(f"[{lo}, {hi}]" for lo, hi in pads)
    return f"dense<[{body}]> : tensor<{len(pads)}x2xi64>"
