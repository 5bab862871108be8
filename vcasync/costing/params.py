"""Command-line inputs shared by ``vcasync simulate`` and ``demo``: ``key=value`` parameters
(``--policy-param``), the text of a file a flag names (``--prices``, ``--trace``, ...), and the
records of such a file when it is CSV."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from ..coerce import parsed_or_word
from ..errors import ConfigError

__all__ = ["MAX_INPUT_FILE_BYTES", "MAX_INPUT_FILE_ROWS", "csv_records", "parse_params", "read_text_file",
           "too_many_rows"]

#: The largest file a flag names (``--prices``, ``--spot-trace``, ``--trace``) may be: a 38 MB trace was
#: read whole, parsed into lists several times its size, and the run took minutes longer (docs/limits.md).
MAX_INPUT_FILE_BYTES: Final = 8 * 1024 * 1024
#: The most rows (price rows, trace rows) such a file may hold: a price every 5 minutes for a year is
#: 105,120 rows, hourly for eleven years 96,360.
MAX_INPUT_FILE_ROWS: Final = 120_000


def read_text_file(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path``; a missing, unreadable or non-UTF-8 file is a :class:`ConfigError`
    ``cannot read <what> '<path>': <why>``, and so is one over :data:`MAX_INPUT_FILE_BYTES`, refused
    by its size before it is read (a pipe, whose size is not known, once it has sent more). A leading
    byte-order mark is dropped: Excel's "CSV UTF-8" writes one, and it was read as part of the first
    header name (``'\ufeffprovider'``)."""
    limit = MAX_INPUT_FILE_BYTES
    try:
        with Path(path).open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = b"" if size > limit else f.read(limit + 1)
        if size > limit or len(data) > limit:
            got = f"{size:,} bytes" if size > limit else f"more than {limit:,} bytes"
            raise ConfigError(f"cannot read {what} {str(path)!r}: it is {got}, over the limit of "
                              f"{limit:,} bytes (MAX_INPUT_FILE_BYTES): keep the rows the run needs")
        return data.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read {what} {str(path)!r}: {why}") from None


def too_many_rows(at: str) -> ConfigError:
    """The error for a file past :data:`MAX_INPUT_FILE_ROWS` rows, ``at`` its place (the file, the
    line where the rows went past it)."""
    return ConfigError(f"{at}: more than {MAX_INPUT_FILE_ROWS:,} rows, over the limit of "
                       f"{MAX_INPUT_FILE_ROWS:,} (MAX_INPUT_FILE_ROWS): keep the rows the run needs")


def csv_records(text: str, at: str, *, strict: bool = False
                ) -> tuple[list[str], Iterator[tuple[int, dict[str, str]]]]:
    """A CSV file's header names and its records, each with the file line it ends on (a quoted
    cell may span lines), read alike for every CSV input (price rows, spot traces): header names
    stripped ("provider, instance", as people type a header, named ' instance'), a name given
    twice refused (its last cell was kept without a word: the second of two prices), and a row
    with more cells than the header refused (its extra cell was dropped), and so is the record past
    :data:`MAX_INPUT_FILE_ROWS`, and what the csv module cannot read (a cell past its field limit)
    is a :class:`ConfigError` too. ``at`` starts each error's place ("line " or "FILE:"), followed by
    the line number."""
    reader = csv.DictReader(io.StringIO(text), strict=strict)
    try:
        header = reader.fieldnames
    except csv.Error as exc:
        raise _not_csv(at, reader, exc) from None
    names = [name.strip() for name in header or ()]
    reader.fieldnames = names
    twice = sorted({n for n in names if n and names.count(n) > 1})
    if twice:
        raise ConfigError(f"{at}1: the header names {twice} more than once: which cell is the "
                          f"price?")

    def records() -> Iterator[tuple[int, dict[str, str]]]:
        n = 0
        while True:
            try:
                rec = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise _not_csv(at, reader, exc) from None
            n += 1
            if n > MAX_INPUT_FILE_ROWS:
                raise too_many_rows(f"{at}{reader.line_num}")
            if None in rec:
                raise ConfigError(f"{at}{reader.line_num}: the row has more cells than the header")
            yield reader.line_num, rec
    return names, records()


def _not_csv(at: str, reader: csv.DictReader[str], exc: csv.Error) -> ConfigError:
    # the csv module's own errors (a cell past its 131,072 characters, a stray quote in strict
    # mode) ended simulate --spot-trace and --trace on a traceback
    return ConfigError(f"{at}{reader.reader.line_num}: not valid CSV: {exc}")   # the line it failed on


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
