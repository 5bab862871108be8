"""A join whose name or info a snapshot cannot hold is refused, in one process, and stores nothing.

JSON (and Python) hold more than msgpack, which every snapshot is packed with: a lone surrogate
(``"\\ud800"``), an int past 64 bits. Such a worker name or info once went into the ledger, and every
snapshot after it failed: the run never finished and a restart lost what it had merged.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from vcasync import encode_payload, make_delta
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.errors import FrameError
from vcasync.ledger._units import make_units
from vcasync.policy import build_policy
from vcasync.storage import open_storage
from vcasync.tensors import ModelState

SNAPSHOT = CoordinatorConfig(durability="snapshot")


def zeros() -> ModelState:
    return ModelState({"w": torch.zeros(2)})


async def chunks(body: list[bytes]) -> Any:
    for chunk in body:
        yield chunk


async def run_units(coord: Coordinator, worker_id: str, n: int) -> None:
    """``n`` units, each moving every weight by +1."""
    for _ in range(n):
        grant = await coord.lease(worker_id)
        base = coord.model(grant.base_version)
        meta = {"lease_id": grant.lease_id, "base_version": grant.base_version, "kind": "delta",
                "steps": grant.unit.steps, "samples": 1}
        trained = {k: v + 1 for k, v in base.items()}
        body = encode_payload("result", meta, make_delta(base, trained))
        receipt = await coord.submit(worker_id, grant.lease_id, chunks(body))
        assert receipt.status == "accepted"


@pytest.mark.parametrize(("name", "info", "field", "says"), [
    ("\ud800", None, "name", "lone surrogate \\ud800"),
    ("ok", {"s": "\ud800"}, "info", "info.s is not valid UTF-8"),
    ("ok", {"\udcff": 1}, "info", "a key in info is not valid UTF-8"),
    ("ok", {"n": 1180591620717411303424}, "info", "info.n = 1180591620717411303424 does not fit in 64 bits"),
    ("ok", {"n": -(1 << 63) - 1}, "info", "does not fit in 64 bits"),
    ("ok", {"tags": [1, [2, "\udfff"]]}, "info", "info.tags[1][1] is not valid UTF-8"),
    ("ok", {"x": float("nan")}, "info", "info.x = nan is not finite"),
    ("ok", {"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a": 1}}}}}}}}}, "info", "nests deeper than 8"),
])
async def test_a_join_a_snapshot_cannot_hold_is_refused_and_stores_nothing(
        tmp_path: Path, name: str, info: dict[str, Any] | None, field: str, says: str) -> None:
    async with open_storage(f"file://{tmp_path}") as storage, Coordinator(
            zeros(), make_units(3, steps=1), policy=build_policy("vcasgd"), storage=storage,
            config=SNAPSHOT) as coord:
        with pytest.raises(FrameError) as caught:
            await coord.join(name, info)
        assert caught.value.field == field
        assert says in str(caught.value)
        assert coord.status()["workers"]["known"] == 0


async def test_the_edges_of_64_bits_and_astral_characters_are_taken(tmp_path: Path) -> None:
    info = {"big": (1 << 64) - 1, "small": -(1 << 63), "emoji": "\U0001f680", "deep": [[[[1]]]]}
    async with open_storage(f"file://{tmp_path}") as storage, Coordinator(
            zeros(), make_units(1, steps=1), policy=build_policy("vcasgd"), storage=storage,
            config=SNAPSHOT) as coord:
        worker_id = await coord.join("\U0001f680" * 200, info)
        await run_units(coord, worker_id, 1)
    assert coord.storage_error is None


async def test_after_a_refused_join_every_snapshot_is_written(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with open_storage(f"file://{tmp_path}") as storage:
        async with Coordinator(zeros(), make_units(3, steps=1), policy=build_policy("vcasgd"),
                               storage=storage, config=SNAPSHOT) as coord:
            with pytest.raises(FrameError):
                await coord.join("\ud800")
            with pytest.raises(FrameError):
                await coord.join("w", {"n": 1 << 70})
            await run_units(coord, await coord.join("w1"), 3)
            await coord.wait_finished()
            merged = coord.model()["w"].clone()
        assert coord.storage_error is None
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        # A restart finds the merged model, not the initial weights.
        async with Coordinator(zeros(), make_units(3, steps=1), policy=build_policy("vcasgd"),
                               storage=storage, config=SNAPSHOT) as again:
            assert again.version == 3
            assert torch.equal(again.model()["w"], merged)
            assert not torch.equal(merged, torch.zeros(2))
