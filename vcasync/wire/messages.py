"""Small control messages: one msgpack map ``{"v": version, "kind": str, "body": map}``.

Used for lease requests, receipts, heartbeats: anything without big tensors (those go in a payload,
see :mod:`.payload`). Decoding checks the size first, parses with every msgpack limit on, insists on
exactly those three keys, the protocol version and (optionally) the expected kind, and refuses any
body that is not plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import FrameError, ProtocolVersionError
from . import _msgpack
from .frames import PROTOCOL_VERSION
from .limits import DEFAULT_LIMITS, Limits, check_limit

__all__ = ["Message", "decode_message", "encode_message"]


@dataclass(frozen=True, slots=True)
class Message:
    """A decoded control message."""

    kind: str
    body: dict[str, Any] = field(default_factory=dict)


def encode_message(kind: str, body: Mapping[str, Any] | None = None) -> bytes:
    """msgpack bytes of a control message; ``body`` must be plain data (``TypeError`` if not)."""
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"message kind must be a non-empty str, got {kind!r}")
    if body is not None and not isinstance(body, Mapping):
        raise TypeError(f"message body must be a mapping, got {type(body).__name__}")
    return _msgpack.pack({"v": PROTOCOL_VERSION, "kind": kind, "body": dict(body or {})})


def decode_message(data: bytes | bytearray | memoryview, *, expected_kind: str | None = None,
                   limits: Limits | None = None) -> Message:
    """Parse a control message; any problem raises a :class:`~vcasync.errors.WireError`."""
    limits = limits if limits is not None else DEFAULT_LIMITS
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FrameError(f"a message must be bytes, got {type(data).__name__}", field="message")
    obj = _msgpack.unpack(data, limits, field="message", max_bytes=limits.max_meta_bytes)
    if not isinstance(obj, dict):
        raise FrameError("a message must be a msgpack map", field="message")
    version = obj.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolVersionError(f"message protocol version {str(version)[:20]} is not "
                                   f"supported (this build speaks {PROTOCOL_VERSION})",
                                   field="message.v")
    if set(obj) != {"v", "kind", "body"}:
        raise FrameError(f"message keys {sorted(obj)[:8]} are not ['body', 'kind', 'v']",
                         field="message")
    kind, body = obj["kind"], obj["body"]
    if not isinstance(kind, str) or not kind:
        raise FrameError("message kind must be a non-empty string", field="message.kind")
    check_limit("message kind bytes", len(kind.encode()), limits.max_name_bytes,
                what="Limits.max_name_bytes")
    if expected_kind is not None and kind != expected_kind:
        raise FrameError(f"expected a {expected_kind!r} message, got {kind[:64]!r}",
                         field="message.kind")
    if not isinstance(body, dict):
        raise FrameError("message body must be a map", field="message.body")
    return Message(kind, body)
