"""The HTTP protocol between workers and the coordinator: routes, media types, message bodies.

Control messages are small msgpack maps (``vcasync.wire.encode_message``: protocol version + kind);
JSON is accepted and returned for humans with curl. Tensors travel only as wire payloads
(``application/x-vcasync-payload``): results uploaded with ``PUT``, models downloaded with ``GET``.
The messages themselves are typed structs (:mod:`vcasync.protocol._bodies`, one converter for all);
this module wraps them in their envelope (:func:`encode_msg`, :func:`decode_msg`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import EllipsisType
from typing import Any, Final, Protocol, TypeVar

from ..errors import FrameError, LimitExceededError, UnsupportedMediaTypeError
from ..ledger._plain import plain_problem, text_problem
from ..ledger._units import LeaseGrant, Receipt
from ..wire import decode_message, encode_message
from ._bodies import from_body, kind_of, to_body

__all__ = [
    "API_PREFIX", "JSON", "MSGPACK", "PAYLOAD", "decode_control", "decode_msg", "encode_control",
    "encode_msg", "get_field",
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
    if content_type in (JSON, ""):     # "": no Content-Type header, read as JSON (curl -H-less)
        obj = _json_object(data)
        got = obj.pop("kind", kind)
        if got != kind:
            raise FrameError(f"expected a {kind!r} message, got {got!r}", field="kind")
        return obj
    # text/plain and application/octet-stream were read as JSON until 2026-12-07: a body sent as
    # something else was taken for what it was not
    raise UnsupportedMediaTypeError(f"unsupported content type {content_type[:80]!r}: send "
                                    f"Content-Type: {JSON} or {MSGPACK}", field="content-type")


def _json_object(data: bytes) -> dict[str, Any]:
    """A JSON control body as a dict, held to what a msgpack body can carry, since what it holds
    may be kept in a snapshot or the journal: ints within 64 bits, strings of UTF-8 (JSON allows
    ``"\\ud800"``, a lone surrogate, which msgpack cannot encode); :class:`FrameError` naming the
    field."""
    try:
        obj = json.loads(data)
    except RecursionError:
        raise FrameError("body is not valid JSON: it nests too deeply", field="body") from None
    except ValueError as exc:   # not JSON, not UTF-8, an int of over 4300 digits
        if not isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
            # Python's own limit on int digits, whose message tells the caller to raise it in
            # this process: an int that long is no 64-bit int anyway
            raise FrameError("body is not valid JSON here: it holds an integer of thousands of "
                             "digits; integers must fit in 64 bits", field="body") from None
        raise FrameError(f"body is not valid JSON: {exc}", field="body") from exc
    if not isinstance(obj, dict):
        raise FrameError("body must be a JSON object", field="body")
    for name, value in obj.items():
        bad_name = text_problem(name, "a field name of the body")
        if bad_name is not None:
            raise FrameError(bad_name, field="body")
        problem = plain_problem(value, name, finite=False)
        if problem is not None:
            raise FrameError(problem, field=name)
    return obj


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


def encode_msg(msg: Any, content_type: str) -> bytes:
    """A typed message (:mod:`vcasync.protocol._bodies`) as a control body of its own kind."""
    return encode_control(kind_of(type(msg)), to_body(msg), content_type)


def decode_msg(cls: type[T], data: bytes, content_type: str) -> T:
    """The typed message ``cls`` from a control body of its kind, every field checked."""
    return from_body(cls, decode_control(data, content_type, kind_of(cls)))


def grant_to_body(grant: LeaseGrant) -> dict[str, Any]:
    return to_body(grant)


def grant_from_body(body: Mapping[str, Any]) -> LeaseGrant:
    return from_body(LeaseGrant, body)


def receipt_to_body(r: Receipt) -> dict[str, Any]:
    return to_body(r)


def receipt_from_body(body: Mapping[str, Any]) -> Receipt:
    return from_body(Receipt, body)
