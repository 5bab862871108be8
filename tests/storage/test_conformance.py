"""Every built-in backend passes the public conformance suite (S3 and GCS against real API servers)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path

import pytest
from vcasync.backends.local import LocalStorage
from vcasync.backends.memory import MemoryStorage
from vcasync.backends.s3 import S3Storage

from vcasync.storage import BytesLike, Storage, open_storage
from vcasync.testing.emulators import DUMMY_S3_CREDENTIALS
from vcasync.testing.faults import ForwardingStorage
from vcasync.testing.storage import StorageConformance

S3_BUCKET = GCS_BUCKET = "vcasync-tests"


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


class TestS3(StorageConformance):
    @pytest.fixture
    async def storage(self, s3_endpoint: str, unique_prefix: str) -> AsyncIterator[Storage]:
        async with open_storage(f"s3://{S3_BUCKET}/{unique_prefix}", endpoint_url=s3_endpoint,
                                **DUMMY_S3_CREDENTIALS) as st:
            yield st

    async def open_peer(self, storage: Storage) -> Storage:
        assert isinstance(storage, S3Storage)
        return open_storage(f"s3://{storage.bucket}/{storage.prefix}",
                            endpoint_url=storage.options.endpoint_url, **DUMMY_S3_CREDENTIALS)


class TestGCS(StorageConformance):
    @pytest.fixture
    async def storage(self, gcs_endpoint: str, unique_prefix: str) -> AsyncIterator[Storage]:
        async with open_storage(f"gs://{GCS_BUCKET}/{unique_prefix}?emulator_host={gcs_endpoint}") as st:
            yield st


class _MemoryviewReads(ForwardingStorage):
    async def get(self, key: str) -> bytes:
        return memoryview(await self.inner.get(key))  # type: ignore[return-value]


async def test_the_suite_refuses_a_get_that_is_not_bytes() -> None:
    # Found by a tester: a backend whose get returned a memoryview passed the whole suite, and a
    # coordinator on it then failed to restart with "not a vcasync run record".
    async with _MemoryviewReads(open_storage("memory://not-bytes")) as st:
        with pytest.raises(AssertionError, match=r"_MemoryviewReads\.get must return bytes.*memoryview"):
            await StorageConformance().test_reads_return_bytes(st)


class _PublishesAsItGoes(ForwardingStorage):
    """put_stream writes what it has after every chunk, and puts back what was there if the
    stream breaks: every other law of the suite holds."""

    async def put_stream(self, key: str, chunks: AsyncIterable[BytesLike], *,
                         if_absent: bool = False) -> None:
        if if_absent and await self.inner.exists(key):
            await self.inner.put(key, b"", if_absent=True)     # raises PreconditionFailedError
        old = await self.inner.get(key) if await self.inner.exists(key) else None
        written = b""
        try:
            async for chunk in chunks:
                written += bytes(chunk)
                await self.inner.put(key, written)
        except BaseException:
            if old is None:
                await self.inner.delete(key)
            else:
                await self.inner.put(key, old)
            raise


async def test_the_suite_refuses_a_stream_published_before_it_is_complete() -> None:
    # Found by a tester: such a backend passed the whole suite, though a reader (a restarted
    # coordinator, a peer) could read half a journal entry or snapshot while it was written.
    async with _PublishesAsItGoes(open_storage("memory://half-published")) as st:
        with pytest.raises(AssertionError, match=r"_PublishesAsItGoes\.put_stream publishes before "
                                                 r"its input is complete \(3000 bytes to 'fresh'\): "
                                                 r"'fresh' exists while"):
            await StorageConformance().test_stream_is_published_only_when_complete(st)


UNSORTED_STORE = """
import pytest

from vcasync.storage import open_storage
from vcasync.testing.faults import ForwardingStorage
from vcasync.testing.storage import StorageConformance


class Unsorted(ForwardingStorage):
    async def list(self, prefix=""):
        for key in sorted([k async for k in self.inner.list(prefix)], key=lambda k: k.split("/")):
            yield key


class TestUnsorted(StorageConformance):
    @pytest.fixture
    async def storage(self):
        async with Unsorted(open_storage("memory://unsorted")) as st:
            yield st
"""


def test_a_broken_law_says_what_differed(tmp_path: Path) -> None:
    # Found by a tester: pytest rewrites the asserts of test modules only, so a backend failing a
    # law of the installed suite got a bare "AssertionError", not what its listing returned.
    (tmp_path / "test_unsorted_store.py").write_text(textwrap.dedent(UNSORTED_STORE))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
         "-o", "asyncio_default_fixture_loop_scope=function", "-k", "list_prefix_semantics",
         "test_unsorted_store.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "At index 0 diff: 'a/1' != 'a.x'" in out.stdout, out.stdout
