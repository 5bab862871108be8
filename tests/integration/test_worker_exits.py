"""How a ``vcasync worker`` process ends with ``--state URL``: the same one line and exit status as with
``--state-dir`` (a grace period exceeded after SIGTERM exits 0, a refused join secret exits 2 as a
configuration error), never an exception-group traceback; without ``--state-dir`` the temporary local
cache (it holds the worker's token) is gone when the process ends, on those paths too; a store that
ignores conditional writes is refused (exit 2) unless ``--allow-unsafe-store``, as a coordinator's is;
a worker restarted after its run finished (Kubernetes restarts every exit) is done at once."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from vcasync.cli import ExitCode
from vcasync.testing.emulators import Emulator

from .conftest import HERE, Procs, free_port
from .test_remote_state import BUCKET, http, start_coordinator, state_url, stored, wait_until

pytestmark = pytest.mark.slow


def private_tmp(procs: Procs, tmp_path: Path) -> Path:
    """The worker's TMPDIR: where its temporary local cache goes, watched by the test alone."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    procs.env["TMPDIR"] = str(tmp)
    return tmp


def test_sigterm_past_the_grace_period_with_remote_state_exits_0_with_one_line(
        procs: Procs, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = state_url("file", tmp_path, request)
    tmp = private_tmp(procs, tmp_path)
    coordinator = start_coordinator(procs, tmp_path)
    worker = procs.start("w", "worker", "--coordinator", coordinator, "--trainer", "stubborn_trainer:train",
                         "--app-dir", str(HERE), "--state", url, "--grace-period", "2")
    wait_until("the worker holding a lease", lambda: bool(stored(url, "lease.json")))
    (cache,) = tmp.iterdir()
    assert (cache / "identity.json").exists()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, procs.log("w")[-3000:]
    log = procs.log("w")
    assert "grace period of 2.0s exceeded; leaving the lease for a restart" in log
    assert "Traceback" not in log
    assert stored(url, "lease.json") == ["lease.json"]      # left for a restart, as with --state-dir
    assert list(tmp.iterdir()) == []                        # the cache and the token in it are gone


def test_a_refused_join_secret_with_remote_state_is_one_line_and_exit_2(
        procs: Procs, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = state_url("file", tmp_path, request)
    tmp = private_tmp(procs, tmp_path)
    coordinator = start_coordinator(procs, tmp_path)
    procs.env["VCASYNC_JOIN_SECRET"] = "not-the-join-secret-of-this-run"
    worker = procs.start("w", "worker", "--coordinator", coordinator, "--trainer", "stubborn_trainer:train",
                         "--app-dir", str(HERE), "--state", url)
    assert worker.wait(60) == ExitCode.CONFIG, procs.log("w")[-3000:]    # a wrong secret: configuration
    log = procs.log("w")
    assert "vcasync worker: configuration error: the coordinator at" in log
    assert "refused this worker's join secret" in log
    assert "Traceback" not in log
    assert list(tmp.iterdir()) == []


@pytest.fixture(scope="module")
def stock_gcs() -> Iterator[str]:
    """gcp-storage-emulator as shipped: it takes ``ifGenerationMatch=0`` on an existing object."""
    with Emulator("gcs", preconditions=False) as gcs:
        http("POST", f"{gcs.endpoint}/storage/v1/b?project=test", json.dumps({"name": BUCKET}).encode(),
             {"Content-Type": "application/json"})
        yield gcs.endpoint


def test_a_state_store_that_ignores_conditional_writes_is_refused_unless_allowed(
        procs: Procs, tmp_path: Path, stock_gcs: str) -> None:
    url = f"gs://{BUCKET}/w-{uuid.uuid4().hex[:10]}?emulator_host={stock_gcs}"
    args = ["--trainer", "stubborn_trainer:train", "--app-dir", str(HERE), "--state", url,
            "--grace-period", "1"]
    refused = procs.start("refused", "worker", "--coordinator", "http://127.0.0.1:9", *args)
    assert refused.wait(60) == ExitCode.CONFIG, procs.log("refused")[-3000:]
    log = procs.log("refused")
    assert "does not honour conditional writes" in log
    assert "--allow-unsafe-store" in log
    assert "Traceback" not in log

    coordinator = start_coordinator(procs, tmp_path)
    allowed = procs.start("allowed", "worker", "--coordinator", coordinator, *args, "--allow-unsafe-store")
    wait_until("the worker joining", lambda: "joined as worker" in procs.log("allowed"))
    assert "UNSAFE STORE" in procs.log("allowed")
    allowed.send_signal(signal.SIGTERM)
    assert allowed.wait(60) == 0, procs.log("allowed")[-3000:]


def test_a_worker_restarted_after_its_run_finished_exits_0_when_the_coordinator_is_gone(
        procs: Procs, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Kubernetes restarts a container whatever its exit status: the pod of a worker that heard its
    run is finished starts again once its coordinator has stopped lingering (and that coordinator's
    own restarts exit at once, never serving). It is done (exit 0), not retrying for
    --give-up-after (an hour) on a spot node; the same state at a coordinator that serves a new run
    joins and works as before."""
    url = state_url("file", tmp_path, request)
    port = free_port()
    coordinator = f"http://127.0.0.1:{port}"

    def start_coordinator(name: str, store: str) -> subprocess.Popen[bytes]:
        return procs.start(name, "coordinator", "--model", "vcasync.examples.digits:model",
                           "--shards", "1", "--epochs", "1", "--steps", "5",
                           "--storage", f"file://{tmp_path / store}", "--port", str(port), "--linger", "1")

    def serving() -> bool:
        try:
            http("GET", f"{coordinator}/healthz")
        except OSError:
            return False
        return True

    args = ["--coordinator", coordinator, "--trainer", "vcasync.examples.digits:train", "--state", url]
    coord = start_coordinator("coord", "store")
    first = procs.start("w1", "worker", *args)
    assert first.wait(180) == 0, procs.log("w1")[-3000:]
    assert "done (finished)" in procs.log("w1")
    assert coord.wait(60) == 0, procs.log("coord")[-3000:]

    restarted = procs.start("w2", "worker", *args)           # a new pod: an empty local cache
    assert restarted.wait(120) == 0, procs.log("w2")[-3000:]
    log = procs.log("w2")
    assert "is finished; asking the coordinator" in log
    assert "after it said the run is finished: nothing left to do" in log
    assert "Traceback" not in log

    new_run = start_coordinator("coord2", "store2")
    wait_until("the new run's coordinator", lambda: new_run.poll() is None and serving())
    again = procs.start("w3", "worker", *args)
    assert again.wait(180) == 0, procs.log("w3")[-3000:]
    log = procs.log("w3")
    assert "joining as a new worker" in log
    assert re.search(r"result for lease \S+ \(unit \S+\) accepted", log), log[-3000:]
    assert new_run.wait(60) == 0, procs.log("coord2")[-3000:]
