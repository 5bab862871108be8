"""``POST /v1/leave``: a worker exiting cleanly is shown ``left`` and no longer counted alive at once
(until 2026-12-07 it was counted alive until twice the lease timeout had passed). Its leases stay as
they are, a restart does not show it alive again, and it is alive again once heard from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from vcasync.wire import decode_message

from .conftest import bearer, control, running
from .test_routes import join, lease


async def leave(http: aiohttp.ClientSession, url: str, token: str, reason: str = "preempted") -> int:
    async with http.post(f"{url}/v1/leave", data=control("leave", {"reason": reason}),
                         headers=bearer(token)) as r:
        if r.status == 200:
            assert decode_message(await r.read(), expected_kind="left").body
        return r.status


def rows(coord: Any) -> dict[str, str]:
    return {row["id"]: row["state"] for row in coord.live_status()["worker_rows"]}


async def test_a_worker_that_leaves_is_not_alive_and_keeps_its_lease(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as http:
        async with running(tmp_path) as (coord, server):
            idle, idle_token = await join(http, server.url, "idle")
            busy, busy_token = await join(http, server.url, "busy")
            grant = await lease(http, server.url, busy_token)
            assert coord.status()["workers"]["alive"] == 2
            async with http.post(f"{server.url}/v1/leases/{grant['lease_id']}/heartbeat",
                                 data=control("heartbeat", {"steps_done": 1, "stopping": True}),
                                 headers=bearer(busy_token)) as r:
                assert r.status == 200, await r.text()
            assert await leave(http, server.url, idle_token, "finished") == 200
            assert await leave(http, server.url, busy_token) == 200
            assert await leave(http, server.url, busy_token) == 200      # twice: the same
            workers = coord.status()["workers"]
            assert (workers["alive"], workers["left"]) == (0, 2)
            # the preempted one keeps its lease for a restart to resume, and is shown preempted
            assert rows(coord) == {idle: "left", busy: "preempted"}
            assert coord.status()["units"]["leased"] == 1
            kinds = [e["kind"] for e in coord.live_status()["events"]]
            assert kinds.count("left") == 2
        # a clean stop's final snapshot holds who left: the restart shows them so, not alive
        async with running(tmp_path) as (coord, server):
            workers = coord.status()["workers"]
            assert (workers["alive"], workers["left"]) == (0, 2)
            assert rows(coord)[idle] == "left"
            await coord.lease(idle)        # heard again (this server keeps no tokens): alive
            assert rows(coord)[idle] == "alive"
            assert coord.status()["workers"] == {**workers, "alive": 1, "left": 1}


async def test_leave_needs_the_worker_token_and_a_checked_body(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as http, running(tmp_path) as (coord, server):
        worker, token = await join(http, server.url)
        assert await leave(http, server.url, "vca_0000000000000000_nope") == 401
        async with http.post(f"{server.url}/v1/leave", data=control("leave", {"reason": "x" * 65}),
                             headers=bearer(token)) as r:
            assert r.status == 400
            body = await r.json()
            assert body["field"] == "reason", body
        assert rows(coord) == {worker: "alive"}
        assert coord.status()["workers"]["left"] == 0
