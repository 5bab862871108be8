"""The coordinator in one process: leases, submits, exactly-once, staleness, bad input, heartbeats
during a merge, lifetime. Durability "none" here; recovery is in test_recovery.py."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch

from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.errors import (
    ClosedError,
    ConfigError,
    LeaseExpiredError,
    NoWorkAvailableError,
    SpecMismatchError,
    UnitClosedError,
    ValidationError,
    VersionNotFoundError,
    WireError,
)
from vcasync.ledger import UnitState
from vcasync.ledger._units import make_units
from vcasync.wire import decode_payload, encode_payload

NONE = CoordinatorConfig(durability="none", lease_timeout_s=10.0)


def coordinator(kit, clock, policy, *, units=3, steps=4, **cfg) -> Coordinator:
    config = CoordinatorConfig(**{"durability": "none", "lease_timeout_s": 10.0, **cfg})
    return Coordinator(kit.tiny_model(), make_units(units, steps=steps), policy=policy,
                       storage=None, config=config, clock=clock)


async def submit(kit, coord, w, g, tensors, **kw):
    kw.setdefault("steps", g.unit.steps)
    kw.setdefault("base_version", g.base_version)
    return await coord.submit(w, g.lease_id, kit.stream(kit.result_chunks(g.lease_id, tensors, **kw)))


async def test_lease_heartbeat_submit_download(kit, clock, policy) -> None:
    async with coordinator(kit, clock, policy) as coord:
        start = coord.model()
        w = await coord.join("w1", {"cores": 2})
        g = await coord.lease(w)
        assert (g.base_version, g.unit.unit_id, g.resumed) == (0, "e0-s0", False)
        hb = await coord.heartbeat(w, g.lease_id, 2)
        assert hb.deadline_s == 10.0
        await coord.lease(w)                # a second unit, on version 0 too
        delta = kit.delta_like(start)
        r = await submit(kit, coord, w, g, delta)
        assert (r.status, r.version, r.unit_id) == ("accepted", 1, "e0-s0")
        expected = {k: (v + (v + delta[k])) * 0.5 if v.is_floating_point() else v
                    for k, v in start.items()}
        assert coord.model().equal(expected)
        again = await submit(kit, coord, w, g, delta)
        assert (again.status, again.version) == ("duplicate", 1)
        assert coord.version == 1
        payload = await decode_payload(coord.model_payload(1), spec=start.spec)
        assert payload.kind == "model"
        assert payload.meta == {"version": 1, "digest": coord.model().digest()}
        assert coord.status()["retained_versions"] == [0, 1]     # 0 is still the other's base
        assert coord.model_etag(1) != coord.model_etag(0)
        status = coord.status()
        json.dumps(status, allow_nan=False)
        assert status["units"]["done"] == 1
        assert status["metrics"]["results"] == {"accepted": 1, "duplicate": 1}
        text = coord.metrics.render_prometheus()
        assert 'vcasync_results_total{status="accepted"} 1.0' in text
        assert "vcasync_leases_issued_total 2.0" in text
        assert "vcasync_workers_alive 1.0" in text


async def test_late_result_wins_and_newer_holder_is_refused(kit, clock, policy) -> None:
    async with coordinator(kit, clock, policy, units=1) as coord:
        a, b = await coord.join("a"), await coord.join("b")
        ga = await coord.lease(a)
        clock.advance(11)
        gb = await coord.lease(b)
        assert gb.unit.unit_id == ga.unit.unit_id
        with pytest.raises(LeaseExpiredError):
            await coord.heartbeat(a, ga.lease_id, 1)
        delta = kit.delta_like(coord.model())
        assert (await submit(kit, coord, a, ga, delta)).status == "accepted"
        with pytest.raises(UnitClosedError):
            await submit(kit, coord, b, gb, delta)
        with pytest.raises(NoWorkAvailableError) as closed:  # the run is over, not only the unit
            await coord.heartbeat(b, gb.lease_id, 1)
        assert closed.value.finished
        assert "already has a result" in str(closed.value)
        assert coord.version == 1
        assert coord.metrics.merges == 1
        assert coord.metrics.rejects["unit_closed"] == 1
        await asyncio.wait_for(coord.wait_finished(), 5)
        with pytest.raises(NoWorkAvailableError) as ei:
            await coord.lease(b)
        assert ei.value.finished


async def test_concurrent_duplicates_merge_once(kit, clock, policy) -> None:
    async with coordinator(kit, clock, policy) as coord:
        w = await coord.join()
        g = await coord.lease(w)
        delta = kit.delta_like(coord.model())
        receipts = await asyncio.gather(*(submit(kit, coord, w, g, delta) for _ in range(5)))
        assert sorted(r.status for r in receipts) == ["accepted"] + ["duplicate"] * 4
        assert {r.version for r in receipts} == {1}
        assert coord.metrics.merges == 1


async def test_too_stale_is_rejected_and_requeued(kit, clock, policy) -> None:
    async with coordinator(kit, clock, policy, units=4, max_staleness=1) as coord:
        w = await coord.join()
        old = await coord.lease(w)
        delta = kit.delta_like(coord.model())
        for _ in range(2):
            g = await coord.lease(w)
            await submit(kit, coord, w, g, delta, base_version=coord.version)
        assert coord.version == 2
        r = await submit(kit, coord, w, old, delta)
        assert (r.status, r.reason, r.version) == ("rejected", "too_stale", 2)
        assert coord.status()["units"] == {"queued": 2, "leased": 0, "done": 2, "parked": 0}
        assert (await coord.lease(w)).unit.unit_id == old.unit.unit_id    # requeued at the front
        assert coord.metrics.rejects["too_stale"] == 1
        assert (await submit(kit, coord, w, old, delta)).status == "rejected"   # the same receipt


async def test_policy_rejection_is_a_receipt_and_changes_no_model(kit, clock, policy) -> None:
    async with coordinator(kit, clock, policy) as coord:
        w = await coord.join()
        g = await coord.lease(w)
        before = coord.model().digest()
        r = await submit(kit, coord, w, g, kit.delta_like(coord.model()), metrics={"refuse": 1.0})
        assert (r.status, r.reason) == ("rejected", "refused_by_policy")
        assert coord.model().digest() == before
        assert coord.version == 0



async def test_a_unit_the_policy_refuses_on_every_worker_parks(kit, clock, policy) -> None:
    """Found running ``vcasync coordinator --policy gate --policy-param inner=fedbuff`` and three
    digits workers: the gate refused one unit's result as a norm outlier, the unit went back to
    the queue, was trained again to the same result on the same model and refused again, some
    2,000 times in 3 minutes on all three workers, and the run never finished. A refusal by the
    policy now counts as a failure of the unit on that worker (still without backing the worker
    off), so the unit parks like any unit that fails everywhere; a refusal for the coordinator's
    own reasons (too stale, base unavailable) does not count."""
    async with coordinator(kit, clock, policy, units=1, max_attempts=3,
                           park_after_workers=2) as coord:
        delta = kit.delta_like(coord.model())
        workers = [await coord.join(name) for name in "ab"]
        for i in range(3):
            w = workers[i % 2]
            g = await coord.lease(w)
            r = await submit(kit, coord, w, g, delta, metrics={"refuse": 1.0})
            assert (r.status, r.reason) == ("rejected", "refused_by_policy")
        await asyncio.wait_for(coord.wait_finished(), 5)
        assert "e0-s0" in coord.status()["parked"]
        assert "refused_by_policy" in coord.status()["parked"]["e0-s0"]
        g = None
        with pytest.raises(NoWorkAvailableError) as ei:
            g = await coord.lease(workers[0])      # not backed off: told the run is over
        assert ei.value.finished, g


async def test_stale_refusals_never_park_a_unit(kit, clock, policy) -> None:
    async with coordinator(kit, clock, policy, units=3, max_staleness=0, max_attempts=1,
                           park_after_workers=1) as coord:
        delta = kit.delta_like(coord.model())
        a, b = await coord.join("a"), await coord.join("b")
        old = await coord.lease(a)
        g = await coord.lease(b)
        await submit(kit, coord, b, g, delta)
        r = await submit(kit, coord, a, old, delta)
        assert (r.status, r.reason) == ("rejected", "too_stale")
        assert coord.status()["units"]["parked"] == 0     # the coordinator's reason, not the unit's
        assert (await coord.lease(a)).unit.unit_id == old.unit.unit_id


@pytest.mark.parametrize("breakage", ["dtype", "shape", "extra", "missing"])
async def test_a_policy_that_breaks_the_model_in_place_publishes_nothing(kit, clock, breakage) -> None:
    # Found by hand: a policy that changed a tensor's dtype in the model it was given (not in a
    # new object) had v1 published as float64; every later result was then refused as the
    # worker's dtype_mismatch and the run stalled.
    class Breaks(type(kit.HalfWay())):     # type: ignore[misc]
        def merge(self, model, update, state):
            super().merge(model, update, state)
            t = model.tensors
            if breakage == "dtype":
                t["w"] = t["w"].double()
            elif breakage == "shape":
                t["w"] = torch.zeros(13)
            elif breakage == "extra":
                t["new"] = torch.zeros(1)
            else:
                del t["b"]
            return model

    async with coordinator(kit, clock, Breaks()) as coord:
        w = await coord.join()
        before = coord.model()
        r = await submit(kit, coord, w, await coord.lease(w), kit.delta_like(before))
        assert (r.status, r.reason) == ("rejected", "policy")
        assert coord.version == 0
        assert coord.model().equal(before)
        assert coord._owner._working.spec == before.spec      # the working copy is whole again
        assert coord._owner._working.equal(before)


def _bad_bodies(kit, g, good):
    shape = dict(good, w=torch.zeros(3, 4))
    nan = dict(good, b=torch.tensor([0.0, float("nan"), 0.0]))
    dtype = dict(good, b=torch.zeros(3, dtype=torch.float64))
    extra = dict(good, z=torch.zeros(1))
    missing = {k: v for k, v in good.items() if k != "b"}
    huge = dict(good, b=torch.full((3,), 1e6))
    ok = kit.result_chunks(g.lease_id, good, steps=g.unit.steps)
    return {
        "shape": (kit.result_chunks(g.lease_id, shape, steps=4), SpecMismatchError),
        "nan": (kit.result_chunks(g.lease_id, nan, steps=4), ValidationError),
        "dtype": (kit.result_chunks(g.lease_id, dtype, steps=4), SpecMismatchError),
        "extra": (kit.result_chunks(g.lease_id, extra, steps=4), SpecMismatchError),
        "missing": (kit.result_chunks(g.lease_id, missing, steps=4), SpecMismatchError),
        "norm": (kit.result_chunks(g.lease_id, huge, steps=4), ValidationError),
        "garbage": ([b"\x00" * 100], WireError),
        "truncated": ([b"".join(ok)[:-7]], WireError),
        "flipped": ([bytes(b ^ 1 if i == len(b"".join(ok)) - 30 else b
                           for i, b in enumerate(b"".join(ok)))], WireError),
        "kind": (list(encode_payload("model", {}, good)), WireError),
        "other_lease": (kit.result_chunks("someone-else", good, steps=4), ValidationError),
        "steps": (kit.result_chunks(g.lease_id, good, steps=5), ValidationError),
        "future_base": (kit.result_chunks(g.lease_id, good, steps=4, base_version=3),
                        ValidationError),
        "update_kind": (kit.result_chunks(g.lease_id, good, steps=4, kind="grad"), ValidationError),
        "metrics": (kit.result_chunks(g.lease_id, good, steps=4, metrics={"x": "y"}),
                    ValidationError),
    }


async def test_bad_payloads_change_nothing(kit, clock, policy) -> None:
    async with coordinator(kit, clock, policy, max_update_norm=100.0) as coord:
        w = await coord.join()
        g = await coord.lease(w)
        good = kit.delta_like(coord.model())
        digest = coord.model().digest()
        for name, (chunks, error) in _bad_bodies(kit, g, good).items():
            with pytest.raises(error):
                await coord.submit(w, g.lease_id, kit.stream(chunks))
            assert coord.model().digest() == digest, name
            assert coord.version == 0, name
        # The one ledger change: a well-formed but invalid upload freed the unit for reissue at once
        # (issue 13), once; malformed bytes change nothing.
        assert coord._ledger.unit_state(g.unit.unit_id) is UnitState.QUEUED
        assert coord._ledger.stats["refused"] == 1
        assert sum(coord.metrics.rejects.values()) == 15
        assert coord.metrics.rejects["non_finite"] == 1
        assert coord.metrics.rejects["norm_too_large"] == 1
        assert (await submit(kit, coord, w, g, good)).status == "accepted"   # still usable


async def test_heartbeat_answers_while_a_merge_runs(kit, clock) -> None:
    entered, release = threading.Event(), threading.Event()

    class Slow(kit.HalfWay):
        def merge(self, model, update, state):
            entered.set()
            assert release.wait(30), "the test never released the merge"
            return super().merge(model, update, state)

    async with coordinator(kit, clock, Slow(), units=2) as coord:
        a, b = await coord.join("a"), await coord.join("b")
        ga, gb = await coord.lease(a), await coord.lease(b)
        task = asyncio.create_task(submit(kit, coord, a, ga, kit.delta_like(coord.model())))
        assert await asyncio.to_thread(entered.wait, 30)
        assert not task.done()
        clock.advance(1)
        hb = await coord.heartbeat(b, gb.lease_id, 1)      # answered with the merge still running
        assert hb.deadline_s == 10.0
        assert coord.status()["metrics"]["merge_queue"] == 0
        assert not task.done()
        release.set()
        assert (await task).status == "accepted"


async def test_expiry_parks_after_max_attempts_and_run_finishes(kit, clock, policy) -> None:
    async with coordinator(kit, clock, policy, units=1, max_attempts=2, park_after_workers=2) as coord:
        for name in "ab":                  # parking needs failures on distinct workers
            await coord.lease(await coord.join(name))
            clock.advance(11)
        with pytest.raises(NoWorkAvailableError) as ei:
            await coord.lease(await coord.join("c"))
        assert ei.value.finished
        await asyncio.wait_for(coord.wait_finished(), 5)
        assert "e0-s0" in coord.status()["parked"]


async def test_partial_result_requeues_the_rest(kit, clock, policy) -> None:
    async with coordinator(kit, clock, policy, units=1, steps=10) as coord:
        w = await coord.join()
        g = await coord.lease(w)
        r = await submit(kit, coord, w, g, kit.delta_like(coord.model()), steps=3, partial=True)
        assert r.status == "accepted"
        rest = await coord.lease(w)
        assert (rest.unit.steps, rest.unit.step_offset) == (7, 3)


async def test_versions_are_retained_for_deltas_and_dropped_outside_the_window(kit, clock,
                                                                                policy) -> None:
    async with coordinator(kit, clock, policy, units=6, max_staleness=2) as coord:
        w = await coord.join()
        delta = kit.delta_like(coord.model())
        while coord.version < 3:
            await coord.lease(w)                      # stays open: its base may still be needed
            g = await coord.lease(w)
            await submit(kit, coord, w, g, delta)
        assert coord.status()["retained_versions"] == [1, 2, 3]   # 0 is outside the window
        with pytest.raises(VersionNotFoundError):
            coord.model_payload(0)
        with pytest.raises(VersionNotFoundError):
            coord.model_etag(0)


async def test_a_lease_that_expires_at_a_lease_request_or_a_heartbeat_is_a_status_event(
        kit, clock, policy) -> None:
    """A lease found past its deadline by a lease request (its unit handed to another worker) or
    by its own heartbeat (revived) counted in the ledger's `expired` but was no status-page event:
    only those the expiry loop found were; a stalled worker's expiry left no trace in the page."""
    async with coordinator(kit, clock, policy, units=2, expiry_interval_s=0.02) as coord:
        slow, other = await coord.join("slow"), await coord.join("other")
        taken = await coord.lease(slow)
        revived = await coord.lease(slow)
        clock.advance(1000.0)               # both past their deadlines, the expiry loop not run yet
        await coord.heartbeat(slow, revived.lease_id, steps_done=1)    # expires both, revives one
        await coord.lease(other)                                       # the other unit, expired
        assert coord.status()["leases"]["expired"] == 2
        for _ in range(200):                # the expiry loop's next pass (every 0.02 s)
            events = [e for e in coord.activity.events() if e.kind == "expired"]
            if len(events) == 2:
                break
            await asyncio.sleep(0.01)
        assert sorted((e.worker, e.unit) for e in events) == sorted(
            [(slow, taken.unit.unit_id), (slow, revived.unit.unit_id)])
        assert coord.activity.totals["expired"] == 2


async def test_only_bases_of_results_that_may_still_come_are_kept(kit, clock, policy) -> None:
    async with coordinator(kit, clock, policy, units=6, max_staleness=8) as coord:
        w = await coord.join()
        delta = kit.delta_like(coord.model())
        late = await coord.lease(w)                   # on version 0; it will expire
        for _ in range(3):
            g = await coord.lease(w)
            await submit(kit, coord, w, g, delta)
        # 1 and 2 were the bases of results already merged: within the window, but nothing can
        # be based on them any more, so they are gone (their buffers recycled).
        assert coord.status()["retained_versions"] == [0, 3]
        clock.advance(1000.0)
        coord._ledger.expire()
        coord._merger.retain()
        assert coord.status()["retained_versions"] == [0, 3]  # an expired lease may still deliver
        r = await submit(kit, coord, w, late, delta)
        assert r.status == "accepted"
        assert coord.status()["retained_versions"] == [4]


async def test_lifetime(kit, clock, policy) -> None:
    coord = coordinator(kit, clock, policy)
    with pytest.raises(ClosedError):
        await coord.lease("w")
    async with coord:
        w = await coord.join()
        with pytest.raises(ClosedError):
            await coord.__aenter__()
    await coord.aclose()
    await coord.aclose()
    with pytest.raises(ClosedError):
        await coord.lease(w)
    with pytest.raises(ClosedError):
        await coord.wait_finished()
    assert coord.status()["phase"] == "closed"
    assert coord.version == 0             # the views outlive the close
    assert coord.model().version == 0


async def test_views_before_entering_say_so(kit, clock, policy) -> None:
    """An embedding program that reads the coordinator before ``async with`` gets a ClosedError
    saying to enter it first (it got an AttributeError on a private name), and wait_finished()
    raises at once instead of waiting forever for a run that cannot start."""
    coord = coordinator(kit, clock, policy)
    reads = {"version": lambda: coord.version, "model": coord.model, "parked": coord.parked,
             "model_etag": lambda: coord.model_etag(0),
             "record_eval": lambda: coord.record_eval(0, {"loss": 1.0})}
    for name, read in reads.items():
        with pytest.raises(ClosedError, match=r"is new and holds no model yet: enter it"):
            read()
        assert name in reads
    with pytest.raises(ClosedError, match="enter it"):
        await asyncio.wait_for(coord.wait_finished(), 5)
    assert coord.status()["phase"] == "new"
    async with coord:
        assert coord.version == 0


@pytest.mark.parametrize("buffer_size", [3, 2])
async def test_a_run_that_finishes_with_results_in_a_policy_buffer_applies_them(
        kit, clock, caplog, buffer_size: int) -> None:
    """fedbuff with a buffer of 3 and 4 units: the 4th result was accepted (its worker told so)
    but waited in the buffer when the run finished, so the final model never included it (a
    WARNING said so). The policy's flush applies it at the end: one more version, nothing held,
    no warning. (tests/coordinator/test_flush.py has the policies, restarts and crashes.)"""
    from vcasync.policy import build_policy

    caplog.set_level("WARNING", logger="vcasync.coordinator")
    async with coordinator(kit, clock, build_policy("fedbuff", {"buffer_size": buffer_size}),
                           units=4) as coord:
        w = await coord.join("w1")
        for _ in range(4):
            g = await coord.lease(w)
            r = await submit(kit, coord, w, g, kit.delta_like(coord.model(g.base_version)))
            assert r.status == "accepted"
        await asyncio.wait_for(coord.wait_finished(), 10)
        assert coord.version == 2          # 3 + the flush of 1, or 2 + 2
        assert coord.status()["held_results"] == 0
    assert [r for r in caplog.records if "holds without having applied" in r.getMessage()] == []


def test_config_errors(kit, policy) -> None:
    with pytest.raises(ConfigError, match="max_staleness"):
        CoordinatorConfig(max_staleness=-1)
    with pytest.raises(ConfigError, match="durability"):
        CoordinatorConfig(durability="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="model_codec"):
        CoordinatorConfig(model_codec="gzip-9000")
    # heartbeat 50 s on a lease of 4 s: every lease expired between heartbeats, units trained twice
    with pytest.raises(ConfigError, match=r"heartbeat_interval_s must be at most a third of "
                                          r"lease_timeout_s \(1\.33333 s\).*got 50\.0"):
        CoordinatorConfig(lease_timeout_s=4.0, heartbeat_interval_s=50.0)
    with pytest.raises(ConfigError, match="heartbeat_interval_s"):
        CoordinatorConfig(lease_timeout_s=60.0, heartbeat_interval_s=30.0)
    with pytest.raises(ConfigError, match=r"lease_timeout_s must be finite.*got inf"):
        CoordinatorConfig(lease_timeout_s=float("inf"))
    # found by a probe: 1e308 was taken, and a dead worker's unit then waited for ever
    with pytest.raises(ConfigError, match=r"lease_timeout_s must be at most 604800 s.*got 1e\+308"):
        CoordinatorConfig(lease_timeout_s=1e308)
    CoordinatorConfig(lease_timeout_s=7 * 24 * 3600.0)
    # found by hand: '../up' failed at the first write (exit 1); an infinite interval never expired
    with pytest.raises(ConfigError, match=r"state_prefix '\.\./up'.*'\.\.' part"):
        CoordinatorConfig(state_prefix="../up")
    with pytest.raises(ConfigError, match=r"expiry_interval_s must be finite"):
        CoordinatorConfig(expiry_interval_s=float("inf"))
    third = CoordinatorConfig(lease_timeout_s=60.0, heartbeat_interval_s=20.0)
    assert third.ledger_config().heartbeat_s == 20.0
    with pytest.raises(ConfigError, match="needs a storage"):
        Coordinator(kit.tiny_model(), make_units(1), policy=policy, storage=None)
    with pytest.raises(ConfigError, match="MergePolicy"):
        Coordinator(kit.tiny_model(), make_units(1), policy=object(),  # type: ignore[arg-type]
                    storage=None, config=NONE)


async def test_memory_budget_drops_old_bases_and_refuses_their_deltas(kit, clock, policy) -> None:
    nbytes = kit.tiny_model().nbytes
    async with coordinator(kit, clock, policy, units=7, max_retained_bytes=2 * nbytes) as coord:
        w = await coord.join()
        old = await coord.lease(w)
        delta = kit.delta_like(coord.model())
        for _ in range(3):
            if coord.version:
                await coord.lease(w)                  # an open lease on every version
            g = await coord.lease(w)
            await submit(kit, coord, w, g, delta, base_version=coord.version)
        assert coord.status()["retained_versions"] == [2, 3]     # two models fit the budget
        r = await submit(kit, coord, w, old, delta)
        assert (r.status, r.reason) == ("rejected", "base_unavailable")
        w_c = {k: v + 0.5 if v.is_floating_point() else v for k, v in coord.model().items()}
        # why a worker does not resend full weights after base_unavailable (docs/limits.md said it
        # did): the refusal closes the lease, so a second upload on it only gets the same receipt;
        # the unit is queued again, not counted against the worker, and trained again
        version = coord.version
        again = await submit(kit, coord, w, old, w_c, kind="weights", base_version=version)
        assert (again.status, again.reason) == ("rejected", "base_unavailable")
        assert coord.version == version                                        # nothing merged
        assert coord._ledger.unit_state(old.unit.unit_id) is UnitState.QUEUED   # trained again
        g = await coord.lease(w)                                 # full weights need no base
        assert (await submit(kit, coord, w, g, w_c, kind="weights", base_version=0)).status \
            == "accepted"


async def test_with_many_leases_the_bases_are_scanned_by_the_expiry_loop(kit, clock, policy) -> None:
    # 1,000 open leases: the merges no longer scan them for bases (10 ms at 10,000) and keep every
    # version since the last scan, so nothing a new lease is based on can go; the expiry loop's
    # scan (once a second) drops what no lease is based on.
    async with coordinator(kit, clock, policy, units=1003, max_staleness=8,
                           max_leases_per_worker=None) as coord:    # one id for 1,000 workers
        w = await coord.join()
        for _ in range(1000):
            await coord.lease(w)                      # all on version 0, left open
        delta = kit.delta_like(coord.model())
        seen = []
        for _ in range(3):
            g = await coord.lease(w)
            await submit(kit, coord, w, g, delta)
            seen.append(coord.status()["retained_versions"])
        assert seen == [[0, 1], [0, 1, 2], [0, 1, 2, 3]]
        coord._merger.retain(rescan=True)             # what the expiry loop does every second
        assert coord.status()["retained_versions"] == [0, 3]


async def test_the_expiry_loop_forgets_long_silent_workers(kit, clock, policy) -> None:
    async with coordinator(kit, clock, policy, forget_workers_s=30.0,
                           expiry_interval_s=0.01) as coord:
        gone, busy = await coord.join("gone"), await coord.join("busy")
        g = await coord.lease(busy)
        await asyncio.sleep(0.05)                     # the loop has started (its minute counts)
        clock.advance(61.0)                           # past the horizon and the loop's minute
        await coord.heartbeat(busy, g.lease_id, 1)
        for _ in range(200):
            if coord.status()["workers"]["known"] == 1:
                break
            await asyncio.sleep(0.01)
        assert coord.status()["workers"]["known"] == 1   # "gone" forgotten, "busy" kept
        await coord.lease(gone)                       # back: registered again
        assert coord.status()["workers"]["known"] == 2
