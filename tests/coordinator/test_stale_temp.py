"""A writer killed mid-write leaves a temporary file in a ``file://`` store (a coordinator killed
during a large upload: a partial copy of it); the coordinator deletes such files at start and
periodically, once no write has touched them for ``STALE_TEMP_AGE_S``, and never a live one."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

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
