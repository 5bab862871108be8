"""Admitting one declared tensor: every check that must pass before its memory is allocated.

Shared by single-tensor and group frames. The order matters: types, then limits (computed with
Python integers, so no overflow), then the spec and ``out`` buffers, and only then an allocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import FrameError, LimitExceededError, SpecMismatchError
from ..tensors import ModelSpec
from .dtypes import LOSSY_TARGETS, as_bytes, dtype_from_name
from .limits import Limits

__all__ = ["Admitted", "admit"]


@dataclass(slots=True)
class Admitted:
    """A tensor allowed in: its destination and how many bytes of it travel on the wire."""

    name: str
    dest: torch.Tensor
    dest_u8: np.ndarray[Any, Any]     # the destination's bytes (empty when a cast is needed)
    nbytes: int                        # bytes on the wire (in the wire dtype)
    decoded: int                       # bytes once decoded (in the tensor's dtype)
    cast: torch.dtype | None           # the wire dtype, when it differs from the tensor's


def _over(field: str, value: int, limit: int, what: str) -> LimitExceededError:
    return LimitExceededError(f"{field} = {value} exceeds the limit {limit} ({what})",
                              field=field, limit=limit, value=value)


def admit(name: Any, dtype_name: Any, shape: Any, wire_name: Any, *, limits: Limits,
          spec: ModelSpec | None, out: Mapping[str, torch.Tensor] | None,
          seen: Mapping[str, object], decoded: int) -> Admitted:
    """Validate a declared tensor and allocate (or pick from ``out``) its destination.

    ``seen`` holds the names admitted so far, ``decoded`` their total decoded bytes.
    """
    if not isinstance(name, str):
        raise FrameError("tensor name must be a string", field="tensor.name")
    if len(name) > limits.max_name_bytes or len(name.encode()) > limits.max_name_bytes:
        size = len(name.encode())
        raise _over("tensor name bytes", size, limits.max_name_bytes, "Limits.max_name_bytes")
    if name in seen:
        raise FrameError(f"tensor {name[:64]!r} appears twice", field="tensor.name")
    dtype = dtype_from_name(dtype_name, limits.allowed_dtypes)
    dims = _shape(shape, limits)
    numel = 1
    for d in dims:
        numel *= d
    if numel > limits.max_elements:
        raise _over("tensor elements", numel, limits.max_elements, "Limits.max_elements")
    nbytes = numel * dtype.itemsize
    if nbytes > limits.max_tensor_bytes:
        raise _over("tensor bytes", nbytes, limits.max_tensor_bytes, "Limits.max_tensor_bytes")
    if decoded + nbytes > limits.max_decoded_bytes:
        raise _over("decoded bytes", decoded + nbytes, limits.max_decoded_bytes,
                    "Limits.max_decoded_bytes")
    cast: torch.dtype | None = None
    if wire_name is not None:
        cast = dtype_from_name(wire_name, limits.allowed_dtypes & frozenset(LOSSY_TARGETS))
        if not dtype.is_floating_point or dtype.itemsize <= cast.itemsize:
            raise FrameError(f"wire dtype {cast} cannot carry a {dtype} tensor", field="tensor.wire")
    if spec is not None:
        _check_spec(spec, name, dtype, dims)
    dest = _destination(out, name, dtype, dims)
    dest_u8 = as_bytes(dest) if cast is None else np.empty(0, dtype=np.uint8)
    wire_bytes = nbytes if cast is None else numel * cast.itemsize
    return Admitted(name, dest, dest_u8, wire_bytes, nbytes, cast)


def _shape(shape: Any, limits: Limits) -> tuple[int, ...]:
    if not isinstance(shape, list):
        raise FrameError("tensor shape must be a list", field="tensor.shape")
    if len(shape) > limits.max_dims:
        raise _over("tensor dims", len(shape), limits.max_dims, "Limits.max_dims")
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise FrameError("tensor shape entries must be non-negative ints", field="tensor.shape")
        if d > limits.max_elements:
            raise _over("tensor dim", d, limits.max_elements, "Limits.max_elements")
    return tuple(shape)


def _check_spec(spec: ModelSpec, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    ts = spec.get(name)
    if ts is None:
        raise SpecMismatchError(f"payload has unknown tensor {name[:64]!r}",
                                reason="unknown_tensor", name=name)
    if ts.dtype != dtype:
        raise SpecMismatchError(f"tensor {name!r} has dtype {dtype}, the model has {ts.dtype}",
                                reason="dtype_mismatch", name=name)
    if ts.shape != shape:
        raise SpecMismatchError(f"tensor {name!r} has shape {shape}, the model has {ts.shape}",
                                reason="shape_mismatch", name=name)


def _destination(out: Mapping[str, torch.Tensor] | None, name: str, dtype: torch.dtype,
                 shape: tuple[int, ...]) -> torch.Tensor:
    buf = out.get(name) if out is not None else None
    if buf is None:
        return torch.empty(shape, dtype=dtype)
    if buf.dtype != dtype or tuple(buf.shape) != shape:
        raise SpecMismatchError(
            f"tensor {name!r} is {dtype}{list(shape)} but its out buffer is "
            f"{buf.dtype}{list(buf.shape)}", reason="out_mismatch", name=name)
    if buf.device.type != "cpu" or not buf.is_contiguous() or buf.requires_grad:
        raise SpecMismatchError(f"out buffer for {name!r} must be a contiguous CPU tensor "
                                f"without grad", reason="out_mismatch", name=name)
    return buf
