"""How a program is partitioned, beside what (the schedule): one frozen `PartitionOptions`
that `partir.jit`, `partir report` and the tests hand to the one driver path (`stages`), and
the string-valued policies it holds, as enums.

It sits below `core`: nothing here knows the IR, so every layer may read an option.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum, nonmember
from typing import Any, ClassVar


class Option(StrEnum):
    """A keyword option's values; `of` accepts a member or its string and names the keyword
    (a subclass's `keyword = enum.nonmember("name")`) and the accepted values in its error."""

    keyword: ClassVar[str]

    @classmethod
    def of(cls, value):
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{cls.keyword}={value!r}: expected one of "
                             f"{[p.value for p in cls]}") from None


class ConflictPolicy(Option):
    """What propagation does where operands carry incompatible tilings on an axis."""

    keyword = nonmember("conflicts")

    REDISTRIBUTE = "redistribute"  # loop the op with the cheapest entry, move the rest
    STOP = "stop"  # PartIR's strict semantics: leave the op unpartitioned on the axis


class PaddingPolicy(Option):
    """Whether a tiling may pad a dimension its axes do not divide."""

    keyword = nonmember("padding")

    ALLOW = "allow"
    ERROR = "error"  # any padding is a PartitionError (tactics), never inferred (propagation)


class UnevenOutputs(Option):
    """What happens to a program output a tactic tiles unevenly (jax needs divisible
    shardings at the program's boundary)."""

    keyword = nonmember("uneven_outputs")

    ERROR = "error"  # a PartitionError naming the output, dimension, sizes and tactic
    REPLICATE = "replicate"  # gathered (to its largest divisible layout) and trimmed; warns


@dataclass(frozen=True)
class PartitionOptions:
    """Everything but the schedule that decides the partitioned program (`partir.jit`'s
    keyword options; DESIGN.md §3 says what each means). Strings are accepted for the
    policies and checked here, so a typo fails where it is written.

    `scatter_sums=None` picks by the platform the program runs on (`for_platform`): False
    on CPU, where XLA runs a pending sum faster all-reduced then sliced, True elsewhere.
    `hardware` is a `HardwareSpec`, a spec's name or alias, or None (the default spec the
    hardware plugins name): the estimates' hardware, resolved by the driver.
    """

    conflicts: ConflictPolicy = ConflictPolicy.REDISTRIBUTE
    padding: PaddingPolicy = PaddingPolicy.ALLOW
    uneven_outputs: UnevenOutputs = UnevenOutputs.ERROR
    scatter_sums: bool | None = None
    hardware: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "conflicts", ConflictPolicy.of(self.conflicts))
        object.__setattr__(self, "padding", PaddingPolicy.of(self.padding))
        object.__setattr__(self, "uneven_outputs", UnevenOutputs.of(self.uneven_outputs))
        if self.scatter_sums is not None:
            object.__setattr__(self, "scatter_sums", bool(self.scatter_sums))

    def for_platform(self, platform: str) -> PartitionOptions:
        """These options with `scatter_sums` decided for `platform` ("cpu", "gpu", ...)."""
        if self.scatter_sums is not None:
            return self
        return dataclasses.replace(self, scatter_sums=platform != "cpu")

    def replace(self, **changes: Any) -> PartitionOptions:
        return dataclasses.replace(self, **changes)
