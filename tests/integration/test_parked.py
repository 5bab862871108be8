"""Issue 13 with the real commands: a unit is never given up on silently.

A ``vcasync worker`` whose trainer always raises is backed off and gives up with a trainer error (exit
1, not "configuration error") without getting the unit parked on its own; once a second worker failed
it too the unit is parked, logged with its last failure, and ``vcasync requeue`` (operator token, never
the join secret) queues it again without a restart; a run that ends with a parked unit exits 3. A
trainer whose integer buffer goes down fails its units in the worker, named, and the run ends too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from harness.fleet import toml_text
from tests._procs import wait_until
from vcasync.cli import ExitCode

from .conftest import HERE, SECRET, Procs, free_port

OPERATOR = "operator-token-for-tests-5a9e7c3b1d"


def call(url: str, path: str, body: dict[str, Any] | None, token: str | None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method="POST" if data is not None else "GET",
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def fail_once(url: str, name: str) -> str:
    """A worker (raw HTTP) that leases the unit and hands it back as failed; returns its token."""
    status, joined = call(url, "/v1/join", {"name": name}, SECRET)
    assert status == 200, joined
    token = joined["token"]
    status, grant = call(url, "/v1/leases", {}, token)
    assert status == 201, grant
    status, body = call(url, f"/v1/leases/{grant['lease_id']}/release",
                        {"reason": f"trainer error: {name} broke", "failed": True}, token)
    assert status == 200, body
    return token


def units(url: str, token: str) -> dict[str, int]:
    status, body = call(url, "/v1/status", None, token)
    assert status == 200, body
    return dict(body["units"])


@pytest.mark.slow
def test_parked_unit_is_logged_requeued_by_the_operator_and_ends_the_run_with_exit_3(
        procs: Procs, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "run.toml").write_text(toml_text({
        "model": {"factory": "vcasync.examples.digits:model"},
        "units": {"shards": 1, "epochs": 1, "steps": 2},
        "storage": {"url": f"file://{tmp_path / 'store'}"},
        "coordinator": {"durability": "journal", "max_attempts": 2, "park_after_workers": 2,
                        "worker_backoff_s": 0.2},
        "server": {"host": "127.0.0.1", "port": port},
        "run": {"linger_s": 120.0},
    }))
    (tmp_path / "operator").write_text(OPERATOR + "\n")
    coord = procs.start("coord", "coordinator", "--config", str(tmp_path / "run.toml"),
                        "--operator-token-file", str(tmp_path / "operator"))
    wait_until("the coordinator", lambda: coord.poll() is not None or _healthy(url), 90)
    assert coord.poll() is None, procs.log("coord")

    # One machine whose trainer always raises: backed off, then it gives up, as a trainer error.
    bad = procs.start("bad", "worker", "--coordinator", url, "--trainer", "raising_trainer:train",
                      "--app-dir", str(HERE), "--state-dir", str(tmp_path / "bad"))
    assert bad.wait(120) == ExitCode.ERROR, procs.log("bad")
    bad_log = procs.log("bad")
    assert "TrainerError: the trainer failed 3 units in a row" in bad_log
    assert "configuration error" not in bad_log
    assert bad_log.count("backing off") >= 2
    token = fail_once(url, "second")                       # ... until a second worker fails it too
    assert units(url, token) == {"queued": 0, "leased": 0, "done": 0, "parked": 1}
    wait_until("the parked log line", lambda: "unit e0-s0 parked" in procs.log("coord"), 30)
    assert "second broke" in procs.log("coord")             # its last failure, named

    # Requeueing needs the operator token: not the join secret, not a worker token.
    for cred in (None, SECRET, token, "not-the-operator-token"):
        status, body = call(url, "/v1/units/requeue", {}, cred)
        assert (status, body["error"]) == (401, "unauthorized"), (cred, body)
    env = {**os.environ, "VCASYNC_OPERATOR_TOKEN": OPERATOR}
    out = subprocess.run([sys.executable, "-P", "-m", "vcasync", "requeue", "--coordinator", url,
                          "--unit", "e0-s0"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == ExitCode.OK, out.stderr
    assert json.loads(out.stdout) == {"requeued": ["e0-s0"]}
    assert units(url, token) == {"queued": 1, "leased": 0, "done": 0, "parked": 0}
    wait_until("the run going on", lambda: "the run goes on" in procs.log("coord"), 30)
    assert coord.poll() is None                            # no restart

    for name in ("third", "fourth"):                       # it fails again on two workers
        fail_once(url, name)
    assert units(url, token)["parked"] == 1
    wait_until("the run to finish again", lambda: procs.log("coord").count("run finished") >= 2, 30)
    coord.send_signal(signal.SIGTERM)
    assert coord.wait(60) == ExitCode.PARKED
    log = procs.log("coord")
    assert "1 parked unit(s), never merged: exit code 3" in log
    assert OPERATOR not in log
    assert SECRET not in log

    # Started again on the same storage, the run (finished with a parked unit) is served, not
    # exited at once: operating.md says "requeue them and start the coordinator again", and a
    # start that exited at once left nothing to requeue on.
    again = procs.start("again", "coordinator", "--config", str(tmp_path / "run.toml"),
                        "--operator-token-file", str(tmp_path / "operator"))
    wait_until("the restarted coordinator", lambda: again.poll() is not None or _healthy(url), 90)
    assert again.poll() is None, procs.log("again")
    wait_until("the parked notice", lambda: "ended with 1 parked unit(s); serving" in procs.log("again"), 30)
    out = subprocess.run([sys.executable, "-P", "-m", "vcasync", "requeue", "--coordinator", url],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == ExitCode.OK, out.stderr
    assert units(url, fail_once(url, "fifth")) == {"queued": 1, "leased": 0, "done": 0, "parked": 0}
    again.send_signal(signal.SIGTERM)
    assert again.wait(60) == ExitCode.INTERRUPTED


@pytest.mark.slow
def test_a_buffer_that_goes_down_stops_the_worker_named_and_the_run_ends_parked(
        procs: Procs, tmp_path: Path) -> None:
    # Found by a probe: the worker uploaded ~50 results a second, each rejected as
    # negative_increment, for ever (no back-off, no exit, a journal entry per refusal).
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "run.toml").write_text(toml_text({
        "model": {"factory": "cursor_trainer:model"},
        "units": {"count": 1, "steps": 1},
        "storage": {"url": f"file://{tmp_path / 'store'}"},
        "coordinator": {"max_attempts": 3, "park_after_workers": 1, "worker_backoff_s": 0.2},
        "server": {"host": "127.0.0.1", "port": port},
        "run": {"linger_s": 1.0},
    }))
    coord = procs.start("coord", "coordinator", "--config", str(tmp_path / "run.toml"),
                        "--app-dir", str(HERE))
    wait_until("the coordinator", lambda: coord.poll() is not None or _healthy(url), 90)
    assert coord.poll() is None, procs.log("coord")
    worker = procs.start("w", "worker", "--coordinator", url, "--trainer", "cursor_trainer:train",
                         "--app-dir", str(HERE), "--state-dir", str(tmp_path / "w"))
    assert worker.wait(60) == ExitCode.ERROR, procs.log("w")[-3000:]
    log = procs.log("w")
    assert "integer tensor 'cursor' went down from 5 to 1: integer tensors are counters that may " \
           "only grow" in log
    assert "make it a float buffer, or keep it out of the state dict" in log
    assert "TrainerError: the trainer failed 3 units in a row" in log
    assert "rejected" not in log                         # found before any upload
    assert coord.wait(60) == ExitCode.PARKED, procs.log("coord")[-3000:]
    assert "unit e0-s0 parked" in procs.log("coord")
    assert "cursor" in procs.log("coord")                 # the unit's last failure names it


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False
