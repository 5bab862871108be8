"""Hand-made wire payloads that a careful decoder must refuse: the raw material of hostile tests.

:func:`valid_result` encodes a well-formed result for a lease; the other functions build payloads
that are wrong in exactly one way, frame by frame (see :mod:`vcasync.wire.frames` for the layout),
with correct checksums where the point is to get past them: a declared shape that overflows, a dtype
outside the allow-list, a tensor count that lies, a zstd block that inflates far beyond what it
declares (a decompression bomb), a header length of a terabyte, trailing bytes after the end frame.
Each returns bytes; none allocates more than a few MiB here.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgpack
import torch

from vcasync.tensors import ModelState
from vcasync.wire import PROTOCOL_VERSION, checksum, encode_payload

__all__ = [
    "MAGIC", "block", "bomb_payload", "crafted_payload", "frame", "result_meta", "tensor_frame",
    "valid_result",
]

MAGIC: Final = b"VCAW"
_PREFIX: Final = struct.Struct("<II")
_BLOCK: Final = struct.Struct("<III")


def result_meta(lease_id: str, base_version: int, *, steps: int, kind: str = "delta",
                samples: int = 32) -> dict[str, Any]:
    return {"lease_id": lease_id, "base_version": base_version, "kind": kind, "samples": samples,
            "steps": steps, "partial": False, "metrics": {"loss": 1.0}}


def valid_result(model: ModelState, lease_id: str, base_version: int, *, steps: int,
                 scale: float = 1e-3, meta: Mapping[str, Any] | None = None,
                 tensors: Mapping[str, torch.Tensor] | None = None, kind: str = "result") -> bytes:
    """A result payload for ``lease_id``: a small delta on every floating tensor (or ``tensors``)."""
    if tensors is None:
        tensors = {k: (torch.full_like(v, scale) if v.is_floating_point() else v.clone())
                   for k, v in model.items()}
    body = dict(meta) if meta is not None else result_meta(lease_id, base_version, steps=steps)
    return b"".join(encode_payload(kind, body, tensors))


def frame(header: Mapping[str, Any] | bytes, *, crc: int | None = None,
          declared_len: int | None = None) -> bytes:
    """One frame: ``u32 len | u32 crc32c | header``; ``crc``/``declared_len`` override (to lie)."""
    data = header if isinstance(header, bytes) else msgpack.packb(dict(header), use_bin_type=True)
    length = len(data) if declared_len is None else declared_len
    return _PREFIX.pack(length & 0xFFFFFFFF, checksum(data) if crc is None else crc) + data


def block(raw_len: int, wire: bytes, *, crc: int | None = None, wire_len: int | None = None) -> bytes:
    """One data block: ``u32 raw_len | u32 wire_len | u32 crc32c(wire) | wire``."""
    return _BLOCK.pack(raw_len & 0xFFFFFFFF, (len(wire) if wire_len is None else wire_len) & 0xFFFFFFFF,
                       checksum(wire) if crc is None else crc) + wire


def preamble(kind: str, meta: Mapping[str, Any], count: int, *, version: int = PROTOCOL_VERSION) -> bytes:
    return MAGIC + frame({"t": "P", "v": version, "kind": kind, "count": count, "meta": dict(meta)})


def tensor_frame(name: Any, dtype: Any, shape: Any, *, codec: str = "raw", shuffle: bool = False,
                 extra: Mapping[str, Any] | None = None) -> bytes:
    return frame({"t": "T", "name": name, "dtype": dtype, "shape": shape, "codec": codec,
                  "shuffle": shuffle, **(extra or {})})


def end_frame(count: int) -> bytes:
    return frame({"t": "E", "count": count})


def crafted_payload(meta: Mapping[str, Any], tensors: Sequence[bytes], *, kind: str = "result",
                    count: int | None = None, end_count: int | None = None,
                    version: int = PROTOCOL_VERSION, trailer: bytes = b"") -> bytes:
    """A payload assembled from pre-built tensor sections (a tensor frame plus its blocks each)."""
    n = len(tensors) if count is None else count
    return (preamble(kind, meta, n, version=version) + b"".join(tensors)
            + end_frame(len(tensors) if end_count is None else end_count) + trailer)


def raw_section(name: str, t: torch.Tensor) -> bytes:
    """A correct raw-coded tensor section (frame and one block) for ``t``."""
    data = t.detach().contiguous().numpy().tobytes()
    dtype = str(t.dtype).removeprefix("torch.")
    return tensor_frame(name, dtype, list(t.shape)) + (block(len(data), data) if data else b"")


def bomb_payload(meta: Mapping[str, Any], model: ModelState, *, inflate_to: int = 256 << 20) -> bytes:
    """A zstd block of a few KiB that inflates to ``inflate_to`` bytes while declaring the size of
    the model's first tensor: a decoder that trusts the stream instead of the declaration explodes."""
    import zstandard

    name, first = next(iter(model.items()))
    declared = first.numel() * first.element_size()
    bomb = _zeros_frame(inflate_to, zstandard)
    dtype = str(first.dtype).removeprefix("torch.")
    section = tensor_frame(name, dtype, list(first.shape), codec="zstd") + block(declared, bomb)
    rest = [raw_section(k, v) for k, v in list(model.items())[1:]]
    return crafted_payload(meta, [section, *rest])


_BOMBS: dict[int, bytes] = {}


def _zeros_frame(size: int, zstandard: Any) -> bytes:
    """zstd of ``size`` zero bytes, made once per size, streamed (never ``size`` bytes in memory)."""
    cached = _BOMBS.get(size)
    if cached is None:
        cctx = zstandard.ZstdCompressor(level=1)
        chunk = bytes(1 << 20)
        obj = cctx.compressobj(size=size)
        parts = [obj.compress(chunk) for _ in range(size >> 20)]
        parts.append(obj.compress(bytes(size & ((1 << 20) - 1))))
        parts.append(obj.flush())
        cached = _BOMBS[size] = b"".join(parts)
    return cached
