"""Encoding a payload: a generator of chunks that never builds the whole message.

Tensors are read in place (``contiguous()`` copies only a non-contiguous tensor, a lossy codec
produces one half-size cast). With ``zero_copy=True`` raw blocks (of 32 KiB and more) are yielded
as memoryviews of the tensors themselves, so the caller must not modify them until the iteration
ends (a change would be caught by the receiver's checksum, never silently merged). Small pieces
(headers, small tensors) are coalesced into chunks of about ``chunk_size`` bytes so a consumer
never sees a flood of tiny writes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any

import msgpack
import numpy as np
import torch

from ..errors import ConfigError
from . import _msgpack
from .codecs import BlockEncoder, block_codec, shuffle_into
from .dtypes import _BY_DTYPE, as_bytes, byte_view, dtype_name
from .frames import BLOCK, MAGIC, PROTOCOL_VERSION, checksum, frame_prefix
from .plan import CodecSpec, TensorPlan, plan_tensor, wire_dtype_for

__all__ = ["iter_payload"]

Piece = bytes | memoryview
_MIN_CHUNK = 4096   # blocks are >= _MIN_CHUNK - 15 bytes: the decoder insists (MIN_BLOCK)
_MAX_CHUNK = 64 << 20
_pack_block = BLOCK.pack
_string_at = ctypes.string_at


def iter_payload(kind: str, meta: Any, tensors: Mapping[str, torch.Tensor],
                 spec: CodecSpec, chunk_size: int, zero_copy: bool) -> Generator[Piece, None, None]:
    """All chunks of one payload (see :mod:`.frames` for the layout)."""
    if not isinstance(chunk_size, int) or not _MIN_CHUNK <= chunk_size <= _MAX_CHUNK:
        raise ConfigError(f"chunk_size must be an int in {_MIN_CHUNK}..{_MAX_CHUNK}, got {chunk_size!r}")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"payload kind must be a non-empty str, got {kind!r}")
    names = list(tensors)
    for name in names:   # all refused here, before anything is sent
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {type(name).__name__}")
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor {name!r} is a {type(t).__name__}, not a torch.Tensor")
        if t.dtype not in _BY_DTYPE:
            dtype_name(t.dtype)
    return _chunks(kind, meta, tensors, names, spec, chunk_size, zero_copy)


class _Stream:
    """Per-payload encoding state: codec contexts and scratch buffers, allocated once, reused
    for every block (a fresh buffer per block would cost a page fault per 4 KiB)."""

    def __init__(self, spec: CodecSpec, chunk_size: int) -> None:
        self.spec = spec
        self.chunk_size = chunk_size
        self.encoders: dict[tuple[str, int, int], BlockEncoder] = {}
        self.scratch = np.empty(chunk_size, dtype=np.uint8)
        self.casts: dict[torch.dtype, torch.Tensor] = {}

    def encoder(self, plan: TensorPlan) -> BlockEncoder:
        key = (plan.codec, plan.level, plan.threads)
        enc = self.encoders.get(key)
        if enc is None:
            enc = self.encoders[key] = block_codec(plan.codec).encoder(plan.level, plan.threads)
        return enc

    def cast_buffer(self, dtype: torch.dtype) -> torch.Tensor:
        buf = self.casts.get(dtype)
        if buf is None:
            buf = self.casts[dtype] = torch.empty(self.chunk_size // dtype.itemsize, dtype=dtype)
        return buf


def _chunks(kind: str, meta: Any, tensors: Mapping[str, torch.Tensor], names: list[str],
            spec: CodecSpec, chunk_size: int, zero_copy: bool) -> Generator[Piece, None, None]:
    """The payload's frames, coalesced as they are made: small pieces (headers, block prefixes,
    small tensors) gather in ``pending`` and leave as one chunk of about ``chunk_size``; a big
    block leaves on its own (a view of the tensor when ``zero_copy``, else copied to bytes).

    One generator, no nested ones, and the exact raw path (most payloads) inlined: per block it
    costs a checksum, a prefix and a slice."""
    preamble = {"t": "P", "v": PROTOCOL_VERSION, "kind": kind, "count": len(names), "meta": meta}
    pending = bytearray(MAGIC)
    pending += frame_prefix(_msgpack.pack(preamble))
    big = chunk_size // 4
    # A view costs the consumer nothing to receive, a copy into ``pending`` and out again two
    # memcpys: with zero_copy, a raw block leaves alone from 32 KiB on (still no flood of tiny
    # writes), a tensor of 100 KiB is no longer copied twice on its way.
    alone = min(big, 32 << 10) if zero_copy else big
    stream = _Stream(spec, chunk_size)
    group = _Group(stream)
    small = group.small
    raw = spec.compression == "raw" and spec.lossy is None   # exact raw: no plan to make
    # One packer per payload (this generator runs in one thread at a time) for its tensor
    # headers, plain str/int/list maps: msgpack.packb would build a Packer per header.
    pack = msgpack.Packer(use_bin_type=True, datetime=False).pack
    # Small tensors first, in groups that say where each belongs ("at"), then the others in
    # order: interleaved with 1 MiB blocks, every group met caches the blocks had just flushed
    # (a ResNet-50 lost about 3 ms in 20 to it), and fewer groups are fewer frames.
    bigs: list[str] = []
    for i, name in enumerate(names):
        src = tensors[name]
        if src.nbytes > small:
            bigs.append(name)
            continue
        t = _prepare(src)
        group.add(name, t, i)
        if group.full:
            yield from _flush_group(group, pending, pack, chunk_size)
    if group.items:
        yield from _flush_group(group, pending, pack, chunk_size)
    for name in bigs:
        t = _prepare(tensors[name])   # one at a time: a GPU model is copied piecewise
        nbytes = t.nbytes
        if not raw:
            for piece in _tensor_pieces(name, t, stream):
                if len(piece) >= big:
                    if pending:
                        yield bytes(pending)
                        pending.clear()
                    yield piece if zero_copy or isinstance(piece, bytes) else bytes(piece)
                    continue
                pending += piece
                if len(pending) >= chunk_size:
                    yield bytes(pending)
                    pending.clear()
            continue
        # The exact raw path: blocks are the tensor's own bytes, a multiple of the item size.
        itemsize = t.itemsize
        pending += frame_prefix(pack(
            {"t": "T", "name": name, "dtype": _BY_DTYPE[t.dtype], "shape": t.shape,
             "codec": "raw", "shuffle": False}))
        data = byte_view(t)
        step = max(itemsize, chunk_size // itemsize * itemsize)
        for off in range(0, nbytes, step):
            block = data[off:off + step]
            k = len(block)
            pending += _pack_block(k, k, checksum(block))
            if k >= alone:
                yield bytes(pending)
                pending.clear()
                yield block if zero_copy else block.tobytes()
            else:
                pending += block
                if len(pending) >= chunk_size:
                    yield bytes(pending)
                    pending.clear()
    pending += frame_prefix(_msgpack.pack({"t": "E", "count": len(names)}))
    yield bytes(pending)


def _flush_group(group: _Group, pending: bytearray, pack: Callable[[Any], bytes],
                 chunk_size: int) -> Iterator[bytes]:
    """The group's frame into ``pending``, which leaves first if the two would overflow a
    chunk, and after if it is full."""
    if len(pending) + group.size() > chunk_size and pending:
        yield bytes(pending)
        pending.clear()
    group.flush_into(pending, pack)
    if len(pending) >= chunk_size:
        yield bytes(pending)
        pending.clear()


def _prepare(tensor: torch.Tensor) -> torch.Tensor:
    """A detached, contiguous CPU tensor (a copy only when needed); its type and dtype were
    checked by :func:`iter_payload`."""
    t = tensor.detach() if tensor.requires_grad else tensor  # torch calls cost ~0.6 us each
    if not t.is_cpu:
        t = t.cpu()
    if t.is_neg() or (t.dtype.is_complex and t.is_conj()):
        t = t.resolve_conj().resolve_neg()   # lazy views: their memory is not their values
    return t if t.is_contiguous() else t.contiguous()


class _Group:
    """Small tensors (biases, norms, counters: most of a model's entries) sent as one frame
    and one block, so each costs a list entry instead of a frame, a block and their checks.
    They always travel exactly (a lossy codec would save a few bytes and cost precision)."""

    def __init__(self, stream: _Stream) -> None:
        self.stream = stream
        self.small = min(16 << 10, stream.chunk_size // 16)
        self.items: list[list[Any]] = []
        self.at: list[int] = []             # each item's place in the payload's order
        self.tensors: list[torch.Tensor] = []
        self.nbytes = 0
        self.header_bytes = 0

    def add(self, name: str, t: torch.Tensor, at: int) -> None:
        shape = t.shape             # a tuple: msgpack packs it as the same array as a list
        self.items.append([name, _BY_DTYPE[t.dtype], shape])
        self.at.append(at)
        self.tensors.append(t)
        self.nbytes += t.nbytes
        self.header_bytes += len(name) * 4 + 29 + 9 * len(shape)   # generous msgpack estimate

    @property
    def full(self) -> bool:
        # One block of at most chunk_size bytes, a header well under Limits.max_header_bytes.
        return self.nbytes >= self.stream.chunk_size // 2 or self.header_bytes >= 32 << 10

    def size(self) -> int:
        """About how many bytes the group's frame will take (an upper bound)."""
        return self.nbytes + self.header_bytes + 32

    def flush_into(self, out: bytearray, pack: Callable[[Any], bytes]) -> None:
        """Append the group's frame (header and its one block) to ``out`` and start afresh."""
        items, at, tensors, nbytes = self.items, self.at, self.tensors, self.nbytes
        self.items, self.at, self.tensors, self.nbytes, self.header_bytes = [], [], [], 0, 0
        spec = self.stream.spec
        if spec.compression != "raw":
            data = np.frombuffer(b"".join([byte_view(t) for t in tensors]), dtype=np.uint8)
            plan = plan_tensor(spec, data, 1)
            out += frame_prefix(pack({"t": "G", "items": items, "codec": plan.codec, "at": at}))
            if nbytes:
                for piece in _encode_blocks(iter([(data, True)]), 1, plan, self.stream):
                    out += piece
            return
        # raw (as ``auto`` would choose for so few bytes, and the plan of every raw spec): the
        # bytes go straight into ``out``, then the block prefix is filled in behind them.
        out += frame_prefix(pack({"t": "G", "items": items, "codec": "raw", "at": at}))
        if not nbytes:
            return
        mark = len(out)
        out += bytes(BLOCK.size)
        for t in tensors:
            # Its bytes, read at its address: a contiguous CPU tensor (``_prepare``) without a
            # conjugate or negative bit (resolved there) holds exactly t.nbytes bytes from
            # data_ptr(). One C call where a numpy view and its buffer cost three.
            out += _string_at(t.data_ptr(), t.nbytes)
        with memoryview(out) as whole, whole[mark + BLOCK.size:] as body:
            crc = checksum(body)
        BLOCK.pack_into(out, mark, nbytes, nbytes, crc)


def _tensor_pieces(name: str, src: torch.Tensor, stream: _Stream) -> Iterator[Piece]:
    dname = dtype_name(src.dtype)
    wire_dtype = wire_dtype_for(stream.spec, src)
    if wire_dtype is not None and not _fits(src, wire_dtype):
        wire_dtype = None  # finite values beyond the target's range: full precision, never inf
    if wire_dtype is None:
        itemsize = src.element_size()
        data = as_bytes(src)
        plan = plan_tensor(stream.spec, data, itemsize)
        blocks = _raw_blocks(data, itemsize, stream.chunk_size)
    else:
        itemsize = wire_dtype.itemsize
        flat = src.reshape(-1)
        plan = plan_tensor(stream.spec, _cast_sample(flat, wire_dtype), itemsize, wire_dtype,
                           total=flat.numel() * itemsize)
        blocks = _cast_blocks(flat, stream.cast_buffer(wire_dtype))
    header: dict[str, Any] = {"t": "T", "name": name, "dtype": dname, "shape": list(src.shape),
                              "codec": plan.codec, "shuffle": plan.shuffle}
    if wire_dtype is not None:
        header["wire"] = dtype_name(wire_dtype)
    head = frame_prefix(_msgpack.pack(header))
    if wire_dtype is None and src.numel() * itemsize <= stream.chunk_size // 4:
        # A small tensor: one piece (header, block prefix, bytes) instead of three; most tensors
        # of a model are small (biases, norms, counters), so this is the common case.
        yield head + b"".join(_encode_blocks(blocks, itemsize, plan, stream))
        return
    yield head
    yield from _encode_blocks(blocks, itemsize, plan, stream)


def _fits(src: torch.Tensor, target: torch.dtype) -> bool:
    """Whether every finite value of ``src`` stays finite in ``target`` (one pass, no big
    temporaries unless a value is out of range)."""
    if src.numel() == 0:
        return True
    lo, hi = torch.aminmax(src.reshape(-1))
    limit = torch.finfo(target).max
    if bool(hi <= limit) and bool(lo >= -limit):
        return True
    finite_src = int(torch.isfinite(src).sum())
    return finite_src == int(torch.isfinite(src.to(target)).sum())


def _cast_sample(flat: torch.Tensor, target: torch.dtype) -> np.ndarray[Any, Any]:
    """Up to three 16K-element slices of ``flat`` cast to ``target``, as bytes, for ``auto``."""
    n = flat.numel()
    take = min(n, 16384)
    starts = sorted({0, (n - take) // 2, n - take})
    return as_bytes(torch.cat([flat[s:s + take] for s in starts]).to(target))


def _raw_blocks(data: np.ndarray[Any, Any], itemsize: int,
                chunk_size: int) -> Iterator[tuple[np.ndarray[Any, Any], bool]]:
    """(block, reused) pairs: views into the tensor itself, never reused."""
    step = max(itemsize, chunk_size // itemsize * itemsize)
    for off in range(0, data.shape[0], step):
        yield data[off:off + step], False


def _cast_blocks(flat: torch.Tensor,
                 buf: torch.Tensor) -> Iterator[tuple[np.ndarray[Any, Any], bool]]:
    """The tensor cast to ``buf``'s dtype one block at a time, into the reused ``buf``."""
    step = buf.numel()
    for e0 in range(0, flat.numel(), step):
        k = min(step, flat.numel() - e0)
        out = buf[:k]
        out.copy_(flat[e0:e0 + k])
        yield as_bytes(out), True


def _encode_blocks(blocks: Iterator[tuple[np.ndarray[Any, Any], bool]], itemsize: int,
                   plan: TensorPlan, stream: _Stream) -> Iterator[Piece]:
    enc = stream.encoder(plan)
    for view, reused in blocks:
        block = shuffle_into(view, itemsize, stream.scratch) if plan.shuffle else view
        wire = enc.encode(block)
        if isinstance(wire, np.ndarray):
            # Passed through: a view of the tensor (zero-copy), or of a reused buffer (copy it).
            crc = checksum(wire)
            piece: Piece = wire.data if (wire is view and not reused) else wire.tobytes()
        else:
            piece = wire if isinstance(wire, bytes | memoryview) else bytes(wire)
            crc = checksum(piece)
        yield BLOCK.pack(view.shape[0], len(piece), crc)
        yield piece
