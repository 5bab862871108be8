"""Durable ingest in one pass (journal mode): an upload's bytes are written as they arrive while
they are decoded, and the journal's record names them; the policy merges the result while the write
ends, and the new version is published only once the bytes and the record are durable (a write that
fails undoes the merge); a refused upload leaves nothing replay would apply; a crash after the
record and before the acknowledgement replays the result."""

from __future__ import annotations

import asyncio
import gc
import threading
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch

from vcasync.coordinator._ingest import tee
from vcasync.coordinator._journal import ENTRY_REF
from vcasync.coordinator._model_owner import ModelOwner
from vcasync.errors import ChecksumError, StorageError, StorageUnavailableError, WireError
from vcasync.storage import BytesLike, Storage, open_storage
from vcasync.testing.faults import ForwardingStorage
from vcasync.wire import decode_payload_bytes

from .test_recovery import crash, make, submit

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

    result, done = await tee(_chunks(parts), write, read, depth=2)
    assert result == sum(map(len, parts))
    await done
    assert written == parts


async def test_tee_hands_the_result_on_while_the_write_finishes() -> None:
    """The decoded result goes on to the merge while the bytes' write ends (its last chunks and
    the storage's fsync): the write is a future the caller awaits before acknowledging."""
    go = asyncio.Event()
    written: list[bytes] = []

    async def write(chunks: AsyncIterator[bytes]) -> None:
        async for c in chunks:
            written.append(c)
        await go.wait()                      # the fsync, say

    async def read(chunks: Any) -> int:
        return len([c async for c in chunks])

    result, done = await tee(_chunks([b"a", b"b", b"c"]), write, read, depth=8)
    assert result == 3
    await asyncio.sleep(0.01)
    assert not done.done()
    go.set()
    await done
    assert written == [b"a", b"b", b"c"]


async def test_a_write_that_fails_after_the_read_fails_its_future() -> None:
    go = asyncio.Event()

    async def write(chunks: AsyncIterator[bytes]) -> None:
        async for _ in chunks:
            pass
        await go.wait()
        raise StorageError("fsync failed")

    async def read(chunks: Any) -> int:
        return len([c async for c in chunks])

    result, done = await tee(_chunks([b"a"] * 5), write, read)
    assert result == 5
    go.set()
    with pytest.raises(StorageError, match="fsync failed"):
        await done


async def test_a_reader_that_stops_early_still_ends_the_write() -> None:
    """The reader needs fewer chunks than the body holds (and the queue is full): the writer is
    told where the chunks end and finishes with exactly those the reader saw."""
    written: list[bytes] = []
    go = asyncio.Event()

    async def write(chunks: AsyncIterator[bytes]) -> None:
        await go.wait()                      # slow storage: the queue fills up
        async for c in chunks:
            written.append(c)

    async def read(chunks: Any) -> int:
        n = 0
        async for _ in chunks:
            n += 1
            if n == 2:
                return n
        return n

    result, done = await tee(_chunks([bytes([i]) for i in range(10)]), write, read, depth=2)
    assert result == 2
    go.set()
    await asyncio.wait_for(done, 5)
    assert written == [b"\x00", b"\x01"]


async def test_cancelling_the_write_future_stops_the_write() -> None:
    stopped = asyncio.Event()

    async def write(chunks: AsyncIterator[bytes]) -> None:
        try:
            async for _ in chunks:
                pass
            await asyncio.Event().wait()     # never ends by itself
        finally:
            stopped.set()

    async def read(chunks: Any) -> int:
        return len([c async for c in chunks])

    _, done = await tee(_chunks([b"a"] * 3), write, read)
    done.cancel()
    with pytest.raises(asyncio.CancelledError):
        await done
    assert stopped.is_set()


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

    async def die_here(self: ModelOwner, number: int) -> None:   # the step after the record
        written.set()
        await asyncio.Event().wait()

    a = await make(kit, inner, clock).__aenter__()
    monkeypatch.setattr(ModelOwner, "_publish", die_here)
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


# -- the merge runs while the bytes' write ends ------------------------------------------------------
class HeldIncoming(ForwardingStorage):
    """Holds the end of the next write of an upload's bytes (every chunk taken, none durable yet:
    the storage's fsync) until ``go``; with ``fail`` it then fails, as a failed fsync does."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.go = asyncio.Event()
        self.fail = False
        self.armed = True

    async def put_stream(self, key: str, chunks: Any, *, if_absent: bool = False) -> None:
        if not (self.armed and "/incoming/" in key):
            await self.inner.put_stream(key, chunks, if_absent=if_absent)
            return
        self.armed = False
        parts: list[BytesLike] = [bytes(c) async for c in chunks]
        await self.go.wait()
        if self.fail:
            raise StorageError("fsync failed: input/output error", key=key)
        await self.inner.put(key, b"".join(parts), if_absent=if_absent)


def signalling(kit: Any) -> tuple[Any, threading.Event]:
    """The test policy (HalfWay: w <- (w + base + delta) / 2, a count in its state), which says
    when it has merged."""
    merged = threading.Event()

    class Signals(kit.HalfWay):
        def merge(self, model: Any, update: Any, state: Any) -> Any:
            out = super().merge(model, update, state)
            merged.set()
            return out

    return Signals(), merged


async def test_the_policy_merges_while_the_bytes_are_written_and_publishes_after(kit, clock) -> None:
    """Found by timing an upload's phases: the merge (40 ms of a 100-MB ResNet-50 result) waited
    for the end of the bytes' write (its fsync, 30-40 ms after the last byte was decoded); now
    they overlap, and nothing is seen before both are done."""
    storage = HeldIncoming(open_storage("memory://ingest-overlap"))
    policy, merged = signalling(kit)
    async with make(kit, storage, clock, policy) as coord:
        w = await coord.join("w")
        g = await coord.lease(w)
        before = coord.model()
        sent = asyncio.ensure_future(submit(kit, coord, w, g))
        assert await asyncio.to_thread(merged.wait, 10)      # merged into the working model,
        await asyncio.sleep(0.05)
        assert not sent.done()                               # not acknowledged,
        assert coord.version == 0                            # nor published,
        assert coord.model().equal(before)
        assert await keys(storage, "journal/") == []         # nor journaled
        storage.go.set()
        receipt = await sent
        assert (receipt.status, receipt.version) == ("accepted", 1)
        assert len(await keys(storage, "journal/")) == 1
    await storage.aclose()


async def test_a_write_that_fails_after_the_merge_undoes_it(kit, clock) -> None:
    """The bytes' write fails once the policy has merged: the sender is told the storage is
    unavailable, and the working model and the policy's state are as they were, so the result
    sent again merges once (bit for bit what a run without the failure makes)."""
    reference = open_storage("memory://ingest-undo-reference")
    async with make(kit, reference, clock) as ref:
        w = await ref.join("w")
        g = await ref.lease(w)
        assert (await submit(kit, ref, w, g)).status == "accepted"
        want, want_state = ref.model(), await ref._owner.pack_state()
    await reference.aclose()
    storage = HeldIncoming(open_storage("memory://ingest-undo"))
    policy, merged = signalling(kit)
    async with make(kit, storage, clock, policy, storage_probe_interval_s=0.02) as coord:
        w = await coord.join("w")
        g = await coord.lease(w)
        before, state = coord.model(), await coord._owner.pack_state()
        storage.fail = True
        sent = asyncio.ensure_future(submit(kit, coord, w, g))
        assert await asyncio.to_thread(merged.wait, 10)
        storage.go.set()
        with pytest.raises(StorageUnavailableError):
            await sent
        assert coord.version == 0
        assert coord.model().equal(before)
        assert await coord._owner.pack_state() == state
        await settle()
        assert await keys(storage, "journal/") == []
        assert await keys(storage, "incoming/") == []
        for _ in range(500):                             # a probe write finds the storage back
            if coord.status()["storage"]["state"] == "ok":
                break
            await asyncio.sleep(0.01)
        again = await submit(kit, coord, w, g)
        assert (again.status, again.version) == ("accepted", 1)
        assert coord.model().equal(want)
        assert await coord._owner.pack_state() == want_state
    await storage.aclose()


async def test_a_crash_while_merged_but_not_durable_leaves_nothing(kit, clock) -> None:
    inner = open_storage("memory://ingest-crash-early")
    storage = HeldIncoming(inner)
    policy, merged = signalling(kit)
    a = await make(kit, storage, clock, policy).__aenter__()
    w = await a.join("w")
    g = await a.lease(w)
    sent = asyncio.ensure_future(submit(kit, a, w, g))
    assert await asyncio.to_thread(merged.wait, 10)
    await crash(a)
    storage.fail = True
    storage.go.set()
    sent.cancel()
    await asyncio.gather(sent, return_exceptions=True)
    async with make(kit, inner, clock) as b:
        assert b.version == 0
        assert await keys(inner, "journal/") == []
        assert (await submit(kit, b, w, g)).status == "accepted"
    await inner.aclose()
