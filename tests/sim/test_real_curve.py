"""bench.convergence's real sweeps (``--real-rates``, ``--step-s``): each value's runs get what it
changes (preemptions, or steps paced on both sides), a missed target is counted, and the curve
keeps every seed's times. ``real_run`` is replaced by a recorder: the real processes behind it are
the demo's, tested in tests/demo."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

import bench.convergence as conv


def _report(saving: float | None, fleet_s: float | None) -> dict[str, Any]:
    return {"saving": saving, "time_to_target_s": fleet_s, "ddp_time_to_target_s": 20.0,
            "accuracy_gap": 0.002,
            "cost": {"saving_per_second": None if saving is None else saving - 0.01,
                     "samples_to_target": {"async": 1200, "ddp": 1000, "ratio": 1.2}},
            "workers": [{"sessions": [[0, 1], [2, 3]]}, {"sessions": [[0, 3]]}]}


def test_each_value_runs_every_seed_with_what_it_changes(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    outcomes = iter([(0.7, 30.0), (None, None), (0.8, 25.0), (0.75, 28.0)])

    def fake_run(workload: str, seed: int, *args: Any, **kw: Any) -> dict[str, Any]:
        calls.append({"workload": workload, "seed": seed} | kw)
        return {"report": _report(*next(outcomes))}

    monkeypatch.setattr(conv, "real_run", fake_run)
    a = argparse.Namespace(quick=True, workers=4, hours=5.0)
    searches = {"digits": {"lr": 0.1, "sync_lr": 0.2}}
    curve = conv.real_curve(a, [0, 1], searches, tmp_path, None, values=[0.05, 0.2], label="step",
                            run_kw=lambda v: {"min_step_s": v})
    assert [(c["seed"], c["min_step_s"], c["preemptions"]) for c in calls] == [
        (0, 0.05, 6), (1, 0.05, 6), (0, 0.2, 6), (1, 0.2, 6)]
    assert all(c["lr"] == 0.1 and c["sync_lr"] == 0.2 for c in calls)
    first, second = curve["0.05"], curve["0.2"]
    assert first["n"] == 1
    assert first["missing"] == 1          # the miss is counted, not dropped
    assert first["time_to_target_s"] == [30.0, None]
    assert second["mean"] == pytest.approx(0.775)
    assert second["per_second"]["mean"] == pytest.approx(0.765)
    assert second["min_step_s"] == 0.2
    assert second["sessions"] == [3, 3]
    assert second["samples_ratio"] == [1.2, 1.2]
    assert second["policy"] == "vcasgd"
    assert second["policy_params"] == {"alpha": 0.5}


def test_an_alpha_curve_records_the_policy_it_ran(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(conv, "real_run", lambda *args, **kw: {"report": _report(0.6, 30.0)})
    a = argparse.Namespace(quick=True, workers=4, hours=5.0)
    curve = conv.real_curve(a, [0], {"digits": {"lr": 0.1, "sync_lr": 0.2}}, tmp_path, None,
                            values=[0.75], label="alpha", run_kw=lambda v: {"policy_params": {"alpha": v}})
    assert curve["0.75"]["policy_params"] == {"alpha": 0.75}


def test_sweeps_only_needs_a_sweep() -> None:
    with pytest.raises(SystemExit):
        conv.main(["--sweeps-only"])
