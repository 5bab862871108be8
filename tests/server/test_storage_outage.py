"""A coordinator whose storage refuses writes, over real HTTP on 127.0.0.1: leases, results and
joins are answered ``503 storage_unavailable`` with ``Retry-After`` and change nothing; status and
metrics say so; a probe write finds the storage back and the same result then goes through. And a
final snapshot that cannot be written is an error the caller can see, not a log line at WARNING."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.errors import (
    AccessDeniedError,
    ClosedError,
    NoWorkAvailableError,
    StorageError,
    StorageFailedError,
    StorageUnavailableError,
    TransientStorageError,
)
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy
from vcasync.server import Server, ServerConfig
from vcasync.server._auth import StorageTokenStore, TokenAuthority
from vcasync.storage import open_storage
from vcasync.tensors import ModelState
from vcasync.testing.faults import FaultPlan, FaultyStorage, WriteOutage
from vcasync.wire import decode_payload_bytes
from vcasync.worker._client import CoordinatorClient

from .conftest import SECRET, control, result_payload, tiny_model

PROBE_S = 0.05



async def _model(coord: Coordinator) -> ModelState:
    data = b"".join([c async for c in coord.model_payload()])
    payload = decode_payload_bytes(data, expected_kind="model")
    return ModelState(payload.tensors, version=payload.meta["version"])


@contextlib.asynccontextmanager
async def serving(name: str, units: int, linger_s: float | None = None, probe_s: float = PROBE_S,
                  ) -> AsyncIterator[tuple[Coordinator, Server, WriteOutage]]:
    """A coordinator and its server on a store whose writes fail while ``switch.down``, probed
    every ``probe_s`` at most."""
    switch = WriteOutage()
    config = CoordinatorConfig(storage_probe_interval_s=probe_s, storage_outage_limit_s=60.0)
    async with open_storage(f"memory://{name}") as inner:
        storage: Any = FaultyStorage(inner, trigger=switch)
        async with Coordinator(ModelState.from_module(tiny_model()), make_units(units, steps=3),
                               policy=build_policy("vcasgd"), storage=storage,
                               config=config) as coord, \
                Server(coord, TokenAuthority(join_secret=SECRET, store=StorageTokenStore(storage)),
                       ServerConfig(port=0), linger_s=linger_s) as server:
            yield coord, server, switch


@pytest.fixture
async def served() -> AsyncIterator[tuple[Coordinator, Server, WriteOutage]]:
    async with serving("outage", 4) as parts:
        yield parts


async def _refused_lease(http: aiohttp.ClientSession, server: Server, client: CoordinatorClient
                         ) -> dict[str, Any]:
    """A raw lease request's answer during an outage: 503, ``Retry-After: 1``; its JSON body."""
    async with http.post(f"{server.url}/v1/leases", data=control("lease_request"),
                         headers={"Authorization": f"Bearer {client.token}",
                                  "Content-Type": "application/x-msgpack"}) as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "1"
        body: dict[str, Any] = await resp.json()
    return body


async def _state(coord: Coordinator, want: str) -> None:
    for _ in range(400):
        if coord.status()["storage"]["state"] == want:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"storage never became {want}: {coord.status()['storage']}")


async def test_requests_wait_out_a_storage_outage_and_nothing_is_lost(
        served: tuple[Coordinator, Server, WriteOutage], caplog: pytest.LogCaptureFixture) -> None:
    coord, server, switch = served
    async with CoordinatorClient(server.url) as client:
        await client.join(SECRET, "a")
        grant = await client.lease()
        data = result_payload(await _model(coord), grant.lease_id, grant.base_version)
        before = coord.model().digest(), coord.status()["units"]

        switch.down = True
        with caplog.at_level(logging.WARNING, logger="vcasync"), \
                pytest.raises(StorageUnavailableError) as refused:
            await client.submit(grant.lease_id, data)
        assert refused.value.retry_after == PROBE_S
        assert isinstance(refused.value, TransientStorageError)     # workers retry it
        assert "storage is unavailable" in str(refused.value)
        assert (coord.model().digest(), coord.status()["units"]) == before   # nothing taken in
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1
        assert "storage unavailable" in errors[0].getMessage()

        with pytest.raises(StorageUnavailableError):                 # no new work meanwhile
            await client.lease()
        async with aiohttp.ClientSession() as http:                  # the raw answer
            body = await _refused_lease(http, server, client)
            assert body["error"] == "storage_unavailable"
            assert body["retry_after"] == PROBE_S
            async with http.get(f"{server.url}/metrics") as resp:
                metrics = await resp.text()
        assert "\nvcasync_storage_state 2.0\n" in metrics
        assert "\nvcasync_storage_outages_total 1.0\n" in metrics
        async with CoordinatorClient(server.url) as other:           # a join's token write too
            with pytest.raises(StorageUnavailableError):
                await other.join(SECRET, "b")
        status = await client.status()
        assert status["storage"]["state"] == "unavailable"
        assert status["storage"]["gives_up_in_s"] > 0

        switch.down = False
        await _state(coord, "ok")                                     # the probe found it back
        receipt = await client.submit(grant.lease_id, data)           # the same result, kept
        assert (receipt.status, receipt.version) == ("accepted", 1)
        # Two writes failed (the journal entry, the join token): one outage.
        assert coord.status()["storage"] == {"state": "ok", "write_failures": 2, "outages": 1}


async def test_a_final_snapshot_that_cannot_be_written_is_a_storage_error(
        caplog: pytest.LogCaptureFixture) -> None:
    switch = WriteOutage()
    async with open_storage("memory://final") as inner:
        storage: Any = FaultyStorage(inner, trigger=switch)
        coord = Coordinator(ModelState.from_module(tiny_model()), make_units(2, steps=3),
                            policy=build_policy("vcasgd"), storage=storage,
                            config=CoordinatorConfig(durability="snapshot"))
        async with coord:
            worker = await coord.join()
            grant = await coord.lease(worker)
            data = result_payload(await _model(coord), grant.lease_id, grant.base_version)

            async def body() -> AsyncIterator[bytes]:
                yield data

            await coord.submit(worker, grant.lease_id, body())
            switch.down = True       # the coordinator closes here: the final snapshot fails
        assert coord.storage_error is not None
        assert any(r.levelno == logging.ERROR and "final snapshot failed" in r.getMessage()
                   and "lost" in r.getMessage() for r in caplog.records)


class FullDisk(WriteOutage):
    """While ``down``: a store with room for the probe's few bytes but not for a result (a disk
    that is almost full, a quota almost spent)."""

    def __call__(self, op: str, key: str | None) -> bool:
        return self.down and op in ("put", "put_stream") and not (key or "").endswith("/probe")


def _no_space(op: str, key: str | None) -> Exception:
    """What the file backend raises on a full disk: a StorageError from the OSError."""
    cause = OSError(errno.ENOSPC, "No space left on device", key)
    error = StorageError(f"file:///store: {key!r}: {cause}", key=key)
    error.__cause__ = cause
    return error


def _not_permitted(op: str, key: str | None) -> Exception:
    """... and on a path it may not write to (``chattr +i`` on the snapshots' directory)."""
    cause = PermissionError(errno.EPERM, "Operation not permitted", key)
    error = AccessDeniedError(f"file:///store: {cause}", key=key)
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(("make_error", "hint"), [
    (_no_space, "the disk is full or the quota spent"),
    # found by a probe: a path the probe does not write to refused (EPERM), and the warning still
    # guessed "a full disk or a spent quota?"
    (_not_permitted, "the probe's small write went through where this write did not"),
])
async def test_a_store_that_takes_the_probe_but_not_results_is_one_outage_up_to_its_limit(
        caplog: pytest.LogCaptureFixture, make_error: Callable[[str, str | None], Exception],
        hint: str) -> None:
    """The probe's small write fits, the next result does not: that is the outage going on, not a
    new one each probe (which flapped the state, logged an ERROR per probe and never reached
    ``storage_outage_limit_s``, so a coordinator on a full disk ran on forever). The warning guesses a
    full disk only when the error says so."""
    disk = FullDisk()
    config = CoordinatorConfig(storage_probe_interval_s=PROBE_S, storage_outage_limit_s=1.5)
    async with open_storage("memory://full-disk") as inner:
        storage: Any = FaultyStorage(inner, FaultPlan(make_error=make_error), trigger=disk)
        coord = Coordinator(ModelState.from_module(tiny_model()), make_units(4, steps=3),
                            policy=build_policy("vcasgd"), storage=storage, config=config)
        async with coord, Server(coord, TokenAuthority(join_secret=SECRET,
                                                       store=StorageTokenStore(storage)),
                                 ServerConfig(port=0)) as server, \
                CoordinatorClient(server.url) as client:
            await client.join(SECRET, "a")
            grant = await client.lease()
            data = result_payload(await _model(coord), grant.lease_id, grant.base_version)
            disk.down = True
            with caplog.at_level(logging.DEBUG, logger="vcasync"):
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 10.0
                while coord.failure is None and loop.time() < deadline:    # a worker retrying
                    with contextlib.suppress(StorageUnavailableError, ClosedError):
                        await client.submit(grant.lease_id, data)
                    await asyncio.sleep(0.02)
            assert isinstance(coord.failure, StorageFailedError), coord.status()["storage"]
            assert coord.status()["storage"]["outages"] == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
              and r.name == "vcasync.coordinator"]
    assert sum("storage unavailable" in m for m in errors) == 1, errors
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("storage is back" in m for m in warnings) <= 1, warnings
    (relapse,) = [m for m in warnings if "failed again right after a probe" in m]
    assert hint in relapse
    assert ("full" in relapse) == (make_error is _no_space)


async def test_a_finished_run_says_so_to_a_waiting_worker_while_its_storage_is_down() -> None:
    """A worker told to wait asks again while the finished run lingers, to hear ``410
    run_finished`` and exit. With the storage down by then (a join's token write failed), the
    lease was answered ``503 storage_unavailable`` instead: saying the run is over needs no write,
    but the worker kept waiting, the coordinator exited after its linger, and the worker retried
    for its --give-up-after (seen with real processes and a ``chattr +i`` store)."""
    async with serving("finished-outage", 1, linger_s=4.0) as (coord, server, switch), \
            CoordinatorClient(server.url) as a, CoordinatorClient(server.url) as b:
        await a.join(SECRET, "a")
        await b.join(SECRET, "b")
        grant = await a.lease()
        with pytest.raises(NoWorkAvailableError) as waiting:      # b is told to wait
            await b.lease()
        assert not waiting.value.finished
        data = result_payload(await _model(coord), grant.lease_id, grant.base_version)
        assert (await a.submit(grant.lease_id, data)).status == "accepted"
        assert coord.finished
        switch.down = True
        # a write of the server's own fails (as a join token's did): the storage is unavailable
        coord.report_storage_failure(StorageError("the store refuses writes"))
        assert coord.status()["storage"]["state"] == "unavailable"
        with pytest.raises(NoWorkAvailableError) as told:
            await b.lease()
        assert told.value.finished, told.value


async def test_a_worker_joining_while_a_finished_run_lingers_hears_it_even_with_storage_down() -> None:
    """A join writes the worker's token, so a worker joining while a finished run lingered, with
    the storage down, was told ``503 storage_unavailable`` and waited until the coordinator exited
    (then retried for its --give-up-after and exited 1). The run's end is said before any write."""
    async with serving("finished-join", 1, linger_s=4.0) as (coord, server, switch), \
            CoordinatorClient(server.url) as a, aiohttp.ClientSession() as http:
        await a.join(SECRET, "a")
        grant = await a.lease()
        data = result_payload(await _model(coord), grant.lease_id, grant.base_version)
        assert (await a.submit(grant.lease_id, data)).status == "accepted"
        assert coord.finished
        switch.down = True
        async with CoordinatorClient(server.url) as late:
            with pytest.raises(NoWorkAvailableError) as told:
                await late.join(SECRET, "late")
        assert told.value.finished, told.value
        async with http.post(f"{server.url}/v1/join", data=control("join", {"name": "raw"}),
                             headers={"Authorization": f"Bearer {SECRET}",
                                      "Content-Type": "application/x-msgpack"}) as resp:
            assert resp.status == 410
            assert (await resp.json())["error"] == "run_finished"
        assert coord.status()["storage"]["state"] == "ok"               # nothing was written


async def test_a_capped_storage_wait_is_said_alike_in_message_header_and_status() -> None:
    """With the probe backing off past half the linger, ``retry_after`` was capped but the message
    still said "retry in 1.6s" and ``GET /v1/status`` showed 1.6 too."""
    async with serving("capped-storage", 2, linger_s=1.0, probe_s=30.0) as (coord, server, switch), \
            CoordinatorClient(server.url) as client, aiohttp.ClientSession() as http:
        await client.join(SECRET, "a")
        grant = await client.lease()
        data = result_payload(await _model(coord), grant.lease_id, grant.base_version)
        switch.down = True
        with pytest.raises(StorageUnavailableError):
            await client.submit(grant.lease_id, data)
        for _ in range(400):       # the probes back off: 0.1, 0.2, 0.4, 0.8, 1.6 s ...
            if coord.status()["storage"].get("retry_after_s", 0) > 1.0:
                break
            await asyncio.sleep(0.02)
        assert coord.status()["storage"]["retry_after_s"] > 1.0        # the coordinator's own
        body = await _refused_lease(http, server, client)
        assert body["retry_after"] == 1.0
        assert body["message"].endswith("keep the result; retry in 1s"), body["message"]
        assert (await client.status())["storage"]["retry_after_s"] == 1.0
