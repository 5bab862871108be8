"""A streamed write to local disk starts the writeback as it goes, so its closing fsync is short."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends import local
from backends.local import WRITEBACK_BYTES, LocalOptions, LocalStorage

MIB = 1 << 20


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


async def test_stream_starts_writeback_every_few_megabytes_and_keeps_every_byte(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(local, "_FADVISE", lambda fd, off, n, advice: calls.append((off, n, advice)))
    data = os.urandom(2 * WRITEBACK_BYTES + 3 * MIB + 17)
    store = LocalStorage(tmp_path)
    await store.put_stream("blob", _chunks(data, MIB))
    assert await store.get("blob") == data
    # contiguous ranges from 0, each at least WRITEBACK_BYTES, never past what was written
    assert [c[2] for c in calls] == [os.POSIX_FADV_DONTNEED] * len(calls)
    assert len(calls) == 2
    ends = 0
    for off, n, _ in calls:
        assert off == ends
        assert n >= WRITEBACK_BYTES
        ends = off + n
    assert ends <= len(data)


async def test_no_writeback_advice_when_not_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(local, "_FADVISE", lambda fd, off, n, advice: calls.append(n))
    store = LocalStorage(tmp_path, LocalOptions(durable=False))
    data = os.urandom(3 * WRITEBACK_BYTES)
    await store.put_stream("blob", _chunks(data, MIB))
    assert await store.get("blob") == data
    assert calls == []


async def test_a_file_system_that_refuses_the_advice_still_stores(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(fd: int, off: int, n: int, advice: int) -> None:
        raise OSError(22, "Invalid argument")
    monkeypatch.setattr(local, "_FADVISE", refuse)
    store = LocalStorage(tmp_path)
    data = os.urandom(2 * WRITEBACK_BYTES)
    await store.put_stream("blob", _chunks(data, MIB))
    assert await store.get("blob") == data
