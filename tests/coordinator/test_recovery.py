"""Durability: a coordinator abandoned mid-run (no aclose: a crash) and a new one on the same storage.

Journal mode must bring back the exact model (bit for bit), the receipts (idempotency) and the
ledger; snapshot mode must bring back the last snapshot and move versions past anything served.
Failures are injected between journal write, merge and snapshot.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from vcasync._units import make_units
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.errors import StorageError, TransientStorageError
from vcasync.storage import open_storage


def make(kit, storage, clock, policy=None, *, units=6, steps=4, **cfg: Any) -> Coordinator:
    config = CoordinatorConfig(**{"durability": "journal", "lease_timeout_s": 10.0,
                                  "snapshot_interval_s": 3600.0, "max_staleness": 3, **cfg})
    return Coordinator(kit.tiny_model(), make_units(units, steps=steps),
                       policy=policy or kit.HalfWay(), storage=storage, config=config, clock=clock)


async def crash(coord: Coordinator) -> None:
    """Stop a coordinator the way SIGKILL would: no drain, no final snapshot."""
    assert coord._runner is not None
    coord._runner.cancel()
    await asyncio.gather(coord._runner, return_exceptions=True)
    coord._phase = "closed"


async def submit(kit, coord, w, g, value=0.25, **kw):
    kw.setdefault("steps", g.unit.steps)
    kw.setdefault("base_version", g.base_version)
    tensors = kit.delta_like(coord.model(), value)
    return await coord.submit(w, g.lease_id, kit.stream(kit.result_chunks(g.lease_id, tensors,
                                                                          **kw)))


async def drive(kit, coord, n: int) -> tuple[str, list]:
    """n results plus two held back: deltas from a mix of bases, one partial, one refused by the
    policy, one on an old base (its base must be stored to replay it), one too stale."""
    w = await coord.join("w")
    out = []
    held, stale = await coord.lease(w), await coord.lease(w)
    for i in range(n):
        g = await coord.lease(w)
        extra: dict[str, Any] = {}
        if i == 1:
            extra = {"steps": 2, "partial": True}
        if i == 2:
            extra = {"metrics": {"refuse": 1.0}}
            out.append((held, await submit(kit, coord, w, held, 0.5)))   # base 0, version 2
        out.append((g, await submit(kit, coord, w, g, 0.1 * (i + 1), **extra)))
    out.append((stale, await submit(kit, coord, w, stale, 0.7)))         # too stale by now
    return w, out


@pytest.fixture(params=["memory", "file"])
async def storage(request, tmp_path):
    url = "memory://recovery" if request.param == "memory" else f"file://{tmp_path}/state"
    st = open_storage(url)
    yield st
    await st.aclose()


@pytest.mark.parametrize("snapshot_every", [1, 3, 100])
async def test_journal_recovery_is_bit_identical(kit, clock, storage, snapshot_every) -> None:
    a = await make(kit, storage, clock, snapshot_every=snapshot_every, units=8).__aenter__()
    w, results = await drive(kit, a, 5)
    assert [r.reason for _, r in results if r.status == "rejected"] == ["refused_by_policy",
                                                                          "too_stale"]
    model, version, counts = a.model(), a.version, a.status()["units"]
    await crash(a)

    b = make(kit, storage, clock, snapshot_every=snapshot_every, units=8)
    async with b:
        assert b.version == version
        assert b.model().equal(model), "replay must give the same model bit for bit"
        assert b.status()["units"] == counts
        for g, r in results:      # every earlier receipt survived: nothing merges twice
            again = await submit(kit, b, w, g, 0.9)
            assert again.version == r.version
            assert again.status == ("duplicate" if r.status == "accepted" else "rejected")
        assert b.version == version
        assert b.model().equal(model)


async def test_recovery_twice_and_progress_after(kit, clock, storage) -> None:
    a = await make(kit, storage, clock, snapshot_every=2).__aenter__()
    await drive(kit, a, 3)
    await crash(a)
    b = await make(kit, storage, clock, snapshot_every=2).__aenter__()
    model, version = b.model(), b.version
    await crash(b)
    async with make(kit, storage, clock, snapshot_every=2) as c:
        assert c.model().equal(model)
        assert c.version == version
        w = await c.join()
        g = await c.lease(w)
        assert (await submit(kit, c, w, g, base_version=c.version)).version == version + 1
    async with make(kit, storage, clock, snapshot_every=2) as d:   # after a clean close too
        assert d.version == version + 1


async def test_lease_granted_after_the_snapshot_is_adopted(kit, clock, storage) -> None:
    a = await make(kit, storage, clock).__aenter__()
    w = await a.join()
    g = await a.lease(w)                      # no snapshot knows this lease
    await crash(a)
    async with make(kit, storage, clock) as b:
        resumed = await b.resume(w, g.lease_id)
        assert resumed.resumed
        assert resumed.unit == g.unit
        assert (await submit(kit, b, w, g)).status == "accepted"


async def test_crash_between_journal_write_and_merge(kit, clock, storage) -> None:
    entered, release = threading.Event(), threading.Event()

    class Stuck(kit.HalfWay):
        def merge(self, model, update, state):
            if update.metrics.get("stick"):
                entered.set()
                release.wait(30)
            return super().merge(model, update, state)

    a = await make(kit, storage, clock, Stuck()).__aenter__()
    w = await a.join()
    g = await a.lease(w)
    task = asyncio.create_task(submit(kit, a, w, g, metrics={"stick": 1.0}))
    assert await asyncio.to_thread(entered.wait, 30)   # journaled, merging, not acknowledged
    await crash(a)
    release.set()
    await asyncio.gather(task, return_exceptions=True)
    async with make(kit, storage, clock, Stuck()) as b:
        assert b.version == 1                         # the journaled result was replayed
        again = await submit(kit, b, w, g, metrics={"stick": 0.0})
        assert (again.status, again.version) == ("duplicate", 1)


class Flaky:
    """Wraps a storage; fails chosen writes (by key fragment) a number of times."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.fail: dict[str, int] = {}
        self.url = inner.url

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _maybe(self, key: str) -> None:
        for frag, n in self.fail.items():
            if frag in key and n > 0:
                self.fail[frag] = n - 1
                raise TransientStorageError(f"injected failure writing {key}", key=key)

    async def put(self, key, data, *, if_absent=False):
        self._maybe(key)
        return await self.inner.put(key, data, if_absent=if_absent)

    async def put_stream(self, key, chunks, *, if_absent=False):
        self._maybe(key)
        return await self.inner.put_stream(key, chunks, if_absent=if_absent)

    async def delete(self, key):
        self._maybe("delete:" + key)
        return await self.inner.delete(key)


async def test_failed_journal_write_changes_nothing(kit, clock, storage) -> None:
    flaky = Flaky(storage)
    async with make(kit, flaky, clock) as a:
        w = await a.join()
        g = await a.lease(w)
        digest, ledger = a.model().digest(), a._ledger.snapshot()
        flaky.fail["/journal/"] = 1
        with pytest.raises(StorageError):
            await submit(kit, a, w, g)
        assert a.model().digest() == digest
        assert a._ledger.snapshot() == ledger
        r = await submit(kit, a, w, g)              # the retry goes through
        assert (r.status, r.version) == ("accepted", 1)
        model = a.model()
        await crash(a)
    async with make(kit, storage, clock) as b:
        assert b.model().equal(model)


async def test_failed_snapshot_is_retried_and_recovery_uses_the_journal(kit, clock,
                                                                        storage) -> None:
    flaky = Flaky(storage)
    a = await make(kit, flaky, clock, snapshot_every=1).__aenter__()
    flaky.fail["MANIFEST"] = 2        # a torn snapshot: data objects written, manifest not
    flaky.fail["manifest"] = 2
    await drive(kit, a, 3)
    for _ in range(500):             # the writer runs beside the merges: let it catch up
        if a.metrics.snapshots >= 2 and a.metrics.snapshot_failures >= 2:
            break
        await asyncio.sleep(0.01)
    assert a.metrics.snapshot_failures == 2
    assert a.metrics.snapshots >= 2                  # the initial one, and one after the failures
    model, version = a.model(), a.version
    await crash(a)
    async with make(kit, storage, clock, snapshot_every=1) as b:
        assert b.version == version
        assert b.model().equal(model)


async def test_snapshot_mode_recovers_the_snapshot_and_versions_go_forward(kit, clock,
                                                                            storage) -> None:
    a = await make(kit, storage, clock, durability="snapshot", snapshot_every=2).__aenter__()
    w = await a.join()
    for _ in range(2):
        g = await a.lease(w)
        await submit(kit, a, w, g, base_version=a.version)
    for _ in range(20):                 # let the writer finish the snapshot of version 2
        if a.metrics.snapshots >= 2:
            break
        await asyncio.sleep(0.01)
    at_snapshot = a.model()
    g = await a.lease(w)
    await submit(kit, a, w, g, base_version=a.version)   # lost in the crash, by design
    served = a.version
    await crash(a)
    async with make(kit, storage, clock, durability="snapshot", snapshot_every=2) as b:
        assert b.version > served                     # never reuse a number that was served
        assert b.model().equal(at_snapshot)
        assert b.status()["units"]["done"] == 2
        w2 = await b.join()
        g = await b.lease(w2)
        assert g.unit.unit_id == "e0-s2"              # the lost result's unit is open again


async def test_none_mode_keeps_nothing(kit, clock, storage) -> None:
    async with make(kit, storage, clock, durability="none") as a:
        w = await a.join()
        await submit(kit, a, w, await a.lease(w))
    assert [k async for k in storage.list("")] == []
