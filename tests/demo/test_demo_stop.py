"""Stopping the demo's workers from outside their slot loop (the --max-wall limit, a failing demo):
each open session is closed when its process stops, billed, and said on the timeline; and an
unfinished run says why it did not finish."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (vcasync[demo])")

from vcasync.demo import procs
from vcasync.demo.run import DemoConfig, _Demo


def _demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str, workers: int = 1) -> _Demo:
    # the slots' workers are stand-ins: a python that runs ``code`` (no coordinator is started)
    monkeypatch.setattr(procs, "module_command", lambda _m, *_a: [sys.executable, "-c", code])
    cfg = DemoConfig(workers=workers, run_dir=tmp_path / "run", progress=False, grace_s=2.0)
    return _Demo(cfg, 1000, "unused")


async def test_a_worker_stopped_from_outside_its_loop_is_billed_until_it_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `demo --max-wall 4` cancelled each slot's task and stopped its process: the session stayed
    # open, so report.json had sessions 0, machine_seconds 0 and the fleet cost its coordinator.
    demo = _demo(tmp_path, monkeypatch, "import time; time.sleep(60)")
    slot = demo.slots[0]
    task = asyncio.create_task(demo.run_slot(slot))
    for _ in range(200):                      # its session is open once the process is up
        if slot.proc.running and slot.up_since is not None:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    task.cancel()
    await asyncio.wait([task])
    await demo.stop_slot(slot, "--max-wall")
    assert not slot.proc.running
    assert len(slot.sessions) == 1
    start, end = slot.sessions[0]
    assert end - start >= 0.3
    assert slot.uptime_s == pytest.approx(end - start)
    assert slot.state == "stopped"
    stopped = [e for e in demo.timeline.events if e.who == slot.name and e.kind == "stopped"]
    assert len(stopped) == 1
    assert "--max-wall" in stopped[0].detail


async def test_a_worker_that_exited_done_as_the_limit_came_counts_as_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The race: every unit merged, the worker heard "finished" and exited 0, and the limit cancelled
    # its task before the task saw the exit: the slot stayed "running" and the run "unfinished".
    demo = _demo(tmp_path, monkeypatch, "pass")
    slot = demo.slots[0]
    await slot.proc.start()
    slot.went_up(demo.timeline.now())
    assert await slot.proc.wait(60) == 0        # it exited; no task of its own saw it
    await demo.stop_slot(slot, "--max-wall")
    assert slot.state == "done"
    assert len(slot.sessions) == 1


def test_an_unfinished_run_names_crashes_not_the_time_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `demo --lr 1e6`: every worker gave up after repeated trainer failures, and the demo said
    # "the fleet did not finish within --max-wall 900 s".
    demo = _demo(tmp_path, monkeypatch, "pass", workers=2)
    for s in demo.slots:
        s.state = "failed"
        for _ in range(4):
            demo.timeline.add(s.name, "crash", "exit 1")
    demo.slots[1].proc.log_path.write_text(
        "INFO joined\nERROR vcasync.worker: trainer failed on unit e0-s0: metric 'loss' is nan\n"
        "WARNING back off\n")
    why = demo.why_incomplete(None, 0)
    assert "max-wall" not in why
    assert "every worker stopped after repeated crashes (8 crash(es)" in why
    assert "w1.log" in why
    assert "metric 'loss' is nan" in why
    limit = demo.why_incomplete(4.3, 11)
    assert "--max-wall 4" not in limit   # the config's 900 s, not a number from elsewhere
    assert "did not finish within --max-wall 900 s (stopped at 4.3 s" in limit
    assert "11 result(s) merged while the workers were stopped are not counted" in limit


class _FarAlong:
    """A monitor stand-in past --kill-coordinator's 40 % mark, the run not finished."""

    async def poll(self) -> None:
        return None

    def finished(self) -> bool:
        return False

    def units_done(self) -> int:
        return 10**6


async def test_a_coordinator_that_dies_as_kill_coordinator_restarts_it_ends_the_run_with_a_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The restarted coordinator exited at start (killed from outside while the demo brought it back):
    # start_coordinator's ConfigError left restart_coordinator_once inside the fleet's task group,
    # and `vcasync demo --kill-coordinator` ended on an ExceptionGroup traceback, exit 1, no report.
    demo = _demo(tmp_path, monkeypatch, "import sys; sys.exit(3)")   # every coordinator start fails
    await demo.coordinator.start()
    await demo.coordinator.wait(60)
    await demo.restart_coordinator_once(_FarAlong())                 # no exception
    assert demo.coordinator_restarts == 0
    why = demo.coordinator_exited(restart_done=True)
    assert why is not None
    assert why.startswith("the coordinator restarted by --kill-coordinator did not come back "
                          "(exit status 3)")
    assert str(demo.coordinator.log_path) in why
    assert demo.why_incomplete(None, 0) == why
    assert any(e.who == "coordinator" and e.kind == "exited" for e in demo.timeline.events)


def test_the_summary_does_not_call_a_coordinator_killed_by_kill_coordinator_not_killed() -> None:
    # its restart did not come back: the preemptions line said "not killed, the run finished
    # before 40 % of its units were seen done" beside the incomplete line saying it was
    from vcasync.demo.cli import _not_killed

    killed = {"t_s": 9.0, "who": "coordinator", "kind": "killed", "detail": "SIGKILL"}
    r: dict[str, Any] = {"config": {"kill_coordinator": True}, "coordinator_restarts": 0,
                         "timeline": [killed]}
    assert "not killed" not in _not_killed(r)
    assert "its restart did not come back" in _not_killed(r)
    r["timeline"] = []
    assert "not killed, the run finished" in _not_killed(r)


async def test_a_coordinator_lost_after_writing_its_final_weights_is_not_said_to_have_died_before_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # killed from outside just after the run finished (final.pt written), before the demo's next
    # status poll: the report said "before the run finished" of a run with every unit merged
    demo = _demo(tmp_path, monkeypatch, "import sys; sys.exit(3)")
    await demo.coordinator.start()
    await demo.coordinator.wait(60)
    demo.final_weights.write_bytes(b"weights")
    why = demo.coordinator_exited(restart_done=True)
    assert why is not None
    assert "before the run finished" not in why
    assert f"after the run finished (it had written {demo.final_weights})" in why
    await demo.coordinator.stop(1.0)          # closes its log
