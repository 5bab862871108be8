"""Command-line inputs shared by ``vcasync simulate`` and ``demo``: ``key=value`` parameters
(``--policy-param``), and the text of a file a flag names (``--prices``, ``--trace``, ...)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..coerce import parsed_or_word
from ..errors import ConfigError

__all__ = ["parse_params", "read_text_file"]


def read_text_file(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path``; a missing, unreadable or non-UTF-8 file is a :class:`ConfigError`
    ``cannot read <what> '<path>': <why>``. A leading byte-order mark is dropped: Excel's "CSV UTF-8"
    writes one, and it was read as part of the first header name (``'\ufeffprovider'``)."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read {what} {str(path)!r}: {why}") from None


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """``key=value`` pairs; values are JSON when they parse as JSON (numbers, true, lists), a bare
    word is a string, and anything else is refused (:func:`vcasync.coerce.parsed_or_word`)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--policy-param wants key=value, got {item!r}")
        # 'nan' is no JSON, so it became the word 'nan' and was refused as "must be float, got
        # 'nan'"; JSON's NaN and Infinity parse to floats no policy parameter can mean
        if raw.strip().lower().lstrip("+-") in _NON_FINITE:
            raise ConfigError(f"--policy-param {key} must be a finite number, got {raw!r}")
        out[key] = parsed_or_word(raw, json.loads, f"--policy-param {key}")
    return out


#: Words that mean a number that is not finite (as Python's float() reads them).
_NON_FINITE = frozenset({"nan", "inf", "infinity"})
