"""A writer killed mid-write leaves a temporary file in a ``file://`` store (a coordinator killed
during a large upload: a partial copy of it); the coordinator deletes such files at start and
periodically, once no write has touched them for ``STALE_TEMP_AGE_S``, and never a live one."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.coordinator._coordinator import STALE_TEMP_AGE_S, STALE_TEMP_EVERY_S
from vcasync.ledger._units import make_units
from vcasync.storage import StaleTemp, open_storage


def _temp(root: Path, name: str, age_s: float) -> Path:
    tmp = root / ".vcasync-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / name
    path.write_bytes(b"\0" * 4096)          # the first part of an upload cut off by SIGKILL
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


async def test_stale_temporary_files_are_removed_at_start_and_later(kit, clock, policy,
                                                                    tmp_path: Path) -> None:
    root = tmp_path / "store"
    stale = _temp(root, "0123456789abcdef.tmp", STALE_TEMP_AGE_S + 60)
    live = _temp(root, "fedcba9876543210.tmp", 5)      # a write in progress (another prefix)
    config = CoordinatorConfig(expiry_interval_s=0.01)
    async with open_storage(f"file://{root}") as storage:
        assert isinstance(storage, StaleTemp)
        async with Coordinator(kit.tiny_model(), make_units(2), policy=policy, storage=storage,
                               config=config, clock=clock):
            assert not stale.exists()
            assert live.exists()
            then = time.time() - STALE_TEMP_AGE_S - 1    # its writer was killed since
            os.utime(live, (then, then))
            await asyncio.sleep(0.1)
            assert live.exists()                         # not before the next sweep is due
            clock.advance(STALE_TEMP_EVERY_S)
            for _ in range(200):
                if not live.exists():
                    break
                await asyncio.sleep(0.01)
            assert not live.exists()


class _HangingSweep:
    """A ``file://`` store whose stale-temp sweep hangs once the run is going (a hung NFS mount:
    the directory listing never returns), everything else as it was."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.hanging = False
        self.entered = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def remove_stale_temp(self, max_age_s: float = STALE_TEMP_AGE_S) -> int:
        if not self.hanging:
            return int(await self._inner.remove_stale_temp(max_age_s))
        self.entered.set()
        await asyncio.Event().wait()        # never returns
        return 0


async def test_a_sweep_that_hangs_does_not_stop_leases_expiring_nor_the_close(
        kit, clock, policy, tmp_path: Path) -> None:
    """The periodic sweep ran inside the expiry loop: a file system hanging in it stopped every
    lease from expiring (a dead worker's unit never handed on) for as long as it hung, and
    ``aclose()`` waited on it. It runs on its own now."""
    config = CoordinatorConfig(expiry_interval_s=0.01, lease_timeout_s=2 * STALE_TEMP_EVERY_S)
    async with open_storage(f"file://{tmp_path / 'store'}") as inner:
        storage = _HangingSweep(inner)
        assert isinstance(storage, StaleTemp)
        coord = Coordinator(kit.tiny_model(), make_units(2), policy=policy, storage=storage,
                            config=config, clock=clock)
        await coord.__aenter__()
        try:
            worker = await coord.join("w")
            grant = await coord.lease(worker)
            await asyncio.sleep(0.1)            # the loops started (they time from their start)
            storage.hanging = True
            clock.advance(STALE_TEMP_EVERY_S)
            await asyncio.wait_for(storage.entered.wait(), 2.0)    # the sweep is hanging now
            clock.advance(config.lease_timeout_s)       # the lease runs out while the sweep hangs
            for _ in range(200):
                if coord.status()["leases"]["expired"]:
                    break
                await asyncio.sleep(0.01)
            assert coord.status()["leases"]["expired"] == 1
            assert [e.unit for e in coord.activity.events() if e.kind == "expired"] == [
                grant.unit.unit_id]
        finally:
            await asyncio.wait_for(coord.aclose(), 5.0)
