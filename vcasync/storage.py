"""The storage contract, key rules, and the URL-scheme registry.

Keys are ``/``-separated strings relative to the backend's root (a bucket prefix, a directory).
Every backend is an async resource: ``async with open_storage(url) as st: ...``.

Backends register under the ``vcasync.backends`` entry-point group (ours too, see pyproject.toml):
the entry names a class with ``from_url(url, **options) -> Storage``. They load lazily, so a
missing optional dependency only matters for the scheme that needs it, and then says how to fix
it (``pip install 'vcasync[s3]'``).

The laws every backend obeys are spelled out, and tested, by
:class:`vcasync.testing.storage.StorageConformance`:

- ``put`` replaces atomically: a reader sees the old bytes or the new ones, never a mix, and a
  failed or cancelled write (``put_stream`` whose input raises) leaves nothing under the key;
- ``put(..., if_absent=True)`` creates or raises :class:`PreconditionFailedError`; of several
  concurrent writers exactly one wins;
- ``get`` returns ``bytes`` and ``open_read`` yields ``bytes`` (never a memoryview or bytearray);
- ``get``/``stat``/``open_read`` of a missing key raise :class:`ObjectNotFoundError`; ``delete`` of a
  missing key is a no-op (so retries and concurrent cleaners are harmless);
- ``list(prefix)`` yields every key that starts with ``prefix`` (a plain string prefix, not a
  directory), each once, in ascending code-point order;
- after ``aclose`` (idempotent) every call raises :class:`ClosedError`.

Durability rests on the if-absent law, and not every store keeps it (the stock GCS emulator accepts
``ifGenerationMatch=0`` twice; some S3-compatible stores ignore ``If-None-Match``). So before a
coordinator writes anything, :func:`probe_storage` runs the backend's own open-time checks (a
:class:`Preflight` backend: bucket exists, credentials found) and then *tries* the law on a scratch
key, so the coordinator can refuse a store that would let a restart overwrite its run.

What a third-party backend needs is here and public: the contract (:class:`Storage`,
:class:`ObjectInfo`, :data:`BytesLike`), the key rules (:func:`validate_key`,
:func:`validate_prefix`), :data:`DEFAULT_CHUNK_SIZE`, and two asyncio helpers the built-in backends
use, :func:`buffer_blocks` (a zero-copy streaming body) and :func:`first_error` (the failure inside a
TaskGroup's exception group).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import types
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeAlias, runtime_checkable
from urllib.parse import SplitResult, urlsplit, urlunsplit

from ._aio import buffer_blocks, first_error
from ._registry import Registry
from .errors import (
    AccessDeniedError,
    BackendUnavailableError,
    ConfigError,
    InvalidKeyError,
    ObjectNotFoundError,
    PreconditionFailedError,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MAX_KEY_BYTES",
    "BytesLike",
    "ObjectInfo",
    "Preflight",
    "ProbeResult",
    "StaleTemp",
    "Storage",
    "StorageBackend",
    "available_backends",
    "backend_registry",
    "buffer_blocks",
    "first_error",
    "open_storage",
    "outlives_process",
    "probe_storage",
    "register_backend",
    "shown_url",
    "unregister_backend",
    "validate_key",
    "validate_prefix",
]

MAX_KEY_BYTES = 1024
"""The longest key, in UTF-8 bytes, that every backend accepts (S3's and GCS's limit)."""

DEFAULT_CHUNK_SIZE = 1 << 20
"""How many bytes ``open_read`` yields at a time unless the caller asks otherwise."""

BytesLike: TypeAlias = bytes | bytearray | memoryview
"""What ``put`` and ``put_stream`` accept; stored bytes are always a private copy."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``stat`` knows about an object. ``etag`` changes whenever the content does (or is None)."""

    key: str
    size: int
    etag: str | None = None


@runtime_checkable
class Storage(Protocol):
    """Async object storage; see the module docstring and the conformance suite for the laws."""

    @property
    def url(self) -> str:
        """Where the store is (read-only: a plain attribute or a property both satisfy it)."""
        ...

    async def get(self, key: str) -> bytes: ...

    async def put(self, key: str, data: BytesLike, *, if_absent: bool = False) -> None: ...

    async def exists(self, key: str) -> bool: ...

    async def stat(self, key: str) -> ObjectInfo: ...

    def list(self, prefix: str = "") -> AsyncIterator[str]: ...

    async def delete(self, key: str) -> None: ...

    def open_read(self, key: str, *, chunk_size: int = ...) -> AsyncIterator[bytes]: ...

    async def put_stream(self, key: str, chunks: AsyncIterable[BytesLike], *,
                         if_absent: bool = False) -> None: ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: types.TracebackType | None) -> None: ...


#: What an object needs to be a :class:`Storage` (``isinstance`` checks that each is there).
_STORAGE_MEMBERS = ("url", "get", "put", "exists", "stat", "list", "delete", "open_read",
                    "put_stream", "aclose", "__aenter__", "__aexit__")


def _missing_storage_members(obj: object) -> list[str]:
    """The members of the :class:`Storage` contract ``obj`` lacks (a method set to None counts
    as lacking), in the contract's order: what to say when ``isinstance(obj, Storage)`` is False."""
    missing = []
    for name in _STORAGE_MEMBERS:
        value = getattr(obj, name, None)
        if value is None or (name != "url" and not callable(value)):
            missing.append(name)
    return missing


@runtime_checkable
class Preflight(Protocol):
    """Optional for a backend: checks that need no write, run once before a coordinator starts.

    ``preflight`` raises a clear, typed error when the store cannot work at all: the bucket does not
    exist (:class:`~vcasync.errors.BucketNotFoundError`, naming it), no credentials can be found
    (:class:`~vcasync.errors.AccessDeniedError`, saying how to provide them). It must be quick: a
    missing credential is reported in about a second, not after a minute of retries.
    """

    async def preflight(self) -> None: ...


@runtime_checkable
class StaleTemp(Protocol):
    """Optional for a backend that writes through temporary files of its own (``file://``): a
    writer killed mid-write (a coordinator killed during an upload or a snapshot) leaves one behind,
    which nothing else would ever delete. ``remove_stale_temp`` deletes those no write has touched
    for ``max_age_s`` and returns how many; a coordinator calls it at start and every
    ``STALE_TEMP_EVERY_S`` (:mod:`vcasync.coordinator`)."""

    async def remove_stale_temp(self, max_age_s: float = ...) -> int: ...


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What :func:`probe_storage` found out about a store."""

    url: str
    conditional_writes: bool    # a second if-absent put of one key raised PreconditionFailedError


async def probe_storage(storage: Storage, prefix: str) -> ProbeResult:
    """Check a store before a coordinator relies on it: the backend's :class:`Preflight` (if it
    has one), that ``prefix`` is writable, and whether ``put(..., if_absent=True)`` is honoured.

    The probe writes a scratch object ``<prefix>/probe-<random>`` if absent, tries the same again
    (which must fail) and deletes it. A refused write raises :class:`AccessDeniedError` naming the
    store; an honest store that ignores preconditions gives ``conditional_writes=False``.
    """
    if isinstance(storage, Preflight):
        await storage.preflight()
    key = f"{prefix.strip('/')}/probe-{secrets.token_hex(8)}"
    try:
        await storage.put(key, b"first", if_absent=True)
    except AccessDeniedError as exc:
        raise AccessDeniedError(f"cannot write to {storage.url}: {exc}", key=key) from exc
    try:
        await storage.put(key, b"second", if_absent=True)
        honoured = False
    except PreconditionFailedError:
        honoured = True
    finally:
        with contextlib.suppress(ObjectNotFoundError):
            await storage.delete(key)
    return ProbeResult(storage.url, honoured)


class StorageBackend(Protocol):
    """What a ``vcasync.backends`` entry point names: a factory from a URL and options."""

    def from_url(self, url: str, **options: Any) -> Storage: ...


# --- keys -----------------------------------------------------------------------------------


def _check_text(what: str, text: object) -> str:
    if not isinstance(text, str):
        raise InvalidKeyError(f"{what} must be a str, got {type(text).__name__}")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidKeyError(f"{what} {text!r} is not valid Unicode (lone surrogate)",
                              key=text) from None
    if len(raw) > MAX_KEY_BYTES:
        raise InvalidKeyError(f"{what} is {len(raw)} bytes in UTF-8; the limit is {MAX_KEY_BYTES}",
                              key=text)
    for ch in text:
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise InvalidKeyError(f"{what} {text!r} contains the control character {ch!r}", key=text)
    if "\\" in text:
        raise InvalidKeyError(f"{what} {text!r} contains a backslash; use '/' to separate parts",
                              key=text)
    if text.startswith("/"):
        raise InvalidKeyError(f"{what} {text!r} must be relative (no leading '/')", key=text)
    return text


def _check_segments(what: str, text: str, segments: list[str]) -> None:
    for seg in segments:
        if seg == "":
            raise InvalidKeyError(f"{what} {text!r} has an empty part ('//' or a trailing '/')",
                                  key=text)
        if seg in (".", ".."):
            raise InvalidKeyError(f"{what} {text!r} has a {seg!r} part", key=text)


def validate_key(key: object) -> str:
    """Return ``key`` if every backend can hold it, else raise :class:`InvalidKeyError` saying why.

    A key is 1..1024 UTF-8 bytes of ``/``-separated non-empty parts, none ``.`` or ``..``; no
    leading or trailing ``/``, no control characters, no backslash. Spaces and any other Unicode
    are fine.
    """
    text = _check_text("key", key)
    if text == "":
        raise InvalidKeyError("key must not be empty", key=text)
    _check_segments("key", text, text.split("/"))
    return text


def validate_prefix(prefix: object) -> str:
    """Like :func:`validate_key`, but ``""`` and a trailing ``/`` are allowed (a listing prefix)."""
    text = _check_text("prefix", prefix)
    if text == "":
        return text
    segments = text.split("/")
    if segments[-1] == "":
        segments.pop()
    _check_segments("prefix", text, segments)
    return text


# --- the registry -----------------------------------------------------------------------------

_EXTRAS = {"s3": "s3", "gs": "gcs"}


def _validate_backend(name: str, obj: object) -> StorageBackend:
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9+.-]+", name):
        # url_scheme lowercases what a URL says, and takes a one-letter scheme for a drive and
        # a name urlsplit does not take for a path: a backend under such a name never opens
        raise BackendUnavailableError(
            f"storage backend {name!r}: a URL scheme is a lowercase letter, then lowercase "
            f"letters, digits, '+', '-' or '.', two characters at least (so that {name}://... "
            f"names it, not a file path)")
    if not callable(getattr(obj, "from_url", None)):
        raise BackendUnavailableError(
            f"storage backend {name!r} ({obj!r}) has no from_url(url, **options) factory")
    return obj  # type: ignore[return-value]


def _missing(name: str, path: str, exc: ImportError) -> Exception:
    extra = _EXTRAS.get(name)
    hint = f"pip install 'vcasync[{extra}]'" if extra else f"pip install {exc.name or 'the dependency'}"
    return BackendUnavailableError(
        f"the {name}:// storage backend ({path}) needs a package that is not installed "
        f"({exc.name or exc}): {hint}")


def _broken(name: str, problem: str) -> Exception:
    return BackendUnavailableError(f"the {name}:// storage backend: {problem}")


def _unknown(name: str, known: list[str]) -> Exception:
    if not known and " " in name:  # Registry.register passes its duplicate-name message here
        return BackendUnavailableError(name)
    listed = ", ".join(f"{k}://" for k in known)
    return BackendUnavailableError(f"no storage backend for the URL scheme {name!r}; known: {listed}")


def backend_registry() -> Registry[StorageBackend]:
    """A fresh registry fed by the ``vcasync.backends`` entry points (tests use their own)."""
    return Registry("vcasync.backends", validate=_validate_backend, missing=_missing,
                    unknown=_unknown, broken=_broken)


_BACKENDS = backend_registry()


def register_backend(scheme: str, backend: object, *, replace: bool = False) -> None:
    """Add a backend for ``scheme://`` URLs at run time (entry points are the usual way); a
    scheme already taken, by a registration or an installed backend, needs ``replace=True``."""
    _BACKENDS.register(scheme, backend, replace=replace)


def unregister_backend(scheme: str) -> None:
    """Forget a backend :func:`register_backend` added (entry points stay); unknown schemes are a no-op."""
    _BACKENDS.unregister(scheme)


def available_backends() -> list[str]:
    """The URL schemes a backend is registered for (installed or not)."""
    return _BACKENDS.names()


def shown_url(url: str) -> str:
    """``url`` as an error message may show it: user info and every query value masked (``***``),
    the option names kept. A URL may carry a secret by mistake (``?aws_secret_access_key=...``,
    ``user:password@``) and the message that refuses it ends up in logs. Core and backends show
    a URL through this one function."""
    try:
        parts = urlsplit(url)
        if not parts.netloc and "://" in parts.path:
            # a scheme urlsplit does not take ('my_store://u:p@h'): the rest is still a URL's
            scheme, _, rest = url.partition("://")
            parts = SplitResult(scheme, *urlsplit("//" + rest)[1:])
    except ValueError:
        return "<a storage URL that does not parse>"
    host = parts.netloc.rpartition("@")[2]
    netloc = f"***@{host}" if "@" in parts.netloc else host
    # option names stay, values go; an item without '=' (a bare token) may be the secret itself
    query = "&".join(f"{name}=***" if sep else "***"
                     for name, sep, _ in (item.partition("=") for item in parts.query.split("&") if item))
    return urlunsplit((parts.scheme, netloc, parts.path, query, "***" if parts.fragment else ""))


def _not_a_url(url: object) -> str:
    """What a refusal of something that is not a URL string shows of it: its type, never its
    value (bytes or another object may hold a URL with its secrets)."""
    return "''" if url == "" else f"a {type(url).__name__}"


def url_scheme(url: str) -> str:
    """The scheme of ``url``; plain paths (and ``C:\\``-style drive paths) are ``file``."""
    if not isinstance(url, str) or url == "":
        raise BackendUnavailableError(f"a storage URL must be a non-empty str, got {_not_a_url(url)}")
    scheme = urlsplit(url).scheme
    if "://" not in url or len(scheme) <= 1:
        return "file"
    return scheme.lower()


def outlives_process(url: str | os.PathLike[str], *,
                     registry: Registry[StorageBackend] | None = None) -> bool:
    """Whether what the store ``url`` names outlives the process that opens it. False for a
    backend that says ``process_local = True`` (``memory://``: its objects live in that process
    and are gone when it exits, so a coordinator restarted on it starts the run over); True for
    every other (a backend that does not say is taken to be durable)."""
    url = os.fspath(url) if isinstance(url, os.PathLike) else url
    backend = (registry if registry is not None else _BACKENDS).get(url_scheme(url))
    return not bool(getattr(backend, "process_local", False))


def open_storage(url: str | os.PathLike[str], *, registry: Registry[StorageBackend] | None = None,
                 **options: Any) -> Storage:
    """Open the storage ``url`` names: ``file:///abs/path`` (or a plain path, also as a
    :class:`~pathlib.Path`), ``memory://name``, ``s3://bucket/prefix?endpoint_url=...``,
    ``gs://bucket/prefix``.

    Options may come as keyword arguments or (non-secret ones) as URL query parameters; unknown
    ones raise :class:`ConfigError` naming them, and so does a ``url`` that is not a non-empty
    string or path. Use the result with ``async with``.
    """
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise ConfigError(f"a storage URL is a non-empty str (file:///path, s3://bucket/prefix, "
                          f"gs://bucket/prefix, memory://name) or a path, got {_not_a_url(url)}")
    scheme = url_scheme(url)
    backend = (registry if registry is not None else _BACKENDS).get(scheme)
    storage: object = backend.from_url(url, **options)   # a third party's: checked
    if not isinstance(storage, Storage):
        # said here, naming the backend, rather than as an AttributeError wherever the call is
        lacks = ", ".join(_missing_storage_members(storage)) or "a member"
        raise BackendUnavailableError(
            f"the {scheme}:// storage backend's from_url returned a {type(storage).__name__}, "
            f"which lacks {lacks} of the vcasync.storage.Storage contract")
    return storage
