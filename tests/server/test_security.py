"""Credentials never reach a log line or a repr; TLS end to end with a certificate made in the test."""

from __future__ import annotations

import json
import logging
import ssl
from pathlib import Path

import aiohttp
import pytest

from harness.tls import self_signed
from vcasync.ledger._units import make_units
from vcasync.server import ServerConfig
from vcasync.server._auth import TokenAuthority
from vcasync.wire import decode_message
from vcasync.worker import Worker, WorkerConfig
from vcasync.worker._client import CoordinatorClient, client_ssl_context

from .conftest import SECRET, bearer, control, running
from .test_worker import FAST, make_trainer


async def test_logs_and_reprs_never_hold_secrets_or_tokens(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    tokens: list[str] = []
    async with running(tmp_path, units=make_units(2, steps=2)) as (_, server), \
            aiohttp.ClientSession() as http:
        # Failures first: a wrong secret, a forged token, a garbage body with a good token.
        async with http.post(f"{server.url}/v1/join", data=control("join"),
                             headers=bearer(SECRET[:-1] + "X")) as r:
            assert r.status == 401
        async with http.post(f"{server.url}/v1/join", data=control("join"), headers=bearer(SECRET)) as r:
            tokens.append(decode_message(await r.read()).body["token"])
        async with http.post(f"{server.url}/v1/join", json={},
                             headers={"Authorization": f"Bearer {SECRET}"}) as r:
            tokens.append((await r.json())["token"])
        async with http.post(f"{server.url}/v1/leases", data=b"\xc1", headers=bearer(tokens[1])) as r:
            assert r.status == 400
        async with http.post(f"{server.url}/v1/leases", data=control("lease_request"),
                             headers=bearer(tokens[0][:-2] + "zz")) as r:
            assert r.status == 401
        w = Worker(server.url, make_trainer(), state_dir=tmp_path / "w", join_secret=SECRET,
                   config=WorkerConfig(backoff=FAST))
        report = await w.run()
        assert report.reason == "finished"
        tokens.append(json.loads((tmp_path / "w" / "identity.json").read_text())["token"])
        assert SECRET not in repr(w)
        assert tokens[-1] not in repr(w)
        client = CoordinatorClient(server.url, token=tokens[-1])
        assert tokens[-1] not in repr(client)
        await client.aclose()
    access = [r for r in caplog.records if r.name == "aiohttp.access"]
    assert access, "the access log must be on for this test to mean anything"
    assert any(r.name.startswith("vcasync") for r in caplog.records)
    text = caplog.text + "".join(str(r.args) for r in caplog.records)
    # Not even the secret part of a token (token_urlsafe secrets may hold '_' themselves).
    for secret in (SECRET, *tokens, *(t.split("_", 2)[2] for t in tokens)):
        assert secret not in text


def test_authority_repr_holds_no_secret() -> None:
    auth = TokenAuthority(join_secret=SECRET, join_tokens={"w1": "pre-issued-token-for-w1-0000"})
    assert SECRET not in repr(auth)
    assert "pre-issued" not in repr(auth)


async def test_tls_end_to_end(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    cfg = ServerConfig(port=0, tls_cert=cert, tls_key=key)
    async with running(tmp_path, units=make_units(2, steps=2), server_config=cfg) as (coord, server):
        assert server.url.startswith("https://127.0.0.1:")
        w = Worker(server.url, make_trainer(), state_dir=tmp_path / "w", join_secret=SECRET,
                   config=WorkerConfig(backoff=FAST, ca_file=cert))
        report = await w.run()
        assert report.reason == "finished"
        assert report.results_accepted == 2
        # Without trusting the certificate the handshake fails, and that is not retried.
        async with CoordinatorClient(server.url, ssl_context=client_ssl_context(None)) as client:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await client.join(SECRET)
        # Plain HTTP to the TLS port does not get through either.
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                async with http.get(server.url.replace("https://", "http://") + "/healthz") as r:
                    await r.read()
        ctx = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as http, http.get(f"{server.url}/healthz", ssl=ctx) as r:
            assert r.status == 200
        assert coord.version >= 0
