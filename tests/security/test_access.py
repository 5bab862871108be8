"""Access control: every route but the probes and the status page needs a worker token; tokens are
per worker and revocable; a worker cannot touch another worker's lease, whatever route it tries.
(The status page's data has its own rule, loopback or a read token: tests/status/test_routes.py.)"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from harness import hostile_payloads as HP
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy
from vcasync.server import Server, ServerConfig
from vcasync.server._auth import StorageTokenStore, TokenAuthority
from vcasync.server.status import PUBLIC_STATUS_ROUTES
from vcasync.storage import open_storage

from .conftest import PAYLOAD, SECRET, call, digits_model, join, lease, serving

PUBLIC = {"healthz", "metrics", *PUBLIC_STATUS_ROUTES}


async def test_every_route_but_the_probes_needs_a_worker_token(tmp_path: Path) -> None:
    async with serving(tmp_path) as (coord, server, _), aiohttp.ClientSession() as http:
        _, token = await join(http, server.url, "a")
        g = await lease(http, server.url, token)
        named = {r.name: r for r in server.app.router.routes() if r.name is not None}
        # The list comes from the router itself: a route added later cannot slip past this test.
        assert {"join", "lease", "resume", "heartbeat", "result", "release", "model", "status"} \
            <= set(named)
        before = coord.status()
        for name, route in named.items():
            info = route.get_info()
            path = info.get("path") or info["formatter"]
            path = path.replace("{lease}", g["lease_id"]).replace("{version}", "latest")
            for cred in (None, "", SECRET if name != "join" else token, "vca_0000000000000000_x"):
                status, body, raw = await call(http, route.method, server.url + path,
                                               cred or None, data=b"")
                if name in PUBLIC:
                    assert status == 200, (name, status)
                    continue
                if name == "requeue" and cred:   # an operator route, and no operator token is set
                    assert (status, body["error"]) == (403, "operator_disabled"), (cred, raw[:200])
                    continue
                assert status == 401, (name, cred, status, raw[:200])
                assert body["error"] == "unauthorized"
        after = coord.status()
        assert after["units"] == before["units"]
        assert after["leases"] == before["leases"]
        assert after["version"] == before["version"]


async def test_the_status_answer_is_never_cached(tmp_path: Path) -> None:
    # found by a probe: /status/data said no-store, GET /v1/status (the same document, behind a
    # worker token) said nothing, so a proxy or browser cache could keep and serve it
    async with serving(tmp_path) as (_coord, server, _), aiohttp.ClientSession() as http:
        _, token = await join(http, server.url, "a")
        async with http.get(f"{server.url}/v1/status",
                            headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 200
            assert r.headers.get("Cache-Control") == "no-store"


async def test_tokens_are_per_worker_and_revocable(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_coord, server, auth), aiohttp.ClientSession() as http:
        a_id, a = await join(http, server.url, "a")
        b_id, b = await join(http, server.url, "b")
        assert a != b
        assert a_id != b_id
        assert auth.verify(a) == a_id
        assert auth.verify(b) == b_id
        assert await auth.revoke(a_id) == 1
        status, body, _ = await call(http, "POST", f"{server.url}/v1/leases", a, "lease_request")
        assert (status, body["error"]) == (401, "unauthorized")
        assert "revoked" in body["message"]
        await lease(http, server.url, b)                      # the other worker is unaffected
        _, a2 = await join(http, server.url, "a")             # joining again gives a new token
        assert a2 != a
        await lease(http, server.url, a2)


async def test_revoking_a_join_token_revokes_the_worker_tokens_it_gave(tmp_path: Path) -> None:
    """operating.md: a pre-issued join token is the way to "revoke one machine". Found by a probe:
    a coordinator restarted without alice's line in --join-tokens-file refused alice's next join, but
    the worker token she got with it was still accepted (she leased on), revoked or not."""
    tokens = {"alice": "alice-join-token-0123456789abcdef", "bob": "bob-join-token-0123456789abcdef0"}
    async with open_storage(f"file://{tmp_path / 'store'}") as storage, aiohttp.ClientSession() as http:
        async def start(join_tokens: dict[str, str]) -> tuple[Coordinator, Server, TokenAuthority]:
            coord = Coordinator(digits_model(), make_units(6, steps=5), policy=build_policy("vcasgd"),
                                storage=storage, config=CoordinatorConfig(lease_timeout_s=600.0))
            auth = TokenAuthority(join_tokens=join_tokens, store=StorageTokenStore(storage))
            await coord.__aenter__()
            server = Server(coord, auth, ServerConfig(port=0))
            await server.start()
            return coord, server, auth

        coord, server, _ = await start(tokens)
        worker = {}
        for name, credential in tokens.items():
            status, body, _ = await call(http, "POST", f"{server.url}/v1/join", credential, "join", {})
            assert status == 200, body
            worker[name] = body["token"]
        await server.aclose()
        await coord.__aexit__(None, None, None)

        coord, server, auth = await start({"bob": tokens["bob"]})      # alice's line taken out
        try:
            status, body, _ = await call(http, "POST", f"{server.url}/v1/leases", worker["alice"],
                                         "lease_request")
            assert status == 401, body                                  # it was 201: a lease
            assert body["error"] == "unauthorized"
            assert "revoked" in body["message"]
            assert [name for _, name, _ in auth.joined()] == ["bob"]
            await lease(http, server.url, worker["bob"])               # bob is untouched
            assert auth.revoke_join_token("bob")                        # and in-process the same
            status, body, _ = await call(http, "POST", f"{server.url}/v1/leases", worker["bob"],
                                         "lease_request")
            assert (status, body["error"]) == (401, "unauthorized"), body
        finally:
            await server.aclose()
            await coord.__aexit__(None, None, None)


async def test_a_worker_cannot_touch_another_workers_lease(tmp_path: Path) -> None:
    async with serving(tmp_path) as (coord, server, _), aiohttp.ClientSession() as http:
        _, a = await join(http, server.url, "attacker")
        _b_id, b = await join(http, server.url, "victim")
        g = await lease(http, server.url, b)
        lid = g["lease_id"]
        model = digits_model()
        result = HP.valid_result(model, lid, g["base_version"], steps=g["unit"]["steps"])
        before = coord.status()
        for path, kind, body, data, ctype in [
            (f"/v1/leases/{lid}/heartbeat", "heartbeat", {"steps_done": 1}, None, "application/x-msgpack"),
            (f"/v1/leases/{lid}/release", "release", {"reason": "mine now"}, None, "application/x-msgpack"),
            (f"/v1/leases/{lid}/resume", "resume", {}, None, "application/x-msgpack"),
            (f"/v1/leases/{lid}/result", None, None, result, PAYLOAD),
        ]:
            method = "PUT" if path.endswith("result") else "POST"
            status, answer, _ = await call(http, method, server.url + path, a, kind, body, data, ctype)
            assert status == 403, (path, status, answer)
            assert answer["error"] == "not_lease_holder"
        after = coord.status()
        assert (after["version"], after["units"], after["leases"]) == \
            (before["version"], before["units"], before["leases"])
        # Still the victim's: its own result is accepted.
        status, receipt, _ = await call(http, "PUT", f"{server.url}/v1/leases/{lid}/result", b,
                                        data=result, ctype=PAYLOAD)
        assert status == 200
        assert receipt["status"] == "accepted"
        assert coord.version == before["version"] + 1
