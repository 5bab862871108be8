"""bench.modelsize leaves nothing behind and counts a coordinator that did not stop.

It killed its coordinator 20 s after SIGTERM, before a 4 GB final snapshot was written, and the
coordinator's ``file://`` store (the coordinator process's own temporary directory, tens of GB)
stayed in /tmp; the kill was not counted anywhere. Real coordinator processes, real signals, a
tiny model; TMPDIR points at the test's own directory, so whatever is left there was left by the
bench.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import bench.modelsize as modelsize
from tests._procs import alive, reap

SIZE = 2_000_000          # 500k parameters in ResNet-50's layout
ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(c) for c in text.split()]


@pytest.fixture
def spawned() -> Callable[[], list[int]]:
    """This test process's children that the test started (through the bench), not those an
    earlier test in the same pytest process left running for the session (the storage tests' S3
    and GCS emulators, when pytest-xdist hands this file to a process that ran them)."""
    earlier = set(children(os.getpid()))
    return lambda: [pid for pid in children(os.getpid()) if pid not in earlier]


@pytest.fixture
def tmpdir_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TMPDIR (this process's and its children's) is ``tmp_path/t``."""
    t = tmp_path / "t"
    t.mkdir()
    monkeypatch.setenv("TMPDIR", str(t))
    monkeypatch.setattr(tempfile, "tempdir", str(t))
    return t


def small() -> Any:
    return modelsize.parse(["--warmup", "1", "--held", "0", "--reps", "1", "--spool"])


def test_a_coordinator_that_does_not_stop_is_killed_counted_and_its_store_removed(
        tmpdir_here: Path, monkeypatch: pytest.MonkeyPatch, spawned: Callable[[], list[int]]) -> None:
    real = modelsize.measure
    frozen: list[int] = []

    async def then_freeze(url: str, *args: Any) -> dict[str, Any]:
        result = await real(url, *args)
        # the coordinator can no longer stop (as one still writing a 4 GB snapshot): SIGSTOP
        (pid,) = spawned()
        os.kill(pid, signal.SIGSTOP)
        frozen.append(pid)
        return result

    monkeypatch.setattr(modelsize, "measure", then_freeze)
    monkeypatch.setattr(modelsize, "stop_grace_s", lambda model_bytes: 2.0, raising=False)
    r = modelsize.measure_size(SIZE, small())
    assert frozen
    assert not alive(frozen[0])
    assert list(tmpdir_here.iterdir()) == []           # its store and the spool are gone
    assert r["stop_failed"] == 1                       # counted, not dropped
    assert all(map(lambda t: t != float("inf"), r["raw"]))


def test_the_stop_grace_grows_with_the_model() -> None:
    assert modelsize.stop_grace_s(4 * 10**9) >= 200    # 4 GB: minutes, not 20 s
    assert modelsize.stop_grace_s(4 * 10**9) > modelsize.stop_grace_s(10**8)


def test_a_failing_run_stops_its_coordinator_and_removes_everything(
        tmpdir_here: Path, monkeypatch: pytest.MonkeyPatch, spawned: Callable[[], list[int]]) -> None:
    seen: list[int] = []

    async def broken(url: str, *args: Any) -> dict[str, Any]:
        seen.extend(spawned())
        raise OSError("the upload failed")

    monkeypatch.setattr(modelsize, "measure", broken)
    with pytest.raises(OSError, match="the upload failed"):
        modelsize.measure_size(SIZE, small())
    assert seen
    assert not alive(seen[0])
    assert list(tmpdir_here.iterdir()) == []


def test_sigterm_to_the_bench_stops_its_coordinator_and_removes_everything(
        tmpdir_here: Path, tmp_path: Path) -> None:
    code = ("import sys, bench.modelsize as m, bench._signals as s; s.stop_on_sigterm(); "
            "m.measure_size(int(sys.argv[1]), m.parse(['--warmup', '1000', '--held', '0']))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir_here)}
    log = tmp_path / "stderr"
    coordinator: list[int] = []
    with log.open("w") as err:
        bench = subprocess.Popen([sys.executable, "-c", code, str(SIZE)], cwd=ROOT, env=env,
                                 stderr=err)
    try:
        deadline = time.monotonic() + 120
        # up once the coordinator has written its address (uploads then go on for minutes)
        while not list(tmpdir_here.glob("*/addr")):
            assert bench.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the coordinator did not start"
            time.sleep(0.1)
        coordinator.extend(children(bench.pid))
        time.sleep(2.0)
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=120)
        stopped = [pid for pid in coordinator if not alive(pid)]
    finally:     # never leave a process behind, whatever failed
        reap(bench, coordinator)
    assert len(coordinator) == 1
    assert stopped == coordinator                      # stopped by the bench, not orphaned
    assert bench.returncode != 0
    assert "KeyboardInterrupt" in log.read_text()
    assert list(tmpdir_here.iterdir()) == []


def test_a_sigterm_swallowed_by_a_finaliser_still_stops_the_bench(tmpdir_here: Path) -> None:
    # The handler's KeyboardInterrupt raised inside a __del__ is printed ("Exception ignored")
    # and dropped: the bench ran its 1,000 uploads to the end and exited 0 (CI, stop 37).
    code = ("import os, signal, sys, bench.modelsize as m, bench._signals as s; s.stop_on_sigterm()\n"
            "class Finaliser:\n"
            "    def __del__(self):\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "        sum(range(10**6))      # the handler runs here, inside __del__\n"
            "Finaliser()\n"
            "m.measure_size(int(sys.argv[1]), m.parse(['--warmup', '1000', '--held', '0']))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir_here)}
    bench = subprocess.run([sys.executable, "-c", code, str(SIZE)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert "Exception ignored" in bench.stderr          # the interrupt was swallowed there
    assert bench.returncode != 0, bench.stderr
    assert bench.stderr.count("KeyboardInterrupt") >= 2  # and raised again by the bench
    assert list(tmpdir_here.iterdir()) == []


def test_resume_measures_a_second_coordinator_on_the_same_store_then_removes_it(
        tmpdir_here: Path, spawned: Callable[[], list[int]]) -> None:
    a = modelsize.parse(["--warmup", "1", "--held", "0", "--reps", "1", "--resume"])
    r = modelsize.measure_size(SIZE, a)
    assert r["stop_failed"] == 0
    assert r["resume_version"] == 3              # the warm-up, fp32 and bf16 uploads merged
    assert r["resume_rss_peak"] > r["bytes"]
    assert spawned() == []
    assert list(tmpdir_here.iterdir()) == []
