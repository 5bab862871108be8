"""A real coordinator behind the real server on 127.0.0.1, with the digits model, for the security
review; helpers that talk raw HTTP to it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import torch

from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.examples import digits
from vcasync.ledger._units import make_units
from vcasync.policy import MergePolicy, build_policy
from vcasync.server import Server, ServerConfig
from vcasync.server._auth import TokenAuthority
from vcasync.server.status import StatusAccess
from vcasync.storage import Storage, open_storage
from vcasync.tensors import ModelState
from vcasync.wire import decode_message, encode_message

SECRET = "security-join-secret-0123456789abcdef"
MSGPACK = "application/x-msgpack"
PAYLOAD = "application/x-vcasync-payload"


def digits_model() -> ModelState:
    torch.manual_seed(0)
    return ModelState.from_module(digits.model())


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, *, units: int = 6, steps: int = 5, policy: MergePolicy | None = None,
                  storage: Storage | None = None, server_config: ServerConfig | None = None,
                  model: ModelState | None = None,
                  status_access: StatusAccess | None = None) -> AsyncIterator[tuple[Coordinator, Server,
                                                                          TokenAuthority]]:
    auth = TokenAuthority(join_secret=SECRET)
    async with contextlib.AsyncExitStack() as stack:
        if storage is None:
            storage = await stack.enter_async_context(open_storage(f"file://{tmp_path / 'store'}"))
        coord = await stack.enter_async_context(Coordinator(
            model or digits_model(), make_units(units, steps=steps),
            policy=policy or build_policy("vcasgd"), storage=storage,
            config=CoordinatorConfig(lease_timeout_s=600.0)))
        server = await stack.enter_async_context(Server(coord, auth, server_config or ServerConfig(port=0),
                                                         status_access=status_access))
        yield coord, server, auth


def headers(token: str | None, ctype: str = MSGPACK) -> dict[str, str]:
    out = {"Content-Type": ctype, "Accept": MSGPACK}
    if token is not None:
        out["Authorization"] = f"Bearer {token}"
    return out


async def call(http: aiohttp.ClientSession, method: str, url: str, token: str | None,
               kind: str | None = None, body: Mapping[str, Any] | None = None,
               data: bytes | None = None, ctype: str = MSGPACK) -> tuple[int, Any, bytes]:
    """``(status, decoded body, raw body)``; msgpack answers decoded, JSON errors parsed."""
    payload = data if data is not None else (encode_message(kind, body or {}) if kind else None)
    async with http.request(method, url, data=payload, headers=headers(token, ctype)) as r:
        raw = await r.read()
        if r.content_type == MSGPACK:
            return r.status, decode_message(raw).body, raw
        if r.content_type == "application/json":
            return r.status, await r.json(), raw
        return r.status, None, raw


async def join(http: aiohttp.ClientSession, url: str, name: str) -> tuple[str, str]:
    status, body, _ = await call(http, "POST", f"{url}/v1/join", SECRET, "join", {"name": name})
    assert status == 200, body
    return body["worker_id"], body["token"]


async def lease(http: aiohttp.ClientSession, url: str, token: str) -> dict[str, Any]:
    status, body, _ = await call(http, "POST", f"{url}/v1/leases", token, "lease_request")
    assert status == 201, body
    return dict(body)
