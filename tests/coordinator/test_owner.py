"""One live coordinator per run: the owner lease on the state prefix, in one process.

A second coordinator started while the first serves is refused before it reads anything; one that
stalled past its TTL is taken over and acknowledges nothing more; a clean stop, a refused start and a
crash hand the run on at once. (Real processes, SIGKILL and exit statuses: tests/storage/test_owner_cli.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from vcasync import _owner_lease
from vcasync.coordinator import StartOptions
from vcasync.errors import ClosedError, ConfigError, ObjectNotFoundError, PrefixTakenError
from vcasync.storage import BytesLike, Storage, open_storage
from vcasync.testing.faults import ForwardingStorage

from .test_recovery import crash, make, submit

TTL = 0.6


@pytest.fixture(autouse=True)
def quick_ttl(monkeypatch):
    """Owner TTLs below the 3 s minimum, so that takeovers here take a fraction of a second."""
    monkeypatch.setattr(_owner_lease, "MIN_TTL_S", 0.1)


@pytest.fixture
async def storage(tmp_path):
    st = open_storage(f"file://{tmp_path}/state")
    yield st
    await st.aclose()


async def owners(storage) -> list[str]:
    return [k async for k in storage.list("vcasync/owner/")]


async def test_a_second_coordinator_on_a_live_run_is_refused_before_it_reads_anything(
        kit, clock, storage) -> None:
    async with make(kit, storage, clock, units=4, owner_ttl_s=TTL) as a:
        w = await a.join()
        await submit(kit, a, w, await a.lease(w), base_version=a.version)
        started = time.monotonic()
        with pytest.raises(PrefixTakenError) as info:
            await make(kit, storage, clock, units=4, owner_ttl_s=TTL).__aenter__()
        assert time.monotonic() - started < 5 * TTL          # refused at a's next renewal
        message = str(info.value)
        assert "is in use by a live coordinator" in message
        for part in ("host ", "pid ", "since ", " UTC"):
            assert part in message
        assert "state_prefix" in message
        # the refused start changed nothing: a goes on, and so does its lease
        await submit(kit, a, w, await a.lease(w), base_version=a.version)
        assert a.version == 2
        assert await owners(storage) == ["vcasync/owner/000000000001.json"]
    async with make(kit, storage, clock, units=4, owner_ttl_s=TTL) as b:     # released: at once
        assert b.version == 2


async def test_a_stalled_coordinator_is_taken_over_and_acknowledges_nothing_more(
        kit, clock, storage) -> None:
    a = await make(kit, storage, clock, units=4, owner_ttl_s=TTL).__aenter__()
    w = await a.join()
    held = await a.lease(w)
    await submit(kit, a, w, await a.lease(w), base_version=a.version)
    assert a._renewer is not None
    a._renewer.cancel()                     # a stalls (SIGSTOP, a long pause): no renewals
    b = await asyncio.wait_for(make(kit, storage, clock, units=4, owner_ttl_s=TTL).__aenter__(),
                               10 * TTL)   # waits one TTL of silence, then takes the run over
    assert b.version == 1
    with pytest.raises(ClosedError, match="another one writes this run"):
        await submit(kit, a, w, held, base_version=0)          # a wakes up: its ack is refused
    await asyncio.wait_for(a._closed.wait(), 5)
    assert isinstance(a.storage_error, PrefixTakenError)
    assert "was taken over by another coordinator" in str(a.storage_error)
    await a.aclose()                        # no final snapshot over b's state, no release of b's lease
    wb = await b.join()
    assert (await submit(kit, b, wb, await b.lease(wb), base_version=b.version)).status == "accepted"
    await b.aclose()
    async with make(kit, storage, clock, units=4, owner_ttl_s=TTL) as c:
        assert c.version == 2


async def test_a_crashed_coordinator_is_taken_over_at_once_in_its_own_process(kit, clock,
                                                                              storage) -> None:
    a = await make(kit, storage, clock, units=4, owner_ttl_s=30.0).__aenter__()
    w = await a.join()
    await submit(kit, a, w, await a.lease(w), base_version=a.version)
    await crash(a)
    started = time.monotonic()
    async with make(kit, storage, clock, units=4, owner_ttl_s=30.0) as b:
        assert b.version == 1
    assert time.monotonic() - started < 10          # not the 30 s TTL


async def test_a_refused_start_releases_the_run(kit, clock, storage) -> None:
    async with make(kit, storage, clock, units=4, owner_ttl_s=30.0):
        pass
    with pytest.raises(ConfigError):
        await make(kit, storage, clock, units=6, owner_ttl_s=30.0).__aenter__()     # other units
    started = time.monotonic()
    async with make(kit, storage, clock, units=4, owner_ttl_s=30.0) as c:
        assert c.version == 0
    assert time.monotonic() - started < 10


async def test_a_new_run_keeps_the_owner_lease_it_holds(kit, clock, storage) -> None:
    async with make(kit, storage, clock, units=4, owner_ttl_s=TTL) as a:
        run_id = a.status()["run_id"]
    fresh = make(kit, storage, clock, units=4, owner_ttl_s=TTL)
    fresh._start = StartOptions(new_run=True)
    async with fresh as b:
        assert b.status()["run_id"] != run_id
        assert await owners(storage) == ["vcasync/owner/000000000001.json",
                                          "vcasync/owner/000000000002.json"]
        assert b._prefix_lease is not None
        assert b._prefix_lease.epoch == 2
        await b._ensure_prefix()           # still held after the wipe


async def test_durability_none_takes_no_lease(kit, clock, storage) -> None:
    async with make(kit, storage, clock, durability="none"):
        assert await owners(storage) == []


async def stored(storage) -> dict[str, bytes]:
    """Everything of the run but its owner records (the live owner renews its own), once the live
    owner's snapshot writer is done with it (two reads alike)."""
    async def read() -> dict[str, bytes]:
        out = {}
        async for k in storage.list("vcasync/"):
            if not k.startswith("vcasync/owner/"):
                with contextlib.suppress(ObjectNotFoundError):
                    out[k] = await storage.get(k)
        return out
    last = await read()
    while True:
        await asyncio.sleep(0.1)
        now = await read()
        if now == last:
            return now
        last = now


@pytest.mark.parametrize("durability", ["snapshot", "journal"])
async def test_a_taken_over_coordinator_stopping_cleanly_writes_nothing(kit, clock, storage,
                                                                        durability) -> None:
    a = await make(kit, storage, clock, units=4, owner_ttl_s=TTL, durability=durability,
                   snapshot_every=1).__aenter__()
    w = await a.join()
    await submit(kit, a, w, await a.lease(w), base_version=a.version)
    held = await a.lease(w)                 # a lease in flight: its base is an open base at a stop
    await submit(kit, a, w, await a.lease(w), base_version=a.version)
    assert a._renewer is not None
    a._renewer.cancel()                     # a stalls: no renewals, nobody tells a it was taken over
    b = await asyncio.wait_for(make(kit, storage, clock, units=4, owner_ttl_s=TTL,
                                    durability=durability, snapshot_every=1).__aenter__(), 10 * TTL)
    wb = await b.join()
    assert (await submit(kit, b, wb, await b.lease(wb), base_version=b.version)).status == "accepted"
    before, owners_before = await stored(storage), await owners(storage)
    assert held is not None
    a._prefix_lease._confirmed = time.monotonic()    # a's stale view: "renewed a moment ago"
    await a.aclose()                        # a "clean" stop of a coordinator taken over
    assert isinstance(a.failure, PrefixTakenError)
    assert isinstance(a.storage_error, PrefixTakenError)
    assert await stored(storage) == before  # no snapshot, open base, floor or prune by a
    assert await owners(storage) == owners_before
    version = b.version
    await crash(b)                          # b dies: c must start where b was, not where a was
    async with make(kit, storage, clock, units=4, owner_ttl_s=TTL, durability=durability,
                     snapshot_every=1) as c:
        assert c.version >= version


async def test_durability_none_refuses_new_run_and_any_stored_state_before_writing(
        kit, clock, storage) -> None:
    # Found by a probe: durability none with --new-run beside a live journal-mode run deleted
    # nothing, started anyway, and its worker's token landed in the live run's auth/tokens/
    async with make(kit, storage, clock, units=4, owner_ttl_s=30.0) as a:
        w = await a.join()
        await submit(kit, a, w, await a.lease(w), base_version=a.version)
        before = await stored(storage)
        none = make(kit, storage, clock, units=4, durability="none")
        none._start = StartOptions(new_run=True)
        with pytest.raises(ConfigError) as info:
            await none.__aenter__()
        assert "--new-run" in str(info.value)
        assert "durability 'none'" in str(info.value)
        assert await stored(storage) == before
    # anything of a run under the prefix (here only a worker token) keeps durability none off it
    other = open_storage(f"{storage.url}-tokens")
    try:
        await other.put("vcasync/auth/tokens/t1.json", b"{}")
        with pytest.raises(ConfigError, match="holds a run under 'vcasync'"):
            await make(kit, other, clock, units=4, durability="none").__aenter__()
        assert [k async for k in other.list("")] == ["vcasync/auth/tokens/t1.json"]
    finally:
        await other.aclose()


async def test_a_taken_over_coordinator_stores_no_upload(kit, clock, storage) -> None:
    # a coordinator woken from a stall wrote an upload into the run's incoming/ before any check
    a = await make(kit, storage, clock, units=4, owner_ttl_s=TTL).__aenter__()
    w = await a.join()
    held = await a.lease(w)
    assert a._renewer is not None
    a._renewer.cancel()                     # a stalls
    b = await asyncio.wait_for(make(kit, storage, clock, units=4, owner_ttl_s=TTL).__aenter__(),
                               10 * TTL)
    staged: list[str] = []
    stage = a._journal.stage

    async def spy(key, chunks):
        staged.append(key)
        await stage(key, chunks)

    a._journal.stage = spy
    with pytest.raises(ClosedError, match="another one writes this run"):
        await submit(kit, a, w, held, base_version=0)
    assert staged == []
    assert [k async for k in storage.list("vcasync/incoming/")] == []
    await a.aclose()
    assert isinstance(a.failure, PrefixTakenError)
    await b.aclose()


class HeldSnapshot(ForwardingStorage):
    """Holds the first snapshot object of the next snapshot once ``armed``: after its writer made
    sure it still owned the run, before anything of the snapshot is written (a stall there)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.armed = False
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    async def put(self, key: str, data: BytesLike, *, if_absent: bool = False) -> None:
        if self.armed and key.startswith("vcasync/snapshots/"):
            self.armed = False
            self.reached.set()
            await self.go.wait()
        await self.inner.put(key, data, if_absent=if_absent)

    async def aclose(self) -> None:
        """The test's ``storage`` fixture owns the store beneath."""


async def _first_of(*waits) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in tasks:
        t.cancel()


async def written(coord, version: int) -> None:
    """Until ``coord`` has written a snapshot of ``version`` (its writer sets ``written`` at each)."""
    slot = coord._merger.snapshots
    while slot.written_version < version:
        slot.written.clear()
        if slot.written_version < version:
            await slot.written.wait()


async def test_a_snapshot_checked_before_a_takeover_and_written_after_it_harms_no_one(
        kit, clock, storage) -> None:
    # a made sure it owned the run, then stalled before its snapshot's write; b took the run over
    # meanwhile. a's snapshot took the step b's next one needed, so b (the live owner) found the step
    # taken and stopped with PrefixTakenError, while a had pruned by its stale view.
    held = HeldSnapshot(storage)
    a = await make(kit, held, clock, units=4, owner_ttl_s=TTL, snapshot_every=1).__aenter__()
    w = await a.join()
    await submit(kit, a, w, await a.lease(w), base_version=a.version)
    await asyncio.wait_for(written(a, 1), 5)
    held.armed = True
    await submit(kit, a, w, await a.lease(w), base_version=a.version)     # version 2
    await asyncio.wait_for(held.reached.wait(), 5)       # checked, not written: a stalls here
    assert a._renewer is not None
    a._renewer.cancel()
    b = await asyncio.wait_for(make(kit, storage, clock, units=4, owner_ttl_s=TTL,
                                    snapshot_every=1).__aenter__(), 10 * TTL)
    assert b.version == 2                                # from a's journal
    held.go.set()                                        # a wakes up and writes what it checked
    await asyncio.wait_for(_first_of(a._closed.wait(), written(a, 2)), 5)
    wb = await b.join()
    assert (await submit(kit, b, wb, await b.lease(wb), base_version=b.version)).status == "accepted"
    await asyncio.wait_for(_first_of(b._closed.wait(), written(b, 3)), 5)
    assert b.failure is None, b.failure                  # b serves on: a's late write took nothing of its
    assert b.storage_error is None
    await asyncio.wait_for(a._closed.wait(), 5)          # a found out, at the latest after writing
    assert isinstance(a.failure, PrefixTakenError)
    await a.aclose()
    await crash(b)
    async with make(kit, storage, clock, units=4, owner_ttl_s=TTL, snapshot_every=1) as c:
        assert c.version == 3
        assert c._journal._snapshot_seq == 3             # from b's snapshot, not a's older one
