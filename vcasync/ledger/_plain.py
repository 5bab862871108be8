"""Plain data a snapshot can hold: the one rule for values from users that the ledger keeps.

A worker's info, a unit's params and every JSON control body end up packed as msgpack (snapshots,
the journal). msgpack holds ints of 64 bits (signed or unsigned) and strings of UTF-8; JSON and
Python hold more: ints of any size and strings with lone surrogates (``"\\ud800"`` is valid JSON).
Such a value, once taken in, made every later snapshot fail. :func:`plain_problem` says what in a
value is not plain data, and where, so each boundary refuses it with its own error class before
anything is stored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["INT_END", "INT_MIN", "PLAIN_DATA", "plain_problem", "text_problem"]

INT_MIN, INT_END = -(1 << 63), 1 << 64     # what msgpack (and so a snapshot) can hold
PLAIN_DATA = "None, bool, int, finite float, str, and lists and dicts with str keys of those"


def text_problem(text: str, where: str) -> str | None:
    """Why ``text`` is no UTF-8 string (a lone surrogate, which msgpack cannot encode), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"{where} is not valid UTF-8: it holds the lone surrogate "
                f"{ascii(text[exc.start])[1:-1]} at character {exc.start}")
    return None


def _int_problem(value: int, where: str) -> str | None:
    if INT_MIN <= value < INT_END:
        return None
    shown = str(value) if value.bit_length() <= 256 else f"an int of {value.bit_length()} bits"
    return f"{where} = {shown} does not fit in 64 bits"


def _scalar_problem(value: Any, where: str, noun: str, finite: bool) -> str | None:
    if isinstance(value, str):
        return text_problem(value, where)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return _int_problem(value, where)
    if isinstance(value, float):
        if finite and not math.isfinite(value):
            return f"{where} = {value} is not finite; {noun} hold {PLAIN_DATA}"
        return None
    return f"{where} is of type {type(value).__name__}; {noun} hold {PLAIN_DATA}"


def _key_problem(key: Any, where: str) -> str | None:
    if not isinstance(key, str):
        return f"{where} has the key {key!r} of type {type(key).__name__}: keys must be strings"
    return text_problem(key, f"a key in {where}")


def plain_problem(value: Any, where: str, *, noun: str = "values", max_depth: int | None = None,
                  finite: bool = True) -> str | None:
    """What keeps ``value`` from being plain data (None: nothing), naming its path from ``where``
    (``info.tags[2]``): a type outside :data:`PLAIN_DATA` (``noun`` says whose), a key that is not a
    str, a str with a lone surrogate, an int outside 64 bits, a NaN or infinite float (when
    ``finite``), nesting deeper than ``max_depth``. Walked without recursion, first problem first."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if max_depth is not None and depth > max_depth:
            return f"{where} nests deeper than {max_depth} levels (at {path})"
        if isinstance(item, Mapping):
            for key in item:
                problem = _key_problem(key, path)
                if problem is not None:
                    return problem
            stack.extend((v, f"{path}.{k}", depth + 1) for k, v in reversed(list(item.items())))
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in reversed(list(enumerate(item))))
        else:
            problem = _scalar_problem(item, path, noun, finite)
            if problem is not None:
                return problem
    return None
