"""Tensor and group frame headers, parsed and checked into plans, with a bounded cache.

A payload of a model repeats the previous one's headers byte for byte (the same names, dtypes
and shapes, in the same order), and checking a group header of small tensors cost more than
moving their bytes. A :class:`FramePlan` is everything a header says once checked against the
limits (:func:`~.admit.declare` per tensor); it holds no tensor and depends only on the header
bytes and the :class:`~.Limits`, so plans are cached by exactly those (a changed byte is a
different key). What depends on the payload (duplicates across frames, the decoded budget, the
spec, ``out`` buffers, the tensor count) is checked by the decoder every time.

The cache is bounded in entries, in the header bytes it keeps and in the tensors its plans
declare (least recently used go first): hostile headers cannot grow it past its bounds, and at
worst evict plans, which costs a check again, never a wrong answer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from ..errors import FrameError
from . import _msgpack
from .admit import Declared, declare
from .codecs import BlockCodec, block_codec
from .limits import Limits

__all__ = ["FramePlan", "PlanCache", "frame_plan", "plan_header"]

TENSOR_KEYS: Final = frozenset({"t", "name", "dtype", "shape", "codec", "shuffle", "wire"})
GROUP_KEYS: Final = frozenset({"t", "items", "codec"})
GROUP_KEYS_AT: Final = GROUP_KEYS | {"at"}


@dataclass(frozen=True, slots=True)
class FramePlan:
    """A checked tensor (``T``) or group (``G``) frame header."""

    decls: tuple[Declared, ...]
    codec: BlockCodec
    codec_name: str
    shuffle: bool
    group: bool                        # a G frame: its items' bytes are one block
    nbytes: int                        # wire bytes of all its tensors once decoded
    at: tuple[int, ...] | None = None  # a group's places in the payload's order (distinct)


def plan_header(header: dict[str, Any], limits: Limits) -> FramePlan | None:
    """The plan of a parsed ``T`` or ``G`` header; ``None`` for any other frame type."""
    t = header.get("t")
    if t == "T":
        return _tensor_plan(header, limits)
    if t == "G":
        return _group_plan(header, limits)
    return None


def _tensor_plan(h: dict[str, Any], limits: Limits) -> FramePlan:
    keys = set(h)
    if not keys <= TENSOR_KEYS or not keys >= TENSOR_KEYS - {"wire"}:
        raise FrameError(f"tensor header keys {sorted(keys)[:8]} are not "
                         f"{sorted(TENSOR_KEYS)}", field="tensor.header")
    codec_name = h["codec"]
    codec = block_codec(codec_name, limits.allowed_codecs)
    shuffle = h["shuffle"]
    if not isinstance(shuffle, bool):
        raise FrameError("tensor shuffle flag must be a bool", field="tensor.shuffle")
    d = declare(h["name"], h["dtype"], h["shape"], h.get("wire"), limits)
    return FramePlan((d,), codec, codec_name, shuffle, False, d.nbytes)


def _group_plan(h: dict[str, Any], limits: Limits) -> FramePlan:
    """Small tensors sharing one block: ``{"t": "G", "items": [[name, dtype, shape]...],
    "codec": name, "at": [index...]}``; the block holds their bytes back to back, unshuffled.
    ``at`` (optional) gives each item's place in the payload's order."""
    keys = set(h)
    if keys != GROUP_KEYS and keys != GROUP_KEYS_AT:
        raise FrameError(f"group header keys {sorted(keys)[:8]} are not {sorted(GROUP_KEYS_AT)}",
                         field="group.header")
    codec_name = h["codec"]
    codec = block_codec(codec_name, limits.allowed_codecs)
    items = h["items"]
    if not isinstance(items, list) or not items:
        raise FrameError("group items must be a non-empty list", field="group.items")
    names: set[str] = set()
    decls = []
    total = 0
    for item in items:
        if type(item) is not list or len(item) != 3:
            raise FrameError("a group item must be [name, dtype, shape]", field="group.items")
        d = declare(item[0], item[1], item[2], None, limits)
        if d.name in names:
            raise FrameError(f"tensor {d.name[:64]!r} appears twice", field="tensor.name")
        names.add(d.name)
        decls.append(d)
        total += d.nbytes
    at = _places(h.get("at"), len(decls))
    return FramePlan(tuple(decls), codec, codec_name, False, True, total, at)


def _places(at: Any, n: int) -> tuple[int, ...] | None:
    """A group's ``at``: ``n`` distinct non-negative ints (the payload checks their range)."""
    if at is None:
        return None
    if type(at) is not list or len(at) != n:
        raise FrameError(f"group 'at' must be a list of {n} places", field="group.at")
    for i in at:
        if type(i) is not int or i < 0:
            raise FrameError("group places must be non-negative ints", field="group.at")
    if len(set(at)) != n:
        raise FrameError("group places repeat", field="group.at")
    return tuple(at)


class PlanCache:
    """Plans by (header bytes, limits), least recently used out first, within bounds on
    entries, key bytes and declared tensors; thread-safe (payloads decode in worker threads)."""

    def __init__(self, *, max_entries: int = 4096, max_key_bytes: int = 4 << 20,
                 max_tensors: int = 1 << 15, max_header_bytes: int = 64 << 10) -> None:
        self.max_entries = max_entries
        self.max_key_bytes = max_key_bytes
        self.max_tensors = max_tensors
        self.max_header_bytes = max_header_bytes   # longer headers are planned, never kept
        self._plans: OrderedDict[tuple[bytes, Limits], FramePlan] = OrderedDict()
        self._key_bytes = self._tensors = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, key: tuple[bytes, Limits]) -> FramePlan | None:
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
            return plan

    def put(self, key: tuple[bytes, Limits], plan: FramePlan) -> None:
        if len(key[0]) > self.max_header_bytes:
            return
        with self._lock:
            if key in self._plans:
                self._plans.move_to_end(key)
                return
            self._plans[key] = plan
            self._key_bytes += len(key[0])
            self._tensors += len(plan.decls)
            while (len(self._plans) > self.max_entries or self._key_bytes > self.max_key_bytes
                   or self._tensors > self.max_tensors):
                (header, _), gone = self._plans.popitem(last=False)
                self._key_bytes -= len(header)
                self._tensors -= len(gone.decls)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self._key_bytes = self._tensors = 0


#: Shared by every decoder of the process: a worker or coordinator decodes the same model's
#: headers again and again. At its bounds it holds 4 MiB of headers and 32 Ki declarations
#: (about 8 MiB); a ResNet-50 needs about 110 entries and 30 KiB of headers.
PLANS: Final = PlanCache()


def frame_plan(piece: memoryview, limits: Limits, cache: PlanCache = PLANS) -> FramePlan | None:
    """The plan of a frame header's bytes (``None``: not a tensor or group frame), parsed and
    checked on a cache miss only."""
    key = (bytes(piece), limits)
    plan = cache.get(key)
    if plan is not None:
        return plan
    header = _msgpack.unpack(piece, limits, field="frame header", max_bytes=len(piece),
                             check=False)
    if not isinstance(header, dict):
        raise FrameError("frame header is not a map", field="frame.header")
    plan = plan_header(header, limits)
    if plan is not None:            # the end frame and anything unexpected: not worth keeping
        cache.put(key, plan)
    return plan
