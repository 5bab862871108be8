"""Child process for test_faults.py: writes checkpoints, then freezes at a chosen point so the
parent can SIGKILL it there. Usage: ckpt_child.py URL PAUSE_STEP data|manifest|stream."""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from collections.abc import AsyncIterator

from vcasync.checkpoint import CheckpointStore
from vcasync.storage import open_storage
from vcasync.testing.emulators import DUMMY_S3_CREDENTIALS
from vcasync.testing.faults import FaultyStorage


def payload(step: int, name: str, size: int) -> bytes:
    seed = hashlib.sha256(f"{step}/{name}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def objects(step: int) -> dict[str, bytes]:
    return {"a-model": payload(step, "model", 6 << 20), "b-state": payload(step, "state", 1000),
            "c-extra": payload(step, "extra", 10)}


def freeze(what: str) -> None:
    print("PAUSED", what, flush=True)
    time.sleep(120)  # the parent SIGKILLs us here; this only bounds a forgotten child


async def main(url: str, pause_step: int, pause_at: str) -> None:
    options = DUMMY_S3_CREDENTIALS if url.startswith("s3://") else {}
    async with open_storage(url, **options) as storage:
        data_puts = 0

        def trigger(op: str, key: str | None) -> bool:
            nonlocal data_puts
            step_part = f"/{pause_step:020d}"
            if op == "put" and key is not None and step_part in key:
                if "/data/" in key:
                    data_puts += 1
                    if pause_at == "data" and data_puts == 2:
                        freeze(key)
                elif pause_at == "manifest":
                    freeze(key)
            return False

        store = CheckpointStore(FaultyStorage(storage, trigger=trigger), "ck")
        for step in range(1, pause_step + 1):
            if step == pause_step and pause_at == "stream":
                async def chunks() -> AsyncIterator[bytes]:
                    yield payload(0, "stream", 40 << 20)  # two S3 parts / GCS chunks and a bit
                    freeze("stream")
                    yield b"never"

                await storage.put_stream("big", chunks())
            await store.write(step, objects(step), {"step": step})
            print("WROTE", step, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
