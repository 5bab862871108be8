"""msgpack with every limit on: the only place untrusted msgpack is parsed.

``unpack`` refuses oversized strings, binaries, containers and nesting (``Limits``), non-string map
keys, and every ext type except the ones a caller explicitly maps (``pack_tree`` uses two). Each
failure of the msgpack library, whatever its class, becomes a :class:`~vcasync.errors.FrameError`
that names the field being parsed: nothing else escapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from ..errors import FrameError, LimitExceededError, WireError
from .limits import Limits

__all__ = ["EXACT_SCALARS", "ExtHook", "all_scalars", "check_plain", "pack", "unpack"]

ExtHook = Callable[[int, bytes], Any]

PLAIN_SCALARS = (str, bytes, int, float, bool, type(None))
#: The exact types msgpack returns for scalars: a list holding only these needs no walk.
EXACT_SCALARS = frozenset(PLAIN_SCALARS)


def all_scalars(items: list[Any] | tuple[Any, ...]) -> bool:
    """True when every item is a plain scalar of an exact type (one pass in C: a ledger snapshot
    is a few columns of 100,000s of values, which a walk item by item took seconds to visit)."""
    return set(map(type, items)) <= EXACT_SCALARS


def pack(obj: Any, *, default: Callable[[Any], Any] | None = None) -> bytes:
    """Pack plain data (``TypeError`` naming the culprit for anything else)."""
    try:
        out: bytes = msgpack.packb(obj, use_bin_type=True, datetime=False, default=default)
        return out
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"cannot encode {type(obj).__name__} as msgpack: {exc}") from exc


def _refuse_ext(code: int, data: bytes) -> Any:
    raise FrameError(f"msgpack ext type {code} is not allowed here", field="ext")


def unpack(data: bytes | bytearray | memoryview, limits: Limits, *, field: str, max_bytes: int,
           ext_hook: ExtHook | None = None, check: bool = True) -> Any:
    """Parse one msgpack object of at most ``max_bytes`` bytes under ``limits``.

    ``check=False`` skips the plain-data walk (depth limit) for small fixed-shape headers whose
    every field the caller validates itself; ext types are refused by msgpack either way.
    """
    size = len(data)
    if size > max_bytes:
        raise LimitExceededError(f"{field} is {size} bytes, over the limit {max_bytes}",
                                 field=field, limit=max_bytes, value=size)
    try:
        obj = msgpack.unpackb(
            data, raw=False, use_list=True, strict_map_key=True, timestamp=0,
            max_str_len=max_bytes, max_bin_len=max_bytes, max_array_len=limits.max_items,
            max_map_len=limits.max_items, max_ext_len=max_bytes if ext_hook else 0,
            ext_hook=ext_hook or _refuse_ext)
    except WireError:
        raise
    except RecursionError:
        raise FrameError(f"{field}: msgpack nested too deeply", field=field) from None
    except Exception as exc:  # msgpack raises many classes (ValueError, ExtraData, ...): wrap all
        raise FrameError(f"{field}: malformed msgpack ({type(exc).__name__}: {exc})"[:300],
                         field=field) from None
    if check or ext_hook is not None:
        check_plain(obj, limits, field=field, extra_types=() if ext_hook is None else (tuple, _Leaf))
    return obj


class _Leaf:
    """Base for objects an ext hook may return (e.g. tensor references in a tree)."""

    __slots__ = ()


Leaf = _Leaf


def check_plain(obj: Any, limits: Limits, *, field: str,
                extra_types: tuple[type, ...] = ()) -> None:
    """Only dict[str, ...]/list/str/bytes/int/float/bool/None (+ ``extra_types``), nested at
    most ``limits.max_depth`` deep."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limits.max_depth:
            raise LimitExceededError(f"{field} nests deeper than the limit {limits.max_depth}",
                                     field=f"{field}.depth", limit=limits.max_depth, value=depth)
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise FrameError(f"{field} has a non-string map key", field=field)
                stack.append((v, depth + 1))
        elif isinstance(item, list | tuple) and (isinstance(item, list) or tuple in extra_types):
            if depth < limits.max_depth and all_scalars(item):
                continue                 # its items are leaves within the depth limit
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, PLAIN_SCALARS) or (extra_types and isinstance(item, extra_types)):
            continue
        else:
            raise FrameError(f"{field} holds a {type(item).__name__}, which is not plain data",
                             field=field)
