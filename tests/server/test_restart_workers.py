"""The status after a coordinator crash lists every worker of the run: those in its last snapshot
and those who joined after it (the server's token records keep who joined, and as whom)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests._crash import crash
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy
from vcasync.server import Server, ServerConfig
from vcasync.server._auth import StorageTokenStore, TokenAuthority
from vcasync.storage import open_storage
from vcasync.tensors import ModelState
from vcasync.wire import decode_message

from .conftest import SECRET, bearer, control, tiny_model


def coordinator(storage) -> Coordinator:
    cfg = CoordinatorConfig(durability="journal", lease_timeout_s=30.0, snapshot_interval_s=3600.0,
                            restart_grace_s=0.0)
    return Coordinator(ModelState.from_module(tiny_model()), make_units(4, steps=3),
                       policy=build_policy("vcasgd"), storage=storage, config=cfg)


async def test_workers_who_joined_after_the_last_snapshot_are_listed_by_name_after_a_crash(
        tmp_path: Path) -> None:
    # Found by a probe: after a SIGKILL and a restart, a worker that had joined since the last
    # snapshot and never called back was missing from the status ("known" went from 2 to 1), and
    # the one that called back showed with an empty name (re-registered as an unknown id).
    async with open_storage(f"file://{tmp_path / 'store'}") as storage:
        a = await coordinator(storage).__aenter__()
        server = Server(a, TokenAuthority(join_secret=SECRET, store=StorageTokenStore(storage)),
                        ServerConfig(port=0))
        await server.start()
        tokens = {}
        async with aiohttp.ClientSession() as http:
            for name in ("spot-a", "spot-b"):
                async with http.post(f"{server.url}/v1/join", data=control("join", {"name": name}),
                                     headers=bearer(SECRET)) as r:
                    assert r.status == 200, await r.text()
                    tokens[name] = decode_message(await r.read(), expected_kind="joined").body
        assert a.status()["workers"]["known"] == 2
        await server.aclose()
        await crash(a)
        async with coordinator(storage) as b, Server(
                b, TokenAuthority(join_secret=SECRET, store=StorageTokenStore(storage)),
                ServerConfig(port=0)) as back:
            assert b.status()["workers"]["known"] == 2
            rows = {row["id"]: row for row in b.live_status()["worker_rows"]}
            assert {rows[t["worker_id"]]["name"] for t in tokens.values()} == {"spot-a", "spot-b"}
            async with aiohttp.ClientSession() as http, http.post(     # spot-b calls back
                    f"{back.url}/v1/leases", data=control("lease_request"),
                    headers=bearer(tokens["spot-b"]["token"])) as r:
                assert r.status == 201, await r.text()
            rows = {row["id"]: row for row in b.live_status()["worker_rows"]}
            assert rows[tokens["spot-b"]["worker_id"]]["name"] == "spot-b"
            assert rows[tokens["spot-b"]["worker_id"]]["state"] == "alive"
            assert b.status()["workers"]["known"] == 2


def test_a_worker_the_ledger_would_have_forgotten_by_now_is_not_recalled() -> None:
    from vcasync.ledger import Ledger, LedgerConfig
    led = Ledger(make_units(1, steps=1), config=LedgerConfig(forget_workers_s=600.0),
                 clock=lambda: 1000.0, secret=b"0123456789abcdef0123456789abcdef")
    known = led.join("known")
    assert not led.recall(known, "renamed?", 5.0)              # known: kept as it is
    assert led.recall("w-late", "late", 30.0)                  # joined 30 s ago: gone until heard
    assert not led.recall("w-old", "old", 601.0)               # would have been forgotten
    assert led.recall("w-odd", "\ud800", 1.0)                  # a name from before they were checked
    _, rows = led.worker_rows()
    by_id = {r["id"]: r for r in rows}
    assert set(by_id) == {known, "w-late", "w-odd"}
    assert by_id["w-odd"]["name"] == ""
    assert by_id["w-late"]["name"] == "late"
    assert by_id["w-late"]["last_seen_s"] == 30.0


async def test_token_records_say_who_joined_as_whom_and_when() -> None:
    async with open_storage("memory://joined") as storage:
        first = TokenAuthority(join_secret=SECRET, store=StorageTokenStore(storage))
        await first.issue("w1", "spot-1")
        await first.issue("w1", "spot-1")                      # joined again: one row
        await first.issue("w2", "spot-2")
        await first.revoke("w2")                               # revoked: not a worker of the run
        second = TokenAuthority(join_secret=SECRET, store=StorageTokenStore(storage))
        await second.load()
        (row,) = second.joined()
        assert row[:2] == ("w1", "spot-1")
        assert 0 <= row[2] < 60


def test_after_a_snapshot_every_worker_who_joined_since_is_recalled_however_long_ago() -> None:
    # found by a probe: recall skipped a worker that joined more than forget_workers_s ago, though
    # forgetting counts from when a worker was last seen (it may have heartbeated until the crash)
    from vcasync.ledger import Ledger, LedgerConfig
    led = Ledger(make_units(1, steps=1), config=LedgerConfig(forget_workers_s=5.0),
                 clock=lambda: 1000.0, secret=b"0123456789abcdef0123456789abcdef")
    nameless = led.join("")                                    # as a replayed result re-registers it
    assert led.recall("w-long", "long", 30.0, since_capture_s=60.0)     # joined after the capture
    assert not led.recall("w-before", "before", 90.0, since_capture_s=60.0)   # before: forgotten
    assert not led.recall(nameless, "spot-9", 30.0, since_capture_s=60.0)
    _, rows = led.worker_rows()
    by_id = {r["id"]: r for r in rows}
    assert set(by_id) == {nameless, "w-long"}
    assert by_id[nameless]["name"] == "spot-9"                  # known, nameless: named now
