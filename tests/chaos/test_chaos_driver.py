"""The chaos driver's slow upload against a real coordinator and server on 127.0.0.1 (in-process):
the result it prepared for the upload kill is delivered only after a kill cut that upload, and a
503 that refused the upload leaves the same result for the next try, with a note that says why.

Before, the run's delivery task (every half second) sent any prepared result whole: the slow upload
after it was answered at once, and each refusal cost a new unit's training, which under load took
longer than the rest of the run (the upload kill never came)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.chaos import JOIN_SECRET, ChaosConfig
from harness.chaos_driver import DriverWorker
from vcasync._imports import import_object
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.policy import build_policy
from vcasync.runconfig import UnitsConfig, dataclass_from_table
from vcasync.server import Server, ServerConfig
from vcasync.server._auth import TokenAuthority
from vcasync.storage import open_storage
from vcasync.tensors import ModelState
from vcasync.testing.faults import FaultyStorage, WriteOutage

pytestmark = pytest.mark.slow      # a real server, and the digits trainer run twice

CFG = ChaosConfig(workers=0, shards=2, epochs=1, steps=2, coordinator_kills=("upload",))
PROBE_S = 0.05



@contextlib.asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[Coordinator, DriverWorker, WriteOutage]]:
    """The digits run of ``CFG`` served on storage that fails while ``switch.down``, and a driver."""
    switch = WriteOutage()
    torch.manual_seed(CFG.seed)
    model = ModelState.from_module(import_object(CFG.model, what="model")())
    units = dataclass_from_table(UnitsConfig, CFG.run_table("memory://x", tmp_path)["units"],
                                 "units").build()
    config = CoordinatorConfig(storage_probe_interval_s=PROBE_S, storage_outage_limit_s=60.0)
    async with open_storage(f"file://{tmp_path / 'store'}") as inner:
        storage: Any = FaultyStorage(inner, trigger=switch)
        async with Coordinator(model, units, policy=build_policy("vcasgd"), storage=storage,
                               config=config) as coord, \
                Server(coord, TokenAuthority(join_secret=JOIN_SECRET), ServerConfig(port=0)) as server:
            driver = DriverWorker(server.url, JOIN_SECRET, tmp_path / "driver", CFG)
            try:
                yield coord, driver, switch
            finally:
                await driver.aclose()


async def _storage(coord: Coordinator, want: str) -> None:
    for _ in range(400):
        if coord.status()["storage"]["state"] == want:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"storage never became {want}: {coord.status()['storage']}")


async def test_a_prepared_result_waits_for_its_slow_upload_and_is_delivered_once_cut(
        tmp_path: Path) -> None:
    async with serving(tmp_path) as (coord, driver, _):
        assert await driver.prepare()
        await driver.finish_upload()        # the run's delivery task, before any kill: nothing
        assert driver.receipts == []
        assert coord.version == 0

        sent = await driver.start_slow_upload()
        assert sent is not None, driver.last_error      # the coordinator is reading it now
        driver.upload_cut()                             # (the kill came here)
        for _ in range(100):
            await driver.finish_upload()
            if driver.receipts:
                break
            await asyncio.sleep(0.05)
        assert [r.status for r in driver.receipts] == ["accepted"]
        assert coord.version == 1
        await driver.finish_upload()                    # delivered once
        assert len(driver.receipts) == 1


async def test_a_503_keeps_the_result_for_the_next_try_and_the_note_says_why(tmp_path: Path) -> None:
    async with serving(tmp_path) as (coord, driver, switch):
        assert await driver.prepare()
        switch.down = True
        assert await driver.start_slow_upload() is None
        driver.abandon_upload()
        note = driver.last_error
        assert "503 Service Unavailable: storage_unavailable" in note, note
        assert "the coordinator's storage is unavailable" in note
        assert "nothing was taken in" in note

        switch.down = False
        await _storage(coord, "ok")
        await driver.finish_upload()        # not cut by a kill: still the slow upload's
        assert driver.receipts == []
        assert coord.version == 0
        assert driver.retry_in <= PROBE_S * 2, note     # the answer's retry_after, not a second
        assert await driver.start_slow_upload() is not None, driver.last_error
