"""The storage contract and its URL-scheme registry.

Keys are ``/``-separated strings relative to the backend's root (a bucket prefix, a directory).
Every backend is an async resource: ``async with open_storage(url) as st: ...``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["ObjectInfo", "Storage"]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str | None = None


@runtime_checkable
class Storage(Protocol):
    """Async object storage; see the conformance suite in ``vcasync.testing`` for the exact laws."""

    url: str

    async def get(self, key: str) -> bytes: ...

    async def put(self, key: str, data: bytes, *, if_absent: bool = False) -> None: ...

    async def exists(self, key: str) -> bool: ...

    async def stat(self, key: str) -> ObjectInfo: ...

    def list(self, prefix: str = "") -> AsyncIterator[str]: ...

    async def delete(self, key: str) -> None: ...

    def open_read(self, key: str, *, chunk_size: int = ...) -> AsyncIterator[bytes]: ...

    async def put_stream(self, key: str, chunks: AsyncIterator[bytes], *,
                         if_absent: bool = False) -> None: ...

    async def aclose(self) -> None: ...
