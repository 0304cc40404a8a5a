"""Tensor types of the IR: a shape and an MLIR element type spelled as MLIR spells it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

# MLIR element type -> numpy dtype (the ones a train step uses).
_NUMPY_DTYPES = {
    "f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": "bfloat16",
    "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8, "i1": np.bool_,
    "ui64": np.uint64, "ui32": np.uint32, "ui16": np.uint16, "ui8": np.uint8,
    "complex<f32>": np.complex64, "complex<f64>": np.complex128,
}

_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1,
          "i1": 1, "ui64": 8, "ui32": 4, "ui16": 2, "ui8": 1, "complex<f32>": 8,
          "complex<f64>": 16, "f8E4M3FN": 1, "f8E5M2": 1, "i4": 1, "ui4": 1}


@dataclass(frozen=True)
class TensorType:
    """A ranked tensor type. `element` is MLIR's spelling ("f32", "i1", "bf16", ...)."""

    shape: tuple[int, ...]
    element: str
    opaque: bool = False  # a token, tuple or other non-tensor type: `element` is its MLIR text

    def __str__(self) -> str:
        return self._text

    # A program shares few types among many values, and the printer, the simulator and the
    # lowering ask each value's type for its text and sizes: computed once per type object
    # (`cached_property` writes the instance's dict, which a frozen dataclass allows).
    @cached_property
    def _text(self) -> str:
        if self.opaque:
            return self.element
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.element}>"

    @property
    def rank(self) -> int:
        return len(self.shape)

    @cached_property
    def num_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        return _BYTES.get(self.element, 4)

    @cached_property
    def nbytes(self) -> int:
        return self.num_elements * self.itemsize

    def with_shape(self, shape: tuple[int, ...]) -> TensorType:
        return TensorType(tuple(shape), self.element, self.opaque)

    @property
    def is_tensor(self) -> bool:
        return not self.opaque


def format_bytes(n: float) -> str:
    """A byte count as people read it: "512 B", "3.0 MiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def element_type_of(dtype) -> str:
    """The MLIR element type name of a numpy / jax dtype."""
    name = np.dtype(dtype).name
    table = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
             "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "bool": "i1",
             "uint64": "ui64", "uint32": "ui32", "uint16": "ui16", "uint8": "ui8",
             "complex64": "complex<f32>", "complex128": "complex<f64>"}
    if name not in table:
        raise TypeError(f"unsupported dtype {name}")
    return table[name]


def numpy_dtype_of(element: str):
    if element not in _NUMPY_DTYPES:
        raise TypeError(f"no numpy dtype for MLIR element type {element}")
    d = _NUMPY_DTYPES[element]
    if d == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(d)
