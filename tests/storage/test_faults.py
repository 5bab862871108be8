"""Fault injection: random faults through FaultyStorage, and real SIGKILLs in the middle of a
checkpoint write. Afterwards the newest complete checkpoint loads, and nothing half-written is
ever read."""

from __future__ import annotations

import asyncio
import hashlib
import random
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from vcasync.checkpoint import CheckpointStore
from vcasync.errors import TransientStorageError
from vcasync.storage import Storage, open_storage
from vcasync.testing.emulators import DUMMY_S3_CREDENTIALS
from vcasync.testing.faults import FaultPlan, FaultyStorage, ForwardingStorage
from vcasync.testing.storage import StorageConformance

T = TypeVar("T")
CHILD = Path(__file__).with_name("ckpt_child.py")
S3_BUCKET = GCS_BUCKET = "vcasync-tests"


def payload(step: int, name: str, size: int) -> bytes:  # the same as ckpt_child.payload
    seed = hashlib.sha256(f"{step}/{name}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def child_objects(step: int) -> dict[str, bytes]:
    return {"a-model": payload(step, "model", 6 << 20), "b-state": payload(step, "state", 1000),
            "c-extra": payload(step, "extra", 10)}


async def persist(call: Callable[[], Awaitable[T]], tries: int = 400) -> T:
    """Retry a call through injected transient faults, as a caller would."""
    for _ in range(tries - 1):
        try:
            return await call()
        except TransientStorageError:
            continue
    return await call()


class TestFaultyWrapperIsAStorage(StorageConformance):
    """With delays only (reordering concurrent calls), the wrapper keeps every storage law."""

    large_size = 8 << 20

    @pytest.fixture
    async def storage(self) -> object:
        from vcasync.backends.memory import MemoryStorage
        inner = MemoryStorage("faulty")
        async with FaultyStorage(inner, FaultPlan(delay=0.5, max_delay_s=0.002), seed=3) as st:
            yield st

    async def open_peer(self, storage: Storage) -> Storage:
        assert isinstance(storage, FaultyStorage)
        return FaultyStorage(storage.inner.peer(), FaultPlan(delay=0.5, max_delay_s=0.002), seed=4)  # type: ignore[attr-defined]


class TestForwardingWrapperIsAStorage(StorageConformance):
    """The base docs/testing.md offers for one's own wrapper keeps every storage law as it is.

    Found by a tester: entering a closed ForwardingStorage did not raise ClosedError."""

    large_size = 3 << 20
    many_keys = 120
    holds_object_and_prefix = False

    @pytest.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[Storage]:
        async with ForwardingStorage(open_storage((tmp_path / "root").as_uri())) as st:
            yield st

    async def open_peer(self, storage: Storage) -> Storage:
        return ForwardingStorage(open_storage(storage.url))


@pytest.mark.parametrize("seed", [1, 2])
async def test_random_faults_never_expose_a_partial_checkpoint(any_storage: Storage, seed: int) -> None:
    plan = FaultPlan(fail=0.08, lose_reply=0.08, delay=0.3, max_delay_s=0.002, break_stream=0.2)
    flaky = FaultyStorage(any_storage, plan, seed=seed)
    store = CheckpointStore(flaky, "ck")
    rng = random.Random(seed)

    def objects(step: int) -> dict[str, bytes]:
        return {"model": payload(step, "model", 40_000), "state": payload(step, "state", 300)}

    for step in range(1, 9):
        written = await persist(lambda s=step: store.write(s, objects(s), {"step": s}))
        assert written.step == step
        latest = await persist(store.latest)
        assert latest is not None
        assert latest.step == step
        for name, data in objects(step).items():
            assert await persist(lambda n=name, m=latest: store.read(m, n)) == data
        if rng.random() < 0.4:
            await persist(lambda: store.prune(2))
            assert (await persist(store.latest)) == latest
    assert flaky.injected["fail"] > 0
    assert flaky.injected["lose_reply"] > 0  # some writes happened but were reported lost
    clean = CheckpointStore(any_storage, "ck")
    latest = await clean.latest()
    assert latest is not None
    assert latest.step == 8


async def test_broken_input_stream_publishes_nothing(any_storage: Storage) -> None:
    flaky = FaultyStorage(any_storage, FaultPlan(break_stream=1.0))

    async def chunks():  # type: ignore[no-untyped-def]
        for i in range(5):
            yield bytes([i]) * 1000

    with pytest.raises(TransientStorageError):
        await flaky.put_stream("s", chunks())
    assert not await any_storage.exists("s")


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    prefix = f"kill-{random.Random().getrandbits(40):x}"
    if kind == "file":
        return (tmp_path / "root").as_uri()
    if kind == "s3":
        return f"s3://{S3_BUCKET}/{prefix}?endpoint_url={request.getfixturevalue('s3_endpoint')}"
    return f"gs://{GCS_BUCKET}/{prefix}?emulator_host={request.getfixturevalue('gcs_endpoint')}"


async def _run_until_paused(url: str, pause_at: str) -> list[str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, str(CHILD), url, "3", pause_at,
                                                stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(120):
            while not (lines and lines[-1].startswith("PAUSED")):
                line = await proc.stdout.readline()
                assert line, f"the child exited early ({await proc.wait()}): {lines}"
                lines.append(line.decode().strip())
        proc.send_signal(signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["file", "s3", "gs"])
@pytest.mark.parametrize("pause_at", ["data", "manifest", "stream"])
async def test_sigkill_in_the_middle_of_a_checkpoint(kind: str, pause_at: str, tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    url = _url(kind, tmp_path, request)
    lines = await _run_until_paused(url, pause_at)
    assert lines[:2] == ["WROTE 1", "WROTE 2"], lines
    options = DUMMY_S3_CREDENTIALS if kind == "s3" else {}
    async with open_storage(url, **options) as storage:
        store = CheckpointStore(storage, "ck")
        latest = await store.latest()
        assert latest is not None
        assert latest.step == 2
        for name, data in child_objects(2).items():
            assert await store.read(latest, name) == data
        assert await store.steps() == [1, 2]
        assert not await storage.exists("big")  # the killed stream left nothing under its name
        # Nothing torn under a final name: every data object holds exactly the bytes its name
        # (a content digest) promises, written or not by a complete checkpoint.
        async for key in storage.list("ck/data/"):
            digest = key.rpartition(".")[2]
            assert hashlib.sha256(await storage.get(key)).hexdigest() == digest, key
        # Recovery: the same step again succeeds, and pruning clears the dead write's leftovers.
        third = await store.write(3, child_objects(3), {"step": 3})
        await store.prune(1)
        assert sorted([k async for k in storage.list("ck/data/")]) == sorted(
            r.key for r in third.objects.values())
        if kind == "file":
            from vcasync.backends.local import LocalStorage
            assert isinstance(storage, LocalStorage)
            leftovers = await storage.remove_stale_temp(max_age_s=0)
            assert leftovers == (1 if pause_at == "stream" else 0)
