"""Pieces every built-in backend shares: lifecycle, option parsing, stream re-blocking.

Third-party backends may use these too, but only the :class:`vcasync.storage.Storage` protocol is
a contract.
"""

from __future__ import annotations

import dataclasses
import secrets
import types
import typing
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any, Self, TypeVar
from urllib.parse import SplitResult, parse_qs, urlsplit

from vcasync.coerce import coerce
from vcasync.errors import ClosedError, ConfigError
from vcasync.retry import RetryPolicy
from vcasync.storage import shown_url  # re-exported: the backends' one way to show a URL

__all__ = ["StorageBase", "check_chunk_size", "check_data", "join_key", "parse_options", "rechunk",
           "check_endpoint", "shown_url", "split_url", "writer_token"]

OptionsT = TypeVar("OptionsT")

WRITER_META = "vcasync-writer"
"""Object metadata naming the writer of a conditional create, to settle an ambiguous retry."""


class StorageBase:
    """Lifecycle shared by the built-in backends: ``async with``, idempotent ``aclose``, and a
    :class:`ClosedError` from every call after it. ``repr`` shows the URL only (never secrets)."""

    url: str

    def __init__(self, url: str) -> None:
        self.url = url
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"storage {self.url} is closed; open a new one")

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: types.TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release connections and buffers. Closing twice is fine; the second call does nothing."""
        if self._closed:
            return
        self._closed = True
        await self._release()

    async def _release(self) -> None:
        """Backend hook: free what the instance holds. Runs once."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}{' (closed)' if self._closed else ''}>"


def writer_token() -> str:
    """A fresh random id to tag one conditional write with."""
    return secrets.token_hex(16)


def join_key(root: str, key: str) -> str:
    return f"{root}/{key}" if root else key


def check_data(data: object) -> memoryview:
    """``data`` as a flat byte view; anything not bytes-like is a TypeError naming the type."""
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    raise TypeError(f"storage data must be bytes-like (bytes, bytearray, memoryview), "
                    f"got {type(data).__name__}")


def check_chunk_size(chunk_size: object) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    return chunk_size


async def rechunk(chunks: AsyncIterable[bytes | bytearray | memoryview], size: int) -> AsyncIterator[bytes]:
    """Re-block a byte stream into pieces of exactly ``size`` bytes (the last may be shorter; an
    empty stream yields nothing). Each input byte is copied once into the buffer, once out."""
    buf = bytearray()
    async for chunk in chunks:
        buf += check_data(chunk)
        if len(buf) >= size:
            full = len(buf) - len(buf) % size
            with memoryview(buf) as view:
                parts = [bytes(view[i:i + size]) for i in range(0, full, size)]
            del buf[:full]
            for part in parts:
                yield part
            del parts
    if buf:
        yield bytes(buf)


# --- URLs and options -------------------------------------------------------------------------


def split_url(url: str, scheme: str) -> SplitResult:
    parts = urlsplit(url)
    if parts.scheme.lower() != scheme:
        raise ConfigError(f"{shown_url(url)!r} is not a {scheme}:// URL")
    if parts.fragment:
        raise ConfigError(f"storage URL {shown_url(url)!r} must not have a '#fragment'")
    if "@" in parts.netloc:
        # the URL names the store in every message and log line: a password there goes with it
        raise ConfigError(f"storage URL {shown_url(url)!r} must not carry user info ('user:...@'): "
                          "credentials go as keyword arguments or through the standard credential "
                          "chain, never in the URL")
    return parts


def check_endpoint(owner: str, name: str, value: str | None) -> None:
    """Refuse an endpoint option (``endpoint_url``, ``emulator_host``) that carries user info: it
    becomes part of the store's URL, which every message and log line shows."""
    if value is None:
        return
    if not isinstance(value, str):
        raise ConfigError(f"{owner}.{name} must be a str, got {type(value).__name__}")
    netloc = urlsplit(value if "://" in value else f"//{value}").netloc
    if "@" in netloc:
        raise ConfigError(f"{owner}.{name} {shown_url(value)!r} must not carry user info "
                          "('user:...@'): credentials go as keyword arguments or through the "
                          "standard credential chain")


def _query(url: str, query: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        if len(values) != 1:
            raise ConfigError(f"option {name!r} is given {len(values)} times in {shown_url(url)!r}")
        out[name] = values[0]
    return out


def _has_text_form(hint: Any) -> bool:
    """Whether a value of type ``hint`` can be given as text (in a URL query): a plain scalar."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return all(a in (str, int, float, bool) for a in args)


def parse_options(cls: type[OptionsT], url: str, query: str, kwargs: Mapping[str, Any]) -> OptionsT:
    """Build the frozen options dataclass ``cls`` from the URL query and keyword arguments.

    Unknown names raise :class:`ConfigError` naming them; so does a field declared with
    ``metadata={"secret": True}`` in the URL (URLs end up in logs), and a name given both ways.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    from_url = _query(url, query)
    unknown = sorted((set(from_url) | set(kwargs)) - set(fields))
    if unknown:
        if set(kwargs) - set(fields):
            known = f"known: {', '.join(sorted(fields))}"
        else:   # a URL was listed its secrets, which it is always refused
            # neither a secret (always refused in a URL) nor what has no text form (a
            # RetryPolicy): a URL offered "retry", then refused it
            public = sorted(n for n, f in fields.items() if not f.metadata.get("secret")
                            and _has_text_form(hints[n]))
            known = f"a URL may carry: {', '.join(public)}"
            if any(f.metadata.get("secret") for f in fields.values()):
                known += " (credentials go as keyword arguments or the standard credential chain)"
            python_only = sorted(n for n in fields if not _has_text_form(hints[n]))
            if python_only:
                known += f"; from Python only: {', '.join(python_only)}"
        raise ConfigError(f"unknown option(s) {', '.join(unknown)} for {shown_url(url)!r}; {known}")
    both = sorted(set(from_url) & set(kwargs))
    if both:
        raise ConfigError(f"option(s) {', '.join(both)} given both in the URL and as arguments")
    values: dict[str, Any] = dict(kwargs)
    for name, raw in from_url.items():
        if fields[name].metadata.get("secret"):
            raise ConfigError(f"option {name!r} is a secret: pass it as a keyword argument or "
                              "through the standard credential chain, never in the URL")
        values[name] = coerce(raw, hints[name], f"option {name!r}", text=True)
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"bad options for {shown_url(url)!r}: {exc}") from None


def check_positive(owner: str, **values: int | float) -> None:
    """Raise :class:`ConfigError` unless every value is a positive number (not a bool)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"{owner}.{name} must be > 0, got {value!r}")


def check_retry(owner: str, retry: object) -> None:
    if not isinstance(retry, RetryPolicy):
        raise ConfigError(f"{owner}.retry must be a RetryPolicy, got {type(retry).__name__}")
