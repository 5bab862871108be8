"""A worker on a bad network: the real worker loop in-process, a real coordinator and server on
127.0.0.1, and between them a real TCP proxy (:class:`FaultyLink`) that stalls a request part way,
or answers in place of the coordinator as a proxy does (an HTML error page). Whatever the link does,
no result is lost or merged twice, and the worker keeps going."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from collections.abc import AsyncIterator
from http import HTTPStatus
from pathlib import Path
from typing import Self

import pytest
import torch

from vcasync.ledger._units import make_units
from vcasync.retry import RetryPolicy
from vcasync.server import ServerConfig
from vcasync.trainer import TrainContext, TrainResult
from vcasync.worker import Worker, WorkerConfig

from .conftest import SECRET, running
from .test_worker import eventually

FAST = RetryPolicy(base_delay_s=0.02, max_delay_s=0.2)
KiB = 1024
_REQUEST_LINE = re.compile(rb"(GET|POST|PUT) (\S+) HTTP/1\.1")


def wide_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(256, 256)        # 257 KiB of float32: a result spans many reads


def train(ctx: TrainContext) -> TrainResult:
    net = wide_model()
    ctx.model.load_into(net)
    for step in range(ctx.unit.steps):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.01)
        ctx.report_progress(step + 1, step + 1)
    return ctx.result(net, steps=ctx.unit.steps, samples=ctx.unit.steps)


class _Proxy:
    """A TCP proxy on 127.0.0.1 in front of ``port`` (``url``), serving while ``serving()`` is
    entered; each connection relayed by the subclass's ``_relay``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Self]:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        try:
            yield self
        finally:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _conn(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            client_w.close()
            self._tasks.discard(task)
            return
        try:
            await self._relay(client_r, client_w, server_r, server_w)
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass        # (cancelled: the proxy closes; a handler task must not end cancelled)
        finally:
            client_w.close()
            server_w.close()
            self._tasks.discard(task)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                     server_r: asyncio.StreamReader, server_w: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class FaultyLink(_Proxy):
    """A TCP proxy on 127.0.0.1 in front of ``port``. The first request whose request line holds
    ``match`` gets ``fault``, once: ``"stall"`` forwards ``after`` bytes of it and then nothing more
    from the client (the server's answer still comes back, as on a link that lost its upstream),
    ``"html429"`` (``"html408"``, ...) answers it with a proxy's HTML page of that status (a
    rate-limiting one's 429, one that timed the body out's 408) instead of passing it on,
    ``"throttle"`` passes it and all after it on at ``rate`` bytes a second."""

    def __init__(self, port: int, fault: str, match: str, after: int = 0, rate: float = 0.0) -> None:
        super().__init__(port)
        self.fault, self.match, self.after, self.rate = fault, match, after, rate
        self.fired: list[str] = []

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                     server_r: asyncio.StreamReader, server_w: asyncio.StreamWriter) -> None:
        await asyncio.gather(self._up(client_r, client_w, server_w), self._down(server_r, client_w))

    async def _up(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                  server_w: asyncio.StreamWriter) -> None:
        armed_at: int | None = None
        sent = 0
        while data := await client_r.read(16 * KiB):
            line = _REQUEST_LINE.search(data)
            if armed_at is None and not self.fired and line and self.match in line.group(2).decode():
                self.fired.append(line.group(0).decode())
                armed_at = sent + line.start()
                if self.fault.startswith("html"):
                    code = int(self.fault[4:])
                    head = f"{code} {HTTPStatus(code).phrase}".encode()
                    page = b"<html><body><h1>%s</h1><hr>nginx</body></html>" % head
                    client_w.write(b"HTTP/1.1 %s\r\nServer: nginx\r\n"
                                   b"Content-Type: text/html\r\nContent-Length: %d\r\n"
                                   b"Connection: close\r\n\r\n%s" % (head, len(page), page))
                    await client_w.drain()
                    return
            if armed_at is not None and self.fault == "stall" and sent + len(data) - armed_at > self.after:
                keep = armed_at + self.after - sent
                server_w.write(data[:max(keep, 0)])
                await server_w.drain()
                await asyncio.Event().wait()        # the link upstream is gone; never returns
            if armed_at is not None and self.fault == "throttle":
                await asyncio.sleep(len(data) / self.rate)
            server_w.write(data)
            sent += len(data)
            await server_w.drain()

    async def _down(self, server_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        while data := await server_r.read(64 * KiB):
            client_w.write(data)
            await client_w.drain()


# Small pace limits: a stalled body is cut off (408) a second or two after it stops.
PACED = ServerConfig(port=0, min_upload_bytes_per_s=64 * KiB, upload_rate_grace_s=1.0,
                     upload_rate_window_s=1.0, body_idle_timeout_s=30.0)


async def test_an_upload_cut_off_as_too_slow_is_sent_again_not_dropped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # found by a probe through a stalling proxy: the coordinator's 408 request_timeout for a stalled
    # upload came back as a bare VCAsyncError, which the worker took for a refusal: it dropped the
    # spooled result ("result for lease ... refused: HTTP 408 request_timeout ..."), so the unit's
    # work was lost and trained again once its lease expired, where docs/limits.md says the worker
    # may send the same result again under the same lease
    caplog.set_level(logging.INFO, logger="vcasync.worker")
    async with running(tmp_path, units=make_units(2, steps=2), initial=wide_model(),
                       server_config=PACED, lease_timeout_s=5.0) as (coord, server):
        port = int(server.url.rsplit(":", 1)[1])
        async with FaultyLink(port, "stall", "/result", after=64 * KiB).serving() as link:
            w = Worker(link.url, train, state_dir=tmp_path / "w", join_secret=SECRET,
                       config=WorkerConfig(backoff=FAST))
            report = await w.run()
        assert len(link.fired) == 1
        assert link.fired[0].startswith("PUT")
        assert report.reason == "finished"
        assert report.results_refused == 0
        assert report.results_accepted == 2
        await coord.wait_finished()
        assert coord.version == 2           # each unit merged once, none trained twice
        assert coord.status()["units"]["done"] == 2
    cut = [r.getMessage() for r in caplog.records if "cut the request off" in r.getMessage()]
    assert len(cut) == 1, cut
    assert "request body too slow" in cut[0]


@pytest.mark.parametrize(("status", "match"), [(429, "/v1/leases"), (408, "/result")])
async def test_a_proxys_429_or_408_page_is_retried_not_a_crash(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, status: int, match: str) -> None:
    # found by a probe through a rate-limiting proxy: a 429 HTML page (nginx's limit_req) at a lease
    # request ended the worker on an aiohttp ClientResponseError traceback (exit 1), though the
    # client leaves 429 an HTTP error to be retried, as it does a proxy's 502, 503 and 504; a proxy
    # that timed an upload's body out (nginx's client_body_timeout: 408) was taken for "not a
    # vcasync coordinator" (exit 2), where the coordinator's own 408 is sent again
    caplog.set_level(logging.INFO, logger="vcasync.worker")
    async with running(tmp_path, units=make_units(2, steps=2), initial=wide_model()) as (coord, server):
        port = int(server.url.rsplit(":", 1)[1])
        async with FaultyLink(port, f"html{status}", match).serving() as link:
            w = Worker(link.url, train, state_dir=tmp_path / "w", join_secret=SECRET,
                       config=WorkerConfig(backoff=FAST))
            report = await w.run()
        assert len(link.fired) == 1
        assert match in link.fired[0]
        assert report.reason == "finished"
        assert report.results_accepted == 2
        await coord.wait_finished()
        assert coord.version == 2
    said = [r.getMessage() for r in caplog.records if "coordinator unreachable" in r.getMessage()]
    assert len(said) == 1, said
    assert f"HTTP {status}" in said[0]


async def test_an_upload_slower_than_the_request_timeout_is_not_cut_off_by_the_worker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # found by a probe through a proxy throttled to 50 KB/s: a 4.3 MB result takes ~90 s there, and
    # the worker's own read timeout (request_timeout_s, 60 s), which aiohttp counts from the request's
    # head, cut every upload off at 60 s while its bytes still flowed ("upload: coordinator
    # unreachable (SocketTimeoutError)"), and each retry began again from zero: a result that takes
    # longer than a minute to send was never delivered. Here: 257 KiB at 64 KiB/s, a 1 s timeout.
    caplog.set_level(logging.INFO, logger="vcasync.worker")
    async with running(tmp_path, units=make_units(1, steps=2), initial=wide_model()) as (coord, server):
        port = int(server.url.rsplit(":", 1)[1])
        async with FaultyLink(port, "throttle", "/result", rate=64 * KiB).serving() as link:
            w = Worker(link.url, train, state_dir=tmp_path / "w", join_secret=SECRET,
                       config=WorkerConfig(backoff=FAST, request_timeout_s=1.0, give_up_after_s=60.0))
            report = await w.run()
        assert len(link.fired) == 1
        assert report.reason == "finished"
        assert report.results_accepted == 1
        await coord.wait_finished()
        assert coord.version == 1
    retried = [r.getMessage() for r in caplog.records if "upload:" in r.getMessage()]
    assert retried == []                    # sent once, never cut off and begun again
    said = [r.getMessage() for r in caplog.records if "result for lease" in r.getMessage()]
    assert len(said) == 1
    assert "accepted" in said[0]            # not a "duplicate" of a first try the link still carried


class Blackhole(_Proxy):
    """A TCP proxy on 127.0.0.1 in front of ``port`` whose link can be cut: :meth:`cut` drops every
    byte both ways, on the connections open and on new ones, as a link that loses its packets (no
    reset, no refusal: a request waits for an answer that never comes); :meth:`mend` lets new
    connections through (those that saw the cut stay dead)."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.is_cut = False
        self._dead: list[list[bool]] = []

    def cut(self) -> None:
        self.is_cut = True
        for dead in self._dead:
            dead[0] = True

    def mend(self) -> None:
        self.is_cut = False

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                     server_r: asyncio.StreamReader, server_w: asyncio.StreamWriter) -> None:
        dead = [self.is_cut]
        self._dead.append(dead)
        await asyncio.gather(self._pump(client_r, server_w, dead), self._pump(server_r, client_w, dead))

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, dead: list[bool]) -> None:
        while data := await src.read(64 * KiB):
            if not dead[0]:
                dst.write(data)
                await dst.drain()
        if dead[0]:
            await asyncio.Event().wait()        # a dead link says nothing, not even goodbye


async def test_failing_heartbeats_are_said_with_the_lease_at_stake_and_their_recovery(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # found by a probe: with the link cut for 50 s mid-unit, every failed heartbeat was logged at
    # DEBUG, so the worker said nothing while its 20 s lease expired at the coordinator, and the
    # operator could not tell why the unit was lost. Now: a WARNING when heartbeats start failing
    # (the lease, the time left on it), a WARNING once it has probably expired, an INFO when they
    # get through again; each failure in between only at DEBUG.
    caplog.set_level(logging.DEBUG, logger="vcasync.worker")
    reached, hold = threading.Event(), threading.Event()

    def held(ctx: TrainContext) -> TrainResult:
        net = torch.nn.Linear(2, 2)
        ctx.model.load_into(net)
        ctx.report_progress(1, 1)
        reached.set()
        while not hold.wait(0.01) and not ctx.should_stop:
            pass
        ctx.report_progress(2, 2)
        return ctx.result(net, steps=2, samples=2)

    def heartbeat_failures() -> int:
        return sum("heartbeat for" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)

    torch.manual_seed(0)
    async with running(tmp_path, units=make_units(1, steps=2), initial=torch.nn.Linear(2, 2),
                       lease_timeout_s=4.0) as (coord, server):
        port = int(server.url.rsplit(":", 1)[1])
        async with Blackhole(port).serving() as link:
            # request_timeout_s 1 s: the old worker's heartbeats failed in the blackout too, not
            # after 60 s
            w = Worker(link.url, held, state_dir=tmp_path / "w", join_secret=SECRET,
                       config=WorkerConfig(backoff=FAST, request_timeout_s=1.0, max_units=1))
            task = asyncio.create_task(w.run())
            assert await asyncio.to_thread(reached.wait, 30)
            link.cut()
            # the coordinator lets the lease expire, and the worker's heartbeats go on failing
            await eventually(lambda: coord.status()["leases"]["expired"] >= 1)
            seen = heartbeat_failures()
            await eventually(lambda: heartbeat_failures() >= seen + 3)
            # said while the link is still cut, not once it is back
            warned = [r.getMessage() for r in caplog.records if r.name == "vcasync.worker"
                      and r.levelno == logging.WARNING]
            assert any(m.startswith("heartbeat for lease ") for m in warned), warned
            assert any("has probably expired at the coordinator" in m for m in warned), warned
            link.mend()
            # the next heartbeat reports the progress the coordinator missed: that revives the lease
            await eventually(lambda: any("get through again" in r.getMessage() for r in caplog.records))
            hold.set()
            report = await asyncio.wait_for(task, 60)
        assert report.reason == "max_units"
    lease = coord.status()["leases"]
    assert lease["expired"] >= 1
    lines = [r for r in caplog.records if r.name == "vcasync.worker" and r.levelno >= logging.INFO
             and ("heartbeat" in r.getMessage() or "probably expired" in r.getMessage())]
    said = [(r.levelname, r.getMessage()) for r in lines]
    assert [level for level, _ in said] == ["WARNING", "WARNING", "INFO"], said
    assert re.fullmatch(r"heartbeat for lease \S+ \(unit \S+\) failed \(no answer within 1\.0 s\): "
                        r"the coordinator expires the lease in about \d+ s unless a heartbeat gets "
                        r"through; training goes on, a heartbeat every 1\.0 s", said[0][1]), said[0]
    assert said[1][1].startswith("lease ")
    assert "has probably expired at the coordinator" in said[1][1]
    assert re.fullmatch(r"heartbeats for lease \S+ get through again after \d+ s \(\d+ failed\)", said[2][1])
    failed = int(said[2][1].rsplit("(", 1)[1].split()[0])
    assert failed >= 4
    assert failed == heartbeat_failures()
