"""One live coordinator per run, seen through real ``vcasync coordinator`` processes on a file store.

A second coordinator on a running run exits with the STORAGE status (4) naming the first (host, pid,
since), before it reads or serves anything, also in the case docs/runs.md used to call a hole (a
second coordinator that would have taken no result until the first finished and pruned its
journal); a SIGKILLed coordinator restarted on the same machine takes its run over at once; one that
was paused past its TTL and taken over stops with the STORAGE status when it wakes.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vcasync.cli import ExitCode
from vcasync.errors import NoWorkAvailableError
from vcasync.storage import open_storage

from .test_runs_cli import Coord, _status, start, start_worker

REFUSED = "is in use by a live coordinator"


@pytest.fixture
def procs() -> Iterator[list[Coord]]:
    """Every coordinator a test starts; any still running is killed (by its own pid) at the end."""
    started: list[Coord] = []
    yield started
    for c in started:
        if c.proc.poll() is None:
            c.proc.send_signal(signal.SIGCONT)
            c.proc.kill()
            c.proc.wait()


def toml(tmp: Path, ttl: float) -> str:
    path = tmp / f"owner-{ttl:g}.toml"
    path.write_text(f"[coordinator]\nowner_ttl_s = {ttl}\n")
    return str(path)


def check_refused(second: Coord, first: Coord) -> None:
    assert second.wait() == ExitCode.STORAGE
    log = second.log()
    assert REFUSED in log, log[-3000:]
    assert f"pid {first.proc.pid}, since " in log
    assert "state_prefix" in log
    assert not second.port_file.exists()          # it never served


def test_a_second_coordinator_on_a_running_run_is_refused_with_exit_4(tmp_path: Path,
                                                                      procs: list[Coord]) -> None:
    storage = (tmp_path / "store").as_uri()
    config = toml(tmp_path, 3.0)
    first = start(procs, tmp_path, storage, "--units", "4", "--config", config)
    url = first.ready()
    run_id = asyncio.run(_status(url))["run_id"]
    second = start(procs, tmp_path, storage, "--units", "4", "--config", config, name="second")
    check_refused(second, first)
    assert asyncio.run(_status(url))["run_id"] == run_id       # the first serves on, untouched
    first.stop()
    assert "released the run under 'vcasync'" in first.log()


def test_a_killed_coordinator_restarted_on_its_machine_takes_over_at_once(
        tmp_path: Path, procs: list[Coord]) -> None:
    storage = (tmp_path / "store").as_uri()
    first = start(procs, tmp_path, storage, "--units", "4")        # the default TTL: 30 s
    run_id = asyncio.run(_status(first.ready()))["run_id"]
    first.stop(signal.SIGKILL)                                      # no release
    began = time.monotonic()
    again = start(procs, tmp_path, storage, "--units", "4", name="again")
    url = again.ready()
    assert time.monotonic() - began < 25, "waited out the TTL"
    log = again.log()
    assert "its process no longer runs); taking over" in log, log[-3000:]
    assert f"pid {first.proc.pid}" in log
    assert asyncio.run(_status(url))["run_id"] == run_id
    again.stop()


@pytest.mark.slow
def test_a_second_coordinator_that_would_outlive_the_first_is_refused(tmp_path: Path,
                                                                       procs: list[Coord]) -> None:
    # The hole docs/runs.md named: a second coordinator on the run, taking no result while the
    # first ran to its end and pruned its journal, then journaling results the next start did not
    # replay. Now it is refused at its start, and the first's run is whole.
    storage = (tmp_path / "store").as_uri()
    args = ("--units", "2", "--steps", "5", "--config", toml(tmp_path, 3.0))
    first = start(procs, tmp_path, storage, *args)
    url = first.ready()
    second = start(procs, tmp_path, storage, *args, name="second")
    check_refused(second, first)
    worker = start_worker(tmp_path, url)
    try:
        assert first.wait(240) == ExitCode.OK
    finally:
        worker.kill()
        worker.wait()
    again = start(procs, tmp_path, storage, *args, name="again")   # released: no wait
    assert again.wait() == ExitCode.OK
    assert "already finished" in again.log()
    assert not again.port_file.exists()     # it served, and stopped listening: its URL is gone

    async def journal() -> list[str]:
        async with open_storage(storage) as st:
            return [k async for k in st.list("vcasync/journal/")]

    assert asyncio.run(journal()) == []       # pruned by the first, and nobody wrote after it


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_a_paused_coordinator_taken_over_stops_when_it_wakes(tmp_path: Path,
                                                             procs: list[Coord]) -> None:
    storage = (tmp_path / "store").as_uri()
    config = toml(tmp_path, 3.0)
    first = start(procs, tmp_path, storage, "--units", "4", "--config", config)
    run_id = asyncio.run(_status(first.ready()))["run_id"]
    first.proc.send_signal(signal.SIGSTOP)        # a long pause: no renewals
    try:
        second = start(procs, tmp_path, storage, "--units", "4", "--config", config,
                       name="second")
        url = second.ready()                      # after one TTL of silence
        assert "; taking over" in second.log()      # stale by one rule or the other
    finally:
        first.proc.send_signal(signal.SIGCONT)
    assert first.wait(60) == ExitCode.STORAGE
    assert "was taken over by another coordinator" in first.log()
    assert asyncio.run(_status(url))["run_id"] == run_id      # the second serves the run
    second.stop()


def _finish_then_kill(procs: list[Coord], tmp_path: Path, storage: str, *args: str) -> str:
    """Start a coordinator (``args``: it must linger) and a worker, wait for the run to finish,
    SIGKILL the coordinator while it lingers; its log."""
    first = start(procs, tmp_path, storage, *args)
    worker = start_worker(tmp_path, first.ready())
    try:
        deadline = time.monotonic() + 240
        while "run finished at model" not in first.log():
            assert time.monotonic() < deadline, first.log()[-3000:]
            time.sleep(0.1)
        first.stop(signal.SIGKILL)                      # while it lingered
    finally:
        worker.kill()
        worker.wait()
    return first.log()


@pytest.mark.slow
def test_a_finished_run_taken_over_from_a_crash_serves_so_its_workers_hear_it_ended(
        tmp_path: Path, procs: list[Coord]) -> None:
    """Found SIGKILLing a coordinator while it lingered after the run's last result and starting
    it again: the start said 'already finished ... nothing to serve' and exited, so the workers
    still waiting on the dead one (for the answer to a lease, or a result's receipt) never heard
    the run had ended, and retried for --give-up-after (an hour by default) on billed machines.
    A finished run taken over from a coordinator that stopped uncleanly now serves linger_s, as a
    run that finishes while served does; a clean stop's finished run still exits at once."""
    storage = (tmp_path / "store").as_uri()
    args = ("--units", "2", "--steps", "5")
    _finish_then_kill(procs, tmp_path, storage, *args, "--linger", "600")
    again = start(procs, tmp_path, storage, *args, "--linger", "5", name="again")
    with pytest.raises(NoWorkAvailableError) as heard:   # it serves: a worker calling in hears it
        asyncio.run(_status(again.ready()))              # (a join to a finished run: 410)
    assert heard.value.finished, heard.value
    assert again.wait() == ExitCode.OK
    assert "already finished" in again.log()
    assert not again.port_file.exists()     # it served, and stopped listening: its URL is gone
    last = start(procs, tmp_path, storage, *args, name="last")   # after a clean stop: at once
    assert last.wait() == ExitCode.OK
    assert not last.port_file.exists()


@pytest.mark.slow
def test_a_finished_snapshot_mode_run_keeps_its_version_across_crashes(
        tmp_path: Path, procs: list[Coord]) -> None:
    """Found by a probe: in durability "snapshot", SIGKILLing a finished run's coordinator while
    it lingered, and each coordinator started again on it, added about 1,000 to the model version
    every time (v24, then v1001, v2002, ...), so --output and the status named another version
    after each crash. The snapshot said the run was finished and held every result: nothing can
    have been served above it, so there is nothing to renumber."""
    storage = (tmp_path / "store").as_uri()
    args = ("--units", "2", "--steps", "5", "--durability", "snapshot", "--linger", "600")
    end = re.search(r"run finished at model v(\d+)", _finish_then_kill(procs, tmp_path, storage, *args))
    assert end is not None
    version = int(end.group(1))
    for n in range(3):
        again = start(procs, tmp_path, storage, *args, name=f"again{n}")
        again.ready()                                   # serving, for the workers to hear the end
        said = re.search(r"already finished at model v(\d+)", again.log())
        assert said is not None, again.log()[-3000:]
        assert int(said.group(1)) == version, again.log()[-3000:]
        again.stop(signal.SIGKILL)                      # while it lingered, again
    last = start(procs, tmp_path, storage, *args, "--output", str(tmp_path / "final.pt"),
                 name="last")
    last.ready()
    last.stop()
    assert f"already finished at model v{version}" in last.log(), last.log()[-3000:]
