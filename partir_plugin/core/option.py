"""String-valued keyword options (`partir.jit(conflicts=..., padding=...)`) as enums."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


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
