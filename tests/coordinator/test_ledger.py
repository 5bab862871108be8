"""The ledger in virtual time: leases, deadlines, late results, parking, partial results, snapshots."""

from __future__ import annotations

import pytest

from bench.ledger import as_rows  # the format-1 rows, as coordinators wrote them
from vcasync.errors import (
    ConfigError,
    LeaseExpiredError,
    LeaseNotFoundError,
    NotLeaseHolderError,
    NoWorkAvailableError,
    UnitClosedError,
    ValidationError,
)
from vcasync.ledger import LeaseState, Ledger, LedgerConfig, UnitState
from vcasync.ledger._units import LeaseGrant, Receipt, WorkUnit, make_units

SECRET = b"0123456789abcdef0123456789abcdef"


def make(clock, n=3, steps=10, **cfg) -> Ledger:
    return Ledger(make_units(n, steps=steps), config=LedgerConfig(lease_timeout_s=10.0, **cfg),
                  clock=clock, secret=SECRET)


def accept(led: Ledger, w: str, g: LeaseGrant, *, steps=None, partial=False, version=1) -> Receipt:
    check = led.check_result(w, g.lease_id)
    assert check.receipt is None
    return led.record(g.lease_id, unit_id=check.unit.unit_id, worker_id=w, status="accepted",
                      version=version, steps_done=g.unit.steps if steps is None else steps,
                      partial=partial)


def test_lease_heartbeat_result(clock) -> None:
    led = make(clock)
    w = led.join("a", {"gpu": "none"})
    g = led.lease(w, 0)
    assert g.unit.unit_id == "e0-s0"
    assert g.deadline_s == 10.0
    assert g.heartbeat_interval_s == 2.5
    assert led.unit_state("e0-s0") is UnitState.LEASED
    clock.advance(8)
    g2 = led.heartbeat(w, g.lease_id, 4)      # progress: the deadline moves out
    assert g2.deadline_s == 10.0
    clock.advance(8)
    assert led.heartbeat(w, g.lease_id, 4).deadline_s == pytest.approx(2.0)  # no progress: no move
    r = accept(led, w, g)
    assert r.status == "accepted"
    assert led.unit_state("e0-s0") is UnitState.DONE
    assert led.check_result(w, g.lease_id).receipt == r       # duplicate: the same receipt
    assert led.counts() == {"queued": 2, "leased": 0, "done": 1, "parked": 0}


def test_expired_lease_requeues_front_and_late_result_wins(clock) -> None:
    led = make(clock)
    a, b = led.join("a"), led.join("b")
    ga = led.lease(a, 0)
    clock.advance(11)
    gb = led.lease(b, 1)                       # expiry runs first: the same unit, reissued
    assert gb.unit.unit_id == ga.unit.unit_id
    assert led.lease_state(ga.lease_id) is LeaseState.EXPIRED
    assert led.stats["reissued"] == 1
    with pytest.raises(LeaseExpiredError):
        led.heartbeat(a, ga.lease_id, 3)
    accept(led, a, ga)                         # the late result is still useful
    with pytest.raises(UnitClosedError):       # the new holder learns the unit closed
        led.heartbeat(b, gb.lease_id, 3)
    with pytest.raises(UnitClosedError):
        led.check_result(b, gb.lease_id)
    assert led.lease_state(gb.lease_id) is LeaseState.SUPERSEDED


def test_heartbeat_revives_an_expired_lease_nobody_took(clock) -> None:
    led = make(clock)
    w = led.join()
    g = led.lease(w, 0)
    clock.advance(11)
    assert led.expire() == [g.lease_id]
    assert led.unit_state(g.unit.unit_id) is UnitState.QUEUED
    led.heartbeat(w, g.lease_id, 1)
    assert led.unit_state(g.unit.unit_id) is UnitState.LEASED
    assert led.lease_state(g.lease_id) is LeaseState.ACTIVE


def test_units_fail_max_attempts_times_then_park_and_late_result_still_counts(clock) -> None:
    led = make(clock, n=1, max_attempts=3, park_after_workers=3)
    workers = [led.join(n) for n in "abc"]
    grants = []
    for w in workers:
        grants.append(led.lease(w, 0))
        clock.advance(11)
        led.expire()
    assert led.unit_state("e0-s0") is UnitState.PARKED
    assert "failed 3 times on 3 workers" in led.parked()["e0-s0"]
    assert "lease expired" in led.parked()["e0-s0"]
    with pytest.raises(NoWorkAvailableError) as ei:
        led.lease(led.join("d"), 0)
    assert ei.value.finished
    accept(led, workers[0], grants[0])
    assert led.unit_state("e0-s0") is UnitState.DONE


def test_release_counts_as_an_attempt_and_is_idempotent(clock) -> None:
    led = make(clock, n=1, max_attempts=2, park_after_workers=1, worker_backoff_s=5.0)
    w = led.join()
    g = led.lease(w, 0)
    led.release(w, g.lease_id, "trainer error")
    led.release(w, g.lease_id, "trainer error")
    assert led.unit_state("e0-s0") is UnitState.QUEUED
    with pytest.raises(LeaseNotFoundError, match="released"):
        led.heartbeat(w, g.lease_id, 1)
    clock.advance(5)
    led.release(w, led.lease(w, 0).lease_id)
    assert led.unit_state("e0-s0") is UnitState.PARKED


def test_a_release_that_is_nobodys_fault_costs_no_attempt(clock) -> None:
    led = make(clock, n=1, max_attempts=1, park_after_workers=1)
    w = led.join()
    for _ in range(3):
        led.release(w, led.lease(w, 0).lease_id, "preempted", failed=False)
    assert led.unit_state("e0-s0") is UnitState.QUEUED
    assert led.worker_health() == {}


def test_partial_result_queues_the_remainder(clock) -> None:
    led = make(clock, n=1, steps=10)
    w = led.join()
    g = led.lease(w, 0)
    accept(led, w, g, steps=4, partial=True)
    g2 = led.lease(w, 1)
    assert g2.unit.unit_id == "e0-s0~4"
    assert g2.unit.steps == 6
    assert g2.unit.step_offset == 4
    accept(led, w, g2, steps=5, partial=True)
    g3 = led.lease(w, 2)
    assert (g3.unit.unit_id, g3.unit.steps, g3.unit.step_offset) == ("e0-s0~9", 1, 9)
    assert g3.unit.params["parent"] == "e0-s0"


@pytest.mark.parametrize("key", ["step_offset", "parent"])
def test_the_keys_only_remainders_carry_are_refused_in_users_units(kit, clock, key) -> None:
    # found by review: make_units(params={"step_offset": 3}) was taken for a remainder: its trainer
    # was told 3 steps were done, and a partial result's remainder counted from there
    from vcasync.coordinator import Coordinator, CoordinatorConfig
    from vcasync.policy import build_policy
    from vcasync.runconfig import UnitsConfig

    said = rf"params key '{key}' is reserved: the ledger sets 'step_offset' and 'parent'"
    with pytest.raises(ConfigError, match=rf"^make_units: the {said}"):
        make_units(2, params={"lr": 0.1, key: 3})
    with pytest.raises(ConfigError, match=rf"^units.params \(\[units.params\] in run.toml, "
                                          rf"--unit-param\): the {said}"):
        UnitsConfig(shards=2, params={key: "x"})
    mine = WorkUnit("mine", steps=4, params={key: 1})
    with pytest.raises(ConfigError, match=rf"^work unit 'mine': the {said}"):
        Coordinator(kit.tiny_model(), [mine], policy=build_policy("vcasgd"), storage=None,
                    config=CoordinatorConfig(durability="none"), clock=clock)
    led = make(clock, n=2)
    with pytest.raises(ConfigError, match=rf"^work unit 'mine': the {said}"):
        led.add_units([WorkUnit("fine", steps=4), mine])
    assert led.counts()["queued"] == 2                  # none of them added
    with pytest.raises(ConfigError, match="keys 'step_offset' and 'parent' are reserved"):
        make_units(1, params={"parent": "a", "step_offset": 1})


def test_remainders_keep_their_keys_through_a_snapshot(clock) -> None:
    led = make(clock, n=1, steps=10)
    w = led.join()
    accept(led, w, led.lease(w, 0), steps=4, partial=True)
    back = Ledger.restore(led.snapshot(), clock=clock, secret=SECRET)
    g = back.lease(back.join(), 1)
    assert (g.unit.unit_id, g.unit.params) == ("e0-s0~4", {"step_offset": 4, "parent": "e0-s0"})


def test_wrong_worker_bad_progress_unknown_lease(clock) -> None:
    led = make(clock)
    a, b = led.join(), led.join()
    g = led.lease(a, 0)
    before = led.snapshot()
    with pytest.raises(NotLeaseHolderError):
        led.heartbeat(b, g.lease_id, 1)
    with pytest.raises(NotLeaseHolderError):
        led.check_result(b, g.lease_id)
    with pytest.raises(ValidationError):
        led.heartbeat(a, g.lease_id, 11)
    with pytest.raises(ValidationError):
        led.heartbeat(a, g.lease_id, True)  # type: ignore[arg-type]
    for forged in ("nope", g.lease_id[:-1] + ("0" if g.lease_id[-1] != "0" else "1")):
        with pytest.raises(LeaseNotFoundError):
            led.heartbeat(a, forged, 1)
    assert led.snapshot() == before


def test_deadlines_adapt_to_worker_speed(clock) -> None:
    led = make(clock, n=2, steps=100, deadline_slack=3.0, speed_smoothing=1.0)
    slow = led.join("slow")
    g = led.lease(slow, 0)
    clock.advance(9)
    led.heartbeat(slow, g.lease_id, 1)                  # 9 s per step
    clock.advance(9)
    g2 = led.heartbeat(slow, g.lease_id, 2)
    assert g2.deadline_s == pytest.approx(27.0)         # slack * 9 s > lease_timeout_s
    assert led.worker_speed(slow) == pytest.approx(9.0)
    clock.advance(20)
    assert led.expire() == []                          # a fresh lease would have expired by now


def test_resume_transfers_and_signed_leases_are_adopted_after_restore(clock) -> None:
    led = make(clock)
    w = led.join()
    snap = led.snapshot()
    g = led.lease(w, 7)                                 # granted after the snapshot
    restored = Ledger.restore(snap, config=led.config, clock=clock, secret=SECRET)
    w2 = restored.join()
    r = restored.resume(w2, g.lease_id)
    assert r.resumed
    assert r.unit == g.unit
    assert r.base_version == 7
    assert restored.lease_holder(g.lease_id) == w2
    assert restored.stats["adopted"] == 1
    other = Ledger.restore(snap, config=led.config, clock=clock, secret=b"x" * 32)
    with pytest.raises(LeaseNotFoundError):
        other.resume(w2, g.lease_id)


def test_snapshot_round_trip_rebases_deadlines(clock) -> None:
    led = make(clock)
    w = led.join("a", {"k": [1, 2.5, None]})
    g = led.lease(w, 0)
    accept(led, w, led.lease(w, 0))
    snap = led.snapshot()
    later = type(clock)(start=5.0)                       # a new process: a new monotonic clock
    restored = Ledger.restore(snap, config=led.config, clock=later, secret=SECRET)
    assert restored.counts() == led.counts()
    assert restored.lease(w, 0).unit.unit_id == "e0-s2"   # the queue order survived
    assert restored.heartbeat(w, g.lease_id, 1).deadline_s == 10.0   # grace on restore
    assert unit_rows(restored.snapshot())[:2] == unit_rows(snap)[:2]


def unit_rows(snap: dict) -> list[dict]:
    """A snapshot's unit columns as one dict a unit (its sparse columns filled in)."""
    table = snap["units"]
    n = len(table["unit_id"])
    dense = {k: v for k, v in table.items() if k not in ("params", "failed_by")}
    rows = [{k: col[i] for k, col in dense.items()} for i in range(n)]
    for name in ("params", "failed_by"):
        at = dict(zip(*table[name], strict=True))
        for i, row in enumerate(rows):
            row[name] = at.get(i)
    return rows


_SECONDS = ("lease_timeout_s", "deadline_slack", "worker_backoff_s", "worker_backoff_max_s")
_OPTIONAL = ("heartbeat_interval_s", "restore_grace_s", "alive_window_s", "quarantine_s",
             "forget_workers_s")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", _SECONDS + _OPTIONAL + ("speed_smoothing",))
def test_every_float_setting_must_be_finite(name: str, bad: float) -> None:
    # Found by a probe: worker_backoff_s = inf and deadline_slack = inf were taken (inf passed the
    # '> 0' checks): every back-off was the cap, and a lease's deadline inf, or NaN at 0 s a step.
    if bad == float("inf") and name in ("quarantine_s", "forget_workers_s"):
        assert getattr(LedgerConfig(**{name: bad}), name) is None     # inf: never, as None says
        return
    with pytest.raises(ConfigError, match=rf"^{name} must be .*got -?(nan|inf)$"):
        LedgerConfig(**{name: bad})


def test_run_toml_names_a_non_finite_ledger_setting() -> None:
    from vcasync.coordinator import CoordinatorConfig
    from vcasync.runconfig import dataclass_from_table

    for key in ("worker_backoff_s", "deadline_slack", "worker_backoff_max_s", "heartbeat_interval_s",
                "forget_workers_s"):
        with pytest.raises(ConfigError, match=rf"{key} must be a finite number > 0"):
            dataclass_from_table(CoordinatorConfig, {key: float("nan")}, "coordinator")
        if key != "forget_workers_s":
            with pytest.raises(ConfigError, match=rf"{key} must be a finite number > 0"):
                dataclass_from_table(CoordinatorConfig, {key: float("inf")}, "coordinator")
    cfg = dataclass_from_table(CoordinatorConfig, {"quarantine_s": float("inf")}, "coordinator")
    assert cfg.ledger_config().quarantine_s is None


def test_bad_config_and_units() -> None:
    with pytest.raises(ConfigError, match="max_attempts"):
        LedgerConfig(max_attempts=0)
    with pytest.raises(ConfigError, match="steps"):
        WorkUnit("u", steps=0)
    with pytest.raises(ConfigError, match="duplicate"):
        Ledger([WorkUnit("u"), WorkUnit("u")], clock=lambda: 0.0)
    with pytest.raises(ConfigError, match="unknown fields"):
        WorkUnit.from_dict({"unit_id": "u", "stepz": 3})


@pytest.mark.parametrize(("params", "message"), [
    ([1], r"^make_units: params must be a mapping of str keys .*, got list \[1\]$"),
    ({"x": {1: 2}}, r"^work unit 'e0-s0': params\.x has the key 1 of type int: keys must be strings$"),
    ({"x": [0, object()]}, r"^work unit 'e0-s0': params\.x\[1\] is of type object; params hold None, "),
    ({"x": 2**64}, r"^work unit 'e0-s0': params\.x = 18446744073709551616 does not fit in 64 bits$"),
    # found by a new-user probe: --unit-param lr=nan (or TOML nan/inf) reached the trainer
    ({"lr": float("nan")}, r"^work unit 'e0-s0': params\.lr = nan is not finite; params hold "),
    ({"sched": {"ends": [1.0, float("-inf")]}},
     r"^work unit 'e0-s0': params\.sched\.ends\[1\] = -inf is not finite"),
    # a lone surrogate (from JSON, say) is no UTF-8: a snapshot could not hold it
    ({"tag": "a\ud800"}, r"^work unit 'e0-s0': params\.tag is not valid UTF-8: it holds the lone "
                          r"surrogate \\ud800 at character 1$"),
    ({"\udcff": 1}, r"^work unit 'e0-s0': a key in params is not valid UTF-8"),
])
def test_unit_params_are_plain_data_checked_when_units_are_made(params: object, message: str) -> None:
    # Found by a tester: make_units(2, params=[1]) raised TypeError, and params {"x": {1: 2}} were
    # taken, then a Coordinator failed on them with TypeError "dict keys must be str" (a snapshot
    # cannot hold them, nor can the JSON a worker gets).
    with pytest.raises(ConfigError, match=message):
        make_units(2, params=params)  # type: ignore[arg-type]


def test_a_unit_id_with_a_lone_surrogate_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^work unit field 'unit_id' is not valid UTF-8"):
        WorkUnit("u-\ud800")


def test_plain_unit_params_are_taken_and_checked_on_every_way_in() -> None:
    params = {"lr": 0.1, "aug": ["flip", None], "cfg": {"k": [1, 2.5, True]}, "t": (1, 2)}
    assert make_units(1, params=params)[0].params == params
    with pytest.raises(ConfigError, match=r"^work unit 'u': params\.x has the key 1 of type int"):
        WorkUnit("u", params={"x": {1: 2}})
    with pytest.raises(ConfigError, match=r"^work unit 'u': params\.x is of type set"):
        WorkUnit.from_dict({"unit_id": "u", "params": {"x": {1}}})


def test_a_format_1_snapshot_restores_as_its_columns_do(clock) -> None:
    """Snapshots written as rows (before columns) are still read, to the same ledger."""
    led = make(clock, n=4, max_attempts=2, park_after_workers=1)
    a, b, c, d, e = (led.join(x) for x in "abcde")
    accept(led, a, led.lease(a, 0))                                  # closed
    accept(led, a, led.lease(a, 0), steps=4, partial=True)          # a remainder with params
    for w in (b, c):                                                 # it fails twice: parked
        led.release(w, led.lease(w, 1).lease_id, "trainer error")
    late = led.lease(d, 1)
    clock.advance(11)
    led.expire()                                                     # expired, requeued
    held = led.lease(e, 2)                                           # active
    accept(led, d, late)                                             # late result: e's superseded
    live = led.lease(e, 2)
    snap = led.snapshot()
    assert any(snap["units"]["params"][1])
    assert any(snap["units"]["failed_by"][1])
    states = set(snap["leases"]["state"])
    assert {"closed", "released", "superseded", "active"} <= states, states
    new = Ledger.restore(snap, config=led.config, clock=clock, secret=SECRET)
    old = Ledger.restore(as_rows(snap), config=led.config, clock=clock, secret=SECRET)
    for back in (new, old):
        assert back.counts() == led.counts()
        assert back.stats == led.stats
        assert back.parked() == led.parked()
        assert back.lease_state(held.lease_id) is LeaseState.SUPERSEDED
        assert back.heartbeat(e, live.lease_id, 1).lease_id == live.lease_id
        assert back.worker_health() == led.worker_health()
    assert unit_rows(new.snapshot()) == unit_rows(old.snapshot())
    with pytest.raises(ConfigError, match="format 3"):
        Ledger.restore({**snap, "format": 3}, config=led.config, clock=clock, secret=SECRET)
    broken = {**snap, "leases": {**snap["leases"], "state": snap["leases"]["state"][:-1]}}
    with pytest.raises(ConfigError, match="differ in length"):
        Ledger.restore(broken, config=led.config, clock=clock, secret=SECRET)
