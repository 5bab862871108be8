"""Admitting one declared tensor: every check that must pass before its memory is allocated.

Shared by single-tensor and group frames, in two steps. :func:`declare` checks what a header says
(types, then limits computed with Python integers, so no overflow) and depends on nothing but
the header and the limits, so the decoder caches it per header (see :mod:`.headers`); :func:`admit`
then binds a declaration to one payload: duplicates, the decoded budget, the spec and the ``out``
buffers, and only then an allocation.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch

from ..errors import FrameError, LimitExceededError, SpecMismatchError
from ..tensors import ModelSpec
from .dtypes import _BY_NAME, LOSSY_TARGETS, byte_view, dtype_from_name
from .limits import Limits

__all__ = ["Admitted", "Declared", "admit", "declare"]


@dataclass(frozen=True, slots=True)
class Declared:
    """A tensor as its header declares it, checked against the limits: a pure function of the
    header and :class:`Limits`, so a declaration may be cached and shared (it holds no tensor)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int                        # bytes on the wire (in the wire dtype)
    decoded: int                       # bytes once decoded (in the tensor's dtype)
    cast: torch.dtype | None           # the wire dtype, when it differs from the tensor's


@dataclass(slots=True)
class Admitted:
    """A tensor allowed in: its destination and how many bytes of it travel on the wire."""

    name: str
    dest: torch.Tensor
    view: memoryview                   # the destination's bytes (empty when a cast is needed)
    nbytes: int                        # bytes on the wire (in the wire dtype)
    decoded: int                       # bytes once decoded (in the tensor's dtype)
    cast: torch.dtype | None           # the wire dtype, when it differs from the tensor's


_EMPTY: Final = memoryview(b"")


def _over(field: str, value: int, limit: int, what: str) -> LimitExceededError:
    return LimitExceededError(f"{field} = {value} exceeds the limit {limit} ({what})",
                              field=field, limit=limit, value=value)


def declare(name: Any, dtype_name: Any, shape: Any, wire_name: Any, limits: Limits) -> Declared:
    """Check what a header declares of one tensor (types, the allow-list, every size limit)
    before anything is allocated. Written out plainly, cheapest first: it runs per tensor."""
    if not isinstance(name, str):
        raise FrameError("tensor name must be a string", field="tensor.name")
    limit = limits.max_name_bytes
    chars = len(name)
    if chars > limit or (chars * 4 > limit and len(name.encode()) > limit):  # <= 4 bytes a char
        raise _over("tensor name bytes", len(name.encode()), limit, "Limits.max_name_bytes")
    allowed = limits.allowed_dtypes
    if type(dtype_name) is str and dtype_name in allowed:
        dtype = _BY_NAME[dtype_name]
    else:
        dtype = dtype_from_name(dtype_name, allowed)     # raises the allow-list error
    dims, numel = _shape(shape, limits)
    if numel > limits.max_elements:
        raise _over("tensor elements", numel, limits.max_elements, "Limits.max_elements")
    nbytes = numel * dtype.itemsize
    if nbytes > limits.max_tensor_bytes:
        raise _over("tensor bytes", nbytes, limits.max_tensor_bytes, "Limits.max_tensor_bytes")
    if wire_name is None:
        return Declared(name, dtype, dims, nbytes, nbytes, None)
    cast = dtype_from_name(wire_name, allowed & frozenset(LOSSY_TARGETS))
    if not dtype.is_floating_point or dtype.itemsize <= cast.itemsize:
        raise FrameError(f"wire dtype {cast} cannot carry a {dtype} tensor", field="tensor.wire")
    return Declared(name, dtype, dims, numel * cast.itemsize, nbytes, cast)


def admit(d: Declared, *, limits: Limits, spec: ModelSpec | None,
          out: Mapping[str, torch.Tensor] | None, seen: Container[str], decoded: int,
          view: bool = True) -> Admitted:
    """Let a declared tensor into this payload: not seen before, within the payload's decoded
    budget (``decoded`` bytes so far), fitting ``spec``; then allocate it (or pick it from
    ``out``) and, when ``view``, take a byte view of it (a group's items are written whole
    by address instead)."""
    name = d.name
    if name in seen:
        raise FrameError(f"tensor {name[:64]!r} appears twice", field="tensor.name")
    nbytes = d.decoded
    if decoded + nbytes > limits.max_decoded_bytes:
        raise _over("decoded bytes", decoded + nbytes, limits.max_decoded_bytes,
                    "Limits.max_decoded_bytes")
    dtype, dims = d.dtype, d.shape
    if spec is not None:
        _check_spec(spec, name, dtype, dims)
    dest = _destination(out, name, dtype, dims)
    if view and d.cast is None:
        return Admitted(name, dest, byte_view(dest), nbytes, nbytes, None)
    return Admitted(name, dest, _EMPTY, d.nbytes, nbytes, d.cast)


def _shape(shape: Any, limits: Limits) -> tuple[tuple[int, ...], int]:
    """The declared shape as a tuple, and its element count (a Python int: no overflow)."""
    if not isinstance(shape, list):
        raise FrameError("tensor shape must be a list", field="tensor.shape")
    if len(shape) > limits.max_dims:
        raise _over("tensor dims", len(shape), limits.max_dims, "Limits.max_dims")
    max_elements = limits.max_elements
    numel = 1
    for d in shape:
        if type(d) is not int or d < 0:         # not a bool, not an int subclass
            raise FrameError("tensor shape entries must be non-negative ints", field="tensor.shape")
        if d > max_elements:
            raise _over("tensor dim", d, max_elements, "Limits.max_elements")
        numel *= d
    return tuple(shape), numel


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
    if buf.dtype != dtype or buf.shape != shape:     # torch.Size is a tuple
        raise SpecMismatchError(
            f"tensor {name!r} is {dtype}{list(shape)} but its out buffer is "
            f"{buf.dtype}{list(buf.shape)}", reason="out_mismatch", name=name)
    if (not buf.is_cpu or buf.requires_grad or not buf.is_contiguous()
            or buf.is_neg() or (dtype.is_complex and buf.is_conj())):
        raise SpecMismatchError(f"out buffer for {name!r} must be a contiguous CPU tensor "
                                f"without grad (nor a lazy conjugate or negative view)",
                                reason="out_mismatch", name=name)
    return buf
