"""A worker that exits cleanly says so (``POST /v1/leave``): the status stops counting it alive at once.

Real processes on 127.0.0.1: a ``vcasync coordinator`` with one unit, worker A holding it (its
trainer waits for a gate file) and worker B told "no unit now". Until 2026-12-07 a worker that
exited cleanly (B on SIGTERM while it waited, A after ``410 run_finished``) was counted alive, and
shown ``alive`` on the status page, until twice the lease timeout had passed (here 120 s); so was,
until 2026-12-07, one that ended on an error (its trainer raising on every unit)."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from harness.fleet import toml_text
from vcasync.cli import ExitCode

from .conftest import HERE, Procs, free_port
from .test_fleet import wait_until
from .test_linger import gated_worker

pytestmark = pytest.mark.slow


def coordinator_args(tmp_path: Path, port: int) -> tuple[str, ...]:
    """One unit of digits, a lease timeout of 60 s (workers stay alive 120 s unheard), lingering long
    enough for the test to read the status after the run is finished."""
    return ("coordinator", "--model", "vcasync.examples.digits:model", "--shards", "1", "--epochs", "1",
            "--steps", "5", "--storage", f"file://{tmp_path / 'store'}", "--lease-timeout", "60",
            "--port", str(port), "--linger", "300")


def status_data(port: int) -> dict[str, Any]:
    """``GET /status/data`` (loopback, by address: no credential needed)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status/data", timeout=10) as r:
        data: dict[str, Any] = json.loads(r.read())
    return data


def worker_ids(procs: Procs, *names: str) -> dict[str, str]:
    ids = {}
    for name in names:
        line = next(x for x in procs.log(name).splitlines() if "joined as worker" in x)
        ids[name] = line.split("joined as worker", 1)[1].split()[0].strip(".,:;()")
    return ids


def states(port: int) -> tuple[dict[str, Any], dict[str, str]]:
    data = status_data(port)
    return data["status"]["workers"], {row["id"]: row["state"] for row in data["live"]["worker_rows"]}


def test_a_worker_leaving_cleanly_is_no_longer_counted_alive(procs: Procs, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    procs.env["GATED_TRAINER_GATE"] = str(gate)
    port = free_port()
    procs.start("coord", *coordinator_args(tmp_path, port))
    a = gated_worker(procs, tmp_path, port, "a", 60)
    wait_until("worker A's lease", lambda: '"POST /v1/leases HTTP/1.1" 201' in procs.log("coord"), 90)
    b = gated_worker(procs, tmp_path, port, "b", 60)
    wait_until("worker B told to wait", lambda: '"POST /v1/leases HTTP/1.1" 503' in procs.log("coord"), 90)
    ids = worker_ids(procs, "a", "b")
    workers, rows = states(port)
    assert workers["alive"] == 2
    assert rows == {ids["a"]: "alive", ids["b"]: "alive"}

    b.send_signal(signal.SIGTERM)          # idle, waiting for work: a clean exit
    assert b.wait(30) == ExitCode.OK, procs.log("b")[-3000:]
    workers, rows = states(port)
    assert workers["alive"] == 1, (workers, procs.log("b")[-2000:])
    assert workers["left"] == 1
    assert rows == {ids["a"]: "alive", ids["b"]: "left"}

    gate.touch()                           # A delivers the only unit, hears 410 run_finished, exits
    assert a.wait(60) == ExitCode.OK, procs.log("a")[-3000:]
    workers, rows = states(port)
    assert (workers["alive"], workers["left"]) == (0, 2)
    assert rows == {ids["a"]: "left", ids["b"]: "left"}
    events = [e for e in status_data(port)["live"]["events"] if e["kind"] == "left"]
    assert {e["worker"] for e in events} == set(ids.values())



def test_a_worker_ending_on_an_error_leaves_too(procs: Procs, tmp_path: Path) -> None:
    """A worker whose trainer raises on every unit ends with a trainer error (exit 1): until
    2026-12-07 it sent no leave, and the status counted it alive (here: for 120 s) after it was gone.
    It now leaves as a clean exit does, the reason naming the error's type (not its message)."""
    port = free_port()
    (tmp_path / "run.toml").write_text(toml_text({
        "model": {"factory": "vcasync.examples.digits:model"},
        "units": {"shards": 1, "epochs": 1, "steps": 2},
        "storage": {"url": f"file://{tmp_path / 'store'}"},
        "coordinator": {"lease_timeout_s": 60.0, "worker_backoff_s": 0.2},
        "server": {"host": "127.0.0.1", "port": port},
        "run": {"linger_s": 300.0},
    }))
    procs.start("coord", "coordinator", "--config", str(tmp_path / "run.toml"))
    wait_until("the coordinator", lambda: "status page:" in procs.log("coord"), 90)
    bad = procs.start("bad", "worker", "--coordinator", f"http://127.0.0.1:{port}", "--trainer",
                      "raising_trainer:train", "--app-dir", str(HERE), "--state-dir", str(tmp_path / "bad"))
    assert bad.wait(120) == ExitCode.ERROR, procs.log("bad")[-3000:]
    assert "TrainerError: the trainer failed 3 units in a row" in procs.log("bad")
    (worker,) = worker_ids(procs, "bad").values()
    workers, rows = states(port)
    assert (workers["alive"], workers["left"]) == (0, 1), (workers, procs.log("bad")[-2000:])
    assert rows == {worker: "left"}
    (event,) = [e for e in status_data(port)["live"]["events"] if e["kind"] == "left"]
    assert (event["worker"], event["detail"]) == (worker, "error: TrainerError")
