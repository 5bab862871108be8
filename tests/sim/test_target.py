"""Cost to target: billing minimums, the coordinator, lost seconds, moving prices, misses counted.

Before this module the headline saving was ``1 - spot/on-demand`` of the same worker-seconds: the price
ratio, whatever the run did. Each test here shows a figure that must move with the run.
"""

from __future__ import annotations

import math

import pytest

from vcasync.costing.market import SpotTrace, SpotWalk
from vcasync.costing.prices import InstancePrice
from vcasync.costing.spread import spread, t_975
from vcasync.costing.target import (
    Comparison,
    Span,
    Target,
    async_cost,
    billed_usd,
    ddp_cost,
    summarize_savings,
    time_to_target,
)
from vcasync.errors import ConfigError

WORKER = InstancePrice("x", "w", "r", 8, 32.0, on_demand_per_h=3.6, spot_per_h=0.36, source="test",
                       as_of="2026-01", min_billed_s=60.0)
COORD = InstancePrice("x", "c", "r", 2, 8.0, on_demand_per_h=0.36, spot_per_h=0.1, source="test",
                      as_of="2026-01", min_billed_s=60.0)


def test_targets_are_the_baseline_minus_the_stated_tolerance() -> None:
    acc = Target.from_baseline("accuracy", 0.95)
    assert acc.value == pytest.approx(0.945)
    assert acc.reached(0.945)
    assert not acc.reached(0.9449)
    loss = Target.from_baseline("loss", 2.0)
    assert loss.value == pytest.approx(2.02)
    assert loss.reached(2.02)
    assert not loss.reached(2.03)
    assert not loss.reached(math.nan)
    with pytest.raises(ConfigError, match="metric"):
        Target.from_baseline("f1", 0.9)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="finite"):
        Target.from_baseline("loss", math.inf)


def test_time_to_target_is_the_first_point_that_reaches_it() -> None:
    t = Target.from_baseline("accuracy", 0.9)
    assert time_to_target([(30.0, 0.5), (10.0, 0.3), (50.0, 0.9), (70.0, 0.7)], t) == 50.0
    assert time_to_target([(10.0, 0.3)], t) is None


def test_billing_is_per_second_after_the_minimum() -> None:
    # 10 s is billed as 60 s; 600 s as 600 s
    assert billed_usd(Span(0, 10), WORKER, spot=False) == pytest.approx(60 / 3600 * 3.6)
    assert billed_usd(Span(0, 600), WORKER, spot=True) == pytest.approx(600 / 3600 * 0.36)
    assert billed_usd(Span(5, 5), WORKER, spot=True) == 0.0
    with pytest.raises(ConfigError):
        Span(10, 5)


def test_every_restart_pays_its_own_minimum_and_sessions_are_cut_at_the_target() -> None:
    # one machine preempted twice: three sessions of 20 s each are three minima, not 60 s
    sessions = [Span(0, 20), Span(30, 50), Span(60, 80), Span(500, 900)]
    cost = async_cost(sessions, 100.0, worker=WORKER, coordinator=COORD)
    assert cost.sessions == 3  # the session that began after the target is not billed
    assert cost.billed_seconds == pytest.approx(180.0)
    workers = 3 * 60 / 3600 * 0.36
    coordinator = 100 / 3600 * 0.36  # on demand, from the start to the target
    assert cost.coordinator_usd == pytest.approx(coordinator)
    assert cost.usd == pytest.approx(workers + coordinator)


def test_a_slower_fleet_costs_more_so_the_saving_is_not_the_price_ratio() -> None:
    ddp = ddp_cost(4, 100.0, price=WORKER)
    assert ddp.usd == pytest.approx(4 * 100 / 3600 * 3.6)
    t = Target.from_baseline("accuracy", 0.9)
    fast = Comparison(0, t, async_cost([Span(0, 100)] * 4, 100.0, worker=WORKER, coordinator=COORD), ddp)
    slow = Comparison(1, t, async_cost([Span(0, 400)] * 4, 400.0, worker=WORKER, coordinator=COORD),
                      ddp_cost(4, 100.0, price=WORKER))
    price_ratio = 1 - WORKER.spot_per_h / WORKER.on_demand_per_h
    assert fast.saving is not None
    assert slow.saving is not None
    assert fast.saving < price_ratio  # the coordinator is paid for
    assert slow.saving < fast.saving - 0.2
    assert slow.time_ratio == pytest.approx(4.0)


def test_a_run_that_never_reaches_the_target_is_a_counted_miss() -> None:
    t = Target.from_baseline("accuracy", 0.9)
    ddp = ddp_cost(2, 50.0, price=WORKER)
    missed = async_cost([Span(0, 300), Span(0, 300)], None, worker=WORKER, coordinator=COORD, end_s=300.0)
    assert missed.usd is None
    assert not missed.reached
    assert missed.machine_seconds == pytest.approx(600.0)  # what was spent for nothing is still shown
    ok = async_cost([Span(0, 60), Span(0, 60)], 60.0, worker=WORKER, coordinator=COORD)
    runs = [Comparison(0, t, ok, ddp), Comparison(1, t, missed, ddp), Comparison(2, t, ok, ddp)]
    summary = summarize_savings(runs)
    assert summary["runs"] == 3
    assert summary["targets_missed"] == 1
    assert summary["complete"] is False
    assert summary["seeds"] == [0, 1, 2]
    assert len(summary["savings"]) == 2  # type: ignore[arg-type]


def test_spread_is_a_student_t_interval_and_counts_missing_values() -> None:
    s = spread([0.7, 0.8, 0.9, None], miss="high")
    assert s.mean == pytest.approx(0.8)
    half = t_975(2) * 0.1 / math.sqrt(3)
    assert s.ci_low == pytest.approx(0.8 - half)
    assert s.ci_high is None  # the miss lies above: that end is unbounded (tests/costing/test_spread.py)
    assert spread([0.7, 0.8, 0.9]).ci_high == pytest.approx(0.8 + half)
    assert s.missing == 1
    assert not s.complete
    one = spread([0.5])
    assert one.mean == 0.5
    assert one.ci_low is None  # one seed has no interval
    assert spread([]).mean is None
    assert t_975(1000) == pytest.approx(1.9623, abs=1e-4)   # Student's t, not the normal's 1.96
    with pytest.raises(ValueError, match="finite"):
        spread([math.nan])


def test_a_moving_spot_price_is_integrated_over_the_billed_time() -> None:
    trace = SpotTrace((0.0, 100.0), (0.36, 0.72))
    # 50 s at 0.36 then 50 s at 0.72
    assert billed_usd(Span(50, 150), WORKER, spot=True, path=trace) == pytest.approx(
        (50 * 0.36 + 50 * 0.72) / 3600)
    parsed = SpotTrace.parse("t_s,spot_per_h\n0,0.1\n60,0.2\n")
    assert parsed.rates == (0.1, 0.2)
    with pytest.raises(ConfigError, match="increase"):
        SpotTrace.parse("t_s,spot_per_h\n60,0.1\n0,0.2\n")
    with pytest.raises(ConfigError, match="header"):
        SpotTrace.parse("time,price\n0,1\n")
    walk = SpotWalk(seed=1, step_s=10.0, sigma=0.2)
    flat = billed_usd(Span(0, 100), WORKER, spot=True)
    moved = billed_usd(Span(0, 100), WORKER, spot=True, path=walk)
    assert moved != pytest.approx(flat)
    assert SpotWalk(seed=1, step_s=10.0, sigma=0.2).usd(0.36, 0, 100) == pytest.approx(moved)
    assert SpotWalk(sigma=0.0).usd(0.36, 0, 7200) == pytest.approx(0.72)


def test_a_fleet_that_did_not_hold_the_target_is_named_and_one_that_never_reached_it_is_not() -> None:
    from vcasync.costing.target import fleet_problem

    assert fleet_problem([0.1, 0.5, 0.46], 0.5, "accuracy") is None        # 4 points short: noise
    why = fleet_problem([0.1, 0.5, 0.44], 0.5, "accuracy")
    assert why is not None
    assert "ended at 0.44, more than 5 points worse" in why
    assert fleet_problem([0.1, 0.4, 0.1], 0.5, "accuracy") is None         # a miss, counted apart
    assert fleet_problem([3.0, 1.0, 1.04], 1.0, "loss") is None
    assert fleet_problem([3.0, 1.0, 1.06], 1.0, "loss") is not None
    assert fleet_problem([3.0, 1.0, math.nan], 1.0, "loss") is not None    # diverged after it


def test_a_baseline_of_too_few_steps_is_named_before_the_other_rules() -> None:
    from vcasync.costing.target import MIN_BASELINE_STEPS, baseline_problem

    curve = [0.06, 0.3, 0.5]
    assert baseline_problem(curve, "accuracy") is None                  # steps not given: not judged
    assert baseline_problem(curve, "accuracy", steps=MIN_BASELINE_STEPS) is None
    why = baseline_problem(curve, "accuracy", steps=MIN_BASELINE_STEPS - 1, fewer_steps="--x")
    assert why is not None
    assert f"only {MIN_BASELINE_STEPS - 1} optimiser step(s)" in why
    assert "ended at accuracy 0.5" in why
    assert "--x" in why
