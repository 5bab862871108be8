"""``memory://name``: objects in a dict, for tests and throwaway runs.

Each :class:`MemoryStorage` owns its objects (no process-wide registry, so two
``open_storage("memory://x")`` calls are two independent stores); :meth:`MemoryStorage.peer`
gives a second handle on the same objects, as a second process would have on a real bucket.
It keeps the same laws as the durable backends: streamed writes publish only when complete,
conditional creates are atomic, stored bytes are private copies.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, ClassVar

from vcasync.errors import ConfigError, ObjectNotFoundError, PreconditionFailedError
from vcasync.storage import DEFAULT_CHUNK_SIZE, BytesLike, ObjectInfo, validate_key, validate_prefix

from ._common import StorageBase, check_chunk_size, check_data, split_url

__all__ = ["MemoryStorage"]


class _Objects:
    """The shared state of one memory store: key -> (bytes, version)."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[bytes, int]] = {}
        self.versions = itertools.count(1)


class MemoryStorage(StorageBase):
    """An in-process object store. ``url`` is ``memory://name``; the name is only a label."""

    #: Its objects live in this process: gone when it exits (:func:`vcasync.storage.outlives_process`).
    process_local: ClassVar[bool] = True

    def __init__(self, name: str = "default", *, _objects: _Objects | None = None) -> None:
        super().__init__(f"memory://{name}")
        self.name = name
        self._objects = _objects if _objects is not None else _Objects()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MemoryStorage:
        parts = split_url(url, "memory")
        if options or parts.query:
            raise ConfigError(f"memory:// takes no options, got {sorted(options) or parts.query!r}")
        name = (parts.netloc + parts.path).strip("/") or "default"
        return cls(name)

    def peer(self) -> MemoryStorage:
        """Another handle on the same objects; closing one does not close the other."""
        self._check_open()
        return MemoryStorage(self.name, _objects=self._objects)

    def _lookup(self, key: str) -> tuple[bytes, int]:
        self._check_open()
        validate_key(key)
        try:
            return self._objects.data[key]
        except KeyError:
            raise ObjectNotFoundError(f"{self.url}: no object {key!r}", key=key) from None

    def _store(self, key: str, data: bytes, if_absent: bool) -> None:
        # No await between the check and the store: atomic with respect to other tasks.
        self._check_open()
        if if_absent and key in self._objects.data:
            raise PreconditionFailedError(f"{self.url}: {key!r} already exists", key=key)
        self._objects.data[key] = (data, next(self._objects.versions))

    async def get(self, key: str) -> bytes:
        data, _ = self._lookup(key)
        await asyncio.sleep(0)
        return data

    async def put(self, key: str, data: BytesLike, *, if_absent: bool = False) -> None:
        self._check_open()
        validate_key(key)
        blob = bytes(check_data(data))
        await asyncio.sleep(0)
        self._store(key, blob, if_absent)

    async def put_stream(self, key: str, chunks: AsyncIterable[BytesLike], *,
                         if_absent: bool = False) -> None:
        self._check_open()
        validate_key(key)
        if if_absent and key in self._objects.data:
            raise PreconditionFailedError(f"{self.url}: {key!r} already exists", key=key)
        buf = bytearray()
        async for chunk in chunks:
            self._check_open()
            buf += check_data(chunk)
        self._store(key, bytes(buf), if_absent)

    async def exists(self, key: str) -> bool:
        self._check_open()
        validate_key(key)
        await asyncio.sleep(0)
        return key in self._objects.data

    async def stat(self, key: str) -> ObjectInfo:
        data, version = self._lookup(key)
        await asyncio.sleep(0)
        return ObjectInfo(key=key, size=len(data), etag=str(version))

    async def delete(self, key: str) -> None:
        self._check_open()
        validate_key(key)
        await asyncio.sleep(0)
        self._objects.data.pop(key, None)

    async def list(self, prefix: str = "") -> AsyncIterator[str]:
        self._check_open()
        validate_prefix(prefix)
        keys = sorted(k for k in self._objects.data if k.startswith(prefix))
        for key in keys:
            self._check_open()
            yield key
            await asyncio.sleep(0)

    async def open_read(self, key: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE
                        ) -> AsyncIterator[bytes]:
        check_chunk_size(chunk_size)
        data, _ = self._lookup(key)
        with memoryview(data) as view:
            for start in range(0, len(data), chunk_size):
                self._check_open()
                yield bytes(view[start:start + chunk_size])
                await asyncio.sleep(0)

    async def _release(self) -> None:
        self._objects = _Objects()  # drop our reference; peers keep theirs
