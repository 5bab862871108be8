"""``vcasync simulate --spot-trace FILE`` / ``--spot-walk SIGMA``: the simulated fleet's spot price moves.

Issue 14 item 7: ``vcasync demo`` took a moving spot price, the simulator priced every spot second at
the table's fixed rate. Real command runs here, their costs checked against a hand computation from
the sessions an outage trace makes (each session billed from its start for at least the provider's
60-s minimum, at the path's prices, as the demo bills one: past its end when it is shorter), the
synchronous baseline left on demand, and the path recorded in the JSON as the demo's
``cost.spot_path``; a bad path is refused by option name before the simulation runs (exit 2), with
the demo's own messages (tests/demo/test_spot_path.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vcasync.coordinator", reason="the simulator drives the real Coordinator")

from tests._spot_refusals import REFUSED, refused
from vcasync.cli import main
from vcasync.costing.market import SpotWalk
from vcasync.costing.prices import PriceTable
from vcasync.exit_codes import ExitCode
from vcasync.sim.cli import DEFAULT_WALK_STEP_S, build_config, configure
from vcasync.sim.engine import Simulation
from vcasync.sim.report import render_text

LIST = PriceTable()["gcp:n1-standard-8"]          # the simulator's default instance
MIN_S = LIST.min_billed_s                          # 60 s
#: every slot (the trace's one worker, replayed by both) is down 100-200 s and 230-400 s: sessions
#: 0-100, 200-230 (30 s, billed 200-260 by the 60-s minimum) and 400 to the run's end
OUTAGES = "worker,down_s,up_s,notice_s\n0,100,200,0\n0,230,400,0\n"
#: the spot price triples at 245 s, after the short session's end and inside its billed minute
TRACE = [(0.0, 0.1), (245.0, 0.3), (3600.0, 0.2)]
RUN = ["simulate", "--workers", "2", "--epochs", "1", "--identical", "--seed", "3", "--json"]


def _sessions(end_s: float) -> list[tuple[float, float]]:
    """The fleet's sessions as OUTAGES makes them, two slots alike."""
    return 2 * [(0.0, 100.0), (200.0, 230.0), (400.0, end_s)]


def _usd(steps: list[tuple[float, float]], a: float, b: float) -> float:
    """USD of ``[a, b]`` at a step function of $/h: each ``(t, rate)`` holds until the next ``t``."""
    total = 0.0
    for i, (t, rate) in enumerate(steps):
        nxt = steps[i + 1][0] if i + 1 < len(steps) else float("inf")
        lo, hi = max(a, t if i else -float("inf")), min(b, nxt)
        total += max(0.0, hi - lo) * rate / 3600.0
    return total


def _by_hand(steps: list[tuple[float, float]], until_s: float, end_s: float) -> float:
    """The workers' spot USD: each session cut at ``until_s``, billed from its start for at least
    the minimum, priced on ``steps``."""
    total = 0.0
    for start, end in _sessions(end_s):
        if start >= until_s:
            continue
        up = min(end, until_s) - start
        total += _usd(steps, start, start + max(up, MIN_S))
    return total


def _files(tmp: Path) -> tuple[Path, Path]:
    outages, trace = tmp / "outages.csv", tmp / "spot.csv"
    outages.write_text(OUTAGES)
    trace.write_text("t_s,spot_per_h\n" + "".join(f"{t:g},{r:g}\n" for t, r in TRACE))
    return outages, trace


def _main_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == ExitCode.OK, err
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same run at the table's fixed spot rate."""
    outages, _ = _files(tmp_path_factory.mktemp("fixed"))
    proc = subprocess.run([sys.executable, "-m", "vcasync", *RUN, "--trace", str(outages)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary


def _check_on_demand_unchanged(s: dict[str, Any], fixed: dict[str, Any]) -> None:
    """The path moves the workers' spot bill only: the synchronous baseline, the coordinator and the
    on-demand equivalent are what they are at the fixed rate, and so are the run's figures."""
    assert s["duration_s"] == fixed["duration_s"]
    assert s["time_to_target_s"] == fixed["time_to_target_s"]
    for part in ("cost_full_run", "cost_at_target"):
        for key in ("sync_on_demand_usd", "coordinator_usd", "on_demand_equivalent_usd", "worker_hours"):
            assert s[part][key] == fixed[part][key], (part, key)
    assert s["comparison"]["ddp"] == fixed["comparison"]["ddp"]


def test_a_simulated_run_is_priced_on_a_spot_trace_second_by_second(tmp_path: Path,
                                                                    fixed: dict[str, Any]) -> None:
    outages, trace = _files(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "vcasync", *RUN, "--trace", str(outages),
                           "--spot-trace", str(trace)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    end, t_target = s["duration_s"], s["time_to_target_s"]
    assert t_target is not None, "the run must reach its target for a cost to target"
    fleet = s["comparison"]["async"]
    assert fleet["sessions"] == 6
    assert fleet["machine_seconds"] == pytest.approx(2 * (100 + 30 + min(end, t_target) - 400))
    full = _by_hand(TRACE, end, end)
    assert s["cost_full_run"]["spot_usd"] == pytest.approx(full, rel=1e-9)
    assert s["cost_full_run"]["total_usd"] == pytest.approx(full + s["cost_full_run"]["coordinator_usd"])
    to_target = _by_hand(TRACE, t_target, end)
    assert s["cost_at_target"]["spot_usd"] == pytest.approx(to_target, rel=1e-9)
    assert fleet["usd"] - fleet["coordinator_usd"] == pytest.approx(to_target, rel=1e-9)
    # the short session's billed minute runs past its end (230 s) into the tripled price at 245 s:
    # billed at the price of 200-230 alone, the bill is two slots x 15 s x 0.2 $/h smaller
    cut_at_end = to_target - 2 * 15 * (0.3 - 0.1) / 3600
    assert fleet["usd"] - fleet["coordinator_usd"] != pytest.approx(cut_at_end, rel=1e-9)
    _check_on_demand_unchanged(s, fixed)
    assert s["saving_at_target"] != fixed["saving_at_target"]
    billed = 2 * (100 + MIN_S + min(end, t_target) - 400)
    assert s["spot_path"] == {"kind": "trace", "source": str(trace), "rows": 3,
                              "mean_paid_per_h": pytest.approx(to_target / billed * 3600),
                              "mean_paid_per_h_full_run": pytest.approx(full / (2 * (100 + MIN_S + end - 400))
                                                                        * 3600)}
    assert fixed["spot_path"] == {"kind": "fixed", "spot_per_h": LIST.spot_per_h,
                                  "mean_paid_per_h": pytest.approx(LIST.spot_per_h),
                                  "mean_paid_per_h_full_run": pytest.approx(LIST.spot_per_h)}


def test_a_simulated_run_is_priced_on_a_seeded_walk(tmp_path: Path, fixed: dict[str, Any],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    outages, _ = _files(tmp_path)
    argv = [*RUN, "--trace", str(outages), "--spot-walk", "0.3", "--spot-walk-step", "600"]
    s = _main_json(argv, capsys)
    end, t_target = s["duration_s"], s["time_to_target_s"]
    walk = SpotWalk(seed=3, step_s=600.0, sigma=0.3)       # seeded by --seed, as the demo's
    steps = [(k * 600.0, LIST.spot_per_h * walk.factor(k)) for k in range(int(end // 600) + 2)]
    assert len({r for _, r in steps}) > 10                  # it moves
    assert s["cost_full_run"]["spot_usd"] == pytest.approx(_by_hand(steps, end, end), rel=1e-9)
    fleet = s["comparison"]["async"]
    assert fleet["usd"] - fleet["coordinator_usd"] == pytest.approx(_by_hand(steps, t_target, end), rel=1e-9)
    _check_on_demand_unchanged(s, fixed)
    rec = s["spot_path"]
    assert {k: rec[k] for k in ("kind", "seed", "sigma", "step_s", "low", "high")} == {
        "kind": "walk", "seed": 3, "sigma": 0.3, "step_s": 600.0, "low": 0.5, "high": 2.0}
    # the default step is hourly (a simulated run lasts hours; the demo's 10 s is for its minutes)
    parser = argparse.ArgumentParser()
    configure(parser)
    path = build_config(parser.parse_args(["--spot-walk", "0.3", "--seed", "4"])).spot_path
    assert path == SpotWalk(seed=4, step_s=DEFAULT_WALK_STEP_S, sigma=0.3)
    assert DEFAULT_WALK_STEP_S == 3600.0
    # a walk that does not move is the list price
    still = _main_json([*RUN, "--trace", str(outages), "--spot-walk", "0"], capsys)
    assert still["cost_full_run"]["spot_usd"] == pytest.approx(fixed["cost_full_run"]["spot_usd"], rel=1e-9)


def test_the_text_summary_prints_the_path_under_the_prices(tmp_path: Path, fixed: dict[str, Any],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    outages, trace = _files(tmp_path)
    assert main([*RUN[:-1], "--trace", str(outages), "--spot-trace", str(trace)]) == ExitCode.OK
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("prices: "))
    assert lines[at + 1].startswith(f"  spot price path        trace {trace} (3 row(s) of $/h from the "
                                    "run's start on the virtual clock, in place of the list spot price)")
    assert lines[at + 1].endswith("; the synchronous baseline stays on demand")
    assert "spot price path" not in render_text(fixed)      # the fixed rate: the prices line says it


def test_the_help_says_a_paths_times_are_on_the_simulated_clock() -> None:
    p = argparse.ArgumentParser(prog="vcasync simulate")
    configure(p)
    text = " ".join(p.format_help().split())
    assert "t_s,spot_per_h (virtual seconds from the run's start on the simulated clock" in text
    assert "(the synchronous baseline stays on demand)" in text
    assert "virtual seconds between the steps of --spot-walk (default 3600; at least 1)" in text


@pytest.fixture
def _nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(self: Simulation) -> None:
        raise AssertionError("the simulation ran")

    monkeypatch.setattr(Simulation, "run", run)


@pytest.mark.usefixtures("_nothing_runs")
@pytest.mark.parametrize(("args", "said"), REFUSED)
def test_a_bad_spot_path_is_refused_by_option_before_the_simulation_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str) -> None:
    plot = tmp_path / "saving.png"
    refused(tmp_path, capsys, args, said,
            lambda argv: main(["simulate", "--workers", "2", "--epochs", "1", "--plot", str(plot), *argv]))
    assert not plot.exists()
