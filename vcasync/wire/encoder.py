"""Encoding a payload: a generator of chunks that never builds the whole message.

Tensors are read in place (``contiguous()`` copies only a non-contiguous tensor, a lossy codec
produces one half-size cast). With ``zero_copy=True`` raw blocks are yielded as memoryviews of the
tensors themselves, so the caller must not modify them until the iteration ends (a change would be
caught by the receiver's checksum, never silently merged). Small pieces (headers, small tensors) are
coalesced into chunks of about ``chunk_size`` bytes so a consumer never sees a flood of tiny writes.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from . import _msgpack
from .codecs import BlockEncoder, block_codec, shuffle_into
from .dtypes import as_bytes, dtype_name
from .frames import BLOCK, MAGIC, PROTOCOL_VERSION, checksum, frame_prefix
from .plan import CodecSpec, TensorPlan, plan_tensor, wire_dtype_for

__all__ = ["iter_payload"]

Piece = bytes | memoryview
_MIN_CHUNK = 4096
_MAX_CHUNK = 64 << 20


def iter_payload(kind: str, meta: Any, tensors: Mapping[str, torch.Tensor],
                 spec: CodecSpec, chunk_size: int, zero_copy: bool) -> Generator[Piece, None, None]:
    """All chunks of one payload (see :mod:`.frames` for the layout)."""
    if not isinstance(chunk_size, int) or not _MIN_CHUNK <= chunk_size <= _MAX_CHUNK:
        raise ConfigError(f"chunk_size must be an int in {_MIN_CHUNK}..{_MAX_CHUNK}, got {chunk_size!r}")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"payload kind must be a non-empty str, got {kind!r}")
    names = list(tensors)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {type(name).__name__}")
    return _coalesce(_pieces(kind, meta, tensors, names, spec, chunk_size), chunk_size,
                     zero_copy)


def _pieces(kind: str, meta: Any, tensors: Mapping[str, torch.Tensor], names: list[str],
            spec: CodecSpec, chunk_size: int) -> Iterator[Piece]:
    preamble = {"t": "P", "v": PROTOCOL_VERSION, "kind": kind, "count": len(names), "meta": meta}
    yield MAGIC + frame_prefix(_msgpack.pack(preamble))
    encoders: dict[tuple[str, int, int], BlockEncoder] = {}
    scratch = np.empty(chunk_size, dtype=np.uint8)
    for name in names:
        yield from _tensor_pieces(name, tensors[name], spec, chunk_size, encoders, scratch)
    yield frame_prefix(_msgpack.pack({"t": "E", "count": len(names)}))


def _tensor_pieces(name: str, tensor: torch.Tensor, spec: CodecSpec, chunk_size: int,
                   encoders: dict[tuple[str, int, int], BlockEncoder],
                   scratch: np.ndarray[Any, Any]) -> Iterator[Piece]:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    dname = dtype_name(t.dtype)
    wire_dtype = wire_dtype_for(spec, t)
    src = t
    if wire_dtype is not None:
        cast = t.to(wire_dtype)
        if bool((torch.isinf(cast) & torch.isfinite(t)).any()):
            wire_dtype = None  # out of the target's range: send full precision, never inf
        else:
            src = cast
    src = src.contiguous()
    itemsize = src.element_size()
    data = as_bytes(src)
    plan = plan_tensor(spec, data, itemsize, wire_dtype)
    header: dict[str, Any] = {"t": "T", "name": name, "dtype": dname,
                              "shape": [int(d) for d in t.shape], "codec": plan.codec,
                              "shuffle": plan.shuffle}
    if wire_dtype is not None:
        header["wire"] = dtype_name(wire_dtype)
    yield frame_prefix(_msgpack.pack(header))
    yield from _blocks(data, itemsize, plan, chunk_size, encoders, scratch)



def _blocks(data: np.ndarray[Any, Any], itemsize: int, plan: TensorPlan, chunk_size: int,
            encoders: dict[tuple[str, int, int], BlockEncoder],
            scratch: np.ndarray[Any, Any]) -> Iterator[Piece]:
    n = data.shape[0]
    if n == 0:
        return
    key = (plan.codec, plan.level, plan.threads)
    enc = encoders.get(key)
    if enc is None:
        enc = encoders[key] = block_codec(plan.codec).encoder(plan.level, plan.threads)
    step = max(itemsize, chunk_size // itemsize * itemsize)
    for off in range(0, n, step):
        view = data[off:off + step]
        block = shuffle_into(view, itemsize, scratch) if plan.shuffle else view
        wire = enc.encode(block)
        if isinstance(wire, np.ndarray):
            # Passed through: the block itself (zero-copy) or the reused scratch (copy it out).
            crc = checksum(wire)
            piece: Piece = wire.data if wire is view else wire.tobytes()
        else:
            piece = wire if isinstance(wire, bytes | memoryview) else bytes(wire)
            crc = checksum(piece)
        yield BLOCK.pack(view.shape[0], len(piece), crc)
        yield piece


def _coalesce(pieces: Iterable[Piece], chunk_size: int,
              zero_copy: bool) -> Generator[Piece, None, None]:
    """Join small pieces into chunks of ~``chunk_size``; pass big ones through (copied to bytes
    unless ``zero_copy``)."""
    pending = bytearray()
    big = chunk_size // 4
    for piece in pieces:
        size = len(piece)
        if size >= big:
            if pending:
                yield bytes(pending)
                pending.clear()
            yield piece if zero_copy or isinstance(piece, bytes) else bytes(piece)
            continue
        pending += piece
        if len(pending) >= chunk_size:
            yield bytes(pending)
            pending.clear()
    if pending:
        yield bytes(pending)
