"""A real Coordinator behind a real aiohttp server on 127.0.0.1, for the status page's routes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import torch

from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy
from vcasync.server import Server, ServerConfig
from vcasync.server._auth import TokenAuthority
from vcasync.server.status import StatusAccess
from vcasync.storage import open_storage
from vcasync.tensors import ModelState

SECRET = "join-secret-for-status-tests-7a2c"
OPERATOR = "operator-token-for-status-tests-91e"
READ_TOKEN = "status-read-token-for-tests-5d0b"


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, access: StatusAccess | None = None,
                  units: int = 4) -> AsyncIterator[tuple[Coordinator, Server]]:
    torch.manual_seed(0)
    model = ModelState.from_module(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)))
    auth = TokenAuthority(join_secret=SECRET, operator_token=OPERATOR)
    async with open_storage(f"file://{tmp_path / 'store'}") as storage, \
            Coordinator(model, make_units(units, steps=3), policy=build_policy("vcasgd"), storage=storage,
                        config=CoordinatorConfig(durability="journal")) as coord, \
            Server(coord, auth, ServerConfig(port=0, access_log=False), status_access=access) as server:
        yield coord, server
