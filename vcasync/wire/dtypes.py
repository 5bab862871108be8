"""The dtype allow-list: wire names <-> torch dtypes.

Tensors travel as raw little-endian bytes, so a dtype on the wire is only a name and an item size.
Every float and integer dtype torch can copy is here (bool, the unsigned ints, bf16, the float8
family, complex64/128); quantized and sub-byte dtypes are not, and neither is ``complex32`` (torch
itself calls it experimental). Names come from this table only: nothing on the wire is ever looked
up with ``getattr(torch, name)``.
"""

from __future__ import annotations

import sys
from typing import Any, Final

import numpy as np
import torch

from ..errors import UnsupportedDtypeError

__all__ = ["ALL_DTYPE_NAMES", "LOSSY_TARGETS", "as_bytes", "byte_view", "dtype_from_name", "dtype_name"]

if sys.byteorder != "little":  # pragma: no cover - no big-endian CI machine
    raise ImportError("vcasync.wire sends tensors as little-endian bytes and supports "
                      "little-endian hosts only")

_CANDIDATES: Final = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
)

# Only the names this torch build has (uint16/32/64 arrived in 2.3, float8_e8m0fnu in 2.7).
_BY_NAME: Final[dict[str, torch.dtype]] = {
    n: d for n in _CANDIDATES if isinstance(d := getattr(torch, n, None), torch.dtype)
}
_BY_DTYPE: Final[dict[torch.dtype, str]] = {d: n for n, d in _BY_NAME.items()}

ALL_DTYPE_NAMES: Final[frozenset[str]] = frozenset(_BY_NAME)

#: dtypes a lossy codec may downcast floating tensors to.
LOSSY_TARGETS: Final[dict[str, torch.dtype]] = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of ``dtype``; :class:`UnsupportedDtypeError` when it cannot travel."""
    try:
        return _BY_DTYPE[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"dtype {dtype} cannot be sent; supported: {sorted(ALL_DTYPE_NAMES)}",
            field="dtype") from None


def dtype_from_name(name: object, allowed: frozenset[str] = ALL_DTYPE_NAMES) -> torch.dtype:
    """The torch dtype for a wire name, checked against the ``allowed`` allow-list."""
    if not isinstance(name, str) or name not in allowed or name not in _BY_NAME:
        shown = name if isinstance(name, str) and len(name) <= 40 else type(name).__name__
        raise UnsupportedDtypeError(
            f"dtype {shown!r} is not in the allow-list (Limits.allowed_dtypes: "
            f"{sorted(allowed)})", field="dtype")
    return _BY_NAME[name]


def _numpy_dtypes() -> frozenset[torch.dtype]:
    ok = set()
    for d in _BY_DTYPE:
        try:
            torch.empty(1, dtype=d).numpy()
        except TypeError:
            continue
        ok.add(d)
    return frozenset(ok)


#: dtypes ``Tensor.numpy()`` can view (not bf16 or the float8 family): the fast path below.
_NUMPY_DTYPES: Final = _numpy_dtypes()


def as_bytes(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """A contiguous CPU tensor's bytes as a flat, writable uint8 numpy view (never a copy)."""
    if t.dtype in _NUMPY_DTYPES:
        try:
            arr0 = t.numpy()
        except RuntimeError:        # a conjugate or negative view: the general path decides
            pass
        else:
            if arr0.flags.c_contiguous and arr0.size:
                return arr0.reshape(-1).view(np.uint8)   # contiguous: reshape is a view
    if t.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    flat = t.reshape(-1)
    if flat.stride(0) != 1:
        # torch calls a 1-element tensor contiguous whatever its stride; viewing it as bytes
        # needs stride 1, which is the same memory for a single element.
        flat = flat.as_strided((flat.numel(),), (1,))
    arr: np.ndarray[Any, Any] = flat.view(torch.uint8).numpy()
    return arr


def byte_view(t: torch.Tensor) -> memoryview:
    """:func:`as_bytes` as a flat, writable ``"B"`` memoryview (never a copy): cheaper to make,
    slice and copy into than an ndarray, for the per-tensor and per-block hot paths."""
    if t.dtype in _NUMPY_DTYPES:
        try:
            # cast() refuses a non-C-contiguous buffer (and an empty one) instead of copying.
            return t.numpy().data.cast("B")
        except (RuntimeError, TypeError):
            pass
    return as_bytes(t).data
