"""Source locations of imported ops: jax's name stack and the user's file:line.

jax lowers every op with an MLIR location: `NameLoc(name stack)` around a chain of
`CallSiteLoc(NameLoc(function, FileLineColLoc), caller)` frames, innermost first (inlined
calls nest the same kinds again, and `FusedLoc` joins several). The importer keeps each op's
location object (reading it costs about as much as one attribute); it is parsed here only for
the ops a diagnostic names, so partitioning never pays for it. Locations are walked by kind,
never matched against a fixed shape.
"""

from __future__ import annotations

import enum
import functools
import os
from dataclasses import dataclass
from pathlib import Path

# Frames in these packages are library code: a collective is attributed to the first frame
# outside them (the user's line that called the library).
LIBRARY_PACKAGES = frozenset({"jax", "jaxlib", "flax", "optax", "equinox", "haiku"})
# partir_plugin's own code counts as library, except the models and examples it ships (the
# demo's lines are the user's lines there).
_KERNEL_DIR = Path(__file__).resolve().parents[1]
_USER_DIRS = (_KERNEL_DIR / "models", _KERNEL_DIR / "examples")

# The file name MLIR's parser gives ops of a text without locations: their place in that text.
_PARSED_TEXT = "-"
# How to get locations when a module has none (a StableHLO file printed without them).
NO_LOCATIONS_HINT = ("the module carries no source locations: print it with "
                     "`jax.jit(f).lower(...).as_text(debug_info=True)` to keep them")


@dataclass(frozen=True, order=True)
class SourceLocation:
    """A line of Python source: where a collective's op was written."""

    file: str
    line: int
    function: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where} {self.function}" if self.function else where

    @property
    def short(self) -> str:
        """`file name:line function`, for tables."""
        where = f"{Path(self.file).name}:{self.line}"
        return f"{where} {self.function}" if self.function else where


class Phase(enum.StrEnum):
    """Which part of a train step an op belongs to, from jax's name stack."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"


@dataclass(frozen=True)
class ParsedLocation:
    """An op's location: its name-stack names (outermost scope first) and its Python frames
    (innermost first)."""

    names: tuple[str, ...] = ()
    frames: tuple[SourceLocation, ...] = ()

    @property
    def name_stack(self) -> str:
        return self.names[0] if self.names else ""

    @property
    def scope(self) -> str:
        """The name stack without its primitive and with autodiff's `transpose(...)` removed:
        what a forward op and the backward ops differentiating it share (with their frames),
        e.g. `jit(step)/jvp(Transformer)/Block_3/attn/query` for both."""
        segments = self.name_stack.split("/")[:-1]
        for i, seg in enumerate(segments):
            while seg.startswith("transpose(") and seg.endswith(")"):
                seg = seg[len("transpose("):-1]
            segments[i] = seg
        return "/".join(segments)

    @property
    def source(self) -> SourceLocation | None:
        """The first frame outside the libraries (`LIBRARY_PACKAGES`, partir_plugin's kernel);
        the innermost frame when every frame is library code."""
        for frame in self.frames:
            if not is_library_file(frame.file):
                return frame
        return self.frames[0] if self.frames else None

    @property
    def in_optimizer_library(self) -> bool:
        return any("optax" in Path(f.file).parts for f in self.frames)

    @property
    def autodiff_phase(self) -> Phase | None:
        """forward under `jvp(`, backward under `transpose(`, None outside autodiff."""
        stack = self.name_stack
        if "transpose(" in stack:
            return Phase.BACKWARD
        if "jvp(" in stack:
            return Phase.FORWARD
        return None


def kernel_path_prefixes() -> list[str]:
    """The kernel's source files as path prefixes: every module and package of partir_plugin
    but the models and examples it ships, which are user code (`is_library_file`)."""
    prefixes = []
    for child in sorted(_KERNEL_DIR.iterdir()):
        if child in _USER_DIRS or child.name == "__pycache__":
            continue
        if child.is_dir():
            prefixes.append(f"{child}{os.sep}")
        elif child.suffix == ".py":
            prefixes.append(str(child))
    return prefixes


@functools.cache
def is_library_file(file: str) -> bool:
    path = Path(file)
    if LIBRARY_PACKAGES.intersection(path.parts):
        return True
    try:
        resolved = path.resolve()
    except OSError:
        return False
    if not resolved.is_relative_to(_KERNEL_DIR):
        return False
    return not any(resolved.is_relative_to(d) for d in _USER_DIRS)


def parse_location(location) -> ParsedLocation:
    """Walk an MLIR location (jaxlib's typed `NameLoc`, `CallSiteLoc`, `FileLineColLoc`,
    `FusedLoc`) into names and frames. Op-type names (`"dot_general:"`) are dropped."""
    from jaxlib.mlir import ir

    names: list[str] = []
    frames: list[SourceLocation] = []

    def walk(loc, scope: bool) -> None:
        """`scope`: a name here is a name-stack entry (the outermost names are, even around a
        bare file:line, as jax writes them without full tracebacks)."""
        if isinstance(loc, ir.NameLoc):
            child = loc.child_loc
            if not scope and isinstance(child, ir.FileLineColLoc):  # function at file:line
                frames.append(SourceLocation(child.filename, child.start_line, loc.name_str))
                return
            if loc.name_str.endswith(":"):  # the op type
                walk(child, scope)
                return
            names.append(loc.name_str)
            walk(child, False)
        elif isinstance(loc, ir.CallSiteLoc):
            walk(loc.callee, False)
            walk(loc.caller, False)
        elif isinstance(loc, ir.FileLineColLoc) and loc.filename != _PARSED_TEXT:
            frames.append(SourceLocation(loc.filename, loc.start_line))
        elif isinstance(loc, ir.FusedLoc):
            for inner in loc.locations:
                walk(inner, scope)

    walk(location, True)
    return ParsedLocation(tuple(names), tuple(frames))


def location_name(location) -> str | None:
    """The first name of a location (jax's name stack), as messages show it."""
    from jaxlib.mlir import ir

    while isinstance(location, ir.NameLoc):
        if not location.name_str.endswith(":"):
            return location.name_str
        location = location.child_loc
    return None
