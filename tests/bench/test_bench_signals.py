"""A SIGTERM to a benchmark's process alone (a CI job's time-out) stops it through its clean-ups.

With the default action bench.load, bench.e2e, bench.scale and bench.storage died at once and left
their coordinators, S3/GCS emulators and merger processes running, and their temporary directories
in TMPDIR (bench/_signals.py). SIGINT is ignored in some runs, as in a background job of a
non-interactive shell (``python -m bench.X &`` in a CI script): there bench.convergence's SIGTERM
handler, which raised SIGINT, did nothing, and the run went on to its end and exited 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._procs import alive, reap, wait_until

ROOT = Path(__file__).resolve().parents[2]


def descendants(pid: int) -> list[int]:
    try:
        kids = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []
    return kids + [d for k in kids for d in descendants(k)]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


#: (benchmark, a child's command line that says its processes are up, SIGINT ignored)
CASES = [
    ("load", "bench._peers coordinator", False),
    ("e2e", "bench._peers durable", True),
    ("storage", "_emulator_main gcs", False),
    ("storage", "_emulator_main gcs", True),
    # at once when the merger starts: an interrupt while it started (up to 120 s) left it running
    ("scale", "--merger", True),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "up", "sigint_ignored"), CASES)
def test_sigterm_to_the_benchmark_alone_stops_its_processes_and_removes_its_files(
        tmp_path: Path, name: str, up: str, sigint_ignored: bool) -> None:
    tmp = tmp_path / "t"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    err_file = tmp_path / "stderr.txt"
    with err_file.open("wb") as err:
        bench = subprocess.Popen([sys.executable, "-m", f"bench.{name}", "--quick", "--json"],
                                 cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                 preexec_fn=ignore_sigint if sigint_ignored else None)
    seen: list[int] = []
    try:
        def started() -> bool:
            assert bench.poll() is None, f"bench.{name} ended before its processes were up"
            seen[:] = descendants(bench.pid)
            return any(up in cmdline(p) for p in seen)
        wait_until(f"bench.{name}'s {up!r}", started, 60, every=0.05)
        if name != "scale":
            time.sleep(1.0)                      # at work
        seen[:] = descendants(bench.pid)
        t0 = time.monotonic()
        os.kill(bench.pid, signal.SIGTERM)       # the benchmark's process alone
        try:
            bench.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"bench.{name} did not stop within 30 s of its SIGTERM") from None
        left = [(p, cmdline(p)) for p in seen if alive(p)]   # the moment it ended
        assert bench.returncode != 0, "stopped, not finished"
        assert left == [], "processes that outlived the benchmark"
        # the shell's status for SIGTERM and one line that says so: until 2026-12-08 the
        # KeyboardInterrupt reached the interpreter, which printed its traceback and exited 1
        said = err_file.read_text(errors="replace")
        assert bench.returncode == 128 + signal.SIGTERM, said[-2000:]
        assert said.rstrip().endswith(f"python -m bench.{name}: stopped by SIGTERM; its processes "
                                      "and temporary files were cleaned up"), said[-2000:]
        assert "Traceback" not in said, said[-2000:]
        assert list(tmp.iterdir()) == [], "files it left in TMPDIR"
        assert time.monotonic() - t0 < 30
    finally:     # never leave a process behind, whatever failed
        reap(bench, seen)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupt_as_a_process_starts_kills_it_and_is_then_raised(
        monkeypatch: pytest.MonkeyPatch, signum: int) -> None:
    # bench.scale's merger outlived the benchmark when SIGTERM came as the merger appeared: it was
    # raised inside Popen (or before the caller's try), before anyone held the process.
    from bench import _signals
    from bench._signals import start_process, stop_on_sigterm
    # what _stop remembers stays in this test (a later in-process bench's raise_if_stopped would
    # take it for its own stop: the suite's worker died of it)
    monkeypatch.setattr(_signals, "RECEIVED", [])
    # the handlers a benchmark runs with, whatever an earlier test in this process left (the full
    # suite's worker had a SIGINT handler that raised nothing, uvloop's, left by an in-process
    # `vcasync coordinator` until cli.main gave the signals back: neither case raised there)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop_on_sigterm()          # SIGTERM as the benchmarks take it: as Ctrl-C
    real, started = subprocess.Popen, []

    def popen_then_interrupted(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = real(*args, **kwargs)          # type: ignore[call-overload]
        started.append(proc)
        signal.raise_signal(signum)           # comes just as the child is up
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            start_process([sys.executable, "-c", "import time; time.sleep(60)"])
    finally:
        for signum_, handler in before.items():
            signal.signal(signum_, handler if handler is not None else signal.SIG_DFL)
    (proc,) = started
    try:
        assert proc.returncode is not None    # killed and reaped
        assert not alive(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_benchmark_called_in_process_gives_sigterm_back_as_it_found_it(tmp_path: Path) -> None:
    # The suite calls benchmarks' main() in its own processes; each left bench._signals._stop as
    # the process's SIGTERM handler, so a later SIGTERM to that process (pytest-xdist's worker)
    # raised KeyboardInterrupt wherever it was instead of ending it.
    from bench import convergence
    before = signal.getsignal(signal.SIGTERM)
    (tmp_path / "x.json").write_text("[]")
    assert convergence.main(["--replay-records", str(tmp_path / "x.json")]) == 2   # refused early
    assert signal.getsignal(signal.SIGTERM) is before


FINALISER_SCRIPT = """
import asyncio, signal, sys, time
from bench._signals import run_async, stop_on_sigterm

class Slow:
    def __del__(self):                     # the main thread is in here nearly all the time
        t = time.monotonic()
        while time.monotonic() - t < 0.05:
            pass

async def main():
    print("up", flush=True)
    while True:
        Slow()
        await asyncio.sleep(0)

if sys.argv[1] == "ignored":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
stop_on_sigterm()
try:
    run_async(main())
except KeyboardInterrupt:
    print("stopped", flush=True)
    raise SystemExit(3)
"""


@pytest.mark.parametrize("sigint", ["ignored", "default"])
def test_a_sigterm_while_a_finaliser_runs_still_stops_an_event_loop(sigint: str) -> None:
    """bench.convergence's real run (an event loop) went on to its end after a SIGTERM in CI, SIGINT
    ignored: the KeyboardInterrupt raised wherever the main thread was can land in a finaliser
    (``__del__``), where Python prints it and drops it. ``run_async`` cancels the loop's main task
    from the loop instead. Here the main thread spends nearly all its time in a ``__del__``: under
    ``asyncio.run`` the signal was dropped and the loop ran on past the 20-s bound."""
    proc = subprocess.Popen([sys.executable, "-c", FINALISER_SCRIPT, sigint], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("the loop ran on after its SIGTERM") from None
    assert (proc.returncode, out.strip()) == (3, "stopped"), err[-2000:]


@pytest.mark.slow
def test_sigterm_to_publish_run_stops_the_bench_it_runs(tmp_path: Path) -> None:
    """``python -m bench.publish --run`` runs each bench as a child process: a SIGTERM to it alone
    (a CI job's time-out) ended it at once and left the bench running, with whatever it had
    started, for the rest of its minutes. It now stops the bench through the bench's own
    clean-ups, waits for it, saves nothing and exits non-zero."""
    tmp = tmp_path / "t"
    tmp.mkdir()
    results = tmp_path / "results"
    page = tmp_path / "benchmarks.md"
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # codec at its default sizes: minutes of work, so the bench is still running when told to stop
    publish = subprocess.Popen([sys.executable, "-m", "bench.publish", "--run", "--only", "codec",
                                "--results", str(results), "--page", str(page)], cwd=ROOT, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    seen: list[int] = []
    try:
        def started() -> bool:
            assert publish.poll() is None, "bench.publish ended before its bench was up"
            seen[:] = descendants(publish.pid)
            return any("bench.codec" in cmdline(p) for p in seen)
        wait_until("bench.publish's bench.codec", started, 60, every=0.05)
        time.sleep(1.0)                          # at work
        seen[:] = descendants(publish.pid)
        os.kill(publish.pid, signal.SIGTERM)     # publish's process alone
        try:
            publish.wait(120)
        except subprocess.TimeoutExpired:
            raise AssertionError("bench.publish did not stop after its SIGTERM") from None
        left = [(p, cmdline(p)) for p in seen if alive(p)]   # the moment it ended
        assert left == [], "the bench outlived bench.publish"
        assert publish.returncode != 0, "stopped, not finished"
        assert not (results / "codec.json").exists(), "saved no result"
        assert not page.exists(), "wrote no page"
    finally:     # never leave a process behind, whatever failed
        reap(publish, seen)
