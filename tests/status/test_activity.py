"""The status page's memory: a bounded event ring, the merge rate, the evaluation curve, and the
ledger's per-worker view (state, last seen, units done)."""

from __future__ import annotations

import pytest

from vcasync.coordinator._activity import MAX_SERIES, Activity
from vcasync.errors import FrameError, LimitExceededError
from vcasync.ledger import Ledger, LedgerConfig
from vcasync.ledger._units import make_units


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_event_ring_is_bounded_newest_first_and_totals_count_everything() -> None:
    act = Activity(max_events=5, clock=Clock())
    for i in range(20):
        act.note("join", worker=f"w{i}")
    events = act.events()
    assert [e.worker for e in events] == ["w19", "w18", "w17", "w16", "w15"]
    assert act.totals["join"] == 20
    assert len(act.view(events=3)["events"]) == 3


def test_worker_words_become_one_bounded_printable_line() -> None:
    act = Activity(clock=Clock())
    act.note("released", worker="w\n1", detail="evil\r\nFAKE LOG LINE\x1b[31m" + "x" * 1000)
    (event,) = act.events()
    assert event.worker == "w?1"
    assert "\n" not in event.detail
    assert "\r" not in event.detail
    assert "\x1b" not in event.detail
    assert len(event.detail) == 200


def test_merge_rate_counts_the_last_window_only() -> None:
    clock = Clock(100.0)
    act = Activity(rate_window_s=10.0, clock=clock)
    for _ in range(10):
        clock.now += 1.0
        act.merged()
    assert act.merges_per_s() == pytest.approx(1.0)
    clock.now += 5.0                      # five of the ten are older than the window now
    assert act.merges_per_s() == pytest.approx(0.5)
    clock.now += 60.0
    assert act.merges_per_s() == 0.0


def test_a_young_run_is_rated_over_its_age_not_the_whole_window() -> None:
    clock = Clock(0.0)
    act = Activity(rate_window_s=10.0, clock=clock)
    clock.now = 2.0
    act.merged()
    act.merged()
    assert act.merges_per_s() == pytest.approx(1.0)


def test_curves_keep_their_span_within_the_bound() -> None:
    clock = Clock()
    act = Activity(max_points=4, clock=clock)
    for v in range(10):
        clock.now = float(v)
        act.record_eval(v, {"accuracy": v / 10, "loss": 1 - v / 10})
    acc = act.curves()["accuracy"]
    assert len(acc) <= 4
    assert acc[0][1] == 0
    assert acc[-1][1] == 9
    assert [p[1] for p in acc] == sorted(p[1] for p in acc)


@pytest.mark.parametrize(("version", "values", "field"), [
    (-1, {"accuracy": 0.5}, "version"),
    (True, {"accuracy": 0.5}, "version"),
    (1, {}, "values"),
    (1, {"accuracy": float("nan")}, "values"),
    (1, {"accuracy": "0.5"}, "values"),
    (1, {"<script>": 0.5}, "values"),
    (1, {"x" * 33: 0.5}, "values"),
])
def test_bad_evaluations_are_refused_and_change_nothing(version: int, values: dict[str, object],
                                                        field: str) -> None:
    act = Activity(clock=Clock())
    act.record_eval(0, {"accuracy": 0.1})
    with pytest.raises(FrameError) as err:
        act.record_eval(version, values)  # type: ignore[arg-type]
    assert err.value.field == field
    assert act.curves() == {"accuracy": [(0.0, 0, 0.1)]}


def test_the_number_of_curves_is_bounded() -> None:
    act = Activity(clock=Clock())
    act.record_eval(0, {f"m{i}": 0.0 for i in range(MAX_SERIES)})
    act.record_eval(1, {"m0": 1.0})                 # an existing name is fine
    with pytest.raises(LimitExceededError):
        act.record_eval(2, {"m0": 2.0, "one_too_many": 0.0})
    assert len(act.curves()) == MAX_SERIES
    assert len(act.curves()["m0"]) == 2             # all or nothing: m0 did not get the point


def _ledger(clock: Clock, **cfg: object) -> Ledger:
    return Ledger(make_units(6, steps=4), config=LedgerConfig(lease_timeout_s=10.0, **cfg),  # type: ignore[arg-type]
                  clock=clock, secret=b"s" * 32)


def _states(led: Ledger) -> dict[str, str]:
    return {row["name"]: row["state"] for row in led.worker_rows()[1]}


def test_worker_rows_show_state_last_seen_and_units_done() -> None:
    clock = Clock(1000.0)
    led = _ledger(clock, quarantine_after=2, worker_backoff_s=5.0)
    good, spot, flaky, _idle = (led.join(n) for n in ("good", "spot", "flaky", "idle"))
    g = led.lease(good, 0)
    led.check_result(good, g.lease_id)
    led.record(g.lease_id, unit_id=g.unit.unit_id, worker_id=good, status="accepted", version=1,
               steps_done=4)
    led.release(spot, led.lease(spot, 0).lease_id, "SIGTERM", failed=False)
    led.release(flaky, led.lease(flaky, 0).lease_id, "trainer crashed")
    assert _states(led) == {"good": "alive", "spot": "preempted", "flaky": "backed_off", "idle": "alive"}
    clock.now += 6.0                                    # flaky's back-off is over: one more failure
    led.release(flaky, led.lease(flaky, 0).lease_id, "trainer crashed")
    assert _states(led)["flaky"] == "quarantined"
    clock.now += 30.0                                   # past the alive window (2 x lease timeout)
    led.lease(good, 1)                                  # good is heard from again
    counts, rows = led.worker_rows()
    assert rows[0]["name"] == "good"
    assert rows[0]["last_seen_s"] == 0.0
    assert {r["name"]: r["done"] for r in rows} == {"good": 1, "spot": 0, "flaky": 0, "idle": 0}
    assert counts == {"alive": 1, "preempted": 1, "backed_off": 0, "quarantined": 1, "left": 0,
                      "gone": 1}
    led.lease(spot, 1)                                  # a preempted worker back at work
    assert _states(led)["spot"] == "alive"
    assert len(led.worker_rows(limit=2)[1]) == 2
    assert sum(led.worker_rows(limit=2)[0].values()) == 4    # counts cover every worker


def test_a_worker_that_left_is_not_alive_until_heard_and_a_restart_keeps_it_so() -> None:
    clock = Clock(1000.0)
    led = _ledger(clock, worker_backoff_s=5.0)
    idle, flaky, spot = (led.join(n) for n in ("idle", "flaky", "spot"))
    led.release(flaky, led.lease(flaky, 0).lease_id, "trainer crashed")      # backed off
    grant = led.lease(spot, 0)
    led.heartbeat(spot, grant.lease_id, 1, stopping=True)                   # keeps its lease
    assert led.workers_alive() == 2
    assert [led.leave(w) for w in (idle, flaky, spot)] == [True, True, True]
    assert not led.leave(idle)                                               # twice: the same
    assert led.workers_alive() == 0
    assert (led.workers_left(), led.stats["left"]) == (3, 3)
    assert _states(led) == {"idle": "left", "flaky": "left", "spot": "preempted"}
    assert led.lease_state(grant.lease_id) is not None
    assert led.counts()["leased"] == 1                                       # leases untouched
    back = Ledger.restore(led.snapshot(), config=led.config, clock=clock, secret=b"s" * 32)
    assert back.workers_alive() == 0
    # preempted is kept too (it was not until 2026-12-07: "left" after a restart)
    assert _states(back) == {"idle": "left", "flaky": "left", "spot": "preempted"}
    back.lease(idle, 0)                                                      # heard again: alive
    assert _states(back)["idle"] == "alive"
    assert (back.workers_alive(), back.workers_left()) == (1, 2)
    # a snapshot from before the column: nobody had left
    old = led.snapshot()
    del old["workers"]["left"]
    del old["workers"]["preempted"]
    before = Ledger.restore(old, config=led.config, clock=clock, secret=b"s" * 32)
    assert before.workers_left() == 0
    assert "preempted" not in _states(before).values()


def test_units_done_per_worker_survive_a_snapshot_restore() -> None:
    clock = Clock(1000.0)
    led = _ledger(clock)
    w = led.join("a")
    for version in (1, 2):
        g = led.lease(w, 0)
        led.check_result(w, g.lease_id)
        led.record(g.lease_id, unit_id=g.unit.unit_id, worker_id=w, status="accepted",
                   version=version, steps_done=4)
    again = Ledger.restore(led.snapshot(), config=led.config, clock=clock, secret=b"s" * 32)
    assert again.worker_rows()[1][0]["done"] == 2
