"""Admission limits of the ledger: active leases per worker (``max_leases_per_worker``) and worker
records (``max_workers``). A refusal is typed, says the cap and what is held, and changes nothing."""

from __future__ import annotations

import math

import pytest

from vcasync.coordinator import CoordinatorConfig
from vcasync.errors import ConfigError, LeaseLimitError, WorkerBackoffError, WorkersFullError
from vcasync.ledger import Ledger, LedgerConfig, UnitState
from vcasync.ledger._units import make_units
from vcasync.runconfig import dataclass_from_table

SECRET = b"0123456789abcdef0123456789abcdef"


def make(clock, n=6, **cfg) -> Ledger:
    return Ledger(make_units(n, steps=10), config=LedgerConfig(lease_timeout_s=10.0, **cfg),
                  clock=clock, secret=SECRET)


def accept(led: Ledger, w: str, lease_id: str) -> None:
    unit = led.check_result(w, lease_id).unit
    led.record(lease_id, unit_id=unit.unit_id, worker_id=w, status="accepted", version=1,
               steps_done=unit.steps)


# -- max_leases_per_worker --------------------------------------------------------------------------

def test_a_worker_at_its_lease_cap_is_refused_and_nothing_changes(clock) -> None:
    led = make(clock, max_leases_per_worker=2)
    hog, honest = led.join("hog"), led.join("honest")
    first = led.lease(hog, 0)
    clock.advance(3)
    led.lease(hog, 0)
    before = led.snapshot()
    with pytest.raises(LeaseLimitError) as info:
        led.lease(hog, 0)
    exc = info.value
    assert isinstance(exc, WorkerBackoffError)      # a worker that obeys a back-off obeys this
    assert (exc.limit, exc.held) == (2, 2)
    assert "max_leases_per_worker (2)" in str(exc)
    assert "holds 2 active leases" in str(exc)
    # asked to come back when its first lease is due to expire (7 s), at most a heartbeat (2.5 s)
    assert exc.retry_after == pytest.approx(2.5)
    after = led.snapshot()
    assert after["queue"] == before["queue"]
    assert after["stats"] == before["stats"]
    assert after["leases"] == before["leases"]
    assert after["units"] == before["units"]
    assert led.counts() == {"queued": 4, "leased": 2, "done": 0, "parked": 0}
    # the rest of the fleet is served
    assert led.lease(honest, 0).unit.unit_id == "e0-s2"
    # one of the hog's leases ends (its result): it may lease again, once
    accept(led, hog, first.lease_id)
    led.lease(hog, 0)
    with pytest.raises(LeaseLimitError):
        led.lease(hog, 0)


def test_an_expired_or_released_lease_no_longer_counts(clock) -> None:
    led = make(clock, max_leases_per_worker=1)
    w = led.join("w")
    g = led.lease(w, 0)
    with pytest.raises(LeaseLimitError) as info:
        led.lease(w, 0)
    assert info.value.retry_after == pytest.approx(2.5)
    clock.advance(9.95)
    with pytest.raises(LeaseLimitError) as info:
        led.lease(w, 0)
    assert info.value.retry_after == pytest.approx(0.1)      # never 0: at least 0.1 s
    clock.advance(0.1)             # expired: its unit is back in the queue, and the worker free
    assert led.expire() == [g.lease_id]
    clock.advance(1.5)             # (once its back-off for the expiry is over)
    g2 = led.lease(w, 0)
    assert g2.lease_id != g.lease_id
    led.release(w, g2.lease_id, "preempted", failed=False)
    led.lease(w, 0)


def test_the_default_cap_fits_the_worker_client_and_none_or_inf_is_no_cap(clock) -> None:
    assert LedgerConfig().max_leases_per_worker == 4
    assert CoordinatorConfig().ledger_config().max_leases_per_worker == 4
    led = make(clock, n=6)
    w = led.join("w")
    for _ in range(4):           # one in hand, and grants whose answers were lost on the way
        led.lease(w, 0)
    with pytest.raises(LeaseLimitError):
        led.lease(w, 0)
    for cap in (None, math.inf):
        led = make(clock, n=6, max_leases_per_worker=cap)
        assert led.config.max_leases_per_worker is None
        w = led.join("w")
        for _ in range(6):
            led.lease(w, 0)


def test_resumed_and_restored_leases_count_and_resume_is_not_capped(clock) -> None:
    led = make(clock, max_leases_per_worker=2)
    w = led.join("w")
    a, b = led.lease(w, 0), led.lease(w, 0)
    # a restart of the coordinator keeps the worker at its cap
    back = Ledger.restore(led.snapshot(), config=led.config, clock=clock, secret=SECRET)
    with pytest.raises(LeaseLimitError) as info:
        back.lease(w, 0)
    assert info.value.held == 2
    # a worker restart resumes what it holds: never refused for the cap
    assert back.resume(w, a.lease_id).resumed
    assert back.resume(w, b.lease_id).resumed
    # another worker taking over an expired lease holds it (and its old holder does not)
    other = back.join("other")
    clock.advance(30)
    back.expire()
    back.resume(other, a.lease_id)
    clock.advance(3)              # w's back-off for its two expired leases
    back.lease(w, 0)
    back.lease(w, 0)
    with pytest.raises(LeaseLimitError):
        back.lease(w, 0)
    back.lease(other, 0)
    with pytest.raises(LeaseLimitError) as info:
        back.lease(other, 0)
    assert info.value.held == 2


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3", math.nan])
@pytest.mark.parametrize("name", ["max_leases_per_worker", "max_workers"])
def test_a_bad_cap_is_refused_naming_its_key(name: str, bad: object) -> None:
    with pytest.raises(ConfigError, match=rf"^{name} must be an int >= 1, or None or inf"):
        LedgerConfig(**{name: bad})   # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["max_leases_per_worker", "max_workers"])
def test_run_toml_sets_the_caps(name: str) -> None:
    cfg = dataclass_from_table(CoordinatorConfig, {name: 7}, "coordinator")
    assert getattr(cfg.ledger_config(), name) == 7
    cfg = dataclass_from_table(CoordinatorConfig, {name: math.inf}, "coordinator")
    assert getattr(cfg.ledger_config(), name) is None
    for bad in (0, 1.5):
        with pytest.raises(ConfigError, match=rf"{name} must be an int >= 1"):
            dataclass_from_table(CoordinatorConfig, {name: bad}, "coordinator")
    with pytest.raises(ConfigError, match=rf"coordinator\.{name}"):
        dataclass_from_table(CoordinatorConfig, {name: "many"}, "coordinator")


# -- max_workers ------------------------------------------------------------------------------------

def test_a_join_when_full_is_refused_and_the_joined_are_unaffected(clock) -> None:
    led = make(clock, max_workers=3, forget_workers_s=None)
    ids = [led.join(f"w{i}") for i in range(3)]
    with pytest.raises(WorkersFullError) as info:
        led.join("one too many", {"host": "x"})
    exc = info.value
    assert (exc.limit, exc.held, exc.retry_after, exc.finished) == (3, 3, 30.0, False)
    assert "max_workers (3)" in str(exc)
    assert led.num_workers == 3
    assert set(r["id"] for r in led.worker_rows()[1]) == set(ids)
    for w in ids:                 # the ones that joined lease as before
        led.lease(w, 0)
    # a worker the ledger does not know that authenticated anyway (joined after the last
    # snapshot of a crashed coordinator) is registered again whatever the cap
    led.leave("w-known-to-the-server")
    assert led.num_workers == 4
    assert led.recall("w-recalled", "r", 1.0)
    assert led.num_workers == 5


def test_a_full_join_first_forgets_the_silent(clock) -> None:
    led = make(clock, max_workers=3, forget_workers_s=100.0)
    silent, holder, busy = led.join("silent"), led.join("holder"), led.join("busy")
    led.lease(holder, 0)
    clock.advance(50)
    led.lease(busy, 0)
    with pytest.raises(WorkersFullError):
        led.join("new")           # nobody silent for 100 s yet
    clock.advance(50.5)           # 'silent' is now; the sweep 50.5 s ago found nobody
    fresh = led.join("new")       # 'silent' was forgotten to make room
    assert led.num_workers == 3
    rows = {r["id"] for r in led.worker_rows()[1]}
    assert rows == {holder, busy, fresh}
    assert silent not in rows
    clock.advance(200)            # an expired lease may still deliver: its holder is kept
    led.expire()
    led.join("newer")             # 'new' went, silent and holding nothing
    rows = {r["id"] for r in led.worker_rows()[1]}
    assert holder in rows
    assert busy in rows
    assert fresh not in rows


def test_a_join_flood_looks_for_records_to_forget_once_a_second(clock) -> None:
    led = make(clock, max_workers=2, forget_workers_s=10.0)
    led.join("a")
    clock.advance(5)
    led.join("b")
    clock.advance(4.9)
    with pytest.raises(WorkersFullError):
        led.join("c")             # swept: nobody silent for 10 s
    clock.advance(0.5)            # 'a' is now, but the last sweep was 0.5 s ago
    with pytest.raises(WorkersFullError):
        led.join("c")
    clock.advance(0.5)
    led.join("c")
    assert led.num_workers == 2


def test_a_restore_holding_more_workers_than_the_cap_keeps_them_all(clock) -> None:
    led = make(clock, max_workers=None)
    ids = [led.join(f"w{i}") for i in range(5)]
    back = Ledger.restore(led.snapshot(), config=LedgerConfig(lease_timeout_s=10.0, max_workers=2,
                                                              forget_workers_s=None),
                          clock=clock, secret=SECRET)
    assert back.num_workers == 5
    for w in ids:
        back.lease(w, 0)
    assert back.counts()["leased"] == 5
    assert back.unit_state("e0-s0") is UnitState.LEASED
    with pytest.raises(WorkersFullError) as info:
        back.join("new")
    assert info.value.held == 5
