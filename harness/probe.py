"""A coordinator process under test, and a plain blocking HTTP client that sends anything at it.

Hostile-input tests need a client that does *not* protect the server: it sends any method, path,
header and body bytes, keeps the connection alive between requests (so a hundred thousand inputs
take minutes, not hours) and reconnects when the server closes it. :class:`CoordinatorProcess` runs
the real ``vcasync coordinator`` command on a free port from a run table, and reports its memory.
:func:`fingerprint` is what "nothing changed" means: the model's digest and version, the ledger's
unit and lease counts, the workers it knows, the journal position and the merge count (a holder's
refused upload freeing its own unit, issue 13, is accounted for).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from vcasync._spawn import module_command
from vcasync.errors import VCAsyncError
from vcasync.wire import decode_message, decode_payload_bytes, encode_message

from .fleet import free_port, process_memory, toml_text

__all__ = ["CoordinatorProcess", "HttpProbe", "Reply", "fingerprint"]

MSGPACK = "application/x-msgpack"
PAYLOAD = "application/x-vcasync-payload"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def message(self) -> Any:
        """The body as a control message's map (msgpack or JSON), or None."""
        if self.content_type == MSGPACK:
            try:
                return decode_message(self.body).body
            except VCAsyncError:
                return None
        return self.json()

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()


class HttpProbe:
    """A keep-alive HTTP/1.1 connection that sends whatever it is given."""

    def __init__(self, host: str, port: int, *, timeout: float = 60.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._conn: http.client.HTTPConnection | None = None
        self.sent = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(self, method: str, path: str, *, headers: Mapping[str, str] | None = None,
                body: bytes = b"") -> Reply:
        """One request; a connection the server closed is reopened once and the request re-sent."""
        for attempt in range(2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self._conn.putrequest(method, path, skip_accept_encoding=True)
                for k, v in (headers or {}).items():
                    self._conn.putheader(k, v)
                if body or method in ("POST", "PUT"):
                    self._conn.putheader("Content-Length", str(len(body)))
                self._conn.endheaders(body or None)
                resp = self._conn.getresponse()
                data = resp.read()
                out = Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
                if resp.will_close:
                    self.close()
                self.sent += 1
                return out
            except (ConnectionError, http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def control(self, path: str, kind: str, body: Mapping[str, Any], token: str,
                method: str = "POST") -> Reply:
        """A well-formed msgpack control request (how the real worker talks)."""
        return self.request(method, path, body=encode_message(kind, body),
                            headers={"Authorization": f"Bearer {token}", "Content-Type": MSGPACK,
                                     "Accept": "application/json"})


class CoordinatorProcess:
    """``vcasync coordinator --config <run.toml>`` on a free port, started and stopped by ``with``."""

    def __init__(self, run_dir: Path, table: Mapping[str, Any], *, join_secret: str,
                 env: Mapping[str, str] | None = None, log_level: str = "info") -> None:
        self.run_dir = Path(run_dir)
        self.table = table
        self.join_secret = join_secret
        self.port = free_port()
        self.env = dict(env or {})
        self.log_level = log_level
        self.log = self.run_dir / "coordinator.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: types.TracebackType | None) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        toml = self.run_dir / "run.toml"
        toml.write_text(toml_text(self.table))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "VCASYNC_JOIN_SECRET": self.join_secret,
               **self.env}
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen(
                module_command("vcasync", "--log-level", self.log_level, "coordinator",
                               "--config", str(toml), "--port", str(self.port)),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=self.run_dir)
        deadline = time.monotonic() + timeout
        with HttpProbe("127.0.0.1", self.port, timeout=2) as probe:
            while True:
                with contextlib.suppress(OSError, http.client.HTTPException):
                    if probe.request("GET", "/healthz").status == 200:
                        return
                if self._proc.poll() is not None:
                    raise RuntimeError(f"coordinator exited with {self._proc.returncode}; see {self.log}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"coordinator did not start in {timeout}s; see {self.log}")
                time.sleep(0.1)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def memory(self) -> dict[str, int]:
        """Resident and peak resident bytes of the coordinator process."""
        return process_memory(self.pid)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (a clean shutdown), then SIGKILL after ``timeout``; the exit status."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode


def fingerprint(probe: HttpProbe, token: str) -> dict[str, Any]:
    """What must not change when a hostile input is refused (read over HTTP, as a user would)."""
    auth = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    status = probe.request("GET", "/v1/status", headers=auth)
    if status.status != 200:
        raise RuntimeError(f"GET /v1/status answered {status.status}: {status.body[:200]!r}")
    s = status.json()
    model = probe.request("GET", "/v1/models/latest", headers=auth)
    if model.status != 200:
        raise RuntimeError(f"GET /v1/models/latest answered {model.status}: {model.body[:200]!r}")
    meta = decode_payload_bytes(model.body, expected_kind="model").meta
    # One change is allowed: a holder's well-formed but invalid upload frees *its own* unit for
    # reissue (and backs the holder off). Accounted exactly: each refused lease moved one unit from
    # leased to queued; anything else still shows.
    leases = {k: v for k, v in s.get("leases", {}).items() if k not in ("refused", "backoffs")}
    refused = int(s.get("leases", {}).get("refused", 0))
    units = dict(s.get("units") or {})
    if refused and "queued" in units and "leased" in units:
        units["queued"] -= refused
        units["leased"] += refused
    metrics = s.get("metrics", {})
    return {"version": s["version"], "digest": meta.get("digest"), "units": units,
            "leases": leases, "workers_known": s.get("workers", {}).get("known"),
            "journal_seq": s.get("journal", {}).get("seq"), "merges": metrics.get("merges"),
            "accepted": metrics.get("results", {}).get("accepted", 0)}
