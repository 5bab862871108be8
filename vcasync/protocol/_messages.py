"""The HTTP protocol between workers and the coordinator: routes, media types, message bodies.

Control messages are small msgpack maps (``vcasync.wire.encode_message``: protocol version + kind);
JSON is accepted and returned for humans with curl. Tensors travel only as wire payloads
(``application/x-vcasync-payload``): results uploaded with ``PUT``, models downloaded with ``GET``.
This module converts the coordinator's value types to and from those bodies, checking every field, so
server and client agree in one place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import EllipsisType
from typing import Any, Final, Protocol, TypeVar

from ..errors import FrameError, LimitExceededError
from ..ledger._units import LeaseGrant, Receipt, ReceiptStatus, WorkUnit
from ..wire import decode_message, encode_message

__all__ = [
    "API_PREFIX", "JSON", "MSGPACK", "PAYLOAD", "decode_control", "encode_control", "get_field",
    "grant_from_body", "grant_to_body", "read_capped", "receipt_from_body", "receipt_to_body",
]

T = TypeVar("T")

API_PREFIX: Final = "/v1"
MSGPACK: Final = "application/x-msgpack"
JSON: Final = "application/json"
PAYLOAD: Final = "application/x-vcasync-payload"
#: Control bodies larger than this are refused before they are read.
MAX_CONTROL_BYTES: Final = 64 * 1024


class _Readable(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


async def read_capped(stream: _Readable, limit: int) -> bytes:
    """Read ``stream`` to its end, but never more than ``limit + 1`` bytes (so ``> limit`` shows).

    ``read(n)`` returns what has arrived so far, up to ``n``: one call is not the whole body.
    """
    buf = bytearray()
    while len(buf) <= limit:
        chunk = await stream.read(limit + 1 - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def encode_control(kind: str, body: Mapping[str, Any], content_type: str) -> bytes:
    """``body`` as msgpack (with protocol version and kind) or as a JSON object."""
    if content_type == MSGPACK:
        return encode_message(kind, body)
    return json.dumps({"kind": kind, **body}, separators=(",", ":")).encode()


def decode_control(data: bytes, content_type: str, kind: str) -> dict[str, Any]:
    """The body of a control message of ``kind``; :class:`FrameError` names what is wrong."""
    if len(data) > MAX_CONTROL_BYTES:
        raise LimitExceededError(f"control message of {len(data)} bytes is over {MAX_CONTROL_BYTES}",
                                 field="body", limit=MAX_CONTROL_BYTES, value=len(data))
    if not data:
        return {}
    if content_type == MSGPACK:
        return dict(decode_message(data, expected_kind=kind).body)
    if content_type in (JSON, "", "application/octet-stream", "text/plain"):
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FrameError(f"body is not valid JSON: {exc}", field="body") from exc
        if not isinstance(obj, dict):
            raise FrameError("body must be a JSON object", field="body")
        got = obj.pop("kind", kind)
        if got != kind:
            raise FrameError(f"expected a {kind!r} message, got {got!r}", field="kind")
        return obj
    raise FrameError(f"unsupported content type {content_type!r}: use {MSGPACK} or {JSON}",
                     field="content-type")


def get_field(body: Mapping[str, Any], name: str, kind: type[T], *, default: T | EllipsisType = ...,
              minimum: int | None = None, max_len: int = 1024) -> T:
    """``body[name]`` checked against ``kind`` (and ``minimum`` / ``max_len``); FrameError otherwise."""
    if name not in body:
        if isinstance(default, EllipsisType):
            raise FrameError(f"missing field {name!r}", field=name)
        return default
    value: Any = body[name]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if (type(value) is bool and kind is not bool) or not isinstance(value, kind):
        raise FrameError(f"field {name!r} must be {kind.__name__}, got {type(value).__name__}", field=name)
    if minimum is not None and _as_number(value) < minimum:
        raise FrameError(f"field {name!r} must be >= {minimum}, got {value}", field=name)
    if isinstance(value, (str, dict, list)) and len(value) > max_len:
        raise FrameError(f"field {name!r} is longer than {max_len}", field=name)
    return value


def _as_number(value: Any) -> float:
    return float(value)


def _unit_to_body(unit: WorkUnit) -> dict[str, Any]:
    return {"unit_id": unit.unit_id, "shard": unit.shard, "num_shards": unit.num_shards,
            "epoch": unit.epoch, "steps": unit.steps, "params": dict(unit.params)}


def grant_to_body(grant: LeaseGrant) -> dict[str, Any]:
    return {"lease_id": grant.lease_id, "unit": _unit_to_body(grant.unit),
            "base_version": grant.base_version, "deadline_s": grant.deadline_s,
            "heartbeat_interval_s": grant.heartbeat_interval_s, "resumed": grant.resumed}


def grant_from_body(body: Mapping[str, Any]) -> LeaseGrant:
    u = get_field(body, "unit", dict)
    unit = WorkUnit(unit_id=get_field(u, "unit_id", str), shard=get_field(u, "shard", int, minimum=0),
                    num_shards=get_field(u, "num_shards", int, minimum=1),
                    epoch=get_field(u, "epoch", int, minimum=0), steps=get_field(u, "steps", int, minimum=0),
                    params=get_field(u, "params", dict, default={}))
    return LeaseGrant(lease_id=get_field(body, "lease_id", str), unit=unit,
                      base_version=get_field(body, "base_version", int, minimum=0),
                      deadline_s=get_field(body, "deadline_s", float),
                      heartbeat_interval_s=get_field(body, "heartbeat_interval_s", float),
                      resumed=get_field(body, "resumed", bool, default=False))


_RECEIPT_STATUSES: Final[dict[str, ReceiptStatus]] = {
    "accepted": "accepted", "duplicate": "duplicate", "rejected": "rejected"}


def receipt_to_body(r: Receipt) -> dict[str, Any]:
    return {"lease_id": r.lease_id, "unit_id": r.unit_id, "status": r.status, "version": r.version,
            "reason": r.reason}


def receipt_from_body(body: Mapping[str, Any]) -> Receipt:
    reason = body.get("reason")
    status = get_field(body, "status", str)
    if status not in _RECEIPT_STATUSES:
        raise FrameError(f"unknown receipt status {status!r}", field="status")
    return Receipt(lease_id=get_field(body, "lease_id", str), unit_id=get_field(body, "unit_id", str),
                   status=_RECEIPT_STATUSES[status], version=get_field(body, "version", int),
                   reason=reason if isinstance(reason, str) else None)
