"""A trainer's failure text with secrets in it (probe D6: the join secret a trainer put in its
exception reached the coordinator's log at INFO, ``/status/data`` and the ledger in every snapshot).
Both ends scrub it: the worker takes out what it knows before it sends (and cuts the text), the
coordinator takes out the join secret, join tokens, the operator token and worker tokens before it
logs, stores or shows it, whatever an (older) worker sent. A real coordinator and server on
127.0.0.1 with file storage, and the real ``Worker`` or ``CoordinatorClient``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from vcasync.errors import TrainerError, WorkerBackoffError
from vcasync.ledger._units import make_units
from vcasync.server._auth import TokenAuthority
from vcasync.trainer import TrainContext, TrainResult
from vcasync.worker._client import CoordinatorClient

from .conftest import SECRET, running
from .test_worker import worker

JOIN_TOKEN = "join-token-of-w9-5d2e8a1c0b7f"
OPERATOR = "operator-token-3c9e1f0a2b4d6e8f"


def authority() -> TokenAuthority:
    return TokenAuthority(join_secret=SECRET, join_tokens={"w9": JOIN_TOKEN}, operator_token=OPERATOR)


def stored_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


async def status_data(url: str, token: str) -> str:
    async with aiohttp.ClientSession() as http, \
            http.get(f"{url}/status/data", headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.text()


async def test_the_coordinator_scrubs_what_an_old_worker_sends_raw(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="vcasync")
    cfg = {"worker_backoff_s": 30.0}
    async with running(tmp_path, units=make_units(2, steps=2), authority=authority(),
                       coordinator=cfg) as (coord, server), CoordinatorClient(server.url) as client:
        _, token = await client.join(SECRET, "old")
        grant = await client.lease()
        other = await authority().issue("w-someone")   # another run's, another worker's
        # what a worker before the fix sent: its trainer's message as it was
        await client.release(grant.lease_id, f"trainer error: RuntimeError: secret={SECRET} "
                             f"mine={token} theirs={other} join={JOIN_TOKEN} op={OPERATOR}")
        with pytest.raises(WorkerBackoffError) as refused:   # logged by the refusal log
            await client.lease()
        shown = [str(refused.value), str(coord.status()), await status_data(server.url, token)]
        async with aiohttp.ClientSession() as http, http.get(
                f"{server.url}/v1/status", headers={"Authorization": f"Bearer {token}"}) as resp:
            shown.append(await resp.text())
    secrets = (SECRET, token, other, JOIN_TOKEN, OPERATOR, token.rpartition("_")[2])
    for text in (*shown, caplog.text):
        assert "secret=***" in text, text[-2000:]
        for secret in secrets:
            assert secret not in text, text[-2000:]
    assert "refused lease" in caplog.text
    assert "last: released: trainer error: RuntimeError: secret=*** mine=*** theirs=*** join=*** " \
           "op=***" in str(refused.value)
    stored = stored_bytes(tmp_path / "store")        # the ledger in the final snapshot
    assert b"secret=***" in stored
    for secret in secrets:
        assert secret.encode() not in stored


async def test_the_worker_scrubs_and_cuts_what_it_sends(tmp_path: Path, caplog,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator's own scrubbing off: what arrives is what the worker sent."""
    monkeypatch.setattr(TokenAuthority, "scrub", lambda self, text: text, raising=False)
    monkeypatch.setenv("MY_API_TOKEN", "env-token-value-7e3f")
    caplog.set_level(logging.INFO, logger="vcasync")
    sent: list[str] = []
    holder: dict[str, Any] = {}

    def leaky(ctx: TrainContext) -> TrainResult:
        token = holder["worker"]._ident.token
        raise RuntimeError(f"secret={SECRET} token={token} env=env-token-value-7e3f " + "x" * 5000)

    async with running(tmp_path, units=make_units(1, steps=2),
                       coordinator={"worker_backoff_s": 0.05}) as (coord, server):
        release = coord.release

        async def spy(worker_id: str, lease_id: str, reason: str = "", **kw: Any) -> None:
            sent.append(reason)
            await release(worker_id, lease_id, reason, **kw)

        coord.release = spy  # type: ignore[method-assign]
        w = holder["worker"] = worker(server.url, tmp_path / "w", leaky, max_trainer_failures=1)
        with pytest.raises(TrainerError):
            await asyncio.wait_for(w.run(), 30)
        token = w._ident.token if w._ident else ""
    assert sent, "the worker released nothing"
    for reason in sent:
        assert reason.startswith("trainer error: RuntimeError: secret=*** token=*** env=*** xxx")
        assert len(reason) <= 300         # RELEASE_REASON_CHARS: what the ledger keeps
        assert reason.endswith("...")
    assert "secret=*** token=*** env=***" in caplog.text          # its own log says it too
    for secret in (SECRET, token, "env-token-value-7e3f"):
        assert secret not in caplog.text
        assert all(secret not in reason for reason in sent)
