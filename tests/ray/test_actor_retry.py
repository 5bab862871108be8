"""A Ray actor's worker that stopped on what a retry may cure runs again in its actor (Ray restarts
only dead processes, and the actor's lives on): here without a Ray cluster, on the function the
actor runs its worker with (``run_until_settled``), a real worker, a real coordinator on 127.0.0.1
and a real GCS API server for the worker's state, down at the worker's start and back later.
Left alone in stop 46: such an actor stayed ``failed`` for good."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import urllib.request
from pathlib import Path

import pytest

from vcasync.errors import ConfigError, CoordinatorGoneError, TransientStorageError
from vcasync.examples import digits
from vcasync.launch._fleet_state import restartable, run_until_settled
from vcasync.testing.emulators import Emulator
from vcasync.worker import Worker, WorkerConfig, WorkerReport

from ..security.conftest import SECRET, serving

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _make_bucket(endpoint: str, name: str) -> None:
    req = urllib.request.Request(f"{endpoint}/storage/v1/b?project=test",
                                 data=json.dumps({"name": name}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=30).close()


async def _forward(port: int, to: str) -> asyncio.Server:
    """A TCP forwarder on 127.0.0.1:``port`` to ``to`` (host:port): the storage "back"."""
    host, _, to_port = to.rpartition(":")

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(to_port))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(handle, "127.0.0.1", port)


async def test_a_worker_whose_state_storage_is_down_at_its_start_runs_again_once_it_is_back(
        tmp_path: Path) -> None:
    with Emulator("gcs") as gcs:
        await asyncio.to_thread(_make_bucket, gcs.endpoint, "wb")
        port = _free_port()        # nothing listens there yet: the storage is down
        url = f"gs://wb/worker-0?emulator_host=127.0.0.1:{port}"
        loop = asyncio.get_running_loop()
        back: list[asyncio.Server] = []
        failures: list[BaseException] = []

        def on_retry(exc: BaseException, tries: int, wait: float) -> None:
            failures.append(exc)
            if not back:           # the storage comes back while the worker waits to run again
                host_port = gcs.endpoint.removeprefix("http://")
                back.append(asyncio.run_coroutine_threadsafe(_forward(port, host_port), loop).result(30))

        async with serving(tmp_path, units=2, steps=2) as (coord, server, _):
            def attempt() -> WorkerReport:
                worker = Worker(server.url, digits.train, state_dir=tmp_path / "cache", state=url,
                                join_secret=SECRET, config=WorkerConfig(name="ray-0"))
                return asyncio.run(worker.run())

            report = await asyncio.to_thread(run_until_settled, attempt, threading.Event(),
                                             on_retry=on_retry, first_s=0.1, max_s=0.5)
            assert coord.status()["units"]["done"] == 2
        for server_back in back:
            server_back.close()
    assert failures, "the worker never failed on its storage: the test proved nothing"
    assert all(restartable(exc) for exc in failures), failures
    assert isinstance(report, WorkerReport)
    assert report.reason == "finished"
    assert report.results_accepted == 2


def test_what_a_retry_cannot_cure_is_raised_at_once_and_a_stop_ends_the_wait() -> None:
    waits: list[float] = []
    for exc in (ConfigError("bad flag"), CoordinatorGoneError("gave up after 3600 s"),
                ValueError("a trainer's bug")):
        def fails(exc: Exception = exc) -> None:
            raise exc

        with pytest.raises(type(exc)):
            run_until_settled(fails, threading.Event(), on_retry=lambda e, n, w: waits.append(w))
    assert waits == []        # --give-up-after is the worker's own decision, kept

    calls: list[int] = []

    def storage_down() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise TransientStorageError("503 from the store")
        return "ran"

    assert run_until_settled(storage_down, threading.Event(), first_s=0.01, max_s=0.02,
                             on_retry=lambda e, n, w: waits.append(w)) == "ran"
    assert waits == [0.01, 0.02, 0.02]          # doubling, capped
    stopping = threading.Event()
    stopping.set()          # stopped while it waits: no further try, nothing returned

    def always_down() -> None:
        raise TransientStorageError("503 from the store")

    assert run_until_settled(always_down, stopping, on_retry=lambda e, n, w: None) is None
