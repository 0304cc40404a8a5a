"""Dense array attributes (`array<i64: 1, 2>`, `array<i1: true, false>`) read from and written
to the MLIR text the IR keeps attributes as."""

from __future__ import annotations

import re

_ARRAY = re.compile(r"array<\w+(?::\s*(.*))?>")


def parse_array(text: str) -> list[str]:
    """The elements of a dense array attribute as text (empty for `array<i64>` or no text)."""
    m = _ARRAY.match(text.strip())
    return [x.strip() for x in m.group(1).split(",")] if m and m.group(1) else []


def parse_i64_array(text: str) -> list[int]:
    return [int(x) for x in parse_array(text)]


def i64_array(values) -> str:
    return "array<i64" + (": " + ", ".join(map(str, values)) if values else "") + ">"


def parse_scalar(text: str) -> int | bool:
    """An integer or boolean attribute (`3 : i64`, `true`), as the IR keeps it."""
    value = text.split(":")[0].strip()
    if value in ("true", "false"):
        return value == "true"
    return int(value)
