"""``vcasync demo`` and signals from outside it, with real processes and real signals; a run's children
are found by its run directory, which appears on their command lines.

* SIGTERM to the demo's own process only (``kill PID``, a supervisor, ``docker stop``): it stops its
  coordinator, workers and DDP ranks, says so, and exits 130. With the default handling the demo
  ended at once (exit 143) and left the coordinator serving (with ``--linger 600``) and the workers,
  or the DDP ranks, running with nobody to stop them.
* SIGTERM while it starts (importing torch): it says so and exits 130, having started
  nothing; it ended with 143 and no word.
* Its coordinator killed from outside (a crash, the OOM killer): the demo stops the fleet at once and
  says why (exit 5). Its workers retried the dead coordinator until ``--max-wall`` (15 minutes by
  default), and the demo then said only that the fleet did not finish in time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (vcasync[demo])")

from tests._procs import live_processes, wait_until
from vcasync.cli import ExitCode

pytestmark = pytest.mark.slow


def _children_of_run(marker: str) -> list[str]:
    """The live processes that name ``marker`` (the run directory), as "pid: command line"."""
    return [f"{pid}: {cmd[:160]}" for pid, cmd in live_processes(marker).items()]


def _start(tmp_path: Path, run_dir: Path) -> subprocess.Popen[str]:
    # SIGINT left at its default as a terminal has it (a test runner's children may inherit it ignored)
    return subprocess.Popen([sys.executable, "-m", "vcasync", "demo", "--quick", "--no-progress",
                             "--min-step-s", "0.05", "--preemptions", "0", "--run-dir", str(run_dir)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _stop_and_check(proc: subprocess.Popen[str], marker: str) -> str:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)           # the demo's own process, not its group
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - t0
    left: list[str] = []
    for _ in range(20):                        # a child exiting is reaped by the demo, not at once
        left = _children_of_run(marker)
        if not left:
            break
        time.sleep(0.25)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)   # the test's own leftovers, by their session
    assert not left, f"left running after the demo exited ({proc.returncode}): {left}"
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert took < 45, f"took {took:.1f} s to stop"
    return err


def test_sigterm_during_the_fleet_stops_the_coordinator_and_workers(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, run_dir)
    # a worker is training: its trainer has written an event
    wait_until("a worker training (its first event)", lambda: any((run_dir / "events").glob("*.jsonl")),
               180, every=0.2)
    assert _children_of_run(str(run_dir))      # the coordinator and workers are up
    err = _stop_and_check(proc, str(run_dir))
    assert "interrupted: stopping the workers and the coordinator" in err
    assert str(run_dir) in err
    assert not (run_dir / "report.json").exists()


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def test_sigterm_while_it_starts_is_an_interrupt_that_says_so(tmp_path: Path) -> None:
    """A SIGTERM while the demo starts (importing torch: seconds on a loaded machine) ended it with
    143 and no word, though the quick-start page and the exit codes say 130: vcasync.cli.main held
    the signal from its first moment, then gave it back to its default handling before the demo ran."""
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, run_dir)
    try:
        # importing torch (the commands' options import it): seconds before anything is created
        wait_until("the demo importing torch", lambda: "libtorch" in _maps(proc.pid), 60, every=0.01)
        assert not run_dir.exists(), "the run had started: too late to test start-up"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == ExitCode.INTERRUPTED, (proc.returncode, err)
    assert "interrupted while starting: nothing was started or written" in err
    assert not run_dir.exists()
    assert not _children_of_run(str(run_dir))


def test_sigterm_during_the_ddp_baseline_stops_its_ranks(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, run_dir)
    wait_until("the DDP baseline", (run_dir / "ddp" / "ddp-rank1.log").exists, 300, every=0.2)
    # the ranks name their output files under the run directory
    wait_until("both DDP ranks", lambda: len(_children_of_run(str(run_dir / "ddp"))) == 2, 30,
               every=0.2)
    err = _stop_and_check(proc, str(run_dir))
    assert "interrupted during the DDP baseline" in err
    assert not (run_dir / "report.json").exists()


def test_a_coordinator_killed_from_outside_ends_the_fleet_and_says_so(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, run_dir)
    try:
        wait_until("a worker training (its first event)",
                   lambda: any((run_dir / "events").glob("*.jsonl")), 180, every=0.2)
        coordinators = [c for c in _children_of_run(str(run_dir / "state")) if " coordinator " in c]
        assert len(coordinators) == 1, coordinators
        os.kill(int(coordinators[0].split(":", 1)[0]), signal.SIGKILL)
        _, err = proc.communicate(timeout=150)       # not --max-wall's 900 s
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == ExitCode.INCOMPLETE, err
    assert "the coordinator exited on its own (killed by SIGKILL)" in err
    report = json.loads((run_dir / "report.json").read_text())
    assert report["finished"] is False
    assert report["incomplete_reason"].startswith("the coordinator exited on its own (killed by SIGKILL)")
    assert report["stopped_at_limit_s"] is None                  # not said to be the time limit
    assert any(e["who"] == "coordinator" and e["kind"] == "exited" for e in report["timeline"])
    assert not _children_of_run(str(run_dir))


def test_a_ddp_rank_killed_from_outside_still_reports_the_fleet(tmp_path: Path) -> None:
    # Found by hand: a DDP rank SIGKILLed (the OOM killer) left the demo waiting for the other one
    # until the gloo timeout (--max-wall, 15 minutes by default), then exit 5 with no report of the
    # fleet's run; a rank that failed later was exit 2, "configuration error", and no report either.
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "vcasync", "demo", "--quick", "--no-progress", "--json",
                             "--preemptions", "0", "--max-wall", "120", "--run-dir", str(run_dir)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    ddp = str(run_dir / "ddp")
    try:
        def rank1() -> list[int]:
            return [pid for pid, cmd in live_processes(ddp).items() if "--rank 1 " in cmd]

        wait_until("DDP rank 1", rank1, 300, every=0.1)
        os.kill(rank1()[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == ExitCode.INCOMPLETE, err
    assert "the DDP baseline failed: a DDP rank failed (rank 1 killed by SIGKILL)" in err
    assert "configuration error" not in err
    report = json.loads((run_dir / "report.json").read_text())
    assert report["finished"] is True                      # the fleet's run, reported as it was
    assert report["final_accuracy"] > 0.5
    assert report["baseline"] is None
    assert "rank 1 killed by SIGKILL" in report["baseline_error"]
    assert report["saving"] is None
    assert report["cost"]["target"] is None
    head = json.loads(out.strip().splitlines()[-1])
    assert head["baseline_error"] == report["baseline_error"]
    assert (run_dir / "accuracy.png").exists()
    assert (run_dir / "timeline.png").exists()
    assert not _children_of_run(str(run_dir))
