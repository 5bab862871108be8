"""What bench.convergence measures in a real run for the simulator's replay: the coordinator's own
merge time (not the pace at which the monitor saw versions appear), a session's start-up up to
the end of its slow first unit (torch's lazy set-up), not only up to that unit's start, apart for
the slots' first sessions and for restarts, and the contention its units measured."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.convergence import _measure, coordinator_cpu_per_result, coordinator_merge_s
from vcasync.demo.ddp import DdpConfig

T0 = 1_000_000.0     # the run's wall clock at its start
BATCH = 32


def _session(pid: int, start_s: float, first_unit_s: float, later: list[float], gap_s: float,
             boot_s: float = 4.0) -> list[str]:
    """Event lines of one worker process: its first unit starts ``boot_s`` after the session does."""
    t, cpu, lines = T0 + start_s + boot_s, 1.0, []
    for i, dur in enumerate([first_unit_s, *later]):
        common = {"pid": pid, "unit": f"u{pid}-{i}"}
        lines.append(json.dumps({**common, "t": t, "cpu": cpu, "kind": "unit_start", "start": 0,
                                 "resumed": False}))
        t, cpu = t + dur, cpu + dur / 2
        lines.append(json.dumps({**common, "t": t, "cpu": cpu, "kind": "unit_end", "steps_done": 6}))
        t, cpu = t + gap_s, cpu + 0.01    # the worker's own CPU between units: 10 ms
    return lines


def _run(tmp_path: Path) -> SimpleNamespace:
    events = tmp_path / "events"
    events.mkdir()
    sessions = {11: (0.0, 2.0), 12: (0.5, 2.2)}   # pid: (session start, its first unit's length)
    for pid, (start, first) in sessions.items():
        lines = _session(pid, start, first, [0.03, 0.03, 0.04, 0.03], gap_s=0.035)
        (events / f"{pid}.jsonl").write_text("\n".join(lines) + "\n")
    slots = [SimpleNamespace(index=i, name=f"w{i}", sessions=[(start, start + 30.0)], pids=[pid])
             for i, (pid, (start, _)) in enumerate(sessions.items())]
    config = SimpleNamespace(batch_size=BATCH, epochs=1, worker_lr=0.1, baseline_lr=0.1,
                             num_shards=lambda: 2)
    return SimpleNamespace(run_dir=tmp_path, slots=slots, config=config,
                           timeline=SimpleNamespace(events=[]), unit_steps=6)


def test_the_first_units_warm_up_is_start_up(tmp_path: Path) -> None:
    ddp = DdpConfig(workers=4, workload="digits", batch_size=BATCH, samples=1280, lr=0.1)
    m = _measure(_run(tmp_path), T0, [(5.0, 0, 0.1, 2.0), (6.0, 1280, 0.9, 0.3)], 5.0, ddp)  # type: ignore[arg-type]
    later = 0.03     # the median of the later units
    assert m["first_unit_extra_s"] == pytest.approx((2.0 + 2.2) / 2 - later)
    assert m["boot_s"] == pytest.approx(4.0 + m["first_unit_extra_s"])
    # the per-sample costs and the overhead between units stay the steady state's
    assert m["sample_cost_s"] == pytest.approx(later / (6 * BATCH))
    assert m["unit_overhead_s"] == pytest.approx(0.035)
    assert m["unit_cpu_s"] == pytest.approx(0.01)


def test_a_restart_start_up_is_measured_apart_from_the_first_sessions(tmp_path: Path) -> None:
    """Two slots start together (7 s to the first unit, 2 s for it); slot 0 comes back after a
    preemption alone (3 s, then 1 s): the first sessions' start-up is theirs, not a median with
    the restart's."""
    run = _run(tmp_path)
    events = tmp_path / "events"
    later = [0.03, 0.03, 0.03]
    for pid, start, first, boot in ((11, 0.0, 2.0, 7.0), (12, 0.0, 2.0, 7.0), (13, 20.0, 1.0, 3.0)):
        lines = _session(pid, start, first, later, gap_s=0.035, boot_s=boot)
        (events / f"{pid}.jsonl").write_text("\n".join(lines) + "\n")
    slots = [SimpleNamespace(index=0, name="w0", sessions=[(0.0, 15.0), (20.0, 40.0)], pids=[11, 13]),
             SimpleNamespace(index=1, name="w1", sessions=[(0.0, 40.0)], pids=[12])]
    run.slots = slots
    ddp = DdpConfig(workers=4, workload="digits", batch_size=BATCH, samples=1280, lr=0.1)
    m = _measure(run, T0, [(5.0, 0, 0.1, 2.0), (6.0, 1280, 0.9, 0.3)], 5.0, ddp)  # type: ignore[arg-type]
    assert m["boot_s"] == pytest.approx(7.0 + 2.0 - 0.03)
    assert m["first_unit_extra_s"] == pytest.approx(2.0 - 0.03)
    assert m["restart_boot_s"] == pytest.approx(3.0 + 1.0 - 0.03)
    assert m["restart_first_unit_extra_s"] == pytest.approx(1.0 - 0.03)
    assert m["restarts_measured"] == 1


def test_a_run_without_restarts_restarts_as_it_first_started(tmp_path: Path) -> None:
    ddp = DdpConfig(workers=4, workload="digits", batch_size=BATCH, samples=1280, lr=0.1)
    m = _measure(_run(tmp_path), T0, [(5.0, 0, 0.1, 2.0), (6.0, 1280, 0.9, 0.3)], 5.0, ddp)  # type: ignore[arg-type]
    assert m["restart_boot_s"] == m["boot_s"]
    assert m["restarts_measured"] == 0


def test_the_replays_contention_is_the_stretch_its_units_measured() -> None:
    """Wall over CPU seconds per sample inside units 3.0 on 2 cores with 4 workers: 2 always-busy
    processes more, whatever /proc/loadavg's runnable threads said; never below none."""
    from bench.convergence import replay_extra_runnable

    m = {"sample_cost_s": 3e-4, "sample_cpu_s": 1e-4, "runnable_fleet": 11.7}
    assert replay_extra_runnable(m, 4, 2.0) == pytest.approx(2.0)
    assert replay_extra_runnable({**m, "runnable_fleet": 4.5}, 4, 2.0) == pytest.approx(2.0)
    assert replay_extra_runnable({**m, "sample_cost_s": 1.4e-4}, 4, 2.0) == 0.0  # 2.8 < 4 workers
    assert replay_extra_runnable(m, 4, None) == 0.0                              # no sharing modelled
    # nothing timed inside a unit: the runnable threads less the workers, as before
    assert replay_extra_runnable({"sample_cost_s": None, "sample_cpu_s": None, "runnable_fleet": 5.5},
                                 4, 2.0) == pytest.approx(1.5)


def test_the_merge_time_is_the_coordinators_own() -> None:
    status = {"metrics": {"merge_seconds": {"count": 160, "sum": 0.096, "buckets": {}}}}
    assert coordinator_merge_s(status) == pytest.approx(0.0006)
    assert coordinator_merge_s({"metrics": {"merge_seconds": {"count": 0, "sum": 0.0}}}) == 0.0
    assert coordinator_merge_s({}) == 0.0    # a coordinator that never answered: no queue


def test_the_coordinators_cpu_per_result_leaves_start_up_and_restarts_out() -> None:
    # version 0 polled after 3 s of start-up; 10 results cost 0.1 s; a restart resets the counter
    assert coordinator_cpu_per_result([(0, 3.0), (1, 3.01), (11, 3.11)]) == pytest.approx(0.01)
    assert coordinator_cpu_per_result([(1, 3.0), (5, 3.2), (6, 2.5), (16, 2.7)]) == pytest.approx(0.02)
    assert coordinator_cpu_per_result([(1, 3.0)]) == 0.0
    assert coordinator_cpu_per_result([]) == 0.0


def test_the_replay_meets_each_outage_when_the_run_did() -> None:
    # the run's clock starts 1.5 s before its workers do; the replay's when they do
    from bench.convergence import shifted
    from vcasync.sim.fleet import Outage

    real = {0: [Outage(9.8, 12.9, 1.3)], 2: [Outage(11.5, 14.7, 0.0), Outage(20.0, 22.0, 2.0)]}
    assert shifted(real, -1.5) == {0: [Outage(8.3, 11.4, 1.3)],
                                   2: [Outage(10.0, 13.2, 0.0), Outage(18.5, 20.5, 2.0)]}
