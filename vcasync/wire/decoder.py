"""Incremental payload decoder: feed it chunks of any size, get tensors it owns.

A push parser (a small state machine) so the same code serves a socket, an HTTP body and a file.
Every declared number is checked against :class:`~.Limits` before it is used; a tensor is allocated
only after its header passed the limits (and the spec, when one is given), and then only once
(``out`` buffers are reused as they are). Raw blocks are copied straight from the incoming chunks
into the tensor, then their CRC-32 is checked on the (cache-hot) destination; compressed blocks
are checked before they are decompressed. Any failure raises a :class:`~vcasync.errors.WireError`
(or :class:`~vcasync.errors.SpecMismatchError` for a payload that does not fit ``spec``/``out``),
and the decoder then refuses further input.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import torch

from ..errors import (
    ChecksumError,
    FrameError,
    LimitExceededError,
    ProtocolVersionError,
    SpecMismatchError,
    VCAsyncError,
)
from ..tensors import ModelSpec
from . import _msgpack
from .admit import Admitted, admit
from .codecs import BlockDecoder, block_codec, unshuffle_into
from .frames import BLOCK, MAGIC, PREFIX, PROTOCOL_VERSION, checksum
from .headers import FramePlan, frame_plan
from .limits import DEFAULT_LIMITS, Limits, check_limit

__all__ = ["Payload", "PayloadDecoder"]

Chunk = bytes | bytearray | memoryview

_MAGIC, _PREFIX, _HEADER, _BLOCK_PREFIX, _BLOCK_DIRECT, _BLOCK_WIRE, _DONE, _FAILED = range(8)
_memmove: Final = ctypes.memmove
_PREAMBLE_KEYS: Final = frozenset({"t", "v", "kind", "count", "meta"})
#: Every block but a tensor's last holds at least this many bytes (encoders cut at >= 4 KiB), so
#: a hostile stream of 1-element blocks cannot buy seconds of CPU per megabyte.
MIN_BLOCK: Final = 4080


@dataclass(slots=True)
class Payload:
    """A decoded payload: its kind, its metadata and its tensors (owned by the caller)."""

    kind: str
    meta: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(slots=True)
class _Frame:
    """The tensor frame being decoded: one tensor, or a group of small ones sharing one block."""

    targets: list[Admitted]
    nbytes: int                        # wire bytes of all targets once decoded
    wire_itemsize: int
    codec: BlockDecoder
    codec_name: str
    max_wire: Any
    shuffle: bool
    group: bool                        # a group frame: small tensors sharing one block
    offset: int = 0                    # decoded wire bytes so far
    direct: bool = False               # raw, unshuffled, uncast: blocks land in place

    def __post_init__(self) -> None:
        self.direct = (self.codec_name == "raw" and not self.shuffle and not self.group
                       and self.targets[0].cast is None)

    @property
    def name(self) -> str:
        return self.targets[0].name if len(self.targets) == 1 else f"group of {len(self.targets)}"


class PayloadDecoder:
    """Decode one payload from chunks: ``feed(chunk)`` as they come, then ``finish()``."""

    def __init__(self, *, limits: Limits | None = None, spec: ModelSpec | None = None,
                 expected_kind: str | None = None, out: Mapping[str, torch.Tensor] | None = None,
                 ext_hook: _msgpack.ExtHook | None = None) -> None:
        self._limits = limits if limits is not None else DEFAULT_LIMITS
        self._spec = spec
        self._expected_kind = expected_kind
        self._out = out
        self._ext_hook = ext_hook
        self._state = _MAGIC
        self._need = len(MAGIC)
        self._pending = bytearray()
        self._received = 0
        self._header_crc = 0
        self._kind = ""
        self._meta: dict[str, Any] = {}
        self._count = -1
        self._tensors: dict[str, torch.Tensor] = {}
        self._placed: dict[int, str] = {}     # a group item's place in the payload's order
        self._decoded = 0
        self._cur: _Frame | None = None
        self._blk_raw = self._blk_crc = self._blk_left = self._blk_start = 0
        self._decoders: dict[str, BlockDecoder] = {}
        self._scratch = np.empty(0, dtype=np.uint8)
        self._error: VCAsyncError | None = None

    # -- public -----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: Chunk) -> None:
        """Consume ``data`` (any length, any split); raises on the first problem."""
        if self._error is not None:
            raise self._error
        try:
            mv = memoryview(data)
            if mv.format != "B" or mv.ndim != 1 or not mv.c_contiguous:
                mv = mv.cast("B")               # refuses a non-contiguous buffer
            self._feed(mv)
        except VCAsyncError as exc:
            self._fail(exc)
            raise
        except MemoryError:
            err = LimitExceededError("out of memory while decoding within the configured limits",
                                     field="memory")
            self._fail(err)
            raise err from None
        except Exception as exc:  # a defect, never expected: still only a WireError escapes
            err2 = FrameError(f"malformed payload ({type(exc).__name__}: {exc})"[:300],
                              field="payload")
            self._fail(err2)
            raise err2 from exc

    def feed_many(self, chunks: Iterable[Chunk]) -> None:
        for chunk in chunks:
            self.feed(chunk)

    def finish(self) -> Payload:
        """The payload; :class:`FrameError` when the stream ended early."""
        if self._error is not None:
            raise self._error
        if self._state != _DONE:
            where = {_MAGIC: "the magic", _PREFIX: "a frame prefix", _HEADER: "a frame header",
                     _BLOCK_PREFIX: "a block prefix", _BLOCK_DIRECT: "block data",
                     _BLOCK_WIRE: "block data"}.get(self._state, "?")
            cur = f" (tensor {self._cur.name!r})" if self._cur is not None else ""
            err = FrameError(f"payload truncated: the stream ended inside {where}{cur} after "
                             f"{self._received} bytes", field="payload.end")
            self._fail(err)
            raise err
        if self._spec is not None:
            missing = [n for n in self._spec if n not in self._tensors]
            if missing:
                raise SpecMismatchError(f"payload lacks tensor {missing[0]!r} ({len(missing)} "
                                        f"missing)", reason="missing_tensor", name=missing[0])
        return Payload(self._kind, self._meta, self._in_order())

    # -- machinery ----------------------------------------------------------------------------
    def _fail(self, exc: VCAsyncError) -> None:
        self._error = exc
        self._state = _FAILED
        self._cur = None
        self._pending = bytearray()

    def _feed(self, mv: memoryview) -> None:
        n = len(mv)
        self._received += n
        if self._received > self._limits.max_message_bytes:
            check_limit("message bytes", self._received, self._limits.max_message_bytes,
                        what="Limits.max_message_bytes")
        pos = 0
        while pos < n:
            state = self._state
            if state == _BLOCK_DIRECT:
                pos = self._copy_direct(mv, pos)
                continue
            if state == _DONE:
                raise FrameError(f"{n - pos} bytes after the end frame", field="payload.end")
            need = self._need
            if not self._pending and n - pos >= need:
                end = pos + need
                if state == _BLOCK_PREFIX:          # the commonest step: skip the dispatch
                    self._on_block_prefix(mv[pos:end])
                else:
                    self._step(mv[pos:end])
                pos = end
                continue
            take = min(need - len(self._pending), n - pos)
            self._pending += mv[pos:pos + take]
            pos += take
            if len(self._pending) == need:
                buf, self._pending = self._pending, bytearray()
                self._step(memoryview(buf))

    def _step(self, piece: memoryview) -> None:
        state = self._state
        if state == _MAGIC:
            if piece.tobytes() != MAGIC:
                raise FrameError("not a vcasync payload (bad magic)", field="payload.magic")
            self._state, self._need = _PREFIX, PREFIX.size
        elif state == _PREFIX:
            hlen, self._header_crc = PREFIX.unpack(piece)
            limit = self._header_limit()
            if hlen == 0:
                raise FrameError("empty frame header", field="frame.header_len")
            check_limit("frame header bytes", hlen, limit, what="Limits.max_header_bytes")
            self._state, self._need = _HEADER, hlen
        elif state == _HEADER:
            if checksum(piece) != self._header_crc:
                raise ChecksumError("frame header checksum mismatch", field="frame.header_crc")
            self._on_header(piece)
        elif state == _BLOCK_PREFIX:
            self._on_block_prefix(piece)
        elif state == _BLOCK_WIRE:
            self._on_block_wire(piece)
        else:  # pragma: no cover - _FAILED is caught in feed()
            raise FrameError("decoder is in a failed state", field="payload")

    def _header_limit(self) -> int:
        if self._count < 0:  # the preamble carries the metadata
            return self._limits.max_meta_bytes + self._limits.max_header_bytes
        return self._limits.max_header_bytes

    # -- headers ------------------------------------------------------------------------------
    def _on_header(self, piece: memoryview) -> None:
        limits = self._limits
        if self._count < 0:
            hook = self._ext_hook
            header = _msgpack.unpack(piece, limits, field="preamble", max_bytes=len(piece),
                                     ext_hook=hook)
            self._on_preamble(header)
            return
        plan = frame_plan(piece, limits)
        if plan is not None:
            self._on_plan(plan)
            return
        header = _msgpack.unpack(piece, limits, field="frame header", max_bytes=len(piece),
                                 check=False)
        if not isinstance(header, dict):
            raise FrameError("frame header is not a map", field="frame.header")
        t = header.get("t")
        if t == "E":
            if set(header) != {"t", "count"} or header["count"] != self._count:
                raise FrameError("end frame is malformed or its count differs from the preamble",
                                 field="end.count")
            if len(self._tensors) != self._count:
                raise FrameError(f"end frame after {len(self._tensors)} of {self._count} tensors",
                                 field="payload.count")
            self._state = _DONE
        else:
            raise FrameError(f"unexpected frame type {str(t)[:20]!r}", field="frame.t")

    def _on_preamble(self, header: Any) -> None:
        limits = self._limits
        if not isinstance(header, dict) or header.get("t") != "P":
            raise FrameError("the first frame is not a preamble", field="preamble")
        version = header.get("v")
        if version != PROTOCOL_VERSION:
            raise ProtocolVersionError(f"protocol version {str(version)[:20]} is not supported "
                                       f"(this build speaks {PROTOCOL_VERSION})", field="preamble.v")
        if set(header) != _PREAMBLE_KEYS:
            raise FrameError(f"preamble keys {sorted(header)[:8]} != {sorted(_PREAMBLE_KEYS)}",
                             field="preamble")
        kind, meta, count = header["kind"], header["meta"], header["count"]
        if not isinstance(kind, str) or not kind:
            raise FrameError("payload kind must be a non-empty string", field="preamble.kind")
        check_limit("kind bytes", len(kind.encode()), limits.max_name_bytes,
                    what="Limits.max_name_bytes")
        if self._expected_kind is not None and kind != self._expected_kind:
            raise FrameError(f"expected a {self._expected_kind!r} payload, got {kind[:64]!r}",
                             field="preamble.kind")
        if not isinstance(meta, dict):
            raise FrameError("payload meta must be a map", field="preamble.meta")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise FrameError("tensor count must be a non-negative int", field="preamble.count")
        check_limit("tensor count", count, limits.max_tensors, what="Limits.max_tensors")
        self._kind, self._meta, self._count = kind, meta, count
        self._state, self._need = _PREFIX, PREFIX.size

    def _on_plan(self, plan: FramePlan) -> None:
        """A tensor or group frame: its checked header, bound to this payload."""
        tensors = self._tensors
        if plan.group:
            if len(tensors) + len(plan.decls) > self._count:
                raise FrameError(f"more tensors than the {self._count} declared",
                                 field="payload.count")
        elif len(tensors) >= self._count:
            raise FrameError(f"more tensor frames than the {self._count} declared",
                             field="payload.count")
        limits, spec, out = self._limits, self._spec, self._out
        decoded = self._decoded
        targets = []
        for d in plan.decls:    # within a group, names are distinct: the plan checked that
            target = admit(d, limits=limits, spec=spec, out=out, seen=tensors, decoded=decoded,
                           view=not plan.group)
            decoded += target.decoded
            targets.append(target)
        self._decoded = decoded
        if plan.group:
            check_limit("group bytes", plan.nbytes, limits.max_block_bytes,
                        what="Limits.max_block_bytes: a group is one block")
            if plan.at is not None:
                self._place(plan)
        first = targets[0]
        itemsize = 1 if plan.group else (first.cast or first.dest.dtype).itemsize
        self._start_frame(_Frame(targets, plan.nbytes, itemsize, self._decoder(plan.codec_name),
                                 plan.codec_name, plan.codec.max_wire_len, plan.shuffle,
                                 plan.group))

    def _place(self, plan: FramePlan) -> None:
        placed, count = self._placed, self._count
        assert plan.at is not None
        for i, d in zip(plan.at, plan.decls, strict=True):
            if i >= count or i in placed:
                raise FrameError(f"group place {i} is out of 0..{count - 1} or taken",
                                 field="group.at")
            placed[i] = d.name

    def _in_order(self) -> dict[str, torch.Tensor]:
        """The tensors in the payload's order: placed group items where they say, the others
        (in the order they came) in the places left. Called after the end frame, when there
        are exactly ``count`` tensors and every place is distinct and below ``count``."""
        tensors, placed = self._tensors, self._placed
        if not placed:
            return tensors
        moved = set(placed.values())
        rest = iter([n for n in tensors if n not in moved])
        order = [placed[i] if i in placed else next(rest) for i in range(len(tensors))]
        return {n: tensors[n] for n in order}

    def _decoder(self, codec_name: str) -> BlockDecoder:
        dec = self._decoders.get(codec_name)
        if dec is None:
            dec = self._decoders[codec_name] = block_codec(codec_name).decoder()
        return dec

    def _start_frame(self, frame: _Frame) -> None:
        self._cur = frame
        if frame.nbytes == 0:
            self._finish_frame()
        else:
            self._state, self._need = _BLOCK_PREFIX, BLOCK.size

    # -- blocks -------------------------------------------------------------------------------
    def _on_block_prefix(self, piece: memoryview) -> None:
        cur = self._cur
        assert cur is not None
        raw_len, wire_len, crc = BLOCK.unpack(piece)
        left = cur.nbytes - cur.offset
        if raw_len == 0 or raw_len % cur.wire_itemsize:
            raise FrameError(f"block size {raw_len} is not a positive multiple of the item size "
                             f"{cur.wire_itemsize}", field="block.raw_len")
        if raw_len > left or raw_len > self._limits.max_block_bytes:
            check_limit("block bytes", raw_len, min(left, self._limits.max_block_bytes),
                        what="what remains of the tensor / Limits.max_block_bytes")
        if cur.group and raw_len != left:
            raise FrameError("a group's bytes must come in one block", field="block.raw_len")
        if raw_len < MIN_BLOCK and raw_len < left:
            raise FrameError(f"block of {raw_len} bytes is too small: every block but the last "
                             f"holds at least {MIN_BLOCK}", field="block.raw_len")
        if wire_len == 0:
            raise FrameError("empty block", field="block.wire_len")
        self._blk_raw, self._blk_crc = raw_len, crc
        if cur.direct:
            if wire_len != raw_len:             # the raw bound (checked first), and then some
                check_limit("block wire bytes", wire_len, cur.max_wire(raw_len),
                            what=f"the {cur.codec_name} bound for {raw_len} bytes")
                raise FrameError("raw block wire length differs from its raw length",
                                 field="block.wire_len")
            self._blk_start = cur.offset
            self._blk_left = raw_len
            self._state = _BLOCK_DIRECT
        else:
            check_limit("block wire bytes", wire_len, cur.max_wire(raw_len),
                        what=f"the {cur.codec_name} bound for {raw_len} bytes")
            self._state, self._need = _BLOCK_WIRE, wire_len

    def _copy_direct(self, mv: memoryview, pos: int) -> int:
        cur = self._cur
        assert cur is not None
        k = min(len(mv) - pos, self._blk_left)
        o = cur.offset
        view = cur.targets[0].view
        view[o:o + k] = mv[pos:pos + k]
        o += k
        cur.offset = o
        self._blk_left -= k
        if self._blk_left == 0:
            if checksum(view[self._blk_start:o]) != self._blk_crc:
                raise ChecksumError(f"block checksum mismatch in tensor {cur.name!r}",
                                    field="block.crc")
            self._after_block()
        return pos + k

    def _on_block_wire(self, wire: memoryview) -> None:
        cur = self._cur
        assert cur is not None
        if checksum(wire) != self._blk_crc:
            raise ChecksumError(f"block checksum mismatch in tensor {cur.name!r}", field="block.crc")
        raw_len = self._blk_raw
        decoded = memoryview(cur.codec.decode(wire, raw_len))
        if decoded.format != "B" or decoded.ndim != 1:
            decoded = decoded.cast("B")
        if len(decoded) != raw_len:
            raise FrameError(f"{cur.codec_name} block decoded to {len(decoded)} bytes, its header "
                             f"declared {raw_len}", field="block.raw_len")
        if cur.group:                     # a group: scatter into its tensors
            self._scatter(cur, decoded)
            cur.offset = raw_len
            self._after_block()
            return
        raw = np.frombuffer(decoded, dtype=np.uint8)
        target = cur.targets[0]
        o = cur.offset
        if target.cast is None:
            stage = np.frombuffer(target.view[o:o + raw_len], dtype=np.uint8)
        else:
            if self._scratch.shape[0] < raw_len:
                self._scratch = np.empty(raw_len, dtype=np.uint8)
            stage = self._scratch[:raw_len]
        if cur.shuffle:
            unshuffle_into(raw, cur.wire_itemsize, stage)
        else:
            np.copyto(stage, raw)
        if target.cast is not None:
            e0 = o // cur.wire_itemsize
            k = raw_len // cur.wire_itemsize
            target.dest.view(-1)[e0:e0 + k].copy_(torch.from_numpy(stage).view(target.cast))
        cur.offset = o + raw_len
        self._after_block()

    @staticmethod
    def _scatter(cur: _Frame, block: memoryview) -> None:
        """A group's block into its tensors, each written whole at its address: a contiguous
        CPU tensor of exactly ``t.nbytes`` bytes (admit checked the destination), at offsets
        that sum to the block's length (checked before). One C call per small tensor."""
        base = np.frombuffer(block, dtype=np.uint8)
        addr = base.ctypes.data
        pos = 0
        for t in cur.targets:
            n = t.nbytes
            if n:
                dest = t.dest
                if dest.dtype is torch.bool and bool((base[pos:pos + n] > 1).any()):
                    raise FrameError(f"bool tensor {t.name!r} holds bytes other than 0 and 1",
                                     field="tensor.bool")
                _memmove(dest.data_ptr(), addr + pos, n)
            pos += n

    def _after_block(self) -> None:
        cur = self._cur
        assert cur is not None
        if cur.offset == cur.nbytes:
            self._finish_frame()
        else:
            self._state, self._need = _BLOCK_PREFIX, BLOCK.size

    def _finish_frame(self) -> None:
        cur = self._cur
        assert cur is not None
        tensors = self._tensors
        for t in cur.targets:
            dest = t.dest
            if dest.dtype == torch.bool and len(t.view) and _not_0_or_1(t.view):
                raise FrameError(f"bool tensor {t.name!r} holds bytes other than 0 and 1",
                                 field="tensor.bool")
            tensors[t.name] = dest   # a failure later fails the decoder: nothing is returned
        self._cur = None
        self._state, self._need = _PREFIX, PREFIX.size


def _not_0_or_1(data: memoryview) -> bool:
    """Whether a bool tensor's bytes hold anything but 0 and 1 (torch would misbehave)."""
    return bool((np.frombuffer(data, dtype=np.uint8) > 1).any())
