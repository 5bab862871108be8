"""Durable ingest in one pass (journal mode): an upload's bytes are written as they arrive while
they are decoded, and the journal's record names them; a refused upload leaves nothing replay would
apply; a crash after the record and before the acknowledgement replays the result."""

from __future__ import annotations

import asyncio
import gc
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch

from vcasync.coordinator._ingest import tee
from vcasync.coordinator._journal import ENTRY_REF, Journal
from vcasync.errors import ChecksumError, StorageError, WireError
from vcasync.storage import open_storage
from vcasync.wire import decode_payload_bytes

from .test_recovery import crash, make

PREFIX = "vcasync"


async def keys(storage: Any, sub: str) -> list[str]:
    return sorted([k async for k in storage.list(f"{PREFIX}/{sub}")])


async def settle() -> None:
    for _ in range(20):      # background deletes of refused bytes
        await asyncio.sleep(0)


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


# -- tee ---------------------------------------------------------------------------------------------
async def test_tee_gives_both_sides_the_same_chunks() -> None:
    parts = [bytes([i]) * (i + 1) for i in range(50)]
    written: list[bytes] = []

    async def write(chunks: AsyncIterator[bytes]) -> None:
        async for c in chunks:
            written.append(c)

    async def read(chunks: Any) -> int:
        return sum([len(c) async for c in chunks])

    assert await tee(_chunks(parts), write, read, depth=2) == sum(map(len, parts))
    assert written == parts


async def test_tee_raises_the_readers_error_and_stops_the_writer() -> None:
    stopped = asyncio.Event()

    async def write(chunks: AsyncIterator[bytes]) -> None:
        try:
            async for _ in chunks:
                pass
        finally:
            stopped.set()

    async def read(chunks: Any) -> None:
        async for _ in chunks:
            raise ChecksumError("bad bytes")

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield b"x"
            await asyncio.sleep(0)

    with pytest.raises(ChecksumError):
        await tee(endless(), write, read)
    assert stopped.is_set()


async def test_tee_raises_the_writers_error_when_the_reader_is_fine() -> None:
    async def write(chunks: AsyncIterator[bytes]) -> None:
        async for _ in chunks:
            raise StorageError("disk full")

    async def read(chunks: Any) -> int:
        return len([c async for c in chunks])

    with pytest.raises(StorageError, match="disk full"):
        await tee(_chunks([b"a"] * 100), write, read, depth=1)


@pytest.mark.parametrize("failing", ["read", "write"])
async def test_a_failed_tee_leaves_no_reference_cycle(failing: str) -> None:
    """The error tee raises passes through its frame and is held by the task that raised it: that
    was a cycle (error, traceback, tee's frame, task) holding the queued chunks of every refused
    upload until the cyclic garbage collector ran, which a coordinator may not do for long."""
    async def write(chunks: AsyncIterator[bytes]) -> None:
        async for _ in chunks:
            if failing == "write":
                raise StorageError("disk full")

    async def read(chunks: Any) -> int:
        n = 0
        async for _ in chunks:
            n += 1
            if failing == "read" and n == 3:
                raise ChecksumError("bad bytes")
        return n

    gc.collect()
    gc.disable()
    try:
        with pytest.raises((ChecksumError, StorageError)):
            await tee(_chunks([b"x" * 1024] * 8), write, read, depth=4)
        await asyncio.sleep(0)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, types.FrameType) and o.f_code is tee.__code__]
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
        gc.enable()
    assert left == []


# -- the journal keeps the received bytes ------------------------------------------------------------
async def test_the_journal_keeps_the_bytes_as_received(kit, clock) -> None:
    storage = open_storage("memory://ingest-bytes")
    async with make(kit, storage, clock) as coord:
        w = await coord.join("w")
        g = await coord.lease(w)
        parts = kit.result_chunks(g.lease_id, kit.delta_like(coord.model(), 0.5),
                                  steps=g.unit.steps)
        assert (await coord.submit(w, g.lease_id, kit.stream(parts))).status == "accepted"
        (entry,) = await keys(storage, "journal/")
        record = decode_payload_bytes(await storage.get(entry))
        assert record.kind == ENTRY_REF
        assert not record.tensors
        assert record.meta["lease_id"] == g.lease_id
        assert await storage.get(record.meta["blob"]) == b"".join(parts)   # not re-encoded
    await storage.aclose()


async def test_a_corrupted_upload_leaves_nothing_to_replay(kit, clock) -> None:
    storage = open_storage("memory://ingest-corrupt")
    a = await make(kit, storage, clock).__aenter__()
    w = await a.join("w")
    g = await a.lease(w)
    data = bytearray(b"".join(kit.result_chunks(g.lease_id, kit.delta_like(a.model(), 0.5),
                                                steps=g.unit.steps)))
    data[-20] ^= 0xFF                                   # inside the tensor bytes
    with pytest.raises(WireError):
        await a.submit(w, g.lease_id, kit.stream([bytes(data)]))
    await settle()
    assert await keys(storage, "journal/") == []
    assert await keys(storage, "incoming/") == []
    before = a.model()
    await crash(a)
    async with make(kit, storage, clock) as b:
        assert b.version == 0
        assert all(torch.equal(b.model()[n], t) for n, t in before.items())
    await storage.aclose()


async def test_bytes_no_record_names_are_swept_at_start(kit, clock) -> None:
    storage = open_storage("memory://ingest-sweep")
    a = await make(kit, storage, clock).__aenter__()
    w = await a.join("w")
    g = await a.lease(w)
    parts = kit.result_chunks(g.lease_id, kit.delta_like(a.model(), 0.5), steps=g.unit.steps)
    await storage.put(f"{PREFIX}/incoming/cut-off-by-a-crash", b"".join(parts))
    assert (await a.submit(w, g.lease_id, kit.stream(parts))).status == "accepted"
    await crash(a)
    async with make(kit, storage, clock) as b:
        assert b.version == 1
        named = await keys(storage, "incoming/")
        assert len(named) == 1
        assert not named[0].endswith("cut-off-by-a-crash")
    await storage.aclose()


async def test_a_crash_between_record_and_ack_replays_the_result(kit, clock, monkeypatch) -> None:
    inner = open_storage("memory://ingest-crash")
    reference = open_storage("memory://ingest-reference")
    async with make(kit, reference, clock) as ref:
        w = await ref.join("w")
        g = await ref.lease(w)
        tensors = kit.delta_like(ref.model(), 0.5)
        await ref.submit(w, g.lease_id, kit.stream(kit.result_chunks(g.lease_id, tensors,
                                                                     steps=g.unit.steps)))
        want = ref.model()
    written = asyncio.Event()

    async def die_here(self: Journal, version: int) -> None:   # the step after the record
        written.set()
        await asyncio.Event().wait()

    a = await make(kit, inner, clock).__aenter__()
    monkeypatch.setattr(Journal, "raise_version_floor", die_here)
    w = await a.join("w")
    g = await a.lease(w)
    parts = kit.result_chunks(g.lease_id, tensors, steps=g.unit.steps)
    sent = asyncio.ensure_future(a.submit(w, g.lease_id, kit.stream(parts)))
    await written.wait()
    assert not sent.done()                                 # never acknowledged
    assert len(await keys(inner, "journal/")) == 1
    await crash(a)
    monkeypatch.undo()
    sent.cancel()
    await asyncio.gather(sent, return_exceptions=True)
    async with make(kit, inner, clock) as b:
        assert b.version == 1
        assert all(torch.equal(b.model()[n], t) for n, t in want.items())
        again = await b.submit(w, g.lease_id, kit.stream(parts))
        assert again.status == "duplicate"
        assert again.version == 1
    await inner.aclose()
    await reference.aclose()
