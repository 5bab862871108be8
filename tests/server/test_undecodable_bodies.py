"""A request body that does not decode as its ``Content-Encoding`` says is the client's fault: a
``400 bad_http_request`` like any request aiohttp's parser refuses, never a 500, and no request a
stranger can send leaves an ERROR traceback in the log, read or not.

Found by a probe: ``Content-Encoding: gzip`` on a body that is not gzip was ``500 internal_error``
with a traceback when a route read the body, and an ``ERROR aiohttp.server: Unhandled exception``
traceback when the route answered without reading it (a 401, a 404): aiohttp drains the body after
the answer and failed there.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from vcasync.ledger._units import make_units

from .conftest import PAYLOAD, SECRET, running
from .test_routes import join, lease, snapshot

#: (method, path ({lease}: a live lease), credential, Content-Type, status, code)
CASES = [
    ("POST", "/v1/leases", "worker", "application/json", 400, "bad_http_request"),
    ("POST", "/v1/leases/{lease}/heartbeat", "worker", "application/json", 400, "bad_http_request"),
    ("PUT", "/v1/leases/{lease}/result", "worker", PAYLOAD, 400, "bad_http_request"),
    ("POST", "/v1/join", "secret", "application/json", 400, "bad_http_request"),
    # answered without reading the body: aiohttp drains it afterwards
    ("POST", "/v1/leases", None, "application/json", 401, "unauthorized"),
    ("POST", "/v1/join", None, "application/json", 401, "unauthorized"),
    ("PUT", "/v1/leases/{lease}/result", None, PAYLOAD, 401, "unauthorized"),
    ("POST", "/v1/no-such-route", None, "application/json", 404, "not_found"),
    ("PUT", "/v1/leases/{lease}/result", "worker", "text/plain", 400, "malformed_payload"),
]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize(("method", "path", "who", "ctype", "status", "code"), CASES)
async def test_a_body_that_does_not_decode_is_refused_with_no_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, encoding: str, method: str, path: str,
        who: str | None, ctype: str, status: int, code: str) -> None:
    caplog.set_level(logging.DEBUG)
    async with running(tmp_path, units=make_units(2, steps=3)) as (coord, server):
        async with aiohttp.ClientSession() as http:
            _, token = await join(http, server.url)
            grant = await lease(http, server.url, token)
            before = await snapshot(coord)
        credential = {"worker": token, "secret": SECRET, None: None}[who]
        headers = {"Content-Type": ctype, "Content-Encoding": encoding}
        if credential is not None:
            headers["Authorization"] = f"Bearer {credential}"
        # a connection of its own, as a stranger's would be (the server may close it)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as raw, \
                raw.request(method, server.url + path.format(lease=grant["lease_id"]),
                            data=b"not " + encoding.encode() + b" at all", headers=headers) as r:
            text = await r.text()
            assert r.status == status, text
            assert r.content_type == "application/json"
            body: dict[str, Any] = json.loads(text)
        assert body["error"] == code, body
        assert body["message"]
        if code == "bad_http_request":
            assert "does not decode" in body["message"]
        assert await snapshot(coord) == before          # nothing changed
    # After the server stopped: aiohttp's draining of the body (after the answer) is over too.
    loud = [f"{r.name} {r.levelname}: {r.getMessage()}" for r in caplog.records
            if r.levelno >= logging.ERROR or r.exc_info]
    assert loud == []


async def test_a_body_drained_after_its_answer_that_does_not_decode_is_counted(tmp_path: Path) -> None:
    # left alone in stop 46: logged (rate-limited) but in no figure of /metrics
    async with running(tmp_path, units=make_units(2, steps=3)) as (_, server):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as raw, \
                raw.post(server.url + "/v1/no-such-route", data=b"not gzip at all",
                         headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}) as r:
            assert r.status == 404
        async with aiohttp.ClientSession() as http:
            for _ in range(200):          # aiohttp drains the body after the answer: wait for it
                async with http.get(f"{server.url}/metrics") as r:
                    metrics = await r.text()
                if 'vcasync_http_malformed_requests_total{where="body"} 1.0' in metrics:
                    break
                await asyncio.sleep(0.05)
        assert 'vcasync_http_malformed_requests_total{where="body"} 1.0' in metrics, metrics
        assert 'vcasync_http_malformed_requests_total{where="request"} 0.0' in metrics
