"""Admission limits through the real server on 127.0.0.1: a worker past ``max_leases_per_worker``
is answered ``429 lease_limit`` and a join past ``max_workers`` ``503 workers_full`` with
``Retry-After``, each with a JSON body naming the cap and what is held; nothing changes, the rest of
the fleet is served, and the worker client rebuilds the typed errors it obeys."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest

from vcasync.errors import LeaseLimitError, WorkerBackoffError, WorkersFullError
from vcasync.ledger._units import make_units
from vcasync.worker._client import CoordinatorClient

from .conftest import SECRET, bearer, control, running
from .test_routes import error_of, join, lease
from .test_worker import make_trainer, worker


async def test_a_worker_past_its_lease_cap_is_answered_429_with_the_cap(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as http, \
            running(tmp_path, coordinator={"max_leases_per_worker": 2}) as (coord, server):
        _, hog = await join(http, server.url, "hog")
        _, honest = await join(http, server.url, "honest")
        await lease(http, server.url, hog)
        await lease(http, server.url, hog)
        units = coord.status()["units"]
        async with http.post(f"{server.url}/v1/leases", data=control("lease_request"),
                             headers=bearer(hog)) as r:
            body = await error_of(r, 429, "lease_limit")
        assert (body["limit"], body["held"]) == (2, 2)
        assert 0 < body["retry_after"] <= 7.5     # at most a heartbeat (lease_timeout_s 30 / 4)
        assert "max_leases_per_worker (2)" in body["message"]
        assert coord.status()["units"] == units          # nothing was leased
        await lease(http, server.url, honest)            # the others are served
        # the worker client gets the typed error back, a back-off it waits out
        async with CoordinatorClient(server.url, token=hog) as client:
            with pytest.raises(LeaseLimitError) as info:
                await client.lease()
        assert isinstance(info.value, WorkerBackoffError)
        assert (info.value.limit, info.value.held) == (2, 2)


async def test_a_join_past_max_workers_is_answered_503_and_the_joined_work_on(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as http, \
            running(tmp_path, coordinator={"max_workers": 2}) as (coord, server):
        _, first = await join(http, server.url, "first")
        await join(http, server.url, "second")
        async with http.post(f"{server.url}/v1/join", data=control("join", {"name": "third"}),
                             headers=bearer(SECRET)) as r:
            body = await error_of(r, 503, "workers_full")
            assert r.headers["Retry-After"] == "30"
        assert (body["limit"], body["held"], body["retry_after"]) == (2, 2, 30.0)
        assert "max_workers (2)" in body["message"]
        assert coord.status()["workers"]["alive"] == 2          # no record made, no token issued
        await lease(http, server.url, first)
        async with CoordinatorClient(server.url) as client:
            with pytest.raises(WorkersFullError) as info:
                await client.join(SECRET, "fourth")
        assert not info.value.finished
        assert info.value.retry_after == 30.0


async def test_a_worker_refused_a_join_waits_and_joins_once_there_is_room(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A worker answered ``503 workers_full`` waits as told and joins again; the refusal must not
    end it (it is no ``run_finished``)."""
    caplog.set_level(logging.INFO, logger="vcasync.worker")
    cfg = {"max_workers": 1, "forget_workers_s": 0.5}
    async with aiohttp.ClientSession() as http, \
            running(tmp_path, units=make_units(2, steps=2), coordinator=cfg,
                    linger_s=2.0) as (coord, server):
        squatter, _ = await join(http, server.url, "silent")      # holds the only record
        report = await worker(server.url, tmp_path / "w", make_trainer()).run()
        assert "join refused for now" in caplog.text
        assert "max_workers (1)" in caplog.text
        assert report.reason == "finished"
        assert report.results_accepted == 2
        assert squatter not in {row["id"] for row in coord.live_status()["worker_rows"]}
