"""Fixtures for the server area: a real Coordinator on file storage behind a real aiohttp server on
127.0.0.1, and helpers that speak raw HTTP to it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.ledger._units import WorkUnit, make_units
from vcasync.policy import build_policy
from vcasync.server import Server, ServerConfig
from vcasync.server._auth import TokenAuthority
from vcasync.storage import open_storage
from vcasync.tensors import ModelState
from vcasync.wire import encode_message, encode_payload

SECRET = "join-secret-for-tests-4f1b9c0d7e"
MSGPACK = "application/x-msgpack"
PAYLOAD = "application/x-vcasync-payload"


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


@contextlib.asynccontextmanager
async def running(tmp_path: Path, *, units: Sequence[WorkUnit] | None = None, secret: str = SECRET,
                  server_config: ServerConfig | None = None, durability: str = "journal",
                  lease_timeout_s: float = 30.0, authority: TokenAuthority | None = None,
                  store: str | None = None, initial: torch.nn.Module | None = None,
                  coordinator: Mapping[str, Any] | None = None, policy: Any = None,
                  linger_s: float | None = None) -> AsyncIterator[tuple[Coordinator, Server]]:
    """A coordinator (file storage under ``tmp_path`` unless durability is "none") on 127.0.0.1:0;
    ``coordinator``: more :class:`CoordinatorConfig` fields; ``linger_s``: the Server's."""
    model = ModelState.from_module(initial if initial is not None else tiny_model())
    units = list(units) if units is not None else make_units(4, steps=3)
    cfg = CoordinatorConfig(durability=durability, lease_timeout_s=lease_timeout_s,  # type: ignore[arg-type]
                            **dict(coordinator or {}))
    auth = authority or TokenAuthority(join_secret=secret)
    async with contextlib.AsyncExitStack() as stack:
        storage = None
        if durability != "none":
            storage = await stack.enter_async_context(open_storage(store or f"file://{tmp_path / 'store'}"))
        coord = await stack.enter_async_context(
            Coordinator(model, units, policy=policy or build_policy("vcasgd"), storage=storage,
                        config=cfg))
        server = await stack.enter_async_context(Server(coord, auth, server_config or ServerConfig(port=0),
                                                        linger_s=linger_s))
        yield coord, server


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Coordinator, Server]]:
    async with running(tmp_path) as pair:
        yield pair


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def control(kind: str, body: Mapping[str, Any] | None = None) -> bytes:
    return encode_message(kind, body or {})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": MSGPACK, "Accept": MSGPACK}


def result_payload(coord_model: ModelState, lease_id: str, base_version: int, *, scale: float = 0.01,
                   tensors: Mapping[str, torch.Tensor] | None = None, steps: int = 3,
                   samples: int = 32) -> bytes:
    """A delta result for ``lease_id``: every float tensor moves by ``scale``."""
    delta = dict(tensors) if tensors is not None else {
        k: torch.full_like(v, scale) for k, v in coord_model.items()}
    meta = {"lease_id": lease_id, "base_version": base_version, "kind": "delta", "samples": samples,
            "steps": steps, "partial": False, "metrics": {"loss": 1.0}}
    return b"".join(encode_payload("result", meta, delta))


def coordinator_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str,
                        toml: str | None = None) -> int:
    """``vcasync coordinator`` with ``flags`` (and ``toml`` as its ``--config``) on a model that cannot
    be imported: its exit status, once checked that it made no storage (a bad setting must be
    refused before anything runs; the model's import would fail later)."""
    from vcasync.cli import main

    monkeypatch.setenv("VCASYNC_JOIN_SECRET", "x" * 20)
    args = ["coordinator", "--model", "no.such.module:model", "--port", "0",
            "--storage", str(tmp_path / "store"), *flags]
    if toml is not None:
        config = tmp_path / "run.toml"
        config.write_text(toml)
        args += ["--config", str(config)]
    status = main(args)
    assert not (tmp_path / "store").exists()
    return status
