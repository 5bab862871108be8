"""Issue 13, in virtual time: a unit is never given up on silently.

A hung trainer's heartbeats do not hold its unit; failures are attributed to workers (back-off, then
quarantine); a unit is parked only after failing on several distinct workers; an operator requeues
parked units; a refused upload frees its unit at once; counters agree with the ledger after a restore.
"""

from __future__ import annotations

import contextlib

import pytest

from vcasync.errors import (
    LeaseExpiredError,
    LedgerError,
    NoWorkAvailableError,
    WorkerBackoffError,
    WorkerQuarantinedError,
)
from vcasync.ledger import LeaseState, Ledger, LedgerConfig, UnitState
from vcasync.ledger._units import make_units

SECRET = b"0123456789abcdef0123456789abcdef"


def make(clock, n=1, steps=10, **cfg) -> Ledger:
    return Ledger(make_units(n, steps=steps), config=LedgerConfig(lease_timeout_s=10.0, **cfg),
                  clock=clock, secret=SECRET)


def test_heartbeats_without_progress_do_not_revive_an_expired_lease(clock) -> None:
    led = make(clock)
    hung, idle = led.join("hung"), led.join("idle")
    g = led.lease(hung, 0)
    led.heartbeat(hung, g.lease_id, 2)               # some progress, then the trainer hangs
    for _ in range(5):                               # it keeps heartbeating the same step count
        clock.advance(4)
        with contextlib.suppress(LeaseExpiredError):
            led.heartbeat(hung, g.lease_id, 2)
    assert led.lease_state(g.lease_id) is LeaseState.EXPIRED
    assert led.unit_state("e0-s0") is UnitState.QUEUED
    with pytest.raises(LeaseExpiredError):
        led.heartbeat(hung, g.lease_id, 2)
    assert led.lease(idle, 0).unit.unit_id == "e0-s0"  # the idle worker gets it
    assert led.stats["expired"] == 1
    assert led.stats["revived"] == 0


def test_a_failed_unit_goes_to_another_worker_and_the_failing_one_backs_off(clock) -> None:
    led = make(clock, n=2, worker_backoff_s=2.0)
    bad, good = led.join("bad"), led.join("good")
    g = led.lease(bad, 0)
    led.release(bad, g.lease_id, "trainer error: RuntimeError: boom")
    with pytest.raises(WorkerBackoffError) as ei:    # not the same unit again at once
        led.lease(bad, 0)
    assert ei.value.retry_after == pytest.approx(2.0)
    assert not ei.value.finished
    assert led.lease(good, 0).unit.unit_id == g.unit.unit_id
    clock.advance(2.0)
    assert led.lease(bad, 0).unit.unit_id == "e0-s1"
    health = led.worker_health()[bad]
    assert health["streak"] == 1
    assert "boom" in health["last_failure"]


def test_back_off_grows_then_quarantine_and_success_resets(clock) -> None:
    led = make(clock, n=6, worker_backoff_s=1.0, worker_backoff_max_s=3.0, quarantine_after=4)
    w = led.join("flaky")
    waits = []
    for _ in range(3):
        led.release(w, led.lease(w, 0).lease_id, "trainer error")
        with pytest.raises(WorkerBackoffError) as ei:
            led.lease(w, 0)
        waits.append(ei.value.retry_after)
        clock.advance(ei.value.retry_after)
    assert waits == [1.0, 2.0, 3.0]                  # doubling, capped
    g = led.lease(w, 0)
    check = led.check_result(w, g.lease_id)
    led.record(g.lease_id, unit_id=check.unit.unit_id, worker_id=w, status="accepted", version=1,
               steps_done=10)
    assert led.worker_health()[w]["streak"] == 0     # it works again
    for _ in range(4):
        led.release(w, led.lease(w, 0).lease_id, "trainer error")
        clock.advance(10)
    with pytest.raises(WorkerQuarantinedError, match="quarantined"):
        led.lease(w, 0)
    assert led.workers_quarantined() == 1
    assert led.stats["quarantined"] == 1
    # found by a probe: a quarantined worker (which stops when told) was counted alive too, so the
    # status page's table said "alive 1" beside its state line's "quarantined 1"
    assert led.workers_alive() == 0
    assert led.worker_rows()[0]["quarantined"] == 1


def test_one_worker_never_gets_a_unit_parked(clock) -> None:
    led = make(clock, max_attempts=3, park_after_workers=2, quarantine_after=100)
    a = led.join("a")
    for _ in range(6):
        led.release(a, led.lease(a, 0).lease_id, "trainer error")
        clock.advance(100)
    assert led.unit_state("e0-s0") is UnitState.QUEUED
    b = led.join("b")
    led.release(b, led.lease(b, 0).lease_id, "trainer error: boom")
    assert led.unit_state("e0-s0") is UnitState.PARKED
    assert "on 2 workers" in led.parked()["e0-s0"]
    assert "boom" in led.parked()["e0-s0"]


def test_operator_requeue_all_or_named_and_nothing_on_a_bad_name(clock) -> None:
    led = make(clock, n=3, max_attempts=1, park_after_workers=1)
    w = led.join()
    for _ in range(3):
        led.release(w, led.lease(w, 0).lease_id, "trainer error")
        clock.advance(100)
    assert sorted(led.parked()) == ["e0-s0", "e0-s1", "e0-s2"]
    with pytest.raises(NoWorkAvailableError):
        led.lease(w, 0)
    with pytest.raises(LedgerError, match="nope"):
        led.requeue(["e0-s0", "nope"])
    assert len(led.parked()) == 3                    # all or nothing
    assert led.requeue(["e0-s1"]) == ["e0-s1"]
    assert led.unit_state("e0-s1") is UnitState.QUEUED
    with pytest.raises(LedgerError, match="not parked"):
        led.requeue(["e0-s1"])
    assert led.requeue() == ["e0-s0", "e0-s2"]
    assert not led.parked()
    assert not led.finished
    assert led.stats["requeued"] == 3


def test_a_refused_upload_frees_the_unit_at_once(clock) -> None:
    led = make(clock, n=1)
    a, b = led.join("a"), led.join("b")
    g = led.lease(a, 0)
    assert led.refuse(a, g.lease_id, "not_finite")
    assert not led.refuse(a, g.lease_id, "not_finite")   # once
    assert led.unit_state("e0-s0") is UnitState.QUEUED
    assert led.lease(b, 0).unit.unit_id == "e0-s0"       # no wait for the deadline
    assert "not_finite" in led.worker_health()[a]["last_failure"]
    assert led.check_result(a, g.lease_id).receipt is None   # a corrected re-send still counts


@pytest.mark.parametrize("reason", ["negative_increment", "counter_overflow"])
def test_a_result_rejected_for_its_counters_blames_its_worker(clock, reason) -> None:
    # Found by a probe: rejected without blame, a worker whose trainer always broke a counter
    # re-leased and re-uploaded ~50 times a second for ever.
    led = make(clock, n=1, max_attempts=2, park_after_workers=1, quarantine_after=100)
    a = led.join("a")
    for attempt in (1, 2):
        g = led.lease(a, 0)
        led.record(g.lease_id, unit_id="e0-s0", worker_id=a, status="rejected", version=0,
                   reason=reason)
        assert led.worker_health()[a]["streak"] == attempt
        if attempt == 1:
            with pytest.raises(WorkerBackoffError):       # backed off, like a refused upload
                led.lease(a, 0)
            clock.advance(100)
    assert led.unit_state("e0-s0") is UnitState.PARKED    # and the unit counts toward parking
    assert reason in led.parked()["e0-s0"]


@pytest.mark.parametrize("reason", ["policy", "too_stale"])
def test_a_result_rejected_for_the_coordinators_or_policys_reasons_blames_nobody(clock,
                                                                               reason) -> None:
    led = make(clock, n=2)
    a = led.join("a")
    g = led.lease(a, 0)
    led.record(g.lease_id, unit_id=g.unit.unit_id, worker_id=a, status="rejected", version=0,
               reason=reason)
    assert a not in led.worker_health()
    led.lease(a, 0)                                      # no back-off


def test_counters_agree_with_the_ledger_after_restore(clock) -> None:
    led = make(clock, n=3)
    w = led.join()
    old = led.snapshot()                              # a snapshot taken before any lease
    grants = [led.lease(w, 0) for _ in range(3)]
    back = Ledger.restore(old, config=led.config, clock=clock, secret=SECRET)
    back.heartbeat(w, grants[0].lease_id, 1)          # adopted: it was issued
    back.record(grants[1].lease_id, unit_id=grants[1].unit.unit_id, worker_id=w,
                status="accepted", version=1, steps_done=10)   # replayed from the journal
    assert back.stats["issued"] == 2
    assert back.stats["issued"] >= back.stats["accepted"] + back.counts()["leased"]
    old["units"]["issued"][0] = 4                     # a snapshot whose stats lag its units
    assert Ledger.restore(old, config=led.config, clock=clock, secret=SECRET).stats["issued"] == 4


def test_a_quarantine_ends_after_quarantine_s_with_one_more_try(clock) -> None:
    led = make(clock, n=3, quarantine_after=2, quarantine_s=100.0, worker_backoff_s=1.0)
    w = led.join("unlucky")
    for _ in range(2):
        led.release(w, led.lease(w, 0).lease_id, "trainer error")
        clock.advance(5)
    with pytest.raises(WorkerQuarantinedError, match="for 95s more") as ei:
        led.lease(w, 0)
    assert ei.value.retry_after == pytest.approx(95.0)
    clock.advance(95)
    g = led.lease(w, 0)                              # served its time: one more try
    assert led.workers_quarantined() == 0
    led.release(w, g.lease_id, "trainer error")      # and one more failure quarantines it again
    with pytest.raises(WorkerQuarantinedError):
        led.lease(w, 0)
    snap = led.snapshot()                            # a restart keeps the quarantine
    back = Ledger.restore(snap, config=led.config, clock=clock, secret=SECRET)
    with pytest.raises(WorkerQuarantinedError):
        back.lease(w, 0)


def test_a_quarantine_and_a_back_off_are_served_through_an_outage(clock) -> None:
    """A restart ``down_s`` after the capture counts the outage toward a worker's wait, as it
    counts it toward its last-seen: a quarantine of 100 s that had 95 s left is over after two
    minutes down (before the fix it began its 95 s again at the restart), and a back-off that had
    20 s left has 5 s left after 15 s down."""
    led = make(clock, n=4, quarantine_after=2, quarantine_s=100.0, worker_backoff_s=20.0)
    jailed, slow = led.join("jailed"), led.join("slow")
    led.release(jailed, led.lease(jailed, 0).lease_id, "trainer error")
    clock.advance(20)                                # its back-off served
    led.release(jailed, led.lease(jailed, 0).lease_id, "trainer error")   # quarantined: 100 s
    clock.advance(5)
    led.release(slow, led.lease(slow, 0).lease_id, "trainer error")       # backed off: 20 s
    snap = led.snapshot()
    back = Ledger.restore(snap, config=led.config, clock=clock, secret=SECRET, down_s=15.0)
    with pytest.raises(WorkerQuarantinedError) as eq:
        back.lease(jailed, 0)
    assert eq.value.retry_after == pytest.approx(80.0)
    with pytest.raises(WorkerBackoffError) as eb:
        back.lease(slow, 0)
    assert eb.value.retry_after == pytest.approx(5.0)
    later = Ledger.restore(snap, config=led.config, clock=clock, secret=SECRET, down_s=120.0)
    assert later.lease(jailed, 0).unit.unit_id    # served its time during the outage
    assert later.lease(slow, 0).unit.unit_id
    assert later.workers_quarantined() == 0


def test_a_workers_reason_cannot_forge_log_lines(clock) -> None:
    led = make(clock, max_attempts=1, park_after_workers=1)
    w = led.join()
    led.release(w, led.lease(w, 0).lease_id, "boom\nERROR vcasync.coordinator: all fine\x1b[2J")
    reason = led.parked()["e0-s0"]
    assert "\n" not in reason
    assert "\x1b" not in reason
    assert "boom?ERROR" in reason


def test_long_silent_workers_are_forgotten_unless_they_hold_work_or_a_penalty(clock) -> None:
    led = make(clock, n=4, forget_workers_s=100.0, quarantine_after=1, quarantine_s=None)
    idle, holder, punished, recent = (led.join(x) for x in ("idle", "holder", "punished", "recent"))
    g = led.lease(holder, 0)
    led.release(punished, led.lease(punished, 0).lease_id, "trainer error")   # quarantined
    clock.advance(150)
    led.join("newer")
    led.lease(recent, 0)                 # it takes the holder's unit, whose lease expired
    assert led.forget_workers() == 1                       # idle only
    assert led.num_workers == 4
    assert led.lease_state(g.lease_id) is LeaseState.EXPIRED    # the holder's lease: still open
    clock.advance(200)
    led.record(g.lease_id, unit_id=g.unit.unit_id, worker_id=holder, status="accepted",
               version=1, steps_done=10)                    # a late result closes it
    gone = led.forget_workers()
    assert gone == 3        # holder (its lease closed), recent and newer; the quarantined one stays
    assert led.worker_health().keys() == {punished}
    # a forgotten worker that comes back is registered again on its next request
    again = led.lease(idle, 1)
    assert led.lease_holder(again.lease_id) == idle
    assert led.num_workers == 2
    # None keeps every record
    keep = make(clock, n=1, forget_workers_s=None)
    keep.join("x")
    clock.advance(1e6)
    assert keep.forget_workers() == 0
