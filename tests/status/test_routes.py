"""The status page's routes on a real server: what is served, to whom, and that it shows the same
numbers as ``GET /v1/status`` and never a credential."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from vcasync.errors import ConfigError
from vcasync.server.status import ASSETS, StatusAccess, is_loopback
from vcasync.wire import encode_payload

from .conftest import OPERATOR, READ_TOKEN, SECRET, serving

JSON = {"Content-Type": "application/json"}


async def _join(http: aiohttp.ClientSession, url: str, name: str = "w") -> str:
    async with http.post(f"{url}/v1/join", json={"name": name},
                         headers={"Authorization": f"Bearer {SECRET}"}) as resp:
        assert resp.status == 200
        return str((await resp.json())["token"])


async def _call(http: aiohttp.ClientSession, method: str, url: str, token: str | None = None,
                body: dict[str, Any] | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.request(method, url, json=body if body is not None else {}, headers=headers) as resp:
        return resp.status, await resp.json()


async def _data(http: aiohttp.ClientSession, url: str, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.get(f"{url}/status/data", headers=headers) as resp:
        return resp.status, await resp.json()


async def test_the_page_and_its_assets_are_served_with_a_strict_policy(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_, server), aiohttp.ClientSession() as http:
        async with http.get(f"{server.url}/status", allow_redirects=False) as resp:
            assert resp.status == 308
            assert resp.headers["Location"] == "status/"
        async with http.get(server.status_url) as resp:
            assert resp.status == 200
            assert resp.content_type == "text/html"
            html = await resp.text()
            csp = resp.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp
        assert "default-src 'none'" in csp
        assert "http://" not in html
        assert "https://" not in html
        for name, ctype in ASSETS.items():
            assert name in html
            async with http.get(f"{server.status_url}{name}") as resp:
                assert resp.status == 200
                assert resp.content_type == ctype
                assert "https://" not in (await resp.text()).replace("http://www.w3.org/2000/svg", "")
        async with http.get(f"{server.status_url}secrets.txt") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"] == "not_found"


async def test_the_page_shows_the_v1_status_document_and_the_live_view(tmp_path: Path) -> None:
    async with serving(tmp_path) as (coord, server), aiohttp.ClientSession() as http:
        token = await _join(http, server.url, "spot-1")
        status, grant = await _call(http, "POST", f"{server.url}/v1/leases", token)
        assert status == 201
        status, _ = await _call(http, "POST", f"{server.url}/v1/leases/{grant['lease_id']}/release", token,
                                {"reason": "preempted: SIGTERM", "failed": False})
        assert status == 200
        async with http.get(f"{server.url}/v1/status", headers={"Authorization": f"Bearer {token}"}) as resp:
            v1 = await resp.json()
        status, data = await _data(http, server.url)
        assert status == 200
        # the same document, but for the coordinator's CPU seconds: a clock that moved between reads
        cpu_v1 = v1["metrics"].pop("process_cpu_seconds_total")
        assert data["status"]["metrics"].pop("process_cpu_seconds_total") >= cpu_v1 > 0
        # and the owner lease's renewal age, a clock too
        # (a renewal between the reads may even set it back)
        assert v1["owner"].pop("renewed_s_ago") >= 0
        assert data["status"]["owner"].pop("renewed_s_ago") >= 0
        assert data["status"] == v1
        live = data["live"]
        assert [e["kind"] for e in live["events"]] == ["preempted", "join"]
        assert live["events"][0]["detail"] == "preempted: SIGTERM"
        assert live["events"][0]["unit"] == grant["unit"]["unit_id"]
        assert live["worker_states"]["preempted"] == 1
        (row,) = live["worker_rows"]
        assert row["name"] == "spot-1"
        assert row["state"] == "preempted"
        assert row["done"] == 0
        assert live["curves"] == {}
        assert live["merges_per_s"] == 0.0
        assert coord.version == v1["version"]


async def test_an_evaluator_feeds_the_curve_through_the_hook(tmp_path: Path) -> None:
    async with serving(tmp_path) as (coord, server), aiohttp.ClientSession() as http:
        token = await _join(http, server.url)
        url = f"{server.url}/v1/evals"
        status, body = await _call(http, "POST", url, None, {"version": 0, "values": {"accuracy": 0.5}})
        assert status == 401
        assert body["error"] == "unauthorized"
        status, body = await _call(http, "POST", url, token, {"version": 0,
                                                              "values": {"accuracy": 0.5, "loss": 1.25}})
        assert status == 200, body
        status, body = await _call(http, "POST", url, token, {"version": 0, "values": {"accuracy": "high"}})
        assert status == 400
        assert body["error"] == "malformed_payload"
        assert body["field"] == "values"
        status, body = await _call(http, "POST", url, token, {"version": 7, "values": {"accuracy": 0.9}})
        assert status == 400
        assert body["field"] == "version"
        coord.record_eval(0, {"accuracy": 0.75})                    # in-process, the same hook
        _, data = await _data(http, server.url)
        assert [p[1:] for p in data["live"]["curves"]["accuracy"]] == [[0, 0.5], [0, 0.75]]
        assert [p[1:] for p in data["live"]["curves"]["loss"]] == [[0, 1.25]]


async def test_a_merged_result_moves_the_rate_and_the_worker_row(tmp_path: Path) -> None:
    async with serving(tmp_path) as (coord, server), aiohttp.ClientSession() as http:
        token = await _join(http, server.url, "good")
        _, grant = await _call(http, "POST", f"{server.url}/v1/leases", token)
        delta = {k: torch.full_like(v, 0.01) for k, v in coord.model().items()}
        meta = {"lease_id": grant["lease_id"], "base_version": grant["base_version"], "kind": "delta",
                "samples": 8, "steps": 3, "partial": False, "metrics": {}}
        async with http.put(f"{server.url}/v1/leases/{grant['lease_id']}/result",
                            data=b"".join(encode_payload("result", meta, delta)),
                            headers={"Authorization": f"Bearer {token}",
                                     "Content-Type": "application/x-vcasync-payload"}) as resp:
            assert resp.status == 200, await resp.text()
        _, data = await _data(http, server.url)
        assert data["status"]["units"]["done"] == 1
        assert data["status"]["version"] == 1
        assert data["live"]["merges_per_s"] > 0
        assert data["live"]["worker_rows"][0]["done"] == 1


async def test_data_needs_the_read_token_where_loopback_is_not_trusted(tmp_path: Path) -> None:
    access = StatusAccess(READ_TOKEN, open_on_loopback=False)
    async with serving(tmp_path, access) as (_, server), aiohttp.ClientSession() as http:
        worker = await _join(http, server.url)
        for credential in (None, "wrong-token-of-some-length", worker, SECRET, OPERATOR):
            status, body = await _data(http, server.url, credential)
            assert (status, body["error"]) == (401, "unauthorized"), credential
        status, body = await _data(http, server.url, READ_TOKEN)
        assert status == 200
        assert "status" in body
        async with http.get(server.status_url) as resp:           # the page itself holds no data
            assert resp.status == 200


async def test_without_a_read_token_elsewhere_is_refused_with_403(tmp_path: Path) -> None:
    async with serving(tmp_path, StatusAccess(None, open_on_loopback=False)) as (_, server), \
            aiohttp.ClientSession() as http:
        status, body = await _data(http, server.url, READ_TOKEN)
        assert status == 403
        assert body["error"] == "status_disabled"
        assert "VCASYNC_STATUS_TOKEN" in body["message"]


async def test_loopback_is_trusted_only_under_a_local_host_name(tmp_path: Path) -> None:
    """Found by a probe: a web page the operator opens elsewhere whose name its DNS then points
    at 127.0.0.1 (DNS rebinding) reads the data through the operator's browser, which comes from
    loopback; its requests carry that page's name in ``Host``. Loopback is trusted under an
    address, ``localhost`` or this machine's name only; any other name needs the read token."""
    async with serving(tmp_path, StatusAccess(READ_TOKEN)) as (_, server), \
            aiohttp.ClientSession() as http:
        port = server.port
        for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}",
                     f"localhost.attacker.example:{port}", f"{socket.gethostname()}.evil.example"):
            async with http.get(f"{server.url}/status/data", headers={"Host": host}) as resp:
                body = await resp.json()
                assert (resp.status, body["error"]) == (401, "unauthorized"), host
                assert "Host" in body["message"]
            async with http.get(f"{server.url}/status/data",
                                headers={"Host": host, "Authorization": f"Bearer {READ_TOKEN}"}) as resp:
                assert resp.status == 200, host
        for host in (f"127.0.0.1:{port}", "127.0.0.1", f"[::1]:{port}", f"localhost:{port}",
                     "LocalHost.", f"app.localhost:{port}", f"{socket.gethostname()}:{port}"):
            async with http.get(f"{server.url}/status/data", headers={"Host": host}) as resp:
                assert resp.status == 200, host
    async with serving(tmp_path, StatusAccess(None)) as (_, server), aiohttp.ClientSession() as http, \
            http.get(f"{server.url}/status/data", headers={"Host": "attacker.example"}) as resp:
        body = await resp.json()
        assert (resp.status, body["error"]) == (403, "status_disabled")
        assert "attacker.example" in body["message"]


async def test_a_worker_name_is_shown_as_one_printable_line(tmp_path: Path) -> None:
    """Found by a probe: a name joined with control characters (an escape sequence, a line break)
    was shown as such in the worker rows of /status/data and in /v1/status's failing workers,
    though the events beside them showed it as one printable line, as this page's docs promise."""
    name = "evil\x1b[31m\nFAKE\tline\u202e"
    async with serving(tmp_path) as (_, server), aiohttp.ClientSession() as http:
        token = await _join(http, server.url, name)
        _, grant = await _call(http, "POST", f"{server.url}/v1/leases", token)
        await _call(http, "POST", f"{server.url}/v1/leases/{grant['lease_id']}/release", token,
                    {"reason": "crashed", "failed": True})
        _, data = await _data(http, server.url)
        _, status = await _call(http, "GET", f"{server.url}/v1/status", token)
    shown = [row["name"] for row in data["live"]["worker_rows"]]
    shown += [w["name"] for w in data["status"]["failing_workers"].values()]
    shown += [w["name"] for w in status["failing_workers"].values()]
    shown += [e["detail"] for e in data["live"]["events"] if e["kind"] == "join"]
    assert len(shown) == 4, shown
    assert set(shown) == {"evil?[31m?FAKE?line?"}, shown


@pytest.mark.parametrize(("remote", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.1", False), ("192.168.1.5", False), ("::ffff:10.0.0.1", False), ("2001:db8::1", False),
    (None, False), ("", False), ("localhost", False), ("fe80::1%eth0", False),
])
def test_loopback_is_told_by_address(remote: str | None, loopback: bool) -> None:
    assert is_loopback(remote) is loopback


def test_the_access_rule_keeps_no_token_and_shows_none() -> None:
    access = StatusAccess(READ_TOKEN)
    assert READ_TOKEN not in repr(access)
    assert "set" in repr(access)
    access.check("10.1.2.3", f"Bearer {READ_TOKEN}")
    access.check("127.0.0.1", "")
    with pytest.raises(ConfigError, match="too short"):
        StatusAccess("short")


async def test_no_credential_ever_reaches_the_page_or_its_data(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    aws = "AKIAFAKEFAKEsecretAccessKey0123456789"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", aws)
    async with serving(tmp_path, StatusAccess(READ_TOKEN)) as (coord, server), \
            aiohttp.ClientSession() as http:
        token = await _join(http, server.url, "w1")
        _, grant = await _call(http, "POST", f"{server.url}/v1/leases", token)
        await _call(http, "POST", f"{server.url}/v1/leases/{grant['lease_id']}/release", token,
                    {"reason": "crashed", "failed": True})
        coord.record_eval(0, {"accuracy": 0.5})
        texts = [json.dumps(await _data(http, server.url)), json.dumps(await _data(http, server.url,
                                                                                   READ_TOKEN))]
        for path in ("", *ASSETS):
            async with http.get(f"{server.status_url}{path}") as resp:
                texts.append(await resp.text())
        # the token's secret part: all after "vca_<16 hex>_" (rsplit("_") took what followed the
        # secret's own last "_", which token_urlsafe draws: "U" once, found in the page's HTML)
        prefix, token_id, secret_part = token.split("_", 2)
        assert (prefix, len(token_id)) == ("vca", 16)
        secrets = [SECRET, OPERATOR, READ_TOKEN, token, secret_part, aws]
        for text in texts:
            for secret in secrets:
                assert secret not in text
