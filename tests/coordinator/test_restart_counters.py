"""Issue 13 (restarts): lease counters survive a coordinator restart, and status and metrics agree
with the ledger: a clean stop, and a crash whose last snapshot predates the leases it granted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.ledger._units import make_units
from vcasync.storage import open_storage

from .test_recovery import crash, submit


def make(kit, storage, clock) -> Coordinator:
    config = CoordinatorConfig(durability="journal", lease_timeout_s=10.0, snapshot_interval_s=3600.0,
                               snapshot_every=100)
    return Coordinator(kit.tiny_model(), make_units(4, steps=4), policy=kit.HalfWay(),
                       storage=storage, config=config, clock=clock)


def in_mode(kit, storage, clock, durability: str) -> Coordinator:
    """Six units, a snapshot every two merges, in ``durability``."""
    config = CoordinatorConfig(durability=durability, lease_timeout_s=10.0, snapshot_interval_s=3600.0,
                               snapshot_every=2, max_staleness=3)
    return Coordinator(kit.tiny_model(), make_units(6, steps=4), policy=kit.HalfWay(),
                       storage=storage, config=config, clock=clock)


def counters(coord: Coordinator) -> tuple[Any, Any]:
    return coord.status()["leases"]["issued"], coord.metrics.gauges()["leases_issued_total"]


async def test_lease_counters_survive_a_clean_restart(kit, clock, tmp_path) -> None:
    async with open_storage(f"file://{tmp_path}/state") as storage:
        async with make(kit, storage, clock) as a:
            w = await a.join("w")
            grants = [await a.lease(w), await a.lease(w)]
            assert counters(a) == (2, 2)
        async with make(kit, storage, clock) as b:
            for g in grants:                              # the workers carry on after the restart
                await b.heartbeat(w, g.lease_id, 1)
            assert b.status()["units"]["leased"] == 2
            assert counters(b) == (2, 2)                  # not zero: the ledger holds both leases


async def test_lease_counters_agree_with_the_ledger_after_a_crash(kit, clock) -> None:
    async with open_storage("memory://counters") as storage:
        a = await make(kit, storage, clock).__aenter__()
        w = await a.join("w")
        grants = [await a.lease(w) for _ in range(3)]      # after the only snapshot (the first)
        assert (await submit(kit, a, w, grants[0])).status == "accepted"   # journaled
        await crash(a)
        async with make(kit, storage, clock) as b:
            assert b.status()["leases"]["accepted"] == 1
            assert counters(b) == (1, 1)                  # the replayed result's lease was issued
            for g in grants[1:]:                          # the workers carry on: leases adopted
                await b.heartbeat(w, g.lease_id, 1)
            assert counters(b) == (3, 3)
            assert b.status()["units"] == {"queued": 1, "leased": 2, "done": 1, "parked": 0}


@pytest.mark.parametrize("durability", ["journal", "snapshot"])
async def test_merge_counts_go_on_across_restarts(kit, clock, tmp_path, durability) -> None:
    # Found by a probe: after a restart /v1/status metrics.merges counted this process only (0 in
    # snapshot mode, the replayed entries in journal mode), while the ledger's counts went on.
    def merges(coord: Coordinator) -> tuple[Any, ...]:
        m = coord.status()["metrics"]
        return (m["merges"], m["results"].get("accepted"), m["results"].get("rejected"),
                coord.status()["leases"]["accepted"])

    async with open_storage(f"file://{tmp_path}/state") as storage:
        async with in_mode(kit, storage, clock, durability) as a:
            w = await a.join()
            for refuse in (0.0, 1.0, 0.0, 0.0):       # three merged, one rejected by the policy
                g = await a.lease(w)
                await submit(kit, a, w, g, base_version=a.version, metrics={"refuse": refuse})
            assert merges(a) == (3, 3, 1, 3)
        async with in_mode(kit, storage, clock, durability) as b:           # a clean stop: nothing lost
            assert merges(b) == (3, 3, 1, 3)
            w = await b.join()
            g = await b.lease(w)
            await submit(kit, b, w, g, base_version=b.version)
            assert merges(b) == (4, 4, 1, 4)
            await crash(b)       # after the snapshot of its start: only the journal holds the 4th
        async with in_mode(kit, storage, clock, durability) as c:
            kept = 4 if durability == "journal" else 3     # snapshot mode loses it, by design
            assert merges(c) == (kept, kept, 1, kept)


@pytest.mark.parametrize("durability", ["journal", "snapshot"])
async def test_merge_histograms_go_on_across_restarts_and_count_a_replayed_merge_once(
        kit, clock, tmp_path, durability) -> None:
    # Found in review: /metrics' staleness and merge-seconds histograms started empty at each start
    # and the journal's replay observed its merges again: a crash's restart counted those merges
    # twice across the restart (Prometheus reads a reset and then the replayed ones as new), and
    # a clean restart dropped every merge before it while merges_total went on.
    def histograms(coord: Coordinator) -> tuple[Any, ...]:
        m = coord.status()["metrics"]
        return (m["merges"], m["staleness"]["count"], m["staleness"]["buckets"],
                m["merge_seconds"]["count"])

    async with open_storage(f"file://{tmp_path}/state") as storage:
        async with in_mode(kit, storage, clock, durability) as a:
            w = await a.join()
            held = await a.lease(w)                    # based on version 0
            await submit(kit, a, w, await a.lease(w))                  # staleness 0
            await submit(kit, a, w, held)                              # staleness 1
            await submit(kit, a, w, await a.lease(w))                  # staleness 0
            before = histograms(a)
            assert before[:2] == (3, 3)
            assert before[2]["0"] == 2
            assert before[2]["1"] == 3
        async with in_mode(kit, storage, clock, durability) as b:           # a clean stop: they go on
            assert histograms(b) == before
            w = await b.join()
            g = await b.lease(w)
            await submit(kit, b, w, g, base_version=b.version)
            grown = histograms(b)
            assert grown[:2] == (4, 4)
            await crash(b)       # after the snapshot of its start: only the journal holds the 4th
        async with in_mode(kit, storage, clock, durability) as c:
            # journal: the 4th merge replayed, counted once; snapshot: lost with the result
            assert histograms(c) == (grown if durability == "journal" else before)


async def test_a_quarantine_with_no_result_since_is_snapshotted_and_survives_a_crash(kit, clock) -> None:
    # Found by a probe: the interval snapshot was taken only after a merged result, so a quarantine
    # (and the released, parked, requeued and back-off counts) with no result since the last
    # snapshot was lost to a crash however long ago it happened: the restarted coordinator showed
    # the worker with no failures, handed it work again, and /metrics counters went down.
    def make_q() -> Coordinator:
        config = CoordinatorConfig(durability="journal", lease_timeout_s=10.0,
                                   snapshot_interval_s=0.05, quarantine_after=1, quarantine_s=3600.0)
        return Coordinator(kit.tiny_model(), make_units(4, steps=4), policy=kit.HalfWay(),
                           storage=storage, config=config, clock=clock)

    async with open_storage("memory://quarantine-snapshot") as storage:
        a = await make_q().__aenter__()
        w = await a.join("bad")
        g = await a.lease(w)
        await a.release(w, g.lease_id, "trainer error: boom", failed=True)
        assert a.status()["workers"]["quarantined"] == 1
        written = a.metrics.snapshots
        await wait_for(lambda: a.metrics.snapshots > written)   # the interval snapshot holds it
        await crash(a)
        async with make_q() as b:
            assert b.status()["workers"]["quarantined"] == 1
            assert b.status()["leases"]["released"] == 1
            assert b.metrics.gauges()["worker_backoffs_total"] == 1


async def wait_for(cond: Any, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, "not within the time limit"
        await asyncio.sleep(0.02)
