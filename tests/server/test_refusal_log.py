"""Refused requests reach the ``vcasync.server`` log (docs/operating.md), not only aiohttp's access
log, which may be off: one line per refusal with the reason code, the worker and the lease (never a
token), rate-limited per kind and caller so a broken or hostile worker cannot flood the log
(probe D11: five 422 non_finite results left no vcasync line at all)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import pytest
import torch

from vcasync.server import ServerConfig
from vcasync.server._refusals import RefusalLog
from vcasync.tensors import ModelState
from vcasync.wire import decode_message, decode_payload_bytes

from .conftest import PAYLOAD, SECRET, bearer, control, result_payload, running


def server_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "vcasync.server" and "refused" in r.getMessage()]


async def test_a_refused_result_is_logged_once_with_its_reason_worker_and_lease(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with (running(tmp_path, server_config=ServerConfig(port=0, access_log=False)) as (coord, server),
                aiohttp.ClientSession() as http):
        url = server.url
        async with http.post(f"{url}/v1/join", data=control("join", {"name": "t"}),
                             headers=bearer(SECRET)) as r:
            joined = decode_message(await r.read(), expected_kind="joined").body
        worker, token = joined["worker_id"], joined["token"]
        model_bytes = b"".join([c async for c in coord.model_payload()])
        model = ModelState(decode_payload_bytes(model_bytes, expected_kind="model").tensors)
        nan = {k: torch.full_like(v, float("nan")) for k, v in model.items()}
        with caplog.at_level(logging.INFO, "vcasync.server"):
            async with http.post(f"{url}/v1/leases", data=control("lease_request"),
                                 headers=bearer(token)) as r:
                assert r.status == 201, await r.text()
                grant = decode_message(await r.read(), expected_kind="lease").body
            lid = grant["lease_id"]
            async with http.put(f"{url}/v1/leases/{lid}/result",
                                data=result_payload(model, lid, grant["base_version"], tensors=nan),
                                headers={**bearer(token), "Content-Type": PAYLOAD}) as r:
                assert r.status == 422, await r.text()
        lines = server_lines(caplog)
        [line] = lines
        text = line.getMessage()
        assert line.levelno == logging.WARNING
        assert "422 invalid_update (non_finite)" in text
        assert f"worker {worker}" in text
        assert f"(lease {lid})" in text
        assert "result" in text
        assert token not in text
        assert SECRET not in text


async def test_bad_credentials_are_logged_once_per_caller_without_the_credential(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wrong = "w" * 30
    async with running(tmp_path) as (_, server), aiohttp.ClientSession() as http:
        with caplog.at_level(logging.INFO, "vcasync.server"):
            for _ in range(20):
                async with http.post(f"{server.url}/v1/leases", data=control("lease_request"),
                                     headers=bearer(wrong)) as r:
                    assert r.status == 401
            async with http.get(f"{server.url}/v1/no-such-route") as r:
                assert r.status == 404
    lines = [r.getMessage() for r in server_lines(caplog)]
    assert len(lines) == 2, lines
    assert "401 unauthorized" in lines[0]
    assert "peer 127.0.0.1" in lines[0]
    assert "404 not_found" in lines[1]
    assert all(wrong not in line for line in lines)


def test_the_rate_limit_counts_what_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    refusals = RefusalLog(window_s=60.0, max_keys=3, clock=lambda: now[0])
    kw = {"status": 422, "code": "non_finite", "message": "m", "route": "result", "peer": None,
          "lease": "l1"}
    with caplog.at_level(logging.INFO, "vcasync.server"):
        for _ in range(100):
            refusals.note(worker="w1", **kw)
        refusals.note(worker="w2", **kw)                 # another caller: its own line
        now[0] = 61.0
        refusals.note(worker="w1", **kw)
        for i in range(10):                              # many callers: the table stays bounded
            refusals.note(worker=f"x{i}", **kw)
    lines = [r.getMessage() for r in caplog.records if r.name == "vcasync.server"]
    assert len(lines) == 13
    assert "99 more like it in the last 60s not logged" in lines[2]
    assert len(refusals._seen) <= 3
    routine = RefusalLog()
    with caplog.at_level(logging.INFO, "vcasync.server"):
        routine.note(status=410, code="run_finished", message="done", route="lease", worker="w",
                     peer=None, lease=None)
    assert caplog.records[-1].levelno == logging.INFO


def test_a_flood_from_many_addresses_is_limited_globally_and_summed_up(
        caplog: pytest.LogCaptureFixture) -> None:
    # found by a tester: 10,000 refusals from 10,000 fresh addresses logged 10,000 lines (each
    # address a caller of its own); now at most max_lines a window, then one summary line
    now = [0.0]
    refusals = RefusalLog(window_s=60.0, max_lines=5, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, "vcasync.server"):
        for i in range(10_000):
            refusals.note(status=401, code="unauthorized", message="m", route="join", worker=None,
                          peer=f"10.0.{i // 256}.{i % 256}", lease=None)
        for i in range(3):
            refusals.note(status=404, code="not_found", message="m", route="GET /x", worker=None,
                          peer=f"10.1.0.{i}", lease=None)
        assert len(server_lines(caplog)) == 5           # the window's lines, nothing more yet
        now[0] = 61.0
        refusals.note(status=401, code="unauthorized", message="m", route="join", worker=None,
                      peer="10.2.0.1", lease=None)
    lines = [r.getMessage() for r in caplog.records if r.name == "vcasync.server"]
    assert len(lines) == 7
    assert lines[5] == ("9998 more refusals suppressed (over 5 lines in 60s): by reason unauthorized 9995, "
                        "not_found 3")
    assert "peer 10.2.0.1" in lines[6]                  # a new window logs again
    # every refusal is counted once, logged or not
    assert (refusals.logged, refusals.left_out, refusals.suppressed) == (6, 0, 9998)


async def test_a_client_that_hangs_up_mid_upload_is_one_info_line_not_an_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A worker preempted during its upload is routine on spot machines. Each one was logged by
    aiohttp at ERROR (``Error handling request``) with a 50-line traceback, which the operating
    page says needs a human; it is one INFO line of the refusal log now, and changes nothing."""
    async with (running(tmp_path, server_config=ServerConfig(port=0, access_log=False)) as (coord, server),
                aiohttp.ClientSession() as http):
        async with http.post(f"{server.url}/v1/join", data=control("join", {"name": "t"}),
                             headers=bearer(SECRET)) as r:
            token = decode_message(await r.read(), expected_kind="joined").body["token"]
        async with http.post(f"{server.url}/v1/leases", data=control("lease_request"),
                             headers=bearer(token)) as r:
            grant = decode_message(await r.read(), expected_kind="lease").body
        model_bytes = b"".join([c async for c in coord.model_payload()])
        model = ModelState(decode_payload_bytes(model_bytes, expected_kind="model").tensors)
        body = result_payload(model, grant["lease_id"], grant["base_version"])
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with caplog.at_level(logging.INFO):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"PUT /v1/leases/{grant['lease_id']}/result HTTP/1.1\r\nHost: {host}\r\n"
                         f"Authorization: Bearer {token}\r\nContent-Type: {PAYLOAD}\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:len(body) // 2])
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.transport.abort()                     # the machine is gone
            for _ in range(100):
                if server_lines(caplog):
                    break
                await asyncio.sleep(0.02)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]
        [line] = server_lines(caplog)
        assert line.levelno == logging.INFO
        assert "client_disconnected" in line.getMessage()
        assert coord.version == 0


async def test_a_client_that_hangs_up_mid_download_is_one_info_line_not_an_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same for a model download cut off by the client: it was logged at ERROR as an
    ``internal error in GET /v1/models/latest`` (a ConnectionError) or by aiohttp."""
    big = torch.nn.Linear(2000, 2500)                    # 20 MB: more than the socket buffers
    async with (running(tmp_path, initial=big,
                        server_config=ServerConfig(port=0, access_log=False)) as (_, server),
                aiohttp.ClientSession() as http):
        async with http.post(f"{server.url}/v1/join", data=control("join", {"name": "t"}),
                             headers=bearer(SECRET)) as r:
            token = decode_message(await r.read(), expected_kind="joined").body["token"]
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with caplog.at_level(logging.INFO):
            for _ in range(3):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(f"GET /v1/models/latest HTTP/1.1\r\nHost: {host}\r\n"
                             f"Authorization: Bearer {token}\r\n\r\n".encode())
                await writer.drain()
                await reader.readexactly(1 << 20)
                writer.transport.abort()
                await asyncio.sleep(0.3)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]
        assert all(line.levelno == logging.INFO and "client_disconnected" in line.getMessage()
                   for line in server_lines(caplog))


async def test_a_lease_id_or_path_cannot_forge_a_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The lease id in the path is decoded (``%0a`` is a line break): it was written as it came, so
    ``/v1/leases/x%0a<a fake ERROR line>/heartbeat`` put a line of the client's choosing in the log."""
    forged = "2026-12-07 11:00:00,000 ERROR vcasync.coordinator: FORGED"
    quoted = forged.replace(" ", "%20")
    async with running(tmp_path) as (_, server), aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/v1/join", data=control("join", {"name": "t"}),
                             headers=bearer(SECRET)) as r:
            token = decode_message(await r.read(), expected_kind="joined").body["token"]
        with caplog.at_level(logging.INFO, "vcasync.server"):
            for path in (f"/v1/leases/x%0a{quoted}%1b[2J/heartbeat", f"/v1/nothing%0d%0a{quoted}"):
                async with http.post(server.url + path, data=control("heartbeat", {"steps_done": 1}),
                                     headers=bearer(token)) as r:
                    assert r.status == 404
    lines = [r.getMessage() for r in server_lines(caplog)]
    assert len(lines) == 2, lines
    assert "(lease x\\n2026-12-07" in lines[0]          # shown, escaped, on its own line
    for line in lines:
        assert not {"\n", "\r", "\x1b"} & set(line), line


async def test_requests_the_http_parser_refuses_are_rate_limited_too(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A request line or header aiohttp's parser refuses never reaches a route: each logged its own
    line, so with the access log off a client sending garbage still wrote a line per request."""
    async with running(tmp_path, server_config=ServerConfig(port=0, access_log=False)) as (_, server):
        with caplog.at_level(logging.INFO, "vcasync.server"):
            for i in range(30):
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(f"NOT-A-METHOD{i} /healthz HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                await writer.drain()
                answer = await reader.read()
                writer.close()
                assert answer.startswith(b"HTTP/1.0 400"), answer
                assert b'"bad_http_request"' in answer, answer
        # counted, each one (left alone in stop 46: in no figure of /metrics)
        async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as r:
            metrics = await r.text()
        assert 'vcasync_http_malformed_requests_total{where="request"} 30.0' in metrics, metrics
    lines = [r for r in caplog.records if r.name == "vcasync.server" and "malformed HTTP" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "peer 127.0.0.1" in lines[0].getMessage()
    assert lines[0].levelno == logging.INFO
