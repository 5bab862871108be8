"""Secrets stay where they belong: storage credentials never leave the coordinator (no response
carries them, not even an error about the storage), and no credential reaches a log line, even when
a client sends its token in a header too long to parse."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import aiohttp
import pytest

from harness import hostile_payloads as HP
from harness.probe import HttpProbe, Reply
from vcasync.errors import StorageError
from vcasync.server.status import StatusAccess
from vcasync.storage import open_storage
from vcasync.testing.faults import FaultPlan, FaultyStorage

from .conftest import PAYLOAD, SECRET, call, digits_model, join, lease, serving

AWS_KEY_ID = "AKIAVCASYNCTESTKEY01"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYVCASYNCSECRET"


class CredentialedStorage(FaultyStorage):
    """File storage dressed as a cloud bucket: it holds credentials the way a real backend's options
    do, and its errors name its URL the way the built-in backends' do."""

    def __init__(self, inner: object, fail_journal: list[bool]) -> None:
        def trigger(op: str, key: str | None) -> bool:
            return fail_journal[0] and op == "put_stream" and "journal" in (key or "")

        def error(op: str, key: str | None) -> Exception:
            return StorageError(f"{self.url}: {op} {key!r}: the bucket answered 500", key=key)

        super().__init__(inner, FaultPlan(make_error=error), trigger=trigger)  # type: ignore[arg-type]
        self.aws_access_key_id = AWS_KEY_ID
        self.aws_secret_access_key = AWS_SECRET


async def test_storage_credentials_never_leave_the_coordinator(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    seen: list[bytes] = []
    fail = [False]
    async with open_storage(f"file://{tmp_path / 'store'}") as inner:
        storage = CredentialedStorage(inner, fail)
        async with serving(tmp_path, storage=storage) as (coord, server, _), \
                aiohttp.ClientSession() as http:
            _, token = await join(http, server.url, "w")
            g = await lease(http, server.url, token)
            seen.append(json.dumps(g).encode())
            for method, path in [("GET", "/v1/status"), ("GET", "/metrics"), ("GET", "/healthz"),
                                 ("GET", "/v1/models/latest"), ("GET", "/v1/models/999")]:
                status, _, raw = await call(http, method, server.url + path, token, data=b"")
                seen.append(raw)
            result = HP.valid_result(digits_model(), g["lease_id"], g["base_version"],
                                     steps=g["unit"]["steps"])
            fail[0] = True     # the storage fails under the journal write: the worker hears about it
            status, body, raw = await call(http, "PUT", f"{server.url}/v1/leases/{g['lease_id']}/result",
                                           token, data=result, ctype=PAYLOAD)
            assert status >= 500, raw[:300]
            assert body["error"].startswith("storage"), raw[:300]
            seen.append(raw)
            fail[0] = False
            for _ in range(300):       # told to wait: a probe write finds the storage back first
                if coord.status()["storage"]["state"] == "ok":
                    break
                await asyncio.sleep(0.01)
            status, body, raw = await call(http, "PUT", f"{server.url}/v1/leases/{g['lease_id']}/result",
                                           token, data=result, ctype=PAYLOAD)
            assert status == 200
            assert body["status"] == "accepted"
            seen.append(raw)
            assert coord.version == 1
    blob = b"\n".join(seen)
    for secret in (AWS_KEY_ID, AWS_SECRET, SECRET):
        assert secret.encode() not in blob
    status_text = seen[1]
    assert str(tmp_path).encode() not in status_text   # not even where the storage is


async def test_no_credential_reaches_a_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with serving(tmp_path) as (_, server, _), aiohttp.ClientSession() as http:
        _, token = await join(http, server.url, "w")
        g = await lease(http, server.url, token)
        await call(http, "POST", f"{server.url}/v1/join", SECRET + "x", "join", {})
        await call(http, "POST", f"{server.url}/v1/leases", token[:-3] + "abc", "lease_request")
        await call(http, "PUT", f"{server.url}/v1/leases/{g['lease_id']}/result", token, data=b"junk",
                   ctype=PAYLOAD)
        # A header too long for the HTTP parser, holding the token: aiohttp would log its bytes.
        port = int(server.url.rsplit(":", 1)[1])
        def oversized() -> Reply:
            with HttpProbe("127.0.0.1", port, timeout=10) as probe:
                return probe.request("POST", "/v1/leases", body=b"",
                                     headers={"Authorization": f"Bearer {token}" + " " * 9000,
                                              "X-Secret": SECRET * 300})

        r = await asyncio.to_thread(oversized)
        assert r.status == 400
        assert r.json()["error"] == "bad_http_request"
    text = caplog.text + "".join(str(r.args) + str(r.exc_text) for r in caplog.records)
    assert any(r.name == "aiohttp.access" for r in caplog.records)
    assert "refused a malformed HTTP request" in caplog.text
    for secret in (SECRET, token, token.split("_", 2)[2]):
        assert secret not in text


@pytest.mark.parametrize("command", ["coordinator", "worker"])
def test_a_memory_url_with_credentials_is_refused_without_showing_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        command: str) -> None:
    """Found by a probe: the warning that a memory:// store dies with the process showed the URL as
    given, user info and all, before the URL was refused (the refusal itself masks it)."""
    from vcasync.cli import main

    monkeypatch.setenv("VCASYNC_JOIN_SECRET", SECRET)
    url = "memory://user:NotShownAnywhere123@run"
    args = (["coordinator", "--model", "vcasync.examples.digits:model", "--port", "0", "--storage", url]
            if command == "coordinator" else
            ["worker", "--coordinator", "http://127.0.0.1:1", "--trainer", "vcasync.examples.digits:train",
             "--state", url])
    with caplog.at_level(logging.DEBUG):
        assert main(args) == 2
    assert "memory://***@run" in caplog.text
    assert "NotShownAnywhere123" not in caplog.text


async def test_a_credential_in_a_query_string_never_reaches_the_access_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a probe: no route reads a query string, but aiohttp's access log wrote each request
    line as sent, query and all, at INFO. The status page takes its read token as ``#token=...``
    (never sent); a ``?token=...`` typed for it, or a worker token a script put in the URL, was
    written to the coordinator's log in clear (and a Referer header's query with it)."""
    status_token = "status-read-token-0123456789abcdef"
    caplog.set_level(logging.DEBUG)
    async with serving(tmp_path, status_access=StatusAccess(status_token)) as (_, server, _), \
            aiohttp.ClientSession() as http:
        _, token = await join(http, server.url, "w")
        async with http.get(f"{server.url}/status/?token={status_token}") as r:
            assert r.status == 200
        async with http.get(f"{server.url}/v1/status?token={token}&x=1",
                            headers={"Authorization": f"Bearer {token}",
                                     "Referer": f"http://h/status/?token={status_token}#t=1"}) as r:
            assert r.status == 200
        async with http.get(f"{server.url}/nowhere?{SECRET}") as r:     # a 404, a bare query
            assert r.status == 404
    access = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert any('"GET /status/?*** HTTP/1.1" 200' in line for line in access), access
    assert any('"GET /v1/status?*** HTTP/1.1" 200' in line and '"http://h/status/?***"' in line
               for line in access), access
    text = caplog.text + "".join(str(r.args) + str(r.__dict__) for r in caplog.records)
    for secret in (status_token, token, token.split("_", 2)[2], SECRET):
        assert secret not in text
