"""S3 and GCS backends under HTTP faults: a seeded proxy in front of the emulators answers 503 or
429, loses answers after the upstream acted, and cuts downloads short. The backends retry what is
transient (with injected, instant sleeps), resume broken reads, settle ambiguous conditional
creates, and raise permanent errors at once, naming the key."""

from __future__ import annotations

import hashlib
import io
import random
from collections import Counter
from collections.abc import Callable

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from vcasync.errors import AccessDeniedError, PreconditionFailedError, TransientStorageError
from vcasync.retry import RetryPolicy
from vcasync.storage import Storage, open_storage
from vcasync.testing.emulators import DUMMY_S3_CREDENTIALS
from vcasync.testing.storage import pattern_stream

BUCKET = "vcasync-tests"
MiB = 1 << 20
_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}


class FaultProxy:
    """HTTP proxy to ``upstream`` that injects faults per request, seeded."""

    def __init__(self, upstream: str, *, seed: int = 0, fail: float = 0.0, throttle: float = 0.0,
                 lose: float = 0.0, truncate: float = 0.0, forbid: bool = False,
                 lose_once: Callable[[web.Request], bool] | None = None) -> None:
        self.upstream = upstream
        self.rng = random.Random(seed)
        self.fail, self.throttle, self.lose, self.truncate = fail, throttle, lose, truncate
        self.forbid = forbid
        self.lose_once = lose_once
        self.counts: Counter[str] = Counter()
        self.endpoint = ""

    async def __aenter__(self) -> FaultProxy:
        self.session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.endpoint = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()
        await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.counts["requests"] += 1
        if self.forbid:
            self.counts["forbid"] += 1
            return web.Response(status=403, text="forbidden by the test proxy")
        roll = self.rng.random()
        if roll < self.fail:
            self.counts["fail"] += 1
            return web.Response(status=503, text="unavailable (injected)")
        if roll < self.fail + self.throttle:
            self.counts["throttle"] += 1
            return web.Response(status=429, text="slow down (injected)")
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self.session.request(request.method, URL(self.upstream + request.raw_path, encoded=True),
                                        headers=headers, data=io.BytesIO(body),
                                        allow_redirects=False) as up:
            payload = await up.read()
            status, up_headers = up.status, {k: v for k, v in up.headers.items() if k.lower() not in _HOP}
            length = up.headers.get("Content-Length")
        if self.lose_once is not None and self.lose_once(request):
            self.lose_once = None
            self.counts["lose"] += 1
            return web.Response(status=502, text="answer lost (injected)")
        if self.rng.random() < self.lose:
            self.counts["lose"] += 1
            return web.Response(status=502, text="answer lost (injected)")
        if request.method == "GET" and len(payload) > 4096 and self.rng.random() < self.truncate:
            self.counts["truncate"] += 1
            resp = web.StreamResponse(status=status, headers=up_headers)
            resp.content_length = len(payload)
            await resp.prepare(request)
            await resp.write(payload[: len(payload) // 3])
            assert request.transport is not None
            request.transport.close()  # the client sees the body end early
            return resp
        if request.method == "HEAD" and length is not None:  # keep the object's size
            resp = web.StreamResponse(status=status, headers=up_headers)
            resp.content_length = int(length)
            await resp.prepare(request)
            return resp
        return web.Response(status=status, headers=up_headers, body=payload)


class InstantSleep:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, seconds: float) -> None:
        self.calls += 1


def _open(kind: str, endpoint: str, prefix: str, sleep: InstantSleep, attempts: int = 12) -> Storage:
    retry = RetryPolicy(attempts=attempts, base_delay_s=0.001, max_delay_s=0.01)
    rng = random.Random(0)
    if kind == "s3":
        return open_storage(f"s3://{BUCKET}/{prefix}", endpoint_url=endpoint, retry=retry, sleep=sleep,
                            rng=rng, part_size=5 * MiB, multipart_threshold=6 * MiB,
                            **DUMMY_S3_CREDENTIALS)
    return open_storage(f"gs://{BUCKET}/{prefix}", emulator_host=endpoint, retry=retry, sleep=sleep,
                        rng=rng, chunk_size=MiB, simple_upload_max=256 * 1024)


@pytest.fixture(params=["s3", "gs"])
def upstream(request: pytest.FixtureRequest) -> tuple[str, str]:
    kind = request.param
    return kind, request.getfixturevalue("s3_endpoint" if kind == "s3" else "gcs_endpoint")


async def test_workload_survives_injected_faults(upstream: tuple[str, str], unique_prefix: str) -> None:
    kind, endpoint = upstream
    sleep = InstantSleep()
    async with (FaultProxy(endpoint, seed=11, fail=0.15, throttle=0.05, lose=0.1, truncate=0.25) as proxy,
                _open(kind, proxy.endpoint, unique_prefix, sleep, attempts=20) as storage):
        small = {f"obj/{i:02d}": random.Random(i).randbytes(i * 500) for i in range(24)}
        for i, (key, data) in enumerate(small.items()):
            await storage.put(key, data, if_absent=bool(i % 2))
        for key, data in small.items():
            assert await storage.get(key) == data
            assert (await storage.stat(key)).size == len(data)
        assert [k async for k in storage.list("obj/")] == sorted(small)

        stream = pattern_stream(12 * MiB + 77, seed=5)
        await storage.put_stream("big/streamed", stream, if_absent=True)
        digest = hashlib.sha256()
        async for chunk in storage.open_read("big/streamed", chunk_size=MiB):
            digest.update(chunk)
        assert digest.hexdigest() == stream.digest.hexdigest()
        blob = random.Random(9).randbytes(7 * MiB)
        await storage.put("big/bytes", blob)
        assert await storage.get("big/bytes") == blob

        for key in [*small, "big/streamed", "big/bytes"]:
            await storage.delete(key)
        assert [k async for k in storage.list()] == []
    for kind_of_fault in ("fail", "lose", "truncate"):
        assert proxy.counts[kind_of_fault] > 0, proxy.counts
    assert sleep.calls > 0


async def test_ambiguous_conditional_create_is_recognised_as_ours(upstream: tuple[str, str],
                                                                  unique_prefix: str) -> None:
    kind, endpoint = upstream

    def conditional(request: web.Request) -> bool:
        if kind == "s3":
            return request.method == "PUT" and request.headers.get("If-None-Match") == "*"
        return request.method == "POST" and request.query.get("ifGenerationMatch") == "0"

    async with (FaultProxy(endpoint, lose_once=conditional) as proxy,
                _open(kind, proxy.endpoint, unique_prefix, InstantSleep()) as storage):
        await storage.put("once", b"mine", if_absent=True)  # done upstream, answer lost, retried
        assert proxy.counts["lose"] == 1
        assert await storage.get("once") == b"mine"
        with pytest.raises(PreconditionFailedError):
            await storage.put("once", b"someone else", if_absent=True)


async def test_permanent_errors_are_not_retried(upstream: tuple[str, str], unique_prefix: str) -> None:
    kind, endpoint = upstream
    async with (FaultProxy(endpoint, forbid=True) as proxy,
                _open(kind, proxy.endpoint, unique_prefix, InstantSleep()) as storage):
        with pytest.raises(AccessDeniedError) as info:
            await storage.get("secret/thing")
        assert info.value.key == "secret/thing"
        assert "secret/thing" in str(info.value)
    assert proxy.counts["requests"] == 1


async def test_retries_run_out(upstream: tuple[str, str], unique_prefix: str) -> None:
    kind, endpoint = upstream
    sleep = InstantSleep()
    async with (FaultProxy(endpoint, fail=1.0) as proxy,
                _open(kind, proxy.endpoint, unique_prefix, sleep, attempts=4) as storage):
        with pytest.raises(TransientStorageError, match="gave up after 4 attempts") as info:
            await storage.put("k", b"v")
        assert info.value.key == "k"
    assert proxy.counts["requests"] == 4
    assert sleep.calls == 3


