"""A worker told to wait still hears the end of the run while the coordinator lingers.

Real processes on 127.0.0.1: a ``vcasync coordinator --linger 2`` with one unit, worker A holding it
and worker B told "no unit now" (``503 no_work``). The coordinator's own hint was up to a heartbeat
(15 s here), and B slept 5 to 10 s on it: it woke after the coordinator had lingered its 2 s and
exited, found nothing listening and retried for ``--give-up-after`` (an hour by default) on what is
a billed machine. The coordinator now tells no worker to wait longer than half its linger, so B asks
again, hears ``410 run_finished`` and exits 0 before the coordinator does."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from vcasync.cli import ExitCode

from .conftest import HERE, Procs, free_port
from .test_fleet import wait_until

pytestmark = pytest.mark.slow

LINGER_S = 2.0


def coordinator_args(tmp_path: Path, port: int) -> tuple[str, ...]:
    """One unit of digits on a store under ``tmp_path``, lingering ``LINGER_S``."""
    return ("coordinator", "--model", "vcasync.examples.digits:model", "--shards", "1", "--epochs", "1",
            "--steps", "5", "--storage", f"file://{tmp_path / 'store'}", "--lease-timeout", "60",
            "--port", str(port), "--linger", str(LINGER_S))


def gated_worker(procs: Procs, tmp_path: Path, port: int, name: str,
                 give_up_s: int) -> subprocess.Popen[bytes]:
    """A worker whose trainer holds its unit until the test touches the gate (``procs.env``'s)."""
    return procs.start(name, "worker", "--coordinator", f"http://127.0.0.1:{port}",
                       "--trainer", "gated_trainer:train", "--app-dir", str(HERE),
                       "--state-dir", str(tmp_path / name), "--give-up-after", str(give_up_s))


def test_a_worker_waiting_for_work_hears_the_end_while_the_coordinator_lingers(
        procs: Procs, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    procs.env["GATED_TRAINER_GATE"] = str(gate)
    port = free_port()
    coord = procs.start("coord", *coordinator_args(tmp_path, port))

    def worker(name: str) -> subprocess.Popen[bytes]:
        return gated_worker(procs, tmp_path, port, name, 60)

    a = worker("a")
    # aiohttp's access log: A holds the run's only unit (201), then B is told to wait (503)
    wait_until("worker A's lease", lambda: '"POST /v1/leases HTTP/1.1" 201' in procs.log("coord"), 90)
    b = worker("b")
    wait_until("worker B told to wait", lambda: '"POST /v1/leases HTTP/1.1" 503' in procs.log("coord"), 90)
    told = time.monotonic()
    gate.touch()                           # A delivers the last unit: the run is finished
    assert a.wait(30) == ExitCode.OK, procs.log("a")[-3000:]
    assert coord.wait(30) == ExitCode.OK, procs.log("coord")[-3000:]
    coord_gone = time.monotonic()
    log = procs.log("coord")
    assert "serving 2s more so workers hear it" in log
    assert "run.linger_s" not in log, log[-3000:]      # 2 s is long enough: no warning at start
    # B heard the end while the coordinator lingered: it did not wake to nothing listening
    try:
        code = b.wait(5)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"worker B was still running 5 s after the coordinator exited "
                             f"({coord_gone - told:.1f} s after B was told to wait):\n"
                             f"{procs.log('b')[-3000:]}") from None
    assert code == ExitCode.OK, procs.log("b")[-3000:]
    b_log = procs.log("b")
    assert "the run is finished" in b_log
    assert "unreachable" not in b_log, b_log[-3000:]


def test_a_linger_too_short_for_a_waiting_worker_is_said_at_start(procs: Procs, tmp_path: Path) -> None:
    # --linger 0 caps no wait (no end is served to hear): the operator is told what that costs
    port = free_port()
    coord = procs.start("coord", "coordinator", "--model", "vcasync.examples.digits:model",
                        "--shards", "1", "--epochs", "1", "--steps", "5",
                        "--storage", f"file://{tmp_path / 'store'}", "--port", str(port), "--linger", "0")
    wait_until("the coordinator", lambda: "coordinator listening" in procs.log("coord"), 90)
    coord.send_signal(signal.SIGTERM)
    assert coord.wait(30) == ExitCode.INTERRUPTED, procs.log("coord")[-3000:]
    log = procs.log("coord")
    assert "WARNING vcasync.cli: --linger 0 (run.linger_s): the coordinator exits as soon as the run " \
           "is finished" in log, log[-3000:]
    assert "retry for their --give-up-after" in log


def test_workers_retrying_a_crashed_coordinator_hear_the_end_from_the_one_that_takes_over(
        procs: Procs, tmp_path: Path) -> None:
    """A coordinator SIGKILLed while it lingered leaves workers that never heard the end; they retry
    the unreachable coordinator up to 10 s apart (the worker's reconnect back-off, full jitter). The
    start that takes the finished run over served only ``--linger`` (5 s here): every one of them
    missed it and retried for its --give-up-after. It now serves at least twice that back-off."""
    gate = tmp_path / "gate"
    procs.env["GATED_TRAINER_GATE"] = str(gate)
    port = free_port()
    args = list(coordinator_args(tmp_path, port))
    args[args.index("--linger") + 1] = "5"
    coord = procs.start("coord", *args)

    def worker(name: str) -> subprocess.Popen[bytes]:
        return gated_worker(procs, tmp_path, port, name, 90)

    a = worker("a")
    wait_until("worker A's lease", lambda: '"POST /v1/leases HTTP/1.1" 201' in procs.log("coord"), 90)
    waiting = {name: worker(name) for name in ("b", "c", "d")}
    wait_until("the others told to wait",
               lambda: procs.log("coord").count('"POST /v1/leases HTTP/1.1" 503') >= 3, 90)
    for w in waiting.values():          # asleep: none asks while the run is still served
        w.send_signal(signal.SIGSTOP)
    gate.touch()
    wait_until("the end of the run", lambda: "more so workers hear it" in procs.log("coord"), 60)
    # A must hear the end before the kill: the coordinator logs its linger before A's next request,
    # and an A that asks after the kill retries the dead coordinator for its --give-up-after (CI saw
    # it). The kill must still land while the coordinator lingers: 5 s here, not 2.
    wait_until("worker A told the run is finished",
               lambda: '"POST /v1/leases HTTP/1.1" 410' in procs.log("coord"), 60)
    coord.send_signal(signal.SIGKILL)
    coord.wait(10)
    for w in waiting.values():
        w.send_signal(signal.SIGCONT)
    assert a.wait(30) == ExitCode.OK, procs.log("a")[-3000:]
    time.sleep(20)                      # the workers' reconnect back-off grows to its 10 s
    again = procs.start("again", *args)
    for name, w in waiting.items():
        try:
            code = w.wait(40)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {name} never heard the end:\n{procs.log(name)[-2000:]}\n"
                                 f"{procs.log('again')[-2000:]}") from None
        assert code == ExitCode.OK, procs.log(name)[-3000:]
        assert "the run is finished" in procs.log(name)
    assert again.wait(40) == ExitCode.OK, procs.log("again")[-3000:]
    assert "its coordinator stopped uncleanly, so serving 20s" in procs.log("again")


def test_a_worker_joining_while_a_finished_run_lingers_with_its_storage_down_exits_0(
        procs: Procs, tmp_path: Path) -> None:
    """A join writes the worker's token: joining while the finished run lingered with its storage
    gone, a worker was told ``503 storage_unavailable``, waited out the linger, retried the
    coordinator that had exited for its --give-up-after and exited 1. The end is said first."""
    gate = tmp_path / "gate"
    procs.env["GATED_TRAINER_GATE"] = str(gate)
    port = free_port()
    args = list(coordinator_args(tmp_path, port))
    # long enough for the late worker's process to start and join on a loaded machine (CI's first
    # failure here: 6 s, and the worker's first request came after the coordinator had exited)
    args[args.index("--linger") + 1] = "30"
    coord = procs.start("coord", *args)
    a = gated_worker(procs, tmp_path, port, "a", 60)
    wait_until("worker A's lease", lambda: '"POST /v1/leases HTTP/1.1" 201' in procs.log("coord"), 90)
    gate.touch()
    assert a.wait(30) == ExitCode.OK, procs.log("a")[-3000:]
    wait_until("the end of the run", lambda: "more so workers hear it" in procs.log("coord"), 30)
    store = tmp_path / "store"
    store.rename(tmp_path / "store.gone")           # the storage is gone: every write fails
    store.write_text("not a directory")
    late = gated_worker(procs, tmp_path, port, "late", 60)
    try:
        code = late.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the late worker never heard the end:\n{procs.log('late')[-3000:]}") from None
    assert code == ExitCode.OK, procs.log("late")[-3000:]
    assert "the run is finished: cannot join" in procs.log("late")
    assert '"POST /v1/join HTTP/1.1" 410' in procs.log("coord")
    coord.send_signal(signal.SIGTERM)   # no need to wait out the linger; its final snapshot
    coord.wait(60)                      # cannot be written either: not this test's business


def test_a_worker_whose_unit_was_delivered_elsewhere_hears_the_end_at_a_heartbeat(
        procs: Procs, tmp_path: Path) -> None:
    """Worker A's lease expires (its trainer reports no progress) and B delivers the unit: the run
    is finished. A stopped heartbeating at its first ``410 lease_expired`` and heartbeated only
    every 2 s (longer than the 2 s linger): it trained on, uploaded to a coordinator long gone and
    retried for its --give-up-after, then exited 1. Now it heartbeats on (every second: half the
    linger), hears ``410 run_finished``, and exits 0 once its trainer returns, even with the
    coordinator gone by then (this trainer is slow to stop: it ignores ``ctx.should_stop``)."""
    (tmp_path / "run.toml").write_text("[coordinator]\nheartbeat_interval_s = 2.0\n")
    port = free_port()
    args = list(coordinator_args(tmp_path, port))
    args[args.index("--lease-timeout") + 1] = "6"
    coord = procs.start("coord", *args, "--config", str(tmp_path / "run.toml"))
    gate_a, gate_b = tmp_path / "gate_a", tmp_path / "gate_b"
    gate_b.touch()
    procs.env.update(GATED_TRAINER_GATE=str(gate_a), GATED_TRAINER_DEAF="1")
    a = gated_worker(procs, tmp_path, port, "a", 60)
    wait_until("worker A's lease", lambda: '"POST /v1/leases HTTP/1.1" 201' in procs.log("coord"), 90)
    procs.env.update(GATED_TRAINER_GATE=str(gate_b), GATED_TRAINER_DEAF="")
    b = gated_worker(procs, tmp_path, port, "b", 60)
    assert b.wait(60) == ExitCode.OK, procs.log("b")[-3000:]
    assert coord.wait(30) == ExitCode.OK, procs.log("coord")[-3000:]
    assert "/heartbeat HTTP/1.1\" 410" in procs.log("coord"), procs.log("coord")[-3000:]
    assert "the run is finished (said at a heartbeat)" not in procs.log("a")  # said once it returns
    gate_a.touch()                          # A's trainer returns: the coordinator is gone
    try:
        code = a.wait(15)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"worker A never heard the end:\n{procs.log('a')[-3000:]}") from None
    log = procs.log("a")
    assert code == ExitCode.OK, log[-3000:]
    assert "the run is finished (said at a heartbeat)" in log
    assert "is gone" in log, log[-3000:]
    assert "after it said the run is finished" in log, log[-3000:]


def test_final_weights_that_cannot_be_written_leave_the_workers_told_and_the_start_after_says_so(
        procs: Procs, tmp_path: Path) -> None:
    """Found by a probe: the --output directory removed mid-run (a full disk, a permission taken
    away alike) crashed the coordinator as the run finished, a traceback before it lingered: its
    workers were never told the run is finished and retried for their --give-up-after. It now logs
    why at ERROR, lingers so they hear the end, and exits 1; a start on the finished run with the
    same output does the same without serving work, and one with an output it can write writes it."""
    gate = tmp_path / "gate"
    procs.env["GATED_TRAINER_GATE"] = str(gate)
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    (out / ".final.pt.tmp").mkdir()         # what the weights are saved to first: not a file
    args = [*coordinator_args(tmp_path, port), "--output", str(out / "final.pt")]
    coord = procs.start("coord", *args)
    a = gated_worker(procs, tmp_path, port, "a", 60)
    wait_until("worker A's lease", lambda: '"POST /v1/leases HTTP/1.1" 201' in procs.log("coord"), 90)
    gate.touch()
    assert a.wait(60) == ExitCode.OK, procs.log("a")[-3000:]
    assert "the run is finished" in procs.log("a")
    assert coord.wait(30) == ExitCode.ERROR, procs.log("coord")[-3000:]
    log = procs.log("coord")
    assert "Traceback" not in log, log[-3000:]
    assert f"could not be written to {out / 'final.pt'}" in log
    assert "serving 2s more so workers hear it" in log
    assert not (out / "final.pt").exists()

    again = procs.start("again", *args)
    assert again.wait(60) == ExitCode.ERROR, procs.log("again")[-3000:]
    assert "exiting with status 1: the final weights (model v1) could not be written" \
        in procs.log("again")
    args[-1] = str(tmp_path / "final.pt")
    fixed = procs.start("fixed", *args)
    assert fixed.wait(60) == ExitCode.OK, procs.log("fixed")[-3000:]
    assert (tmp_path / "final.pt").exists()
