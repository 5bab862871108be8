"""Storage failing while a run is in progress, through the real ``vcasync coordinator`` and
``vcasync worker`` processes against the S3 and GCS API servers the suite runs (moto,
gcp-storage-emulator), broken for real: the bucket deleted under the run, or every connection to the
server refused for a while (a TCP gate between the coordinator and the server).

What must hold: workers are told to wait (``503 storage_unavailable``, which they log as the
coordinator's *storage* being down) and keep their results instead of training into the void; the
operator sees it in the log (ERROR), ``/v1/status`` and ``/metrics``; a short outage loses nothing
and the run finishes (exit 0, the journal pruned behind the final snapshot, ``--output`` written
when the run finishes, not when lingering ends); an outage past the limit ends the coordinator with
``ExitCode.STORAGE``; SIGTERM before the end neither writes ``--output`` nor claims to have.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from vcasync.cli import ExitCode
from vcasync.storage import open_storage
from vcasync.testing.emulators import DUMMY_S3_CREDENTIALS
from vcasync.worker._client import CoordinatorClient

HERE = Path(__file__).resolve().parent
SECRET = "outage-tests-join-secret-5e2a9d"
STEP_S = 0.03           # seconds per training step (outage_app), so units last ~0.3 s


# -- the storage servers: buckets of our own (the shared test bucket must survive) ---------------

def _http(method: str, url: str, body: bytes | None = None) -> int:
    headers = {"Content-Type": "application/json"} if body else {}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


class Bucket:
    """One fresh bucket on a storage API server; ``url(endpoint)`` reaches it through ``endpoint``
    (the server itself, or a gate in front of it)."""

    def __init__(self, kind: str, server: str) -> None:
        self.kind, self.server = kind, server
        self.name = f"outage-{uuid.uuid4().hex[:10]}"
        self.create()

    def create(self) -> None:
        if self.kind == "s3":
            status = _http("PUT", f"{self.server}/{self.name}")
        else:
            status = _http("POST", f"{self.server}/storage/v1/b?project=test",
                           json.dumps({"name": self.name}).encode())
        assert status == 200, f"creating bucket {self.name}: HTTP {status}"

    def url(self, endpoint: str | None = None) -> str:
        endpoint = endpoint or self.server
        if self.kind == "s3":
            return f"s3://{self.name}/run?endpoint_url={endpoint}"
        return f"gs://{self.name}/run?emulator_host={endpoint}"

    def options(self) -> dict[str, Any]:
        return dict(DUMMY_S3_CREDENTIALS) if self.kind == "s3" else {}

    async def keys(self, prefix: str = "") -> list[str]:
        async with open_storage(self.url(), **self.options()) as st:
            return [k async for k in st.list(prefix)]

    async def _empty(self) -> None:
        async with open_storage(self.url(), **self.options()) as st:
            for key in [k async for k in st.list()]:
                await st.delete(key)

    def delete(self) -> None:
        """Delete every object, then the bucket (as an operator's cleanup script would)."""
        where = (f"{self.server}/{self.name}" if self.kind == "s3"
                 else f"{self.server}/storage/v1/b/{self.name}")
        for _ in range(20):      # the coordinator may write between the two
            asyncio.run(self._empty())
            if _http("DELETE", where) in (200, 204):
                return
        raise AssertionError(f"bucket {self.name} could not be deleted")


@pytest.fixture(params=["s3", "gs"])
def bucket(request: pytest.FixtureRequest) -> Bucket:
    server = request.getfixturevalue("s3_endpoint" if request.param == "s3" else "gcs_endpoint")
    return Bucket(request.param, server)


class Gate:
    """A TCP forwarder to ``target``: ``close()`` refuses and cuts every connection (the storage
    server is unreachable), ``open()`` lets them through again, on the same port."""

    def __init__(self, target: str) -> None:
        host, _, port = target.removeprefix("http://").partition(":")
        self.target = (host, int(port))
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.open()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


# -- the processes ---------------------------------------------------------------------------------

class Run:
    """A ``vcasync coordinator`` and one ``vcasync worker``, started as a user would, logs in
    files; every process is SIGKILLed by its pid at teardown if still running."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.url = ""
        self.token: str | None = None
        self.env = {**os.environ, "VCASYNC_JOIN_SECRET": SECRET, "OUTAGE_STEP_S": str(STEP_S),
                    "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.root / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "vcasync", "--log-level", "info", *args],
                                    stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                    cwd=self.root)
        self.procs[name] = proc
        return proc

    def coordinator(self, storage: str, *, units: int, linger_s: float, limit_s: float,
                    output: Path | None = None) -> subprocess.Popen[bytes]:
        config = self.root / "run.toml"
        config.write_text(
            f'[storage]\nurl = "{storage}"\n'
            f"[units]\nshards = 2\ncount = {units}\nsteps = 10\n"
            "[coordinator]\nsnapshot_every = 3\nstorage_probe_interval_s = 0.3\n"
            f"storage_outage_limit_s = {limit_s}\n"
            f"[run]\nlinger_s = {linger_s}\n")
        port_file = self.root / "port"
        extra = ["--output", str(output)] if output is not None else []
        proc = self._start("coordinator", "coordinator", "--config", str(config), "--model",
                           "outage_app:model", "--app-dir", str(HERE), "--port", "0",
                           "--port-file", str(port_file), *extra)
        wait_for("the coordinator to listen", port_file.exists, proc=proc, log=self.log)
        self.url = port_file.read_text().strip()
        return proc

    def worker(self) -> subprocess.Popen[bytes]:
        return self._start("worker", "worker", "--coordinator", self.url, "--trainer",
                           "outage_app:train", "--app-dir", str(HERE), "--state-dir",
                           str(self.root / "worker"), "--threads", "1")

    def log(self, name: str = "coordinator") -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def healthz(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as r:
                return dict(json.loads(r.read()))
        except OSError:
            return {}

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
            lines = r.read().decode().splitlines()
        return {k: float(v) for k, _, v in (ln.partition(" ") for ln in lines)
                if k and not k.startswith("#") and "{" not in k}

    def status(self) -> dict[str, Any]:
        """``GET /v1/status``; the first call joins (which stores a token: call it while the
        storage is up)."""
        async def get() -> dict[str, Any]:
            async with CoordinatorClient(self.url, token=self.token) as client:
                if self.token is None:
                    _, self.token = await client.join(SECRET, "observer")
                return await client.status()

        return asyncio.run(get())

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    r = Run(tmp_path)
    try:
        yield r
    finally:
        r.stop_all()


def wait_for(what: str, predicate: Callable[[], bool], *, timeout: float = 60.0,
             proc: subprocess.Popen[bytes] | None = None, log: Callable[[], str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} while waiting for {what}:\n"
                                 f"{log() if log else ''}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}:\n{log() if log else ''}")


def storage_state(run: Run) -> float:
    try:
        return run.metrics().get("vcasync_storage_state", -1)
    except OSError:
        return -1


# -- the tests -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_short_outage_loses_nothing_and_the_run_ends_cleanly(run: Run, bucket: Bucket,
                                                             tmp_path: Path) -> None:
    gate = Gate(bucket.server)
    output = tmp_path / "final.pt"
    units = 12
    coord = run.coordinator(bucket.url(gate.endpoint), units=units, linger_s=120, limit_s=120,
                            output=output)
    worker = run.worker()
    wait_for("two merges", lambda: run.healthz().get("version", 0) >= 2, proc=coord, log=run.log)
    assert run.status()["storage"] == {"state": "ok", "write_failures": 0, "outages": 0}

    gate.close()                                   # the storage server is unreachable
    wait_for("storage to be reported unavailable", lambda: storage_state(run) == 2, proc=coord,
             log=run.log)
    status = run.status()
    assert status["storage"]["state"] == "unavailable", status["storage"]
    assert 0 < status["storage"]["retry_after_s"] <= 0.3          # about the next probe
    metrics = run.metrics()
    assert metrics["vcasync_storage_outages_total"] == 1
    assert metrics["vcasync_storage_unavailable_seconds"] > 0
    wait_for("the worker to wait for storage",
             lambda: "coordinator's storage unavailable, waiting" in run.log("worker"),
             proc=coord, log=lambda: run.log("worker"))
    done_during = status["units"]["done"]
    time.sleep(1.0)                                # nothing is taken in meanwhile
    assert run.status()["units"]["done"] == done_during

    gate.open()
    wait_for("the run to finish", lambda: run.healthz().get("ok") and run.status()["phase"] == "finished",
             timeout=120, proc=coord, log=run.log)
    status = run.status()
    assert status["finished"] is True
    assert status["units"]["done"] == units
    assert status["units"]["parked"] == 0
    assert status["storage"]["state"] == "ok"
    # --output is written when the run finishes, not when lingering ends (it lingers 120 s).
    wait_for("the final weights", output.exists, proc=coord, log=run.log)
    assert worker.wait(60) == 0                    # the worker heard "finished"
    coord.send_signal(signal.SIGTERM)              # end the linger
    assert coord.wait(60) == ExitCode.OK, run.log()

    log, wlog = run.log(), run.log("worker")
    assert "ERROR vcasync.coordinator: storage unavailable" in log
    assert "storage is back after" in log
    assert "gave up after 5 attempts" in log      # the backend's give-up, at WARNING
    retries = [ln for ln in log.splitlines() if " INFO vcasync.retry: " in ln]
    assert retries
    assert all("; retry 1/" in ln for ln in retries)
    assert " refused: " not in wlog
    assert "dropping" not in wlog
    assert f"{units} accepted, 0 refused, 0 abandoned" in wlog
    assert "coordinator unreachable" not in wlog
    assert "final snapshot failed" not in log
    # The final snapshot holds everything: no journal entry outlives it.
    assert asyncio.run(bucket.keys("vcasync/journal/")) == []
    gate.close()


@pytest.mark.slow
def test_deleted_bucket_ends_the_run_with_exit_status_storage(run: Run, bucket: Bucket) -> None:
    coord = run.coordinator(bucket.url(), units=200, linger_s=1, limit_s=3)
    run.worker()
    wait_for("two merges", lambda: run.healthz().get("version", 0) >= 2, proc=coord, log=run.log)
    assert run.status()["storage"]["state"] == "ok"

    bucket.delete()
    wait_for("storage to be reported unavailable", lambda: storage_state(run) == 2, proc=coord,
             log=run.log)
    status = run.status()
    assert status["phase"] == "running"
    assert status["storage"]["state"] == "unavailable"
    assert "does not exist" in status["storage"]["last_error"] \
        or "Not Found" in status["storage"]["last_error"] \
        or "NotFound" in status["storage"]["last_error"], status["storage"]
    assert coord.wait(60) == ExitCode.STORAGE, run.log()

    log, wlog = run.log(), run.log("worker")
    assert "ERROR vcasync.coordinator: storage unavailable" in log
    assert "storage_outage_limit_s" in log
    assert "final snapshot failed" not in log
    assert "final weights" not in log
    # The worker waited with its result in hand: nothing refused, nothing dropped, still spooled.
    assert "coordinator's storage unavailable, waiting" in wlog
    assert " refused: " not in wlog
    assert "dropping" not in wlog
    assert list((run.root / "worker" / "results").glob("*.vca")), wlog


def test_sigterm_before_the_end_writes_no_output(run: Run, bucket: Bucket, tmp_path: Path) -> None:
    output = tmp_path / "final.pt"
    coord = run.coordinator(bucket.url(), units=200, linger_s=1, limit_s=60, output=output)
    run.worker()
    wait_for("two merges", lambda: run.healthz().get("version", 0) >= 2, proc=coord, log=run.log)
    coord.send_signal(signal.SIGTERM)
    assert coord.wait(60) == ExitCode.INTERRUPTED, run.log()
    log = run.log()
    assert "final weights" not in log
    assert "stopped before the run finished" in log
    assert "not written" in log
    assert not output.exists()
    # Closed cleanly: the final snapshot covers every entry, so none is left.
    assert asyncio.run(bucket.keys("vcasync/journal/")) == []
