"""``vcasync demo --spot-trace FILE`` / ``--spot-walk SIGMA``: the fleet's spot price moves during the run.

On recorded runs (no processes): both fleet costs are priced on the path and the saving moves with
it, the report says which path, the summary prints it; bad values are refused by option name before
anything starts (exit 2, no process, no run directory). Issue 14: the library had the paths, no
command took one, so every demo priced its workers at the table's fixed spot rate.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (vcasync[demo])")

from tests._spot_refusals import REFUSED, refused
from vcasync.cli import main
from vcasync.costing.market import SpotTrace, SpotWalk
from vcasync.costing.prices import PriceTable
from vcasync.demo.cli import DEFAULT_WALK_STEP_S, _print_summary
from vcasync.demo.ddp import DdpConfig, DdpResult
from vcasync.demo.procs import Proc, Slot, Timeline
from vcasync.demo.report import build_report
from vcasync.demo.run import DemoConfig, DemoRun

T0_WALL = 1_000_000.0
LIST = PriceTable()[DemoConfig().instance]


def _run(tmp: Path, path: SpotTrace | SpotWalk | None = None) -> DemoRun:
    """Two workers, one restarted; the fleet reaches the target at 150 s (as in test_report)."""
    (tmp / "events").mkdir(exist_ok=True)
    slots = []
    for index, sessions in enumerate([[(0.0, 30.0), (40.0, 200.0)], [(0.0, 95.0)]]):
        s = Slot(index, Proc(f"w{index}", [], env={}, log_path=tmp / f"w{index}.log"))
        s.sessions, s.pids, s.starts, s.state = list(sessions), [10 * index + 1, 10 * index + 2], 1, "done"
        slots.append(s)
    cfg = DemoConfig(workers=2, run_dir=tmp, progress=False, spot_path=path, seed=7)
    run = DemoRun(cfg, tmp, Timeline(t0=0.0, events=[]), slots, total_units=4, unit_steps=5, finished=True)
    run.accuracy = [(60.0, 3, 2, 0.5, 1.0), (150.0, 9, 4, 0.95, 0.2), (190.0, 12, 4, 0.96, 0.2)]
    run.versions = [(20.0, 0), (45.0, 1), (150.0, 9)]
    return run


def _ddp() -> DdpResult:
    cfg = DdpConfig(workers=2, workload="digits", batch_size=32, samples=2000, lr=0.1)
    points = [(5.0, 0, 0.1, 2.3), (50.0, 1000, 0.9, 0.3), (100.0, 2000, 0.95, 0.2)]
    return DdpResult(cfg, points, first_step_s=4.0, wall_s=101.0, digests=["a"] * 2)


def _cost(tmp: Path, path: SpotTrace | SpotWalk | None) -> dict[str, Any]:
    cost: dict[str, Any] = build_report(_run(tmp, path), _ddp(), T0_WALL)["cost"]
    return cost


def _trace(tmp: Path, text: str) -> SpotTrace:
    file = tmp / "spot.csv"
    file.write_text(text)
    return SpotTrace.from_csv(file)


def test_a_trace_at_twice_the_list_price_gives_a_smaller_saving(tmp_path: Path) -> None:
    fixed = _cost(tmp_path, None)
    double = _cost(tmp_path, _trace(tmp_path, f"t_s,spot_per_h\n0,{2 * LIST.spot_per_h}\n"))
    assert double["saving"] < fixed["saving"]
    assert double["saving_per_second"] < fixed["saving_per_second"]
    # the workers' 60 + 110 + 95 billed seconds at twice the rate; the coordinator and DDP unchanged
    workers = 265 * 2 * LIST.spot_per_h / 3600
    fleet, base = double["async"], double["ddp"]
    assert fleet["usd"] == pytest.approx(workers + fleet["coordinator_usd"])
    assert base == fixed["ddp"]
    assert double["spot_path"] == {"kind": "trace", "source": str(tmp_path / "spot.csv"), "rows": 1,
                                   "mean_paid_per_h": pytest.approx(2 * LIST.spot_per_h)}
    assert fixed["spot_path"] == {"kind": "fixed", "spot_per_h": LIST.spot_per_h,
                                  "mean_paid_per_h": pytest.approx(LIST.spot_per_h)}


def test_a_trace_at_the_list_price_gives_the_same_saving_to_the_cent(tmp_path: Path) -> None:
    fixed = _cost(tmp_path, None)
    same = _cost(tmp_path, _trace(tmp_path, f"t_s,spot_per_h\n0,{LIST.spot_per_h}\n100,{LIST.spot_per_h}\n"))
    for key in ("saving", "saving_per_second"):
        assert round(100 * same[key], 2) == round(100 * fixed[key], 2)
    assert round(same["async"]["usd"], 2) == round(fixed["async"]["usd"], 2)
    assert same["async"]["usd"] == pytest.approx(fixed["async"]["usd"])


def test_a_trace_that_rises_during_the_run_prices_each_second_at_its_own_rate(tmp_path: Path) -> None:
    # list price until 50 s, four times it from then: the sessions' seconds after 50 s pay more
    p = LIST.spot_per_h
    cost = _cost(tmp_path, _trace(tmp_path, f"t_s,spot_per_h\n0,{p}\n50,{4 * p}\n"))
    # billed: w0 0-60 (its 0-30 session, a minimum) and 40-150, w1 0-95; the seconds from 50 s pay 4x
    cheap, dear = 50 + 10 + 50, 10 + 100 + 45
    assert cost["async"]["usd"] - cost["async"]["coordinator_usd"] == pytest.approx(
        (cheap * p + dear * 4 * p) / 3600)


def test_a_walk_is_seeded_by_the_demo_seed_and_recorded(tmp_path: Path) -> None:
    walk = SpotWalk(seed=7, step_s=DEFAULT_WALK_STEP_S, sigma=0.3)
    one, two = _cost(tmp_path, walk), _cost(tmp_path, SpotWalk(seed=7, step_s=DEFAULT_WALK_STEP_S, sigma=0.3))
    assert one["saving"] == two["saving"]
    assert one["saving"] != _cost(tmp_path, None)["saving"]
    assert one["saving"] != _cost(tmp_path, dataclasses.replace(walk, seed=8))["saving"]
    rec = one["spot_path"]
    assert {k: rec[k] for k in ("kind", "seed", "sigma", "step_s", "low", "high")} == {
        "kind": "walk", "seed": 7, "sigma": 0.3, "step_s": DEFAULT_WALK_STEP_S, "low": 0.5, "high": 2.0}
    # a walk that does not move is the list price
    assert _cost(tmp_path, SpotWalk(seed=7, sigma=0.0))["saving"] == pytest.approx(
        _cost(tmp_path, None)["saving"])


def test_the_summary_prints_the_path_beside_the_prices(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _print_summary(build_report(_run(tmp_path), _ddp(), T0_WALL), [])
    out = capsys.readouterr().out
    assert "spot price path" not in out     # the fixed price: the prices line says it
    trace = _trace(tmp_path, f"t_s,spot_per_h\n0,{2 * LIST.spot_per_h}\n")
    _print_summary(build_report(_run(tmp_path, trace), _ddp(), T0_WALL), [])
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.strip().startswith("prices "))
    source = tmp_path / "spot.csv"
    assert lines[at + 1].startswith(f"  spot price path         trace {source} (1 row(s) of $/h")
    assert f"the workers paid ${2 * LIST.spot_per_h:.5f}/h on average to the target" in lines[at + 1]
    walk = SpotWalk(seed=7, step_s=10.0, sigma=0.2)
    _print_summary(build_report(_run(tmp_path, walk), _ddp(), T0_WALL), [])
    line = next(x for x in capsys.readouterr().out.splitlines() if "spot price path" in x)
    assert "random walk (seed 7, sigma 0.2 per 10-s step, within 0.5-2x the list spot price)" in line


@pytest.fixture
def _nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    async def start(self: Proc) -> None:
        raise AssertionError(f"{self.name} was started")

    monkeypatch.setattr(Proc, "start", start)


@pytest.mark.usefixtures("_nothing_starts")
@pytest.mark.parametrize(("args", "said"), REFUSED)
def test_a_bad_spot_path_is_refused_by_option_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str) -> None:
    run_dir = tmp_path / "run"
    refused(tmp_path, capsys, args, said,
            lambda argv: main(["demo", "--quick", "--no-progress", "--run-dir", str(run_dir), *argv]))
    assert not run_dir.exists()

