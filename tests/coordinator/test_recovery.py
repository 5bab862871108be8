"""Durability: a coordinator abandoned mid-run (no aclose: a crash) and a new one on the same storage.

Journal mode must bring back the exact model (bit for bit), the receipts (idempotency) and the
ledger; snapshot mode must bring back the last snapshot and move versions past anything served.
Failures are injected between journal write, merge and snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
import torch

from tests._crash import crash
from vcasync.checkpoint import CheckpointStore
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.errors import (
    ConfigError,
    CorruptObjectError,
    NoWorkAvailableError,
    StorageError,
    StorageUnavailableError,
    VersionNotFoundError,
)
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy
from vcasync.storage import open_storage
from vcasync.tensors import ModelState
from vcasync.testing.faults import FaultPlan, FaultyStorage
from vcasync.worker import WorkerConfig


def make(kit, storage, clock, policy=None, *, units=6, steps=4, **cfg: Any) -> Coordinator:
    config = CoordinatorConfig(**{"durability": "journal", "lease_timeout_s": 10.0, "restart_grace_s": 0.0,
                                  "snapshot_interval_s": 3600.0, "max_staleness": 3, **cfg})
    return Coordinator(kit.tiny_model(), make_units(units, steps=steps),
                       policy=policy or kit.HalfWay(), storage=storage, config=config, clock=clock)


async def submit(kit, coord, w, g, value=0.25, **kw):
    kw.setdefault("steps", g.unit.steps)
    kw.setdefault("base_version", g.base_version)
    tensors = kit.delta_like(coord.model(), value)
    return await coord.submit(w, g.lease_id, kit.stream(kit.result_chunks(g.lease_id, tensors,
                                                                          **kw)))


async def merged(kit, coord, n: int) -> str:
    """A worker joins and delivers ``n`` results, each on the version it leased at; its id."""
    w = await coord.join()
    for _ in range(n):
        await submit(kit, coord, w, await coord.lease(w), base_version=coord.version)
    return w


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


async def test_after_a_crash_a_unit_in_flight_is_not_leased_again_before_its_worker_calls_in(
        kit, clock, storage) -> None:
    """Found running a coordinator and two ``vcasync worker`` processes, SIGKILLing the coordinator
    mid-unit and starting it again: the worker that called in first (with its result) was handed
    the unit the other was still training, whose lease no snapshot knew; the other's result came a
    second later and was thrown away (409 unit_closed). After a takeover from a crash, new leases
    now wait one heartbeat interval (plus a worker's longest retry) for such leases to be adopted."""
    a = await make(kit, storage, clock, restart_grace_s=None).__aenter__()
    trainer, idle = await a.join("trainer"), await a.join("idle")
    g = await a.lease(trainer)                          # granted after the start's snapshot
    await crash(a)
    async with make(kit, storage, clock, restart_grace_s=None) as b:
        grace = b.config.restart_grace()
        assert grace == b.config.ledger_config().heartbeat_s + WorkerConfig().backoff.max_delay_s
        with pytest.raises(NoWorkAvailableError) as refused:
            await b.lease(idle)                         # the in-flight unit is not handed out
        assert not refused.value.finished
        assert 0 < refused.value.retry_after <= grace
        assert "stopped uncleanly" in str(refused.value)
        await b.heartbeat(trainer, g.lease_id, 1)       # its worker calls in: adopted
        clock.advance(grace / 2)
        await b.heartbeat(trainer, g.lease_id, 2)       # ... and trains on (the grace outlasts a lease)
        clock.advance(grace / 2)
        other = await b.lease(idle)
        assert other.unit.unit_id != g.unit.unit_id
        assert (await submit(kit, b, trainer, g)).status == "accepted"


@pytest.mark.parametrize("lease_timeout_s", [6.0, 10.0, 60.0])
def test_the_restart_grace_outlasts_a_worker_retrying_at_its_longest_delay(lease_timeout_s) -> None:
    """Found reading docs/leases.md: the default grace is "one heartbeat interval plus a worker's
    longest retry delay", but it added RetryPolicy's default cap (5 s), while a ``vcasync worker``
    retries an unreachable coordinator up to 10 s apart: with ``lease_timeout_s = 6`` (heartbeats
    every 1.5 s) the grace was 6.5 s, and a worker retrying its resume or result 10 s apart called
    in after its unit was handed to another worker."""
    config = CoordinatorConfig(lease_timeout_s=lease_timeout_s)
    worker_retry_s = WorkerConfig().backoff.max_delay_s
    assert config.restart_grace() >= worker_retry_s
    assert config.restart_grace() == config.ledger_config().heartbeat_s + worker_retry_s


async def test_after_a_crash_the_base_of_a_lease_no_snapshot_knew_is_still_held(
        kit, clock, storage) -> None:
    """Found as above, one step on: the killed coordinator had merged a result after granting the
    other worker's lease; the new one replayed it and dropped the lease's base (no lease it knew
    needed it), so the result, adopted, was refused: ``base version 0 is no longer held``."""
    a = await make(kit, storage, clock, build_policy("vcasgd"), restart_grace_s=None).__aenter__()
    slow, fast = await a.join("slow"), await a.join("fast")
    g_slow, g_fast = await a.lease(slow), await a.lease(fast)     # both on v0, unknown to snapshots
    assert (await submit(kit, a, fast, g_fast)).version == 1
    g_next = await a.lease(fast)                                  # on v1
    await crash(a)
    async with make(kit, storage, clock, build_policy("vcasgd"), restart_grace_s=None) as b:
        assert (await submit(kit, b, fast, g_next)).version == 2  # its result comes in first
        receipt = await submit(kit, b, slow, g_slow)
        assert (receipt.status, receipt.version) == ("accepted", 3), receipt


async def test_a_clean_stop_during_the_restart_grace_hands_the_grace_on(kit, clock, storage) -> None:
    """Found running ``vcasync coordinator`` and three workers: the coordinator SIGKILLed mid-run,
    the one that took over stopped with SIGTERM within its grace (before the workers training units
    leased since the last snapshot had called in), and started again. That start was a clean one:
    it granted leases at once and held no version since the crashed coordinator's snapshot, so
    those workers' results were refused as ``base_unavailable`` and their units trained again. The
    leases the grace waited for are still unknown after a clean stop within it, so the next start
    waits for them too and holds their bases."""
    a = await make(kit, storage, clock, build_policy("vcasgd"), restart_grace_s=None).__aenter__()
    slow, fast, idle = await a.join("slow"), await a.join("fast"), await a.join("idle")
    g_slow, g_fast = await a.lease(slow), await a.lease(fast)     # both on v0, unknown to snapshots
    assert (await submit(kit, a, fast, g_fast)).version == 1
    g_next = await a.lease(fast)                                  # on v1
    await crash(a)
    async with make(kit, storage, clock, build_policy("vcasgd"), restart_grace_s=None):
        pass                                   # stopped cleanly before anyone called in
    async with make(kit, storage, clock, build_policy("vcasgd"), restart_grace_s=None) as c:
        with pytest.raises(NoWorkAvailableError) as refused:
            await c.lease(idle)                # the units in flight are not handed out
        assert "stopped uncleanly" in str(refused.value)
        assert (await submit(kit, c, fast, g_next)).version == 2
        receipt = await submit(kit, c, slow, g_slow)
        assert (receipt.status, receipt.version) == ("accepted", 3), receipt


async def test_a_restart_grace_that_ran_out_is_not_handed_on_again(kit, clock, storage) -> None:
    """Found running ``vcasync coordinator`` with a 400 MB model: after the hand-on above, a start
    whose grace ran out with no call at all stopped without a snapshot (nothing had changed), so
    the newest snapshot still said the grace was open: every later start waited out a grace again,
    refusing leases, and held every version since the crashed coordinator's snapshot (3.1 GB
    resident instead of 1.1 GB), for as long as no result came. Its end is written down now."""
    a = await make(kit, storage, clock, build_policy("vcasgd"), restart_grace_s=None).__aenter__()
    fast, idle = await a.join("fast"), await a.join("idle")
    assert (await submit(kit, a, fast, await a.lease(fast))).version == 1
    await a.lease(fast)                        # on v1, unknown to every snapshot
    await crash(a)
    async with make(kit, storage, clock, build_policy("vcasgd"), restart_grace_s=None):
        pass                                   # stopped within the grace: handed on
    async with make(kit, storage, clock, build_policy("vcasgd"), restart_grace_s=None) as c:
        clock.advance(c.config.restart_grace() + 1)     # nobody called in: the grace ran out
    async with make(kit, storage, clock, build_policy("vcasgd"), restart_grace_s=None) as d:
        assert (await d.lease(idle)).base_version == d.version    # no grace any more
        assert d._owner.versions.numbers() == [d.version]


async def test_a_stop_whose_final_snapshot_failed_is_taken_over_as_after_a_crash(
        kit, clock, storage) -> None:
    """Found running ``vcasync coordinator`` on a file:// store on a full disk: it stopped with exit
    status 4 (storage unavailable past ``storage_outage_limit_s``), its final snapshot unwritten,
    and released its owner record as at a clean stop (that small write fitted). The start after the
    disk was freed took the run over as a clean one: no grace, only the newest version held, so a
    worker's result on a version after the last snapshot was refused as ``base_unavailable`` and
    its unit trained again. Such a stop now says in its record that its state was not saved."""
    def writes_fail(op: str, key: str | None) -> bool:     # room for the owner record only
        return full and op in ("put", "put_stream", "delete") \
            and not (key or "").startswith("vcasync/owner/")

    full = False
    store = FaultyStorage(storage, trigger=writes_fail)
    a = await make(kit, store, clock, build_policy("vcasgd"), restart_grace_s=None).__aenter__()
    slow, fast, idle = await a.join("slow"), await a.join("fast"), await a.join("idle")
    g_slow, g_fast = await a.lease(slow), await a.lease(fast)     # both on v0, unknown to snapshots
    assert (await submit(kit, a, fast, g_fast)).version == 1      # journaled
    g_next = await a.lease(fast)                                  # on v1
    full = True
    await a.aclose()                                              # the final snapshot fails
    assert a.storage_error is not None
    full = False
    async with make(kit, storage, clock, build_policy("vcasgd"), restart_grace_s=None) as b:
        with pytest.raises(NoWorkAvailableError) as refused:
            await b.lease(idle)                # the unit in flight is not handed out
        assert "stopped uncleanly" in str(refused.value)
        assert (await submit(kit, b, fast, g_next)).version == 2
        receipt = await submit(kit, b, slow, g_slow)                # on v0: still held
        assert (receipt.status, receipt.version) == ("accepted", 3), receipt


async def test_a_crashed_owner_whose_record_is_unreadable_is_taken_over_as_after_a_crash(
        kit, clock, storage, caplog) -> None:
    """The crashed coordinator's owner record cut to nothing (a disk that lost it): the start took
    the run over as from a clean stop, without the restart grace, and handed the unit in flight to
    the next worker that asked."""
    a = await make(kit, storage, clock, restart_grace_s=None).__aenter__()
    busy, idle = await a.join("busy"), await a.join("idle")
    g = await a.lease(busy)                                   # unknown to every snapshot
    await crash(a)
    [record] = [k async for k in storage.list("vcasync/owner/")]
    await storage.put(record, b"")
    async with make(kit, storage, clock, restart_grace_s=None) as b:
        assert b.took_over
        with pytest.raises(NoWorkAvailableError, match="stopped uncleanly"):
            await b.lease(idle)
        assert (await submit(kit, b, busy, g)).status == "accepted"
    assert f"the record of the previous coordinator of the run under 'vcasync' on " \
           f"{storage.url} ({record}) is unreadable; taking over as from a crash" in caplog.text


async def test_a_clean_restart_grants_leases_at_once(kit, clock, storage) -> None:
    async with make(kit, storage, clock, restart_grace_s=None) as a:
        w = await a.join()
        g = await a.lease(w)
    async with make(kit, storage, clock, restart_grace_s=None) as b:   # every lease was snapshotted
        assert (await b.lease(w)).unit.unit_id != g.unit.unit_id


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
    assert await asyncio.to_thread(entered.wait, 30)   # merging, not acknowledged
    for _ in range(3000):             # the record is written while the policy merges
        if [k async for k in storage.list("vcasync/journal/")]:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the result was never journaled")
    assert not task.done()
    await crash(a)
    release.set()
    await asyncio.gather(task, return_exceptions=True)
    async with make(kit, storage, clock, Stuck()) as b:
        assert b.version == 1                         # the journaled result was replayed
        again = await submit(kit, b, w, g, metrics={"stick": 0.0})
        assert (again.status, again.version) == ("duplicate", 1)


class Countdown:
    """A FaultyStorage trigger: fail the next ``n`` calls of ``op`` whose key contains ``frag``."""

    def __init__(self) -> None:
        self.rules: dict[tuple[str, str], int] = {}

    def arm(self, op: str, frag: str, n: int = 1) -> None:
        self.rules[(op, frag)] = n

    def __call__(self, op: str, key: str | None) -> bool:
        for (rule_op, frag), n in self.rules.items():
            if op == rule_op and key is not None and frag in key and n > 0:
                self.rules[(rule_op, frag)] = n - 1
                return True
        return False


async def test_failed_journal_write_changes_nothing(kit, clock, storage) -> None:
    trigger = Countdown()
    async with make(kit, FaultyStorage(storage, trigger=trigger), clock,
                    storage_probe_interval_s=0.02) as a:
        w = await a.join()
        g = await a.lease(w)
        digest, ledger = a.model().digest(), a._ledger.snapshot()
        trigger.arm("put_stream", "/journal/")
        with pytest.raises(StorageUnavailableError):
            await submit(kit, a, w, g)
        assert a.model().digest() == digest
        assert a._ledger.snapshot() == ledger
        for _ in range(500):                        # a probe write finds the storage back
            if a.status()["storage"]["state"] == "ok":
                break
            await asyncio.sleep(0.01)
        r = await submit(kit, a, w, g)              # the retry goes through
        assert (r.status, r.version) == ("accepted", 1)
        model = a.model()
        await crash(a)
    async with make(kit, storage, clock) as b:
        assert b.model().equal(model)


async def test_failed_snapshot_is_retried_and_recovery_uses_the_journal(kit, clock,
                                                                        storage) -> None:
    trigger = Countdown()
    a = await make(kit, FaultyStorage(storage, trigger=trigger), clock,
                   snapshot_every=1).__aenter__()
    trigger.arm("put", "/manifests/", 2)    # torn snapshots: data objects written, manifest not
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


async def two_results_snapshotted(kit, coord: Coordinator) -> str:
    """A worker's two results merged (snapshot_every=2), once the snapshot of version 2 is written."""
    w = await coord.join()
    for _ in range(2):
        g = await coord.lease(w)
        await submit(kit, coord, w, g, base_version=coord.version)
    for _ in range(20):                 # let the writer finish the snapshot of version 2
        if coord.metrics.snapshots >= 2:
            break
        await asyncio.sleep(0.01)
    return w


async def test_snapshot_mode_recovers_the_snapshot_and_versions_go_forward(kit, clock,
                                                                            storage) -> None:
    a = await make(kit, storage, clock, durability="snapshot", snapshot_every=2).__aenter__()
    w = await two_results_snapshotted(kit, a)
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


class OntoBase:
    """w <- base + delta (the result's own base, looked up by the coordinator); records the
    base version and the staleness each update was handed with."""

    name = "onto_base"
    needs_base = True
    claims: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def init_state(self, model: ModelState) -> dict[str, Any]:
        return {}

    def merge(self, model: ModelState, update: Any, state: dict[str, Any]) -> ModelState:
        assert update.base is not None
        self.seen.append((update.base_version, update.staleness))
        for name, w in model.items():
            if w.is_floating_point():
                w.copy_(update.base[name] + update.tensors[name])
        return model


@pytest.mark.parametrize("known", ["grace", "heartbeat"])
async def test_snapshot_mode_merges_a_result_on_the_snapshot_version_after_the_jump(
        kit, clock, storage, known) -> None:
    # Found with real processes (SIGKILL, restart, durability "snapshot"): the recovered model, the
    # snapshot's v2, is renumbered past the version floor (v1003), and a worker whose lease was
    # on v2, whose weights the model still is, was refused too_stale ("1001 behind the model").
    # The jump now records that v2 is the renumbered version: such a result is merged on it.
    # The second lease on v2 is held for by the restart grace, or adopted by its heartbeat.
    grace = None if known == "grace" else 0.0
    a = await make(kit, storage, clock, OntoBase(), durability="snapshot", snapshot_every=2,
                   restart_grace_s=grace).__aenter__()
    w = await two_results_snapshotted(kit, a)
    at_snapshot, snapshot_version = a.model(), a.version
    on_snapshot = await a.lease(w)                       # on v2: the snapshot's own weights
    later_on_snapshot = await a.lease(w)
    assert on_snapshot.base_version == later_on_snapshot.base_version == snapshot_version
    g = await a.lease(w)
    await submit(kit, a, w, g, base_version=a.version)   # v3: lost in the crash, by design
    after_snapshot = await a.lease(w)                    # on v3: served, then lost
    assert after_snapshot.base_version == snapshot_version + 1
    served = a.version
    await crash(a)
    policy = OntoBase()
    async with make(kit, storage, clock, policy, durability="snapshot", snapshot_every=2,
                    restart_grace_s=grace) as b:
        if known == "heartbeat":
            await b.heartbeat(w, later_on_snapshot.lease_id, 1)
        jumped = b.version
        assert jumped > served + 3                       # renumbered: more behind than max_staleness
        receipt = await submit(kit, b, w, on_snapshot, 0.125, base_version=snapshot_version)
        assert (receipt.status, receipt.reason) == ("accepted", None), receipt
        assert policy.seen == [(jumped, 0)]              # based on the renumbered version, lag 0
        delta = kit.delta_like(at_snapshot, 0.125)
        expected = {k: v + delta[k] if v.is_floating_point() else v
                    for k, v in at_snapshot.items()}
        assert b.version == jumped + 1
        model = b.model()
        assert all(torch.equal(model[k], expected[k]) for k in expected)
        lost = await submit(kit, b, w, after_snapshot, base_version=snapshot_version + 1)
        assert (lost.status, lost.reason) == ("rejected", "too_stale"), lost
        assert b.version == jumped + 1
        assert policy.seen == [(jumped, 0)]
        # one merge since the restart: the renumbered base is still held, and the lag is 1
        receipt = await submit(kit, b, w, later_on_snapshot, 0.5, base_version=snapshot_version)
        assert (receipt.status, receipt.reason) == ("accepted", None), receipt
        assert policy.seen == [(jumped, 0), (jumped, 1)]
        delta = kit.delta_like(at_snapshot, 0.5)         # onto its base: the snapshot's weights
        model = b.model()
        assert all(torch.equal(model[k], at_snapshot[k] + delta[k]) for k in model
                   if model[k].is_floating_point())


async def test_snapshot_mode_a_renumbered_version_is_kept_through_a_clean_restart(
        kit, clock, storage) -> None:
    # Found with real processes: SIGKILL, a restart (v0 renumbered to v1001), SIGTERM within its
    # grace, a third start from the second's final snapshot (v1001, no jump): the workers' results
    # on v0 were refused too_stale ("1001 behind"). The snapshot keeps the renumbering.
    a = await make(kit, storage, clock, OntoBase(), durability="snapshot",
                   restart_grace_s=None).__aenter__()
    w = await a.join()
    on_first = await a.lease(w)                          # on v0, the first snapshot's version
    start = a.model()
    await crash(a)
    async with make(kit, storage, clock, OntoBase(), durability="snapshot",
                    restart_grace_s=None) as b:
        jumped = b.version
        assert jumped > 3
    policy = OntoBase()
    async with make(kit, storage, clock, policy, durability="snapshot",
                    restart_grace_s=None) as c:
        assert c.version == jumped                       # a clean stop: no jump this time
        receipt = await submit(kit, c, w, on_first, 0.25, base_version=0)
        assert (receipt.status, receipt.reason) == ("accepted", None), receipt
        assert policy.seen == [(jumped, 0)]
        delta = kit.delta_like(start, 0.25)
        model = c.model()
        assert all(torch.equal(model[k], start[k] + delta[k]) for k in model
                   if model[k].is_floating_point())


async def test_snapshot_mode_finishes_only_once_a_snapshot_holds_the_last_results(kit, clock,
                                                                                   storage) -> None:
    # Found with `vcasync demo --durability snapshot --kill-coordinator`: the run said "finished",
    # its worker left, the coordinator was killed before any snapshot held the last results, and
    # the restarted one had the first model back, units open and nobody left to train them.
    a = await make(kit, storage, clock, durability="snapshot", snapshot_every=100, units=3).__aenter__()
    await merged(kit, a, 3)
    await asyncio.wait_for(a.wait_finished(), 10)
    final, version = a.model(), a.version
    assert a.status()["finished"]
    await crash(a)                                    # SIGKILL right after workers heard "finished"
    async with make(kit, storage, clock, durability="snapshot", snapshot_every=100, units=3) as b:
        assert b.model().equal(final)
        assert b.status()["units"]["done"] == 3
        assert b.finished
        assert b.version >= version


async def test_a_crash_in_journal_mode_is_recovered_by_a_start_in_snapshot_mode(kit, clock,
                                                                                storage) -> None:
    # Found running `vcasync coordinator` with two workers: durability "journal", SIGKILLed at v28
    # (28 results journaled, none snapshotted), restarted with `--durability snapshot` (the docs:
    # durability may change at any restart). It came back at v0: the 28 acknowledged results were
    # dropped, v1.. were served again with other weights, and the workers' results in flight were
    # refused as "422 invalid_update (bad_base_version): base_version 28 is newer than the model".
    a = await make(kit, storage, clock, snapshot_every=100).__aenter__()
    w = await merged(kit, a, 3)
    acknowledged, version = a.model(), a.version
    await crash(a)
    b = await make(kit, storage, clock, durability="snapshot", snapshot_every=100).__aenter__()
    assert b.version == version                          # the journal's results are all there
    assert b.model().equal(acknowledged)
    assert b.status()["units"]["done"] == 3
    g = await b.lease(w)
    await submit(kit, b, w, g, base_version=b.version)   # one more, lost in the crash by design
    served = b.version
    await crash(b)
    async with make(kit, storage, clock, snapshot_every=100) as c:     # and back to journal mode
        assert c.version > served                        # no number served is used again
        assert c.model().equal(acknowledged)             # the journal's results, applied once
        assert c.status()["units"]["done"] == 3


async def test_a_crash_in_snapshot_mode_is_recovered_by_a_start_in_journal_mode(kit, clock,
                                                                                storage) -> None:
    # Found as above, the other way: durability "snapshot", SIGKILLed at v12 (its snapshot v0),
    # restarted with `--durability journal`: the model came back as v0, not renumbered past the
    # versions served (snapshot mode's version floor was read in snapshot mode only), so v1..v12
    # were served again with other weights.
    a = await make(kit, storage, clock, durability="snapshot", snapshot_every=100).__aenter__()
    w = await a.join()
    at_snapshot = a.model()
    for _ in range(2):
        await submit(kit, a, w, await a.lease(w), base_version=a.version)
    served = a.version
    await crash(a)
    b = await make(kit, storage, clock, snapshot_every=100).__aenter__()
    assert b.version > served                            # never reuse a number that was served
    assert b.model().equal(at_snapshot)
    g = await b.lease(w)
    await submit(kit, b, w, g, base_version=b.version)   # journaled on the renumbered version
    journaled, version = b.model(), b.version
    await crash(b)
    async with make(kit, storage, clock, snapshot_every=100) as c:
        assert c.version == version                      # replayed on the version it was based on
        assert c.model().equal(journaled)


@pytest.mark.parametrize("damage", ["delete", "truncate"])
@pytest.mark.parametrize("durability", ["journal", "snapshot"])
async def test_a_run_whose_snapshots_are_lost_is_refused_not_begun_again(kit, clock, storage, damage,
                                                                         durability) -> None:
    # Found by hand: a finished run whose only snapshot was cut short (or deleted) started again
    # at v0 under the same run id, every merged result silently gone.
    async with make(kit, storage, clock, durability=durability, units=2) as a:
        w = await a.join()
        for _ in range(2):
            await submit(kit, a, w, await a.lease(w), base_version=a.version)
    keys = [k async for k in storage.list("vcasync/snapshots/")]
    for key in keys:
        if damage == "delete":
            await storage.delete(key)
        elif "/data/" in key:
            await storage.put(key, (await storage.get(key))[:10])
    with pytest.raises(CorruptObjectError, match=r"cannot be recovered.*--new-run"):
        await make(kit, storage, clock, durability=durability, units=2).__aenter__()


async def test_a_run_that_died_before_its_first_snapshot_begins_again(kit, clock, storage) -> None:
    # the one state a start may begin again from: the run record and nothing after it
    async with make(kit, storage, clock, units=2):
        pass
    for prefix in ("vcasync/snapshots/", "vcasync/started"):
        for key in [k async for k in storage.list(prefix)]:
            await storage.delete(key)
    async with make(kit, storage, clock, units=2) as b:
        assert b.version == 0


async def test_a_second_coordinator_on_the_same_run_stops_at_its_first_conflict(kit, clock, storage) -> None:
    # Found by hand: a second coordinator on the same prefix logged ~30 "storage is back" pairs
    # for its journal conflicts, went on taking results, and acknowledged some that the run then
    # lost. Now the conflict stops it before it acknowledges anything. (The owner lease refuses
    # such a start; this is the journal's own defence, for a coordinator that lost its lease
    # without noticing yet, or a store that ignores if-absent writes.)
    from vcasync.errors import ClosedError, PrefixTakenError

    async with make(kit, storage, clock, units=4) as a:
        a._abandon_prefix()           # as if a stalled and b took the run over: a has not noticed
        b = await make(kit, storage, clock, units=4).__aenter__()
        wa, wb = await a.join(), await b.join()
        ga, gb = await a.lease(wa), await b.lease(wb)
        assert (await submit(kit, a, wa, ga, base_version=a.version)).status == "accepted"
        with pytest.raises(ClosedError, match="another one writes this run"):
            await submit(kit, b, wb, gb, base_version=b.version)
        await asyncio.wait_for(b._closed.wait(), 5)
        assert isinstance(b.storage_error, PrefixTakenError)
        with pytest.raises(ClosedError):
            await b.lease(wb)
        assert (await submit(kit, a, wa, await a.lease(wa), base_version=a.version)).status == "accepted"
        version = a.version
        await b.aclose()
    async with make(kit, storage, clock, units=4) as c:      # nothing a acknowledged is lost
        assert c.version == version
        assert c.status()["units"]["done"] == 2


@pytest.mark.parametrize("durability", ["journal", "snapshot"])
async def test_a_lease_in_flight_at_a_clean_restart_is_merged_after_it(kit, clock, storage,
                                                                       durability) -> None:
    # Found by hand: after a SIGTERM restart a result on an older version was refused as
    # base_unavailable (only the newest version came back), though runs.md says every lease in
    # flight at a restart stays valid; 2 of 12 results of a 2-worker run were thrown away. In
    # snapshot mode the start also jumped 1,000 versions, so every such result was too stale.
    async with make(kit, storage, clock, units=4, durability=durability) as a:
        w = await a.join()
        old = await a.lease(w)                                    # on version 0
        await submit(kit, a, w, await a.lease(w), base_version=a.version)     # version 1
    async with make(kit, storage, clock, units=4, durability=durability) as b:
        assert b.version == 1                                     # a clean stop: no jump
        before = b.version
        receipt = await submit(kit, b, w, old, base_version=0)
        assert (receipt.status, receipt.reason) == ("accepted", None), receipt
        assert b.version == before + 1


@pytest.mark.parametrize("durability", ["journal", "snapshot"])
async def test_a_finished_run_started_again_leaves_its_storage_as_it_was(kit, clock, storage,
                                                                         durability) -> None:
    # Found by hand: each start of a finished snapshot-mode run wrote a new snapshot and jumped
    # its version (v1001, v2002, v3003), so --output was labelled differently each time.
    async with make(kit, storage, clock, units=2, durability=durability) as a:
        w = await a.join()
        for _ in range(2):
            await submit(kit, a, w, await a.lease(w), base_version=a.version)
        final, version = a.model(), a.version

    async def stored() -> dict[str, bytes]:
        return {k: await storage.get(k) async for k in storage.list("vcasync/")}

    before = await stored()
    for _ in range(2):
        async with make(kit, storage, clock, units=2, durability=durability) as b:
            assert b.finished
            assert b.version == version
            assert b.model().equal(final)
    after = await stored()
    # each start takes (and releases) the run's owner lease: its records change, nothing else does
    def kept(objects: dict[str, bytes]) -> dict[str, bytes]:
        return {k: v for k, v in objects.items() if "/owner/" not in k}

    assert sorted(kept(after)) == sorted(kept(before))
    assert {k: v for k, v in kept(after).items() if not k.endswith(("/probe", "probe/"))} == \
        {k: v for k, v in kept(before).items() if not k.endswith(("/probe", "probe/"))}


@pytest.mark.parametrize("durability", ["journal", "snapshot"])
async def test_a_finished_run_taken_over_from_a_crash_waits_for_no_leases(kit, clock, storage,
                                                                          durability, caplog) -> None:
    """Found by a probe: a finished run started again after its coordinator was SIGKILLed while
    it lingered logged "took run ... over ...: new leases wait 20s for the workers it leased units
    to since its last snapshot", though every unit was done and no such lease can exist. A
    finished run has no restart grace and says nothing of one."""
    caplog.set_level(logging.INFO, logger="vcasync.coordinator")
    a = await make(kit, storage, clock, units=2, durability=durability,
                   restart_grace_s=None).__aenter__()
    w = await a.join()
    for _ in range(2):
        await submit(kit, a, w, await a.lease(w), base_version=a.version)
    await asyncio.wait_for(a.wait_finished(), 10)
    await crash(a)                                    # SIGKILL while it lingered
    async with make(kit, storage, clock, units=2, durability=durability,
                    restart_grace_s=None) as b:
        assert b.took_over
        assert b.finished
        with pytest.raises(NoWorkAvailableError) as told:
            await b.lease(w)
        assert told.value.finished                    # the end, not "new work in 20s"
    assert not [r.getMessage() for r in caplog.records if "new leases wait" in r.getMessage()]


async def test_a_restart_that_replayed_the_journal_snapshots_it_at_a_clean_stop(kit, clock,
                                                                                storage) -> None:
    # Found by the CI chaos run: the coordinator died after the last results were journaled and
    # before its final snapshot; the restart replayed them, got no call (the workers had left) and
    # stopped without a snapshot, so the newest snapshot lacked six acknowledged results (the
    # journal still held them) and every later start replayed them again.
    a = await make(kit, storage, clock, units=3).__aenter__()
    await merged(kit, a, 3)
    final, version = a.model(), a.version
    assert a.finished
    await crash(a)
    store = CheckpointStore(storage, "vcasync/snapshots")
    assert int((await store.load((await store.steps())[-1])).meta["version"]) < version

    async with make(kit, storage, clock, units=3) as b:   # no call at all: it only recovers
        assert b.finished
        assert b.version == version
    assert int((await store.load((await store.steps())[-1])).meta["version"]) == version
    assert [k async for k in storage.list("vcasync/journal/")] == []   # what it covers is pruned
    async with make(kit, storage, clock, units=3) as c:
        assert c.model().equal(final)
        assert c.version == version


async def test_a_second_coordinator_that_outlived_the_first_says_so_at_its_snapshot(kit, clock,
                                                                                    storage) -> None:
    # Found by hand: a second coordinator took its first result after the first had finished and
    # pruned its journal; its final snapshot then failed with "checkpoint step 1 already exists"
    # and the log said "the journal still holds every acknowledged result", which was false.
    # (The owner lease now refuses b's start, below; this is the snapshot's own defence, for a
    # coordinator that lost its lease without noticing yet.)
    from vcasync.errors import PrefixTakenError

    a = await make(kit, storage, clock, units=4).__aenter__()
    a._abandon_prefix()               # as if a stalled and b took the run over: a has not noticed
    b = await make(kit, storage, clock, units=4).__aenter__()
    wa, wb = await a.join(), await b.join()
    gb = await b.lease(wb)
    for _ in range(2):
        await submit(kit, a, wa, await a.lease(wa), base_version=a.version)
    await a.aclose()
    await submit(kit, b, wb, gb, base_version=b.version)
    await b.aclose()
    assert isinstance(b.storage_error, PrefixTakenError)
    assert "another coordinator writes to this state prefix" in str(b.storage_error)


async def test_none_mode_keeps_nothing(kit, clock, storage) -> None:
    async with make(kit, storage, clock, durability="none") as a:
        w = await a.join()
        await submit(kit, a, w, await a.lease(w))
    assert [k async for k in storage.list("")] == []


async def test_none_mode_on_a_stored_run_is_refused(kit, clock, storage) -> None:
    # Found by hand: durability none on storage holding a journaled run started a new run at v0
    # beside it without a word (and a later durable start resumed the old one again).
    async with make(kit, storage, clock) as a:
        w = await a.join()
        await submit(kit, a, w, await a.lease(w))
    with pytest.raises(ConfigError, match="holds a run under 'vcasync'; durability 'none' would ignore it"):
        await make(kit, storage, clock, durability="none").__aenter__()


@pytest.mark.parametrize("seed", range(12))
async def test_random_storage_faults_never_lose_or_double_an_acknowledged_result(kit, clock, seed):
    """Failed writes, lost replies (the write happened, the answer did not come back) and delays on
    every storage call, with retries as a worker would make them; then a crash. The recovered
    coordinator has every acknowledged result exactly once and the same model."""
    inner = open_storage("memory://chaos")
    faulty = FaultyStorage(inner, FaultPlan(fail=0.15, lose_reply=0.15, delay=0.2,
                                            ops=frozenset({"put", "put_stream", "delete"})),
                           seed=seed)
    probe = {"storage_probe_interval_s": 0.002}
    a = make(kit, faulty, clock, units=10, snapshot_every=2, **probe)
    for _ in range(50):                 # the first snapshot may fail too: start again
        try:
            await a.__aenter__()
            break
        except StorageError:
            a = make(kit, faulty, clock, units=10, snapshot_every=2, **probe)
    w = await a.join()
    acked = {}

    async def lease() -> Any:
        for _ in range(500):            # refused while a failed write left the storage unavailable
            try:
                return await a.lease(w)
            except StorageUnavailableError:
                await asyncio.sleep(0.002)
        raise AssertionError("the storage never came back")

    for i in range(10):
        g = await lease()
        for _ in range(500):            # a worker retries until it gets an answer
            try:
                acked[g.lease_id] = (g, await submit(kit, a, w, g, 0.01 * (i + 1),
                                                     base_version=a.version))
                break
            except StorageError:
                await asyncio.sleep(0.002)   # as told (Retry-After): the probe finds it back
    assert len(acked) == 10
    assert faulty.injected["fail"] + faulty.injected["lose_reply"] > 0
    model, version = a.model(), a.version
    await crash(a)
    async with make(kit, inner, clock, units=10, snapshot_every=2) as b:
        assert b.version == version
        assert b.model().equal(model)
        assert b.status()["units"]["done"] == 10
        for g, r in acked.values():
            again = await submit(kit, b, w, g, 0.5)
            assert (again.status, again.version) == ("duplicate", r.version)
    await inner.aclose()


@pytest.mark.parametrize("name", ["vcasgd", "fedasync", "fedbuff", "diloco", "median", "gate"])
async def test_builtin_policies_replay_bit_identically(kit, clock, name) -> None:
    """Every kind of built-in (needs a base or not, buffers and returns None, keeps momentum)
    comes back from the journal exactly as it was, policy state included."""
    from vcasync.policy import build_policy

    storage = open_storage("memory://policies")
    a = await make(kit, storage, clock, build_policy(name), units=8,
                   snapshot_every=3).__aenter__()
    w = await a.join()
    held = await a.lease(w)
    receipts = []
    for i in range(6):
        g = await a.lease(w)
        receipts.append(await submit(kit, a, w, g, 0.05 * (i + 1) * (-1) ** i,
                                     base_version=a.version))
    receipts.append(await submit(kit, a, w, held, 0.3, base_version=0))
    assert all(r.status in ("accepted", "rejected") for r in receipts)
    model, version, state = a.model(), a.version, a._owner.state
    from vcasync.wire import pack_tree
    packed = pack_tree(state)
    await crash(a)
    async with make(kit, storage, clock, build_policy(name), units=8, snapshot_every=3) as b:
        assert b.version == version
        assert b.model().equal(model)
        assert pack_tree(b._owner.state) == packed
    await storage.aclose()


async def test_journal_and_bases_are_pruned_behind_kept_snapshots(kit, clock, storage) -> None:
    async def settled(a: Coordinator) -> None:
        """Let the writer store every capture (snapshot_every=2) before the next result."""
        seq = a.status()["journal"]["seq"]
        for _ in range(500):
            if a.status()["journal"]["last_snapshot_seq"] >= seq - seq % 2:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the snapshot writer did not catch up")

    async def seqs() -> list[int]:
        """The journal entry each kept snapshot covers (its step counts snapshots)."""
        store = CheckpointStore(storage, "vcasync/snapshots")
        return [int((await store.load(step)).meta["seq"]) for step in await store.steps()]

    async with make(kit, storage, clock, units=12, snapshot_every=2, keep_snapshots=2,
                    max_staleness=3) as a:
        w = await a.join()
        old = await a.lease(w)
        for _ in range(3):
            await submit(kit, a, w, await a.lease(w), base_version=a.version)
            await settled(a)
        await submit(kit, a, w, old, base_version=0)          # base 0 must be stored
        assert [k async for k in storage.list("vcasync/bases/")] == [
            "vcasync/bases/0000000000000000"]
        for _ in range(6):
            await settled(a)
            await submit(kit, a, w, await a.lease(w), base_version=a.version)
        await settled(a)
        model = a.model()

        async def journal() -> list[str]:
            for _ in range(500):        # the writer prunes right after recording the snapshot
                keys = sorted([k async for k in storage.list("vcasync/journal/")])
                if len(keys) <= 2:
                    return keys
                await asyncio.sleep(0.01)
            return keys

        # While running, entries after the older kept snapshot stay (a fallback if the newest
        # were corrupt) ...
        assert await journal() == ["vcasync/journal/0000000000000009",
                                   "vcasync/journal/0000000000000010"]
        assert await seqs() == [8, 10]
        # ... and bases older than what its replay could need (version 8 - max_staleness 3) go.
        assert [k async for k in storage.list("vcasync/bases/")] == []
    # Closed: the final snapshot holds everything; the entries it covers and the older snapshot
    # (a fallback without them would drop acknowledged results) go.
    assert [k async for k in storage.list("vcasync/journal/")] == []
    assert await seqs() == [10]
    async with make(kit, storage, clock, units=12) as b:
        assert b.model().equal(model)


async def test_interval_snapshot_without_enough_results(kit, clock, storage) -> None:
    async with make(kit, storage, clock, snapshot_every=1000, snapshot_interval_s=0.02) as a:
        w = await a.join()
        await submit(kit, a, w, await a.lease(w))
        for _ in range(500):
            if a.metrics.snapshots >= 2:      # the initial one and one from the timer
                break
            await asyncio.sleep(0.01)
        assert a.metrics.snapshots >= 2
        assert a.status()["journal"]["last_snapshot_seq"] == 1


async def test_stored_state_of_another_model_is_refused(kit, clock, storage) -> None:
    async with make(kit, storage, clock):
        pass
    other = Coordinator(ModelState({"x": torch.zeros(2)}), make_units(2), policy=kit.HalfWay(),
                        storage=storage, config=CoordinatorConfig(lease_timeout_s=10.0))
    with pytest.raises(ConfigError, match="model: tensors not in this model: w, b, n"):
        await other.__aenter__()


@pytest.mark.parametrize("damage", ["garbage", "gap"])
async def test_a_damaged_journal_stops_the_start_with_a_clear_error(kit, clock, storage,
                                                                     damage) -> None:
    a = await make(kit, storage, clock).__aenter__()
    w = await a.join()
    for _ in range(2):
        await submit(kit, a, w, await a.lease(w))
    await crash(a)
    if damage == "garbage":
        await storage.delete("vcasync/journal/0000000000000002")
        await storage.put("vcasync/journal/0000000000000002", b"\x00not a payload")
    else:
        await storage.delete("vcasync/journal/0000000000000001")
    with pytest.raises(CorruptObjectError, match="journal entry"):
        await make(kit, storage, clock).__aenter__()


async def test_damaged_received_bytes_are_named_not_the_sound_record_naming_them(kit, clock,
                                                                                  storage) -> None:
    """A result's bytes under incoming/ cut short (a disk that lost them): the refusal names that
    object; it blamed the journal entry, whose record was intact."""
    a = await make(kit, storage, clock).__aenter__()
    w = await a.join()
    await submit(kit, a, w, await a.lease(w))
    await crash(a)
    [blob] = [k async for k in storage.list("vcasync/incoming/")]
    data = await storage.get(blob)
    await storage.put(blob, data[:len(data) // 2])
    with pytest.raises(CorruptObjectError) as info:
        await make(kit, storage, clock).__aenter__()
    assert str(info.value).startswith(f"the journal names {blob}, which is unreadable: ")
    assert "journal entry" not in str(info.value)


async def test_objects_not_of_the_run_under_journal_and_bases_are_left_alone(kit, clock, storage,
                                                                              caplog) -> None:
    """A file someone else put beside the journal or the stored bases (a copy, a sync tool's or an
    editor's file, a folder) is no entry: the start replays the run as without it, logs it, and
    leaves it there (it ended the start with a ValueError traceback, exit 1)."""
    a = await make(kit, storage, clock, snapshot_every=2).__aenter__()
    w = await a.join()
    old = await a.lease(w)
    for _ in range(3):
        await submit(kit, a, w, await a.lease(w))
    await submit(kit, a, w, old)      # based on v0, older than the snapshot: v0 goes to bases/
    model, version = a.model(), a.version
    assert a.status()["journal"]["bases_stored"] == 1
    await crash(a)
    strays = {"vcasync/journal/0000000000000004.bak": b"a copy",
              "vcasync/journal/notes.txt": b"x", "vcasync/journal/old/0000000000000009": b"x",
              "vcasync/bases/README": b"x", "vcasync/bases/0000000000000000.tmp": b"x"}
    for key, data in strays.items():
        await storage.put(key, data)

    async with make(kit, storage, clock, snapshot_every=2) as b:
        assert b.version == version
        assert b.status()["journal"]["bases_stored"] == 1
        assert all(torch.equal(b.model()[n], model[n]) for n in model.tensors)
        await submit(kit, b, w, await b.lease(w))
    assert {key: await storage.get(key) for key in strays} == strays
    assert [k async for k in storage.list("vcasync/journal/")] == sorted(
        k for k in strays if k.startswith("vcasync/journal/"))         # the run's own were pruned
    logged = caplog.text
    assert all(f"ignoring {key}: not an object the run wrote" in logged for key in strays)


async def test_snapshot_models_and_bases_are_streamed_to_storage_never_put_whole(kit, clock,
                                                                                 storage) -> None:
    """A model-sized object (a snapshot's model, a delta's stored base) goes to storage as it is
    encoded: one put of the whole object held a bytes copy as big as the model (and its chunks
    while they were joined) beside the model. What is written still recovers bit for bit."""
    calls: list[tuple[str, str | None]] = []
    logged = FaultyStorage(storage, trigger=lambda op, key: calls.append((op, key)) is not None)
    async with make(kit, logged, clock, units=12, snapshot_every=2, max_staleness=3) as a:
        w = await a.join()
        old = await a.lease(w)
        for _ in range(3):
            await submit(kit, a, w, await a.lease(w), base_version=a.version)
        await submit(kit, a, w, old, base_version=0)          # base 0 must be stored
        model = a.model()

    def big(key: str | None) -> bool:
        return key is not None and ("/bases/" in key or "/model." in key)

    assert [key for op, key in calls if op == "put" and big(key)] == []
    streamed = [key for op, key in calls if op == "put_stream" and big(key)]
    assert any("/bases/" in key for key in streamed)
    assert any("/model." in key for key in streamed)
    async with make(kit, storage, clock, units=12) as b:
        again = b.model()
    assert again.version == model.version
    assert all(torch.equal(again[k], model[k]) for k in model.tensors)


async def test_the_snapshot_model_is_streamed_from_storage_at_resume_never_got_whole(
        kit, clock, storage) -> None:
    """Resume read the snapshot's model whole (``get``: a model-sized bytes object) and decoded it
    into tensors: two model-sized copies at once. It is decoded as it is read now, and the
    tensors it decodes into become the working model (no copy): still bit for bit."""
    async with make(kit, storage, clock, units=12) as a:
        w = await a.join()
        for _ in range(3):
            await submit(kit, a, w, await a.lease(w), base_version=a.version)
        model = a.model()
    calls: list[tuple[str, str | None]] = []
    logged = FaultyStorage(storage, trigger=lambda op, key: calls.append((op, key)) is not None)
    async with make(kit, logged, clock, units=12) as b:
        again = b.model()
        assert again.version == model.version
        assert all(torch.equal(again[k], model[k]) for k in model.tensors)
        g = await b.lease(w)         # the adopted tensors merge as a copy would
        await submit(kit, b, w, g, base_version=b.version)
        assert b.version == model.version + 1
    ops = [op for op, key in calls if key is not None and "/model." in key]
    assert "open_read" in ops
    assert "get" not in ops


@pytest.mark.parametrize("where", ["header", "data", "end"])
async def test_a_corrupted_snapshot_model_is_refused_as_corrupt_wherever_the_damage(
        kit, clock, storage, where) -> None:
    """The streamed read checks the manifest's digest before decoding ends; a byte the decoder
    refuses first (a header that no longer fits the model, a block checksum) is still reported
    as a corrupt snapshot, not as another model's state or a wire error."""
    async with make(kit, storage, clock, units=4) as a:
        w = await a.join()
        await submit(kit, a, w, await a.lease(w), base_version=a.version)
    (key,) = [k async for k in storage.list("vcasync/snapshots/") if "/model." in k]
    data = bytearray(await storage.get(key))
    at = {"header": 12, "data": len(data) // 2, "end": len(data) - 1}[where]
    data[at] ^= 0xFF
    await storage.delete(key)
    await storage.put(key, bytes(data))
    with pytest.raises(CorruptObjectError, match="does not match its manifest digest"):
        await make(kit, storage, clock, units=4).__aenter__()


async def _damage_newest_snapshot_model(storage) -> None:
    """Flip one byte of the newest snapshot's model: same size, so only its digest tells."""
    store = CheckpointStore(storage, "vcasync/snapshots")
    key = (await store.load((await store.steps())[-1])).objects["model"].key
    data = bytearray(await storage.get(key))
    data[len(data) // 2] ^= 0xFF
    await storage.delete(key)
    await storage.put(key, bytes(data))


async def _state_keys(storage) -> dict[str, bytes]:
    return {k: await storage.get(k) async for k in storage.list("vcasync/")
            if "/owner/" not in k}


async def test_a_damaged_newest_snapshot_falls_back_to_the_one_before_and_its_journal(
        kit, clock, storage) -> None:
    """Found running ``vcasync coordinator`` (snapshot_every 2, SIGKILLed after 7 results) and
    flipping a byte of the newest snapshot's model: the start stopped with exit 4 ('does not match
    its manifest digest'), though storage.md says the kept older snapshot, with the journal entries
    after it, 'still leaves a way back'. It does now: the start warns and replays from there."""
    a = await make(kit, storage, clock, snapshot_every=2).__aenter__()
    w = await a.join()
    for _ in range(5):
        await submit(kit, a, w, await a.lease(w), base_version=a.version)
    model, version, counts = a.model(), a.version, a.status()["units"]
    await crash(a)
    await _damage_newest_snapshot_model(storage)
    async with make(kit, storage, clock, snapshot_every=2) as b:
        assert b.version == version
        assert b.model().equal(model), "the older snapshot and its journal give the same model"
        assert b.status()["units"] == counts


async def test_no_fallback_past_a_damaged_snapshot_without_its_journal(kit, clock, storage) -> None:
    """The older snapshot is a way back only with the journal entries up to the damaged one: with
    them gone, the start is refused, naming what is missing, and changes nothing."""
    a = await make(kit, storage, clock, snapshot_every=2).__aenter__()
    w = await a.join()
    for _ in range(4):
        await submit(kit, a, w, await a.lease(w), base_version=a.version)
    await crash(a)
    await _damage_newest_snapshot_model(storage)
    async for key in storage.list("vcasync/journal/"):
        await storage.delete(key)
    before = await _state_keys(storage)
    with pytest.raises(CorruptObjectError, match="journal"):
        await make(kit, storage, clock, snapshot_every=2).__aenter__()
    assert await _state_keys(storage) == before


@pytest.mark.parametrize("raw", [{"0": 5}, [[0]], [[5, 3]], [[0, 11]], [[True, 5]], [["0", 5]], 7])
def test_a_snapshot_whose_renumbered_meta_is_damaged_is_refused_as_corrupt(raw) -> None:
    from vcasync.coordinator._journal import _renumbered

    assert _renumbered([[0, 5], [2, 10]], 10) == {0: 5, 2: 10}
    with pytest.raises(CorruptObjectError, match="'renumbered'"):
        _renumbered(raw, 10)


async def test_snapshot_mode_a_lease_on_the_old_number_still_downloads_its_base(kit, clock,
                                                                                 storage) -> None:
    # Left alone last stop, found with real processes: after a snapshot-mode restart renumbered the
    # recovered v2, a worker whose lease on v2 was granted before the crash and had not downloaded
    # its base yet was told "model version 2 is not held" and gave the lease up, though the
    # coordinator merges that lease's result on the renumbered version (the same weights).
    from vcasync.wire import decode_payload_bytes

    a = await make(kit, storage, clock, durability="snapshot", snapshot_every=2).__aenter__()
    w = await two_results_snapshotted(kit, a)
    at_snapshot, snapshot_version = a.model(), a.version
    g = await a.lease(w)
    await submit(kit, a, w, g, base_version=a.version)   # v3: lost in the crash, by design
    await crash(a)
    async with make(kit, storage, clock, durability="snapshot", snapshot_every=2) as b:
        assert b.version > snapshot_version + 1
        assert b.model(snapshot_version).equal(at_snapshot)
        assert b.model_etag(snapshot_version) != b.model_etag(b.version)
        got = decode_payload_bytes(b"".join([c async for c in b.model_payload(snapshot_version)]))
        assert got.meta["version"] == snapshot_version       # under the number the lease names
        assert all(torch.equal(got.tensors[k], at_snapshot[k]) for k in at_snapshot)
        with pytest.raises(VersionNotFoundError):           # v3's weights are gone: not renamed
            b.model_payload(snapshot_version + 1)


async def test_workers_seen_before_an_outage_are_not_shown_alive_after_it(
        kit, clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot keeps when each worker was last seen relative to its capture; a restart an
    hour later put them that close to the restart, so every worker dead through the outage showed
    "alive" on the status page (and counted in ``workers.alive``) for ``alive_s`` after it."""
    async with open_storage("memory://") as storage:
        coord = make(kit, storage, clock)
        async with coord:
            worker = await coord.join("w")
            await coord.lease(worker)
            assert coord.status()["workers"]["alive"] == 1
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 3600.0)     # an hour's outage
        async with make(kit, storage, kit.FakeClock()) as back:
            assert back.status()["workers"]["alive"] == 0
            (row,) = back.live_status()["worker_rows"]
            assert row["state"] == "gone"
            assert 3600 <= row["last_seen_s"] < 3700
            await back.heartbeat(worker, (await back.lease(worker)).lease_id, steps_done=0)
            assert back.status()["workers"]["alive"] == 1           # back: alive again
