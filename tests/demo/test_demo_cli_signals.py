"""``vcasync demo``'s own handling of SIGHUP and of a SIGTERM after its processes have stopped, in
process (the run, the baseline and the report are stand-ins; no process is started).

* SIGHUP (its terminal closed, ``kill -HUP PID``) had its default action: the demo ended at once,
  exit 129, and left its coordinator (``--linger 600``) and workers running with nobody to stop them.
* SIGTERM while the report was written had its default action too (the demo's handler was given back
  once the DDP baseline was done): exit 143, no word, a ``report.json`` without its plots.
* A Ctrl-C after a SIGTERM cancelled the demo's clean-up part way (asyncio's own SIGINT handler).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (vcasync[demo])")

from vcasync.demo import cli as demo_cli
from vcasync.demo import ddp, report, run


@pytest.fixture
def caught() -> Iterator[list[int]]:
    """SIGTERM and SIGHUP caught by the test while it runs (the demo's handler is given back after
    it): a signal that reaches this recorder is one the demo did not handle."""
    seen: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    before = {s: signal.signal(s, record) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield seen
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _args(tmp_path: Path) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    demo_cli.configure(p)
    return p.parse_args(["--quick", "--no-progress", "--run-dir", str(tmp_path / "run")])


def _fleet(tmp_path: Path) -> Any:
    return SimpleNamespace(timeline=SimpleNamespace(t0=time.monotonic()), total_units=1, unit_steps=1,
                           run_dir=tmp_path, finished=True)


def _never(*_a: Any, **_k: Any) -> Any:
    raise AssertionError("the demo went on after the signal")


def test_sighup_during_the_fleet_stops_it_as_sigterm_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caught: list[int]) -> None:
    cancelled: list[bool] = []

    async def fleet(_cfg: Any) -> Any:
        os.kill(os.getpid(), signal.SIGHUP)
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:       # run_demo stops its processes here
            cancelled.append(True)
            raise
        return _fleet(tmp_path)

    monkeypatch.setattr(run, "run_demo", fleet)
    monkeypatch.setattr(ddp, "run_ddp", _never)
    with pytest.raises(KeyboardInterrupt):   # the CLI's exit 130
        demo_cli.run(_args(tmp_path))
    assert cancelled == [True]
    assert caught == []
    assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, demo_cli._sigterm_interrupts)


def test_sigterm_while_the_report_is_written_is_an_interrupt_that_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caught: list[int],
        capsys: pytest.CaptureFixture[str]) -> None:
    async def fleet(_cfg: Any) -> Any:
        return _fleet(tmp_path)

    def write(_report: Any, _run_dir: Path) -> list[Path]:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)                      # the handler runs in the main thread, here
        return []

    monkeypatch.setattr(run, "run_demo", fleet)
    monkeypatch.setattr(ddp, "run_ddp", lambda *_a, **_k: None)
    monkeypatch.setattr(report, "build_report", lambda *_a, **_k: {})
    monkeypatch.setattr(report, "write_report", write)
    with pytest.raises(KeyboardInterrupt):
        demo_cli.run(_args(tmp_path))
    assert caught == []
    assert "interrupted while writing the report" in capsys.readouterr().err


def test_a_ctrl_c_after_a_sigterm_does_not_cut_the_clean_up_short(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caught: list[int]) -> None:
    # asyncio's runner cancels the task on a first SIGINT whether or not it is being cancelled
    # already: after a SIGTERM, the SIGINT cancelled run_demo's clean-up part way, and the demo
    # exited with its coordinator serving (seen with `kill PID; kill -INT PID`)
    cleaned: list[str] = []

    async def fleet(_cfg: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(5)
        finally:                             # run_demo stops its workers, then its coordinator
            cleaned.append("workers")
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(0.3)
            cleaned.append("coordinator")
        return _fleet(tmp_path)

    monkeypatch.setattr(run, "run_demo", fleet)
    monkeypatch.setattr(ddp, "run_ddp", _never)
    with pytest.raises(KeyboardInterrupt):
        demo_cli.run(_args(tmp_path))
    assert cleaned == ["workers", "coordinator"]
    assert caught == []


@pytest.mark.parametrize(("sigint", "sent", "interrupts"), [
    (signal.default_int_handler, signal.SIGTERM, True),
    (signal.default_int_handler, signal.SIGINT, True),
    (signal.SIG_IGN, signal.SIGTERM, True),
    (signal.SIG_IGN, signal.SIGINT, False),    # inherited ignored (a job started with &): ignored
])
def test_a_signal_held_while_the_command_started_interrupts_the_demo(
        sigint: Any, sent: int, interrupts: bool, caught: list[int]) -> None:
    """vcasync.cli.main holds SIGTERM and SIGINT from its first moment; the demo gave the held one
    back to its default handling (SIGTERM: exit 143, no word) before its own handlers were set."""
    from vcasync import _early_signals

    before = signal.signal(signal.SIGINT, sigint)
    previous: dict[int, Any] = {}
    try:
        _early_signals.hold()
        os.kill(os.getpid(), sent)
        assert _early_signals.received() == sent
        if interrupts:
            with pytest.raises(KeyboardInterrupt):
                demo_cli._take_signals(previous)
        else:
            demo_cli._take_signals(previous)
        assert signal.getsignal(signal.SIGTERM) is demo_cli._sigterm_interrupts
        assert signal.getsignal(signal.SIGINT) is sigint
    finally:
        _early_signals.release(act=False)
        for s, handler in previous.items():
            signal.signal(s, handler)
        signal.signal(signal.SIGINT, before)
    assert caught == []
