"""Every built-in backend passes the public conformance suite (S3 and GCS against real API servers)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from vcasync.backends.local import LocalStorage
from vcasync.backends.memory import MemoryStorage
from vcasync.storage import Storage, open_storage
from vcasync.testing.storage import StorageConformance


class TestMemory(StorageConformance):
    @pytest.fixture
    async def storage(self) -> AsyncIterator[Storage]:
        async with open_storage("memory://conformance") as st:
            yield st

    async def open_peer(self, storage: Storage) -> Storage:
        assert isinstance(storage, MemoryStorage)
        return storage.peer()


class TestLocal(StorageConformance):
    holds_object_and_prefix = False

    @pytest.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[Storage]:
        async with open_storage((tmp_path / "root").as_uri()) as st:
            assert isinstance(st, LocalStorage)
            yield st
