"""The demo's report logic on hand-made runs: recoveries, costs and lost work are computed, not assumed.

No processes here: a :class:`DemoRun` is filled the way :func:`run_demo` fills it, so each check can
be shown to fail on a run where the fact it reports is false.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (vcasync[demo])")

from vcasync.costing.prices import PriceTable
from vcasync.demo.ddp import DdpConfig, DdpResult
from vcasync.demo.procs import Proc, Slot, Timeline, TimelineEvent
from vcasync.demo.report import build_report
from vcasync.demo.run import DemoConfig, DemoRun
from vcasync.errors import ConfigError

T0_WALL = 1_000_000.0


def _slot(index: int, sessions: list[tuple[float, float]], pids: list[int], tmp: Path) -> Slot:
    s = Slot(index, Proc(f"w{index}", [], env={}, log_path=tmp / f"w{index}.log"))
    s.sessions, s.pids, s.starts, s.state = list(sessions), list(pids), len(sessions), "done"
    return s


def _run(tmp: Path, events: list[TimelineEvent], slots: list[Slot], *, finished: bool = True,
         trainer: dict[int, list[dict[str, Any]]] | None = None) -> DemoRun:
    (tmp / "events").mkdir(exist_ok=True)
    for pid, evs in (trainer or {}).items():
        lines = [json.dumps({"t": T0_WALL + e["t_s"], "pid": pid, "root": e["unit"].split("~")[0], **{
            k: v for k, v in e.items() if k != "t_s"}}) for e in evs]
        (tmp / "events" / f"{pid}.jsonl").write_text("\n".join(lines) + "\n")
    cfg = DemoConfig(workers=len(slots), run_dir=tmp, progress=False)
    tl = Timeline(t0=0.0, events=list(events))
    run = DemoRun(cfg, tmp, tl, slots, total_units=4, unit_steps=5, finished=finished)
    run.accuracy = [(1.0, 4, 4, 0.9, 0.3)]
    return run


def _ev(t: float, who: str, kind: str, detail: str = "") -> TimelineEvent:
    return TimelineEvent(t, who, kind, detail)


def test_a_preemption_is_recovered_when_the_slot_returns_and_its_unit_is_finished(tmp_path: Path) -> None:
    slots = [_slot(0, [(1.0, 10.0), (12.0, 20.0)], [101, 102], tmp_path)]
    trainer = {101: [{"t_s": 8.0, "kind": "unit_start", "unit": "e0-s1"},
                     {"t_s": 9.0, "kind": "checkpoint", "unit": "e0-s1", "steps_done": 3}],
               102: [{"t_s": 13.0, "kind": "unit_start", "unit": "e0-s1"},
                     {"t_s": 14.0, "kind": "unit_end", "unit": "e0-s1", "steps_done": 5}]}
    events = [_ev(1.0, "w0", "start"), _ev(9.5, "w0", "preempted", "SIGKILL"), _ev(10.0, "w0", "down"),
              _ev(12.0, "w0", "restart"), _ev(20.0, "w0", "done")]
    rep = build_report(_run(tmp_path, events, slots, trainer=trainer), None, T0_WALL)
    (p,) = rep["recovery"]["preemptions"]
    assert p["unit"] == "e0-s1"
    assert p["steps_done"] == 3
    assert p["recovered_at_s"] == 12.0
    assert p["unit_finished_at_s"] == pytest.approx(14.0)
    assert p["recovered"]
    assert rep["recovery"]["all_recovered"]
    assert rep["recovery"]["sigkill"] == 1
    assert rep["recovery"]["sigterm"] == 0
    # The kill cut 0.5 s of training after the last checkpoint.
    assert rep["work_lost"]["seconds_lost_to_kills"] == pytest.approx(0.5)
    assert rep["work_lost"]["units_interrupted_by_kill"] == 1


def test_a_unit_cut_and_never_finished_is_not_a_recovery(tmp_path: Path) -> None:
    slots = [_slot(0, [(1.0, 10.0), (12.0, 20.0)], [101, 102], tmp_path)]
    trainer = {101: [{"t_s": 8.0, "kind": "unit_start", "unit": "e0-s1"}]}
    events = [_ev(1.0, "w0", "start"), _ev(9.5, "w0", "preempted", "SIGTERM"), _ev(12.0, "w0", "restart")]
    rep = build_report(_run(tmp_path, events, slots, trainer=trainer), None, T0_WALL)
    assert rep["recovery"]["preemptions"][0]["unit_finished_at_s"] is None
    assert not rep["recovery"]["all_recovered"]


def test_a_slot_that_never_came_back_before_an_unfinished_end_is_not_a_recovery(tmp_path: Path) -> None:
    slots = [_slot(0, [(1.0, 10.0)], [101], tmp_path)]
    events = [_ev(1.0, "w0", "start"), _ev(9.5, "w0", "preempted", "SIGTERM")]
    rep = build_report(_run(tmp_path, events, slots, finished=False), None, T0_WALL)
    assert not rep["recovery"]["all_recovered"]
    rep = build_report(_run(tmp_path, events, slots, finished=True), None, T0_WALL)
    assert rep["recovery"]["all_recovered"]  # nothing was in progress and the run completed


def _ddp(workers: int, points: list[tuple[float, int, float, float]], samples: int = 2000) -> DdpResult:
    cfg = DdpConfig(workers=workers, workload="digits", batch_size=32, samples=samples, lr=0.1)
    return DdpResult(cfg, points, first_step_s=4.0, wall_s=points[-1][0] + 1, digests=["a"] * workers)


def test_cost_to_target_bills_sessions_to_the_target_against_ddp_on_demand(tmp_path: Path) -> None:
    slots = [_slot(0, [(0.0, 30.0), (40.0, 200.0)], [1, 2], tmp_path), _slot(1, [(0.0, 95.0)], [3], tmp_path)]
    run = _run(tmp_path, [], slots)
    run.accuracy = [(60.0, 3, 2, 0.5, 1.0), (150.0, 9, 4, 0.95, 0.2), (190.0, 12, 4, 0.96, 0.2)]
    run.versions = [(20.0, 0), (45.0, 1), (150.0, 9)]
    ddp = _ddp(2, [(5.0, 0, 0.1, 2.3), (50.0, 1000, 0.9, 0.3), (100.0, 2000, 0.95, 0.2)])
    rep = build_report(run, ddp, T0_WALL)
    price = PriceTable()[DemoConfig().instance]
    coord = PriceTable()[DemoConfig().coordinator_instance]
    c = rep["cost"]
    assert c["target"]["value"] == pytest.approx(0.945)  # DDP's final minus half a point
    assert rep["time_to_target_s"] == 150.0
    assert rep["ddp_time_to_target_s"] == 100.0
    assert rep["first_merge_s"] == 45.0
    # the fleet reached it with 4 units merged, DDP with all of its 2,000 samples
    per_unit = run.unit_steps * run.config.batch_size
    assert c["samples_to_target"] == {"async": 4 * per_unit, "ddp": 2000, "ratio": 4 * per_unit / 2000}
    # sessions cut at the target, each billed per second after a one-minute minimum: 60 + 110 + 95 s
    assert c["async"]["billed_seconds"] == pytest.approx(60 + 110 + 95)
    fleet = 265 * price.spot_per_h / 3600 + 150 * coord.on_demand_per_h / 3600
    assert c["async"]["usd"] == pytest.approx(fleet)
    ddp_usd = 2 * 100 * price.on_demand_per_h / 3600
    assert c["ddp"]["usd"] == pytest.approx(ddp_usd)
    assert rep["saving"] == pytest.approx(1 - fleet / ddp_usd)
    assert rep["saving"] != pytest.approx(1 - price.spot_per_h / price.on_demand_per_h)  # not the price ratio
    assert c["instance"]["source"]
    assert c["instance"]["as_of"]


def test_the_per_second_saving_bills_the_same_sessions_without_the_minimum(tmp_path: Path) -> None:
    # a short run: worker 0 restarted twice, every session shorter than the one-minute minimum
    slots = [_slot(0, [(0.0, 10.0), (15.0, 25.0), (30.0, 45.0)], [1, 2, 3], tmp_path),
             _slot(1, [(0.0, 45.0)], [4], tmp_path)]
    run = _run(tmp_path, [], slots)
    run.accuracy = [(20.0, 3, 2, 0.5, 1.0), (40.0, 9, 4, 0.95, 0.2)]
    ddp = _ddp(2, [(5.0, 0, 0.1, 2.3), (30.0, 2000, 0.95, 0.2)])
    c = build_report(run, ddp, T0_WALL)["cost"]
    price = PriceTable()[DemoConfig().instance]
    coord = PriceTable()[DemoConfig().coordinator_instance]
    assert price.min_billed_s == 60.0
    # with the minimum: 4 sessions x 60 s; per second: 10 + 10 + 10 + 40 s (cut at the target, 40 s)
    fleet_min = 4 * 60 * price.spot_per_h / 3600 + 60 * coord.on_demand_per_h / 3600
    fleet_s = 70 * price.spot_per_h / 3600 + 40 * coord.on_demand_per_h / 3600
    ddp_min, ddp_s = 2 * 60 * price.on_demand_per_h / 3600, 2 * 30 * price.on_demand_per_h / 3600
    assert c["saving"] == pytest.approx(1 - fleet_min / ddp_min)
    assert c["saving_per_second"] == pytest.approx(1 - fleet_s / ddp_s)
    assert c["saving_per_second"] != pytest.approx(c["saving"])


def test_a_fleet_that_never_reaches_the_target_reports_a_miss_not_a_saving(tmp_path: Path) -> None:
    slots = [_slot(0, [(0.0, 200.0)], [1], tmp_path)]
    run = _run(tmp_path, [], slots)
    run.accuracy = [(60.0, 3, 2, 0.5, 1.0), (190.0, 12, 4, 0.93, 0.2)]
    rep = build_report(run, _ddp(1, [(5.0, 0, 0.1, 2.3), (100.0, 2000, 0.95, 0.2)]), T0_WALL)
    assert rep["saving"] is None
    assert rep["time_to_target_s"] is None
    assert rep["cost"]["targets_missed"] == 1
    assert rep["cost"]["samples_to_target"] == {"async": None, "ddp": 2000, "ratio": None}
    assert rep["cost"]["async"]["machine_seconds"] == pytest.approx(200.0)  # spent, and shown


@pytest.mark.parametrize(("kw", "word"), [
    ({"workers": 0}, "workers"),
    ({"kill_coordinator": True, "durability": "none"}, "durab"),
    ({"durability": "sometimes"}, "durability"),
    ({"preemptions": -1}, "preemptions"),
    ({"lr": 0.0}, "lr"),
    ({"restart_delay_s": (5.0, 1.0)}, "restart delay"),
    ({"instance": "no-such-instance"}, "no-such-instance"),
    ({"workload": "imagenet"}, "unknown workload 'imagenet'"),
])
def test_bad_demo_config_names_the_problem(kw: dict[str, Any], word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        DemoConfig(**kw)


def test_learning_rates_default_to_the_square_root_rule() -> None:
    cfg = DemoConfig(workers=4)
    assert cfg.worker_lr == pytest.approx(0.1)
    assert cfg.baseline_lr == pytest.approx(0.1)
    assert DemoConfig(workers=4, lr=0.3, sync_lr=0.2).worker_lr == 0.3


def test_the_summary_shows_the_loss_a_loss_judged_workload_is_targeted_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tinylm's summary showed only accuracies beside a target in loss ("DDP's final minus 1 % of loss")
    from vcasync.demo.cli import _print_summary

    slots = [_slot(0, [(0.0, 200.0)], [1], tmp_path)]
    run = _run(tmp_path, [], slots)
    run.accuracy = [(60.0, 3, 2, 0.5, 1.0), (150.0, 9, 4, 0.95, 0.2)]
    rep = build_report(run, _ddp(1, [(5.0, 0, 0.1, 2.3), (100.0, 2000, 0.95, 0.25)]), T0_WALL)
    _print_summary(rep, [])
    out = capsys.readouterr().out
    assert "final test loss" not in out
    assert "(DDP's final minus 0.5 point(s))" in out
    rep["metric"] = "loss"
    rep["cost"]["target"]["tolerance"] = "1 % of loss"
    _print_summary(rep, [])
    out = capsys.readouterr().out
    assert f"final test loss         {rep['final_loss']:.3f}" in out
    assert f"samples: {rep['ddp_loss']:.3f})" in out
    assert "(DDP's final loss plus 1 % of loss)" in out


def test_a_fleet_that_merged_nothing_says_so_not_that_it_missed_the_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `demo --max-wall 4` printed "first merged result  never (target missed)" for a fleet that
    # merged no result at all
    from vcasync.demo.cli import _print_summary

    run = _run(tmp_path, [], [_slot(0, [(0.0, 4.0)], [1], tmp_path)], finished=False)
    run.accuracy = [(1.0, 0, 0, 0.1, 2.3)]
    run.versions = [(1.0, 0)]
    rep = build_report(run, _ddp(1, [(5.0, 0, 0.1, 2.3), (100.0, 2000, 0.95, 0.25)]), T0_WALL)
    assert rep["first_merge_s"] is None
    _print_summary(rep, [])
    line = next(x for x in capsys.readouterr().out.splitlines() if "first merged result" in x)
    assert "none: no result was merged" in line
    assert "target" not in line


def test_the_summary_says_how_many_seeds_reached(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # every printed saving says "n of m seeds reached" (vcasync.costing.spread's rule), here m = 1
    from vcasync.demo.cli import _print_summary

    slots = [_slot(0, [(0.0, 200.0)], [1], tmp_path)]
    run = _run(tmp_path, [], slots)
    ddp = _ddp(1, [(5.0, 0, 0.1, 2.3), (100.0, 2000, 0.95, 0.25)])
    run.accuracy = [(60.0, 3, 2, 0.5, 1.0), (150.0, 9, 4, 0.95, 0.2)]
    rep = build_report(run, ddp, T0_WALL)
    assert rep["cost"]["reached"] == "1 of 1 seed reached"
    _print_summary(rep, [])
    assert "% (1 of 1 seed reached; one seed: no interval" in capsys.readouterr().out
    run.accuracy = [(60.0, 3, 2, 0.5, 1.0), (150.0, 9, 4, 0.90, 0.2)]
    rep = build_report(run, ddp, T0_WALL)
    _print_summary(rep, [])
    out = capsys.readouterr().out
    assert "n/a: the fleet never reached the target (0 of 1 seed reached)" in out
    # no cost to target, so no part of it is the coordinator's (it said "n/a (of which coordinator $...)")
    cost = next(x for x in out.splitlines() if "cost to target" in x)
    assert "fleet on spot n/a vs DDP on demand $" in cost
    assert "of which" not in cost


def test_seconds_lost_are_split_at_the_fleets_time_to_target(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # The probe's --quick run: target at 13.2 s, both restarts after it (14.5 and 15.5 s, after all
    # work was done). The summary said "12.0 s restarting (billed, in the cost above)"; none of it
    # was in the cost to target, and the sessions restarted after the work had never restarted any.
    from vcasync.demo.cli import _print_summary

    slots = [_slot(0, [(1.0, 12.0), (14.5, 16.5)], [1, 2], tmp_path),
             _slot(1, [(1.0, 13.0), (15.5, 17.0)], [3, 4], tmp_path)]
    trainer = {1: [{"t_s": 5.0, "kind": "unit_start", "unit": "e0-s0"},
                   {"t_s": 9.0, "kind": "unit_end", "unit": "e0-s0", "steps_done": 5}],
               3: [{"t_s": 5.0, "kind": "unit_start", "unit": "e0-s1"},
                   {"t_s": 10.0, "kind": "unit_end", "unit": "e0-s1", "steps_done": 5}]}
    events = [_ev(11.5, "w0", "preempted", "SIGTERM"), _ev(12.5, "w1", "preempted", "SIGTERM")]
    run = _run(tmp_path, events, slots, trainer=trainer)
    run.accuracy = [(6.0, 1, 1, 0.5, 1.0), (13.2, 4, 4, 0.95, 0.2)]
    rep = build_report(run, _ddp(2, [(5.0, 0, 0.1, 2.3), (8.0, 2000, 0.95, 0.2)]), T0_WALL)
    lost = rep["work_lost"]
    assert lost["time_to_target_s"] == pytest.approx(13.2)
    assert lost["before_target"] == {"seconds_lost_to_kills": 0.0, "seconds_restarting": 0.0,
                                     "seconds_restarted_after_work_done": 0.0, "in_cost_to_target": True}
    assert lost["after_target"]["seconds_restarted_after_work_done"] == pytest.approx(2.0 + 1.5)
    assert lost["after_target"]["seconds_restarting"] == 0.0
    assert lost["seconds_restarting"] == 0.0      # was 3.5: the whole of both idle sessions
    assert lost["sessions_after_work_done"] == 2
    assert rep["cost"]["async"]["lost_s"] == 0.0  # nothing lost is inside the cost to target
    _print_summary(rep, [])
    out = capsys.readouterr().out
    assert ("seconds lost to target  0.0 s of training cut by SIGKILL, 0.0 s booting restarted workers "
            "(billed, in the "
            "cost to target)") in out
    assert ("seconds lost after it   0.0 s of training cut by SIGKILL, 0.0 s booting restarted workers, "
            "3.5 s in sessions "
            "restarted after all work was done (billed to the run, not in the cost to target)") in out
    assert "in the cost above" not in out


def test_a_restart_and_a_kill_across_the_target_are_split_at_it(tmp_path: Path) -> None:
    slots = [_slot(0, [(1.0, 6.0), (7.0, 30.0)], [1, 2], tmp_path), _slot(1, [(1.0, 30.0)], [3], tmp_path)]
    trainer = {1: [{"t_s": 3.0, "kind": "unit_start", "unit": "e0-s0"}],
               2: [{"t_s": 11.0, "kind": "unit_start", "unit": "e0-s0"},
                   {"t_s": 13.0, "kind": "unit_end", "unit": "e0-s0", "steps_done": 5}],
               3: [{"t_s": 3.0, "kind": "unit_start", "unit": "e0-s1"},
                   {"t_s": 4.0, "kind": "unit_end", "unit": "e0-s1", "steps_done": 5},
                   {"t_s": 18.0, "kind": "unit_start", "unit": "e1-s1"}]}
    events = [_ev(6.0, "w0", "preempted", "SIGKILL"), _ev(7.0, "w0", "restart"),
              _ev(20.0, "w1", "preempted", "SIGKILL")]
    run = _run(tmp_path, events, slots, trainer=trainer)
    run.accuracy = [(5.0, 1, 1, 0.5, 1.0), (9.0, 4, 4, 0.95, 0.2)]
    rep = build_report(run, _ddp(2, [(5.0, 0, 0.1, 2.3), (8.0, 2000, 0.95, 0.2)]), T0_WALL)
    lost = rep["work_lost"]
    # kills: w0 at 6 s cut 3 s of its unit (3..6, before the 9-s target); w1 at 20 s cut 2 s (after)
    assert lost["before_target"]["seconds_lost_to_kills"] == pytest.approx(3.0)
    assert lost["after_target"]["seconds_lost_to_kills"] == pytest.approx(2.0)
    # w0's restart booted from 7 s to its first unit at 11 s: 2 s before the target, 2 s after
    assert lost["before_target"]["seconds_restarting"] == pytest.approx(2.0)
    assert lost["after_target"]["seconds_restarting"] == pytest.approx(2.0)
    assert rep["cost"]["async"]["lost_s"] == pytest.approx(5.0)
    run.accuracy = [(5.0, 1, 1, 0.5, 1.0)]        # never reached: no split, all of it billed to the run
    rep = build_report(run, _ddp(2, [(5.0, 0, 0.1, 2.3), (8.0, 2000, 0.95, 0.2)]), T0_WALL)
    assert rep["work_lost"]["before_target"] is None
    assert rep["work_lost"]["seconds_lost_to_kills"] == pytest.approx(5.0)
    assert "never reached the target" in rep["work_lost"]["split"]


def test_the_report_says_how_many_preemptions_were_asked_fired_and_cut_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Two --quick runs asked for 4 and fired 2, both with no unit in progress, after all units were
    # merged; the summary said "1 SIGTERM + 1 SIGKILL, all recovered" and nothing of the other two.
    from vcasync.demo.cli import _print_summary

    slots = [_slot(0, [(1.0, 10.0), (12.0, 20.0)], [101, 102], tmp_path),
             _slot(1, [(1.0, 11.0), (13.0, 20.0)], [103, 104], tmp_path)]
    trainer = {101: [{"t_s": 8.0, "kind": "unit_start", "unit": "e0-s1"}],
               102: [{"t_s": 13.0, "kind": "unit_start", "unit": "e0-s1"},
                     {"t_s": 14.0, "kind": "unit_end", "unit": "e0-s1", "steps_done": 5}],
               103: [{"t_s": 8.0, "kind": "unit_start", "unit": "e0-s0"},
                     {"t_s": 9.0, "kind": "unit_end", "unit": "e0-s0", "steps_done": 5}]}
    events = [_ev(9.5, "w0", "preempted", "SIGKILL"), _ev(10.5, "w1", "preempted", "SIGTERM"),
              _ev(12.0, "w0", "restart"), _ev(13.0, "w1", "restart")]
    run = _run(tmp_path, events, slots, trainer=trainer)
    run.market = {"asked": 4, "rate_per_min": None, "fired": 2, "in_unit_at_signal": 1, "not_fired": 2}
    rec = build_report(run, None, T0_WALL)["recovery"]
    assert (rec["asked"], rec["fired"], rec["cut_unit_in_progress"]) == (4, 2, 1)
    assert rec["fewer_than_asked"]
    assert rec["not_fired"] == 2
    assert rec["why_fewer"] == "the fleet finished its units before the other 2 found a worker inside a unit"
    rep = build_report(run, _ddp(2, [(5.0, 0, 0.1, 2.3), (8.0, 2000, 0.95, 0.2)]), T0_WALL)
    _print_summary(rep, [])
    assert ("preemptions             4 asked, only 2 fired (1 SIGTERM + 1 SIGKILL): the fleet finished "
            "its units before the other 2 found a worker inside a unit, 1 of 2 cut a unit part way, "
            "all recovered") in capsys.readouterr().out
    run.market = {"asked": 2, "fired": 2}
    rec = build_report(run, None, T0_WALL)["recovery"]
    assert not rec["fewer_than_asked"]
    assert rec["why_fewer"] is None
    run.timeline.events = []
    run.market = {"asked": 4, "fired": 0}
    rep = build_report(run, _ddp(2, [(5.0, 0, 0.1, 2.3), (8.0, 2000, 0.95, 0.2)]), T0_WALL)
    _print_summary(rep, [])
    # found by a probe: "before the other 4" when none fired
    assert "4 asked, only 0 fired (0 SIGTERM + 0 SIGKILL): the fleet finished its units before any of " \
           "the 4 found a worker inside a unit; nothing to recover" in capsys.readouterr().out


def _strict(text: str) -> Any:
    """JSON as a strict reader (jq, JavaScript) parses it: NaN and Infinity are not JSON."""
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not strict JSON")

    return json.loads(text, parse_constant=refuse)


def test_report_json_is_strict_json_with_a_diverged_loss_written_as_null_and_named(
        tmp_path: Path) -> None:
    # json.dumps' default wrote NaN/Infinity (a loss that diverged), which strict readers refuse
    from vcasync._json import strict_json
    from vcasync.demo.report import write_report

    slots = [_slot(0, [(0.0, 100.0)], [1], tmp_path)]
    run = _run(tmp_path, [], slots)
    run.accuracy = [(50.0, 2, 2, 0.5, 1.0), (100.0, 4, 4, 0.1, float("nan"))]
    rep = build_report(run, _ddp(1, [(5.0, 0, 0.1, 2.3), (90.0, 1000, 0.9, float("inf"))]), T0_WALL)
    write_report(rep, tmp_path)
    doc = _strict((tmp_path / "report.json").read_text())
    assert doc["final_loss"] is None
    assert doc["ddp_loss"] is None
    assert doc["accuracy"][1][4] is None
    assert doc["final_accuracy"] == 0.1                  # finite figures are kept
    fields = doc["non_finite"]["fields"]
    assert "final_loss (nan)" in fields
    assert "ddp_loss (inf)" in fields
    assert "accuracy[1][4] (nan)" in fields
    assert "not a finite number" in doc["non_finite"]["why"]
    # the --json headline goes through the same writer
    assert _strict(strict_json({"saving": float("-inf"), "cost": {"usd": 1.5}})) == {
        "saving": None, "cost": {"usd": 1.5}, "non_finite": {
            "fields": ["saving (-inf)"], "why": "not a finite number, so written as null"}}
    assert "non_finite" not in _strict(strict_json({"saving": 0.5}))


def test_workers_that_crashed_out_are_not_all_recovered_nor_restarted_after_the_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `demo --lr 1e6`: every loss NaN, nothing merged, both workers gave up after repeated crashes;
    # the trainer's unit_end events made each preemption "recovered" ("all recovered"), and the
    # restarted sessions after the last unit_end were "restarted after all work was done".
    from vcasync.demo.cli import _print_summary

    slots = [_slot(0, [(1.0, 10.0), (12.0, 14.0), (15.0, 16.0)], [101, 102, 103], tmp_path),
             _slot(1, [(1.0, 11.0), (13.0, 16.0)], [104, 105], tmp_path)]
    for s in slots:
        s.state = "failed"
    trainer = {101: [{"t_s": 8.0, "kind": "unit_start", "unit": "e0-s1"},
                     {"t_s": 9.0, "kind": "unit_end", "unit": "e0-s1", "steps_done": 5}],
               104: [{"t_s": 8.0, "kind": "unit_start", "unit": "e0-s0"},
                     {"t_s": 9.0, "kind": "unit_end", "unit": "e0-s0", "steps_done": 5}]}
    events = [_ev(9.5, "w0", "preempted", "SIGTERM"), _ev(12.0, "w0", "restart"),
              _ev(14.0, "w0", "crash", "exit 1"), _ev(15.0, "w0", "restart"),
              _ev(16.0, "w0", "crash", "exit 1"), _ev(11.0, "w1", "crash", "exit 1"),
              _ev(13.0, "w1", "restart"), _ev(16.0, "w1", "crash", "exit 1")]
    run = _run(tmp_path, events, slots, finished=False, trainer=trainer)
    run.market = {"asked": 1, "fired": 1}
    run.incomplete_reason = "every worker stopped after repeated crashes (4 crash(es) in all)"
    rep = build_report(run, _ddp(2, [(5.0, 0, 0.1, 2.3), (8.0, 2000, 0.95, 0.2)]), T0_WALL)
    rec = rep["recovery"]
    assert not rec["all_recovered"]
    assert (rec["crashes"], rec["workers_gave_up"]) == (4, 2)
    assert rep["work_lost"]["seconds_restarted_after_work_done"] == 0.0
    assert rep["work_lost"]["sessions_after_work_done"] == 0
    assert rep["incomplete_reason"] == run.incomplete_reason
    _print_summary(rep, [])
    out = capsys.readouterr().out
    assert "all recovered" not in out.replace("NOT all recovered", "")
    assert "NOT all recovered; 4 worker crash(es), 2 worker(s) gave up" in out
    assert "restarted after all work was done" not in out
    assert "incomplete              every worker stopped after repeated crashes" in out


def _stopped_at_limit(tmp_path: Path) -> DemoRun:
    # --max-wall 4: the limit fired at 4.2 s, the workers had stopped by 11.5 s, the run ended at 13 s
    run = _run(tmp_path, [_ev(4.2, "fleet", "max-wall")], [_slot(0, [(0.0, 11.5)], [1], tmp_path)],
               finished=False)
    run.slots[0].state = "stopped"
    run.limit_s, run.workers_stopped_s, run.wall_s, run.merged_after_limit = 4.2, 11.5, 13.0, 3
    run.versions = [(2.0, 1), (4.0, 4)]
    run.incomplete_reason = "the fleet did not finish within --max-wall 4 s"
    return run


def test_a_score_taken_after_the_limit_is_marked_and_kept_out_of_the_curve_and_the_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The coordinator could not be reached when the limit fired, and nothing had been scored: the
    # only score came after the workers were stopped, of v7 (three results merged after the limit),
    # and it was the curve, the "final test accuracy" of the fleet at the limit and its time to target.
    from vcasync.demo.cli import _print_summary

    run = _stopped_at_limit(tmp_path)
    run.accuracy = [(9.0, 7, 4, 0.96, 0.2)]
    rep = build_report(run, _ddp(1, [(5.0, 0, 0.1, 2.3), (50.0, 1000, 0.95, 0.2)]), T0_WALL)
    assert rep["accuracy"] == []
    assert rep["accuracy_after_limit"] == [[9.0, 7, 4, 0.96, 0.2]]
    assert rep["time_to_target_s"] is None
    assert rep["saving"] is None
    assert rep["final_accuracy"] == 0.96                 # said, and marked
    assert rep["final_scored_after_limit"] is True
    assert (rep["final_scored_at_s"], rep["final_version"]) == (9.0, 7)
    _print_summary(rep, [])
    out = capsys.readouterr().out
    assert "final test accuracy     0.960" in out
    assert "(scored after the limit, see below)" in out
    assert "scored after the limit  the final test figures are of v7, scored at 9.0 s" in out
    assert "kept out of the curve and the time to target" in out

    # a score at the limit (or before it) is the fleet's; a later one beside it changes nothing
    run.accuracy = [(3.0, 1, 1, 0.6, 1.2), (9.0, 7, 4, 0.96, 0.2)]
    rep = build_report(run, _ddp(1, [(5.0, 0, 0.1, 2.3), (50.0, 1000, 0.95, 0.2)]), T0_WALL)
    assert rep["accuracy"] == [[3.0, 1, 1, 0.6, 1.2]]
    assert rep["final_accuracy"] == 0.6
    assert rep["final_scored_after_limit"] is False
    _print_summary(rep, [])
    assert "after the limit" not in capsys.readouterr().out.split("stopped by --max-wall")[0]

    # nothing scored at all (the coordinator never answered a download): said, not a TypeError
    run.accuracy = []
    rep = build_report(run, _ddp(1, [(5.0, 0, 0.1, 2.3), (50.0, 1000, 0.95, 0.2)]), T0_WALL)
    assert rep["final_accuracy"] is None
    assert rep["final_scored_after_limit"] is False
    _print_summary(rep, [])
    assert "final test accuracy     n/a" in capsys.readouterr().out


def test_the_wall_time_of_a_fleet_stopped_at_the_limit_says_the_limit_and_the_stop_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # "wall time  13 s (fleet)" of a fleet stopped by --max-wall 4: the figure ran until its workers
    # had stopped and the run ended, and read as the time the fleet trained.
    from vcasync.demo.cli import _print_summary

    run = _stopped_at_limit(tmp_path)
    run.accuracy = [(3.0, 1, 1, 0.6, 1.2)]
    rep = build_report(run, _ddp(1, [(5.0, 0, 0.1, 2.3), (50.0, 1000, 0.95, 0.2)]), T0_WALL)
    assert rep["stopped_at_limit_s"] == 4.2
    assert rep["workers_stopped_s"] == 11.5
    _print_summary(rep, [])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("wall time   "))
    assert "4 s to the --max-wall limit (fleet, its workers stopped by 12 s; the run ended at 13 s)" in line
    assert "+ 51 s (DDP)" in line
    run = _run(tmp_path, [], [_slot(0, [(0.0, 20.0)], [1], tmp_path)])
    run.wall_s = 20.0
    rep = build_report(run, _ddp(1, [(5.0, 0, 0.1, 2.3), (50.0, 1000, 0.95, 0.2)]), T0_WALL)
    assert rep["workers_stopped_s"] is None
    _print_summary(rep, [])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("wall time   "))
    assert "20 s (fleet) + 51 s (DDP)" in line


def test_a_ddp_run_that_rose_and_fell_back_sets_no_target_and_prices_no_saving(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the simulator's 64-worker DDP rose to 84 %, fell to 12 % and ended at 55 %, and the fleet was
    # priced against a 54.5 % target; a real DDP run at the edge of stability gets the same refusal
    slots = [_slot(0, [(0.0, 200.0)], [1], tmp_path), _slot(1, [(0.0, 200.0)], [2], tmp_path)]
    run = _run(tmp_path, [], slots)
    run.accuracy = [(60.0, 3, 2, 0.5, 1.0), (150.0, 9, 4, 0.95, 0.2)]
    ddp = _ddp(2, [(5.0, 0, 0.1, 2.3), (50.0, 1000, 0.84, 0.5), (70.0, 1500, 0.12, 5.0),
                   (100.0, 2000, 0.55, 1.4)])
    rep = build_report(run, ddp, T0_WALL)
    c = rep["cost"]
    assert c["target"] is None
    assert rep["saving"] is None
    assert "fell back from its best accuracy 0.84 to 0.55" in c["target_withheld"]
    assert "--sync-lr" in c["target_withheld"]
    from vcasync.demo.cli import _print_summary

    _print_summary(rep, [])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("target"))
    assert "none, so no saving: the synchronous baseline fell back" in line
    never = _ddp(2, [(5.0, 0, 0.1, 2.3), (100.0, 2000, 0.12, 2.2)])     # it did not learn at all
    assert "did not learn" in build_report(run, never, T0_WALL)["cost"]["target_withheld"]
    held = _ddp(2, [(5.0, 0, 0.1, 2.3), (50.0, 1000, 0.96, 0.2), (100.0, 2000, 0.95, 0.2)])
    assert build_report(run, held, T0_WALL)["cost"]["target"]["value"] == pytest.approx(0.945)


def test_a_ddp_run_of_fewer_than_ten_steps_sets_no_target(tmp_path: Path) -> None:
    # the simulator has refused such a baseline since 2026-12-07 (MIN_BASELINE_STEPS); the demo
    # priced the fleet against one: `vcasync demo --workers 8 --epochs 1` gives DDP 5 steps of 256
    # digits, whose end is a point in its first climb, not a quality anyone trains to
    slots = [_slot(0, [(0.0, 200.0)], [1], tmp_path), _slot(1, [(0.0, 200.0)], [2], tmp_path)]
    run = _run(tmp_path, [], slots)
    run.accuracy = [(60.0, 3, 2, 0.5, 1.0), (150.0, 9, 4, 0.95, 0.2)]
    points = [(5.0, 0, 0.1, 2.3), (50.0, 160, 0.6, 1.0), (100.0, 320, 0.8, 0.6)]
    rep = build_report(run, _ddp(2, points, samples=320), T0_WALL)     # 5 steps of 2 x 32
    c = rep["cost"]
    assert c["target"] is None
    assert rep["saving"] is None
    why = c["target_withheld"]
    assert "took only 5 optimiser step(s) and ended at accuracy 0.8, fewer than the 10" in why
    assert "--epochs" in c["target_withheld"]
    ten = build_report(run, _ddp(2, points, samples=640), T0_WALL)     # 10 steps: judged as before
    assert ten["cost"]["target"]["value"] == pytest.approx(0.795)


def test_a_preemption_cuts_a_unit_only_when_it_stopped_or_killed_it_part_way(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A 4-worker run: 3 SIGTERM + 1 SIGKILL, each inside a unit. The summary said "4 of 4 cut a unit
    # in progress" while report.json gave steps_done 0 for all four (the steps at the last event
    # before the signal, a unit_start) and one unit ended 4 ms after its SIGTERM: it was not cut.
    from vcasync.demo.cli import _print_summary

    slots = [_slot(i, [(1.0, 10.0), (12.0, 30.0)], [100 + i, 200 + i], tmp_path) for i in range(4)]
    trainer: dict[int, list[dict[str, Any]]] = {
        100: [{"t_s": 5.0, "kind": "unit_start", "unit": "e0-s0", "start": 0},
              {"t_s": 8.004, "kind": "unit_end", "unit": "e0-s0", "steps_done": 5}],     # ended anyway
        101: [{"t_s": 5.0, "kind": "unit_start", "unit": "e0-s1", "start": 0},
              {"t_s": 8.3, "kind": "unit_stop", "unit": "e0-s1", "steps_done": 3}],      # stopped at 3
        102: [{"t_s": 5.0, "kind": "unit_start", "unit": "e0-s2", "start": 0},
              {"t_s": 6.0, "kind": "checkpoint", "unit": "e0-s2", "steps_done": 2},
              {"t_s": 8.1, "kind": "checkpoint", "unit": "e0-s2", "steps_done": 4},      # the step it was on
              {"t_s": 8.2, "kind": "unit_stop", "unit": "e0-s2", "steps_done": 4}],      # stopped at 4
        103: [{"t_s": 5.0, "kind": "unit_start", "unit": "e0-s3", "start": 1}],         # killed: keeps 1
    }
    for i, unit in enumerate(("e0-s0", "e0-s1", "e0-s2", "e0-s3")):
        trainer[200 + i] = [{"t_s": 13.0, "kind": "unit_start", "unit": unit},
                            {"t_s": 14.0, "kind": "unit_end", "unit": unit, "steps_done": 5}]
    events = [_ev(8.0, "w0", "preempted", "SIGTERM"), _ev(8.0, "w1", "preempted", "SIGTERM"),
              _ev(8.0, "w2", "preempted", "SIGTERM"), _ev(8.0, "w3", "preempted", "SIGKILL"),
              *(_ev(12.0, f"w{i}", "restart") for i in range(4))]
    run = _run(tmp_path, events, slots, trainer=trainer)
    run.market = {"asked": 4, "fired": 4}
    rep = build_report(run, _ddp(4, [(5.0, 0, 0.1, 2.3), (8.0, 2000, 0.95, 0.2)]), T0_WALL)
    rec = rep["recovery"]
    pairs = {p["worker"]: p for p in rec["preemptions"]}
    assert {w: (p["outcome"], p["steps_done"]) for w, p in pairs.items()} == {
        "w0": ("finished", 5), "w1": ("stopped", 3), "w2": ("stopped", 4), "w3": ("killed", 1)}
    assert pairs["w0"]["unit_finished_at_s"] == pytest.approx(8.004)
    assert (rec["in_unit_at_signal"], rec["cut_unit_in_progress"], rec["unit_finished_anyway"]) == (4, 3, 1)
    assert rec["cut_unit_in_progress"] == sum(1 for p in rec["preemptions"] if p["outcome"] in ("stopped",
                                                                                                "killed"))
    assert rec["all_recovered"]
    assert rep["work_lost"]["seconds_lost_to_kills"] == pytest.approx(3.0)   # w3: 5 s .. 8 s
    _print_summary(rep, [])
    assert ("4 asked, 4 fired (3 SIGTERM + 1 SIGKILL), 3 of 4 cut a unit part way (1 more landed as its "
            "unit was ending, which finished anyway), all recovered") in capsys.readouterr().out


def test_a_sigkill_that_lands_as_its_unit_ends_loses_no_training(tmp_path: Path) -> None:
    slots = [_slot(0, [(1.0, 10.0), (12.0, 20.0)], [101, 102], tmp_path)]
    trainer = {101: [{"t_s": 5.0, "kind": "unit_start", "unit": "e0-s1"},
                     {"t_s": 9.502, "kind": "unit_end", "unit": "e0-s1", "steps_done": 5}]}
    events = [_ev(9.5, "w0", "preempted", "SIGKILL"), _ev(12.0, "w0", "restart")]
    rep = build_report(_run(tmp_path, events, slots, trainer=trainer), None, T0_WALL)
    assert rep["recovery"]["preemptions"][0]["outcome"] == "finished"
    assert rep["recovery"]["cut_unit_in_progress"] == 0
    assert rep["work_lost"]["seconds_lost_to_kills"] == 0.0     # was 4.5 s: unit start to the kill
    assert rep["work_lost"]["units_interrupted_by_kill"] == 0


def test_the_timeline_legend_lists_only_the_marks_drawn(tmp_path: Path) -> None:
    # A run with no coordinator restart had "dotted: coordinator" in its legend, and no such line.
    from vcasync.demo.report import plot_timeline, timeline_legend

    slots = [_slot(0, [(1.0, 10.0), (12.0, 20.0)], [101, 102], tmp_path)]
    events = [_ev(1.0, "w0", "start"), _ev(9.5, "w0", "preempted", "SIGTERM"), _ev(12.0, "w0", "restart"),
              _ev(21.0, "coordinator", "stopped")]
    rep = build_report(_run(tmp_path, events, slots), None, T0_WALL)
    legend = timeline_legend(rep)
    assert legend == "wall seconds  (bars: worker up; v SIGTERM; ^ restart)"
    assert "coordinator" not in legend
    assert "SIGKILL" not in legend
    plot_timeline(rep, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 0
    events += [_ev(5.0, "w0", "preempted", "SIGKILL"), _ev(6.0, "coordinator", "killed"),
               _ev(8.0, "coordinator", "recovered")]
    rep = build_report(_run(tmp_path, events, slots), None, T0_WALL)
    assert timeline_legend(rep) == ("wall seconds  (bars: worker up; v SIGTERM; x SIGKILL; ^ restart; "
                                    "red dotted: coordinator killed; green dotted: coordinator back)")


def test_a_worker_killed_before_the_target_and_back_after_it_boots_after_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # w0 SIGKILLed at 16.5 s, restarted at 20.3 s, after the fleet's target at 19.85 s. Between the
    # kill and the restart no machine is up nor billed; the restarted session boots from 20.3 s to
    # its first unit at 24.3 s, all after the target. The summary said "0.0 s restarting" before the
    # target, read as if the gap from the kill to the restart had been put after it: it is no boot.
    from vcasync.demo.cli import _print_summary

    slots = [_slot(0, [(1.0, 16.5), (20.3, 40.0)], [1, 2], tmp_path), _slot(1, [(1.0, 40.0)], [3], tmp_path)]
    trainer = {1: [{"t_s": 12.0, "kind": "unit_start", "unit": "e0-s0", "start": 0},
                   {"t_s": 14.5, "kind": "checkpoint", "unit": "e0-s0", "steps_done": 2}],
               2: [{"t_s": 24.3, "kind": "unit_start", "unit": "e0-s0", "start": 2},
                   {"t_s": 26.0, "kind": "unit_end", "unit": "e0-s0", "steps_done": 5}],
               3: [{"t_s": 3.0, "kind": "unit_start", "unit": "e0-s1"},
                   {"t_s": 4.0, "kind": "unit_end", "unit": "e0-s1", "steps_done": 5}]}
    events = [_ev(16.5, "w0", "preempted", "SIGKILL"), _ev(20.3, "w0", "restart")]
    run = _run(tmp_path, events, slots, trainer=trainer)
    run.accuracy = [(5.0, 1, 1, 0.5, 1.0), (19.85, 4, 4, 0.95, 0.2)]
    rep = build_report(run, _ddp(2, [(5.0, 0, 0.1, 2.3), (8.0, 2000, 0.95, 0.2)]), T0_WALL)
    lost = rep["work_lost"]
    assert lost["time_to_target_s"] == pytest.approx(19.85)
    assert lost["before_target"]["seconds_lost_to_kills"] == pytest.approx(2.0)   # checkpoint 14.5 to 16.5
    assert lost["after_target"]["seconds_lost_to_kills"] == 0.0
    assert lost["before_target"]["seconds_restarting"] == 0.0
    assert lost["after_target"]["seconds_restarting"] == pytest.approx(4.0)       # 20.3 to 24.3
    _print_summary(rep, [])
    out = capsys.readouterr().out
    assert "2.0 s of training cut by SIGKILL, 0.0 s booting restarted workers (billed, in the cost" in out
    assert "0.0 s of training cut by SIGKILL, 4.0 s booting restarted workers (billed to the run" in out
