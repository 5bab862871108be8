"""A minimal HTTP/1.1 keep-alive client for load generation.

aiohttp's client spends a few hundred microseconds of CPU per request; simulating thousands of workers
from one process with it measures the client more than the server. This pool of raw connections
(asyncio streams, ``Content-Length`` bodies only, which is all the vcasync server sends for control
messages) costs a fraction of that, so the latencies ``bench.scale`` reports are the server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from urllib.parse import urlsplit


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int,
                   method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    """One request and its response on an open keep-alive connection."""
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    data = await reader.readexactly(length) if length else b""
    return status, data


class OneConn:
    """One worker's own keep-alive connection (plain or TLS), opened on first use and again after
    a failure: what a coordinator behind a NAT sees, one TCP connection per worker."""

    def __init__(self, url: str, ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.hostname is None or parts.port is None:
            raise ValueError(f"OneConn needs http(s)://host:port, got {url!r}")
        if (parts.scheme == "https") != (ssl_context is not None):
            raise ValueError("an https URL needs an ssl_context, an http one none")
        self.host, self.port, self.ssl = parts.hostname, parts.port, ssl_context
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.opened = 0

    async def request(self, method: str, path: str, headers: dict[str, str],
                      body: bytes = b"") -> tuple[int, bytes]:
        if self._conn is None:
            self.opened += 1
            self._conn = await asyncio.open_connection(self.host, self.port, limit=1 << 16, ssl=self.ssl)
        reader, writer = self._conn
        ok = False
        try:
            result = await exchange(reader, writer, self.host, self.port, method, path, headers, body)
            ok = True
            return result
        finally:
            if not ok:
                self._conn = None
                writer.close()

    async def aclose(self) -> None:
        if self._conn is not None:
            _, writer = self._conn
            self._conn = None
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()


class LeanPool:
    """``size`` keep-alive connections to one ``http://host:port``; requests wait for a free one."""

    def __init__(self, url: str, size: int) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"LeanPool needs http://host:port, got {url!r}")
        self.host, self.port, self.size = parts.hostname, parts.port, size
        self._idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
        self._opened = 0

    async def _conn(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._idle.empty() and self._opened < self.size:
            self._opened += 1
            return await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        return await self._idle.get()

    async def request(self, method: str, path: str, headers: dict[str, str],
                      body: bytes = b"") -> tuple[int, bytes]:
        reader, writer = await self._conn()
        ok = False
        try:
            result = await exchange(reader, writer, self.host, self.port, method, path, headers, body)
            ok = True
            return result
        finally:
            if ok:
                self._idle.put_nowait((reader, writer))
            else:
                self._opened -= 1
                writer.close()

    async def aclose(self) -> None:
        while not self._idle.empty():
            _, writer = self._idle.get_nowait()
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
