"""A connection that stalls before its request head is counted and logged, a line a minute at most.

Found by a probe: a client (or a proxy) that connected and sent nothing, or half a request line,
held its connection for the idle timeout (75 s) and was closed with no log line and no metric. Now
each such close counts in ``vcasync_http_stalled_connections_total{sent}`` and the ``vcasync.server``
log says so once, at once, then sums up the rest of the minute in one line; a kept-alive connection
idle after its answer (a client's pool) is neither. Raw sockets on a real server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import pytest

from vcasync.server import ServerConfig

from .conftest import running

STALLED = "that sent no whole request within idle_timeout_s"


async def closed_by_server(port: int, sent: bytes) -> None:
    """Connect, send ``sent`` and return once the server closed the connection, unanswered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(sent)
        await writer.drain()
        assert await reader.read() == b""
    finally:
        writer.close()


async def kept_alive_then_closed(port: int) -> None:
    """One whole request, answered; then the connection idles until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        while await reader.read(65536):
            pass
    finally:
        writer.close()


async def test_stalled_connections_are_counted_and_logged_once_a_window(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="vcasync.server")
    config = ServerConfig(port=0, idle_timeout_s=0.5)
    async with running(tmp_path, server_config=config) as (_, server):
        port = server.port
        await closed_by_server(port, b"")                     # connects and sends nothing
        lines = [r for r in caplog.records if STALLED in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in caplog.records]   # the first: at once
        assert "1 sent nothing" in lines[0].getMessage()
        assert "127.0.0.1 (1)" in lines[0].getMessage()
        # five at once, each with half a request line: summed up in one line, not five
        await asyncio.gather(*(closed_by_server(port, b"GET /heal") for _ in range(5)))
        await kept_alive_then_closed(port)                    # a pool's idle connection: neither
        async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as r:
            metrics = await r.text()
        assert 'vcasync_http_stalled_connections_total{sent="nothing"} 1.0' in metrics, metrics
        assert 'vcasync_http_stalled_connections_total{sent="partial_head"} 5.0' in metrics, metrics
    lines = [r.getMessage() for r in caplog.records if STALLED in r.getMessage()]
    assert len(lines) == 2, lines          # the rest of the window, when it ends or at the close
    assert "closed 5 connection(s)" in lines[1], lines
    assert "5 part of a request head" in lines[1], lines
    assert "(0.5s)" in lines[1]
