"""The JSON fields of ``vcasync simulate`` say what they measure (found by a QA probe)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vcasync.coordinator", reason="the simulator drives the real Coordinator")

from vcasync._json import strict_json
from vcasync.sim import FleetConfig, NoPreemption, PoissonPreemption, SimConfig, Simulation, summarize
from vcasync.sim.report import lost_seconds, render_text


def test_lost_time_and_the_baselines_hours_are_reported_as_what_they_are() -> None:
    # comparison.async.lost_s was 0.0 beside 17 preemptions and 1,216 samples lost (never passed);
    # cost_at_target.sync_hours was wall-clock hours beside worker_hours in machine-hours
    cfg = SimConfig(fleet=FleetConfig(workers=4), preemption=PoissonPreemption(1.0, hard_fraction=0.5),
                    epochs=2, seed=1, eval_points=10)
    out = Simulation(cfg).run()
    s = summarize(out)
    assert s["fleet"]["preemptions"] > 0
    assert s["work"]["lost_to_preemption"] > 0
    assert out.rec.lost_spans
    assert all(a <= b for a, b in out.rec.lost_spans)
    assert s["work"]["lost_to_preemption_s"] == pytest.approx(lost_seconds(out.rec.lost_spans, None))
    assert s["work"]["lost_to_preemption_s"] > 0
    cmp = s["comparison"]
    assert cmp is not None
    t_async = s["time_to_target_s"]
    assert cmp["async"]["lost_s"] == pytest.approx(lost_seconds(out.rec.lost_spans, t_async))
    assert 0 < cmp["async"]["lost_s"] <= cmp["async"]["machine_seconds"]
    assert out.sync is not None
    for costs in (s["cost_full_run"], s["cost_at_target"]):
        assert "sync_hours" not in costs
        if costs["sync_wall_hours"] is not None:
            assert costs["sync_machine_hours"] == pytest.approx(out.sync.workers * costs["sync_wall_hours"])
    assert s["cost_full_run"]["sync_wall_hours"] == pytest.approx(out.sync.duration_s / 3600)


def test_lost_seconds_counts_only_the_part_before_the_target() -> None:
    spans = [(0.0, 10.0), (20.0, 30.0)]
    assert lost_seconds(spans, None) == 20.0
    assert lost_seconds(spans, 25.0) == 15.0
    assert lost_seconds(spans, 5.0) == 5.0


def test_simulate_json_is_strict_json_a_non_finite_figure_null_and_named(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # simulate --json printed Python's NaN/Infinity, which strict readers (jq, JavaScript) refuse
    import argparse
    import json

    import vcasync.sim.report as report
    from vcasync.sim.cli import configure, run

    real = report.summarize

    def diverged(out: object) -> dict[str, object]:
        s = real(out)  # type: ignore[arg-type]
        s["final_loss"] = float("nan")
        return s

    monkeypatch.setattr(report, "summarize", diverged)
    p = argparse.ArgumentParser()
    configure(p)
    run(p.parse_args(["--epochs", "1", "--workers", "2", "--preemption-rate", "0", "--json"]))

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not strict JSON")

    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1], parse_constant=refuse)
    assert doc["final_loss"] is None
    assert doc["non_finite"]["fields"] == ["final_loss (nan)"]


def test_the_plot_says_its_figures_are_simulated(tmp_path: Path) -> None:
    # found by QA: `vcasync simulate --plot p.png` titled its panels "accuracy over time" and
    # "staleness", nothing saying the curves were simulated, where the text summary, the JSON and
    # bench.convergence's plot all say so ("Simulated figures are marked so", docs/headline.md)
    import matplotlib

    from vcasync.sim.report import plot_summary

    s = summarize(Simulation(SimConfig(fleet=FleetConfig(workers=2), epochs=1, eval_points=5)).run())
    with matplotlib.rc_context({"svg.fonttype": "none"}):     # the SVG keeps its text as text
        svg = plot_summary(s, tmp_path / "p.svg").read_text()
    assert "simulated" in svg
    assert "virtual clock" in svg


def test_a_run_stopped_at_the_virtual_time_limit_says_why() -> None:
    # --preemption-rate 1000 ran to the 720-hour limit, exited 5 and printed "finished False" with
    # no reason: a machine is preempted every 3.6 s on average and none finished booting
    cfg = SimConfig(fleet=FleetConfig.identical(2), preemption=PoissonPreemption(1000.0), epochs=1,
                    seed=0, eval_points=4, max_virtual_s=3600.0, sync_baseline=False)
    s = summarize(Simulation(cfg).run())
    assert s["finished"] is False
    why = s["incomplete_reason"]
    assert isinstance(why, str)
    assert "limit of 1 virtual hours with 0 of" in why
    assert "--preemption-rate 1000" in why
    assert "3.6 virtual s" in why
    assert "lower --preemption-rate" in why
    assert json.loads(strict_json(s))["incomplete_reason"] == why
    assert f"  incomplete             {why}" in render_text(s).splitlines()


def test_a_finished_run_has_no_incomplete_reason() -> None:
    s = summarize(Simulation(SimConfig(fleet=FleetConfig.identical(2), preemption=NoPreemption(),
                                       epochs=1, seed=0, eval_points=4, sync_baseline=False)).run())
    assert s["finished"] is True
    assert s["incomplete_reason"] is None
    assert "incomplete" not in render_text(s)
