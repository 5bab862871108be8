"""Command-line inputs shared by ``vcasync simulate`` and ``demo``: ``key=value`` parameters
(``--policy-param``), the text of a file a flag names (``--prices``, ``--trace``, ...), and the
records of such a file when it is CSV."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..coerce import parsed_or_word
from ..errors import ConfigError

__all__ = ["csv_records", "parse_params", "read_text_file"]


def read_text_file(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path``; a missing, unreadable or non-UTF-8 file is a :class:`ConfigError`
    ``cannot read <what> '<path>': <why>``. A leading byte-order mark is dropped: Excel's "CSV UTF-8"
    writes one, and it was read as part of the first header name (``'\ufeffprovider'``)."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read {what} {str(path)!r}: {why}") from None


def csv_records(text: str, at: str, *, strict: bool = False
                ) -> tuple[list[str], Iterator[tuple[int, dict[str, str]]]]:
    """A CSV file's header names and its records, each with the file line it ends on (a quoted
    cell may span lines), read alike for every CSV input (price rows, spot traces): header names
    stripped ("provider, instance", as people type a header, named ' instance'), a name given
    twice refused (its last cell was kept without a word: the second of two prices), and a row
    with more cells than the header refused (its extra cell was dropped). ``at`` starts each
    error's place ("line " or "FILE:"), followed by the line number."""
    reader = csv.DictReader(io.StringIO(text), strict=strict)
    names = [name.strip() for name in reader.fieldnames or ()]
    reader.fieldnames = names
    twice = sorted({n for n in names if n and names.count(n) > 1})
    if twice:
        raise ConfigError(f"{at}1: the header names {twice} more than once: which cell is the "
                          f"price?")

    def records() -> Iterator[tuple[int, dict[str, str]]]:
        for rec in reader:
            if None in rec:
                raise ConfigError(f"{at}{reader.line_num}: the row has more cells than the header")
            yield reader.line_num, rec
    return names, records()


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
