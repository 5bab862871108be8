"""Checkpoints: complete or invisible, verified on read, idempotent, pruned safely; on every backend."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator

import pytest

from vcasync.checkpoint import CheckpointStore, Manifest, Streamed
from vcasync.errors import (
    ConfigError,
    CorruptObjectError,
    InvalidKeyError,
    ObjectNotFoundError,
    PreconditionFailedError,
)
from vcasync.storage import Storage
from vcasync.testing.faults import FaultyStorage, InjectedFault


def payload(step: int, name: str, size: int = 3000) -> bytes:
    seed = hashlib.sha256(f"{step}/{name}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def objects_for(step: int) -> dict[str, bytes]:
    return {"model": payload(step, "model", 50_000), "policy/state": payload(step, "policy", 700),
            "empty": b""}


async def keys(storage: Storage, prefix: str = "") -> list[str]:
    return [k async for k in storage.list(prefix)]


async def test_round_trip_and_latest(any_storage: Storage) -> None:
    store = CheckpointStore(any_storage, "run/ckpt")
    assert await store.latest() is None
    written = [await store.write(step, objects_for(step), {"version": step, "note": "ünï"})
               for step in (1, 2, 10)]
    latest = await store.latest()
    assert isinstance(latest, Manifest)
    assert latest.step == 10
    assert latest == written[-1]
    assert dict(latest.meta) == {"version": 10, "note": "ünï"}
    assert latest.names == ["empty", "model", "policy/state"]
    assert latest.total_bytes == 50_700
    for name, data in objects_for(10).items():
        assert await store.read(latest, name) == data
    assert await store.steps() == [1, 2, 10]
    expected = hashlib.sha256(payload(2, "model", 50_000)).hexdigest()
    assert (await store.load(2)).objects["model"].sha256 == expected
    with pytest.raises(ObjectNotFoundError, match="no object 'nope'"):
        await store.read(latest, "nope")


async def test_open_read_streams_an_object_checked_before_its_stream_ends(any_storage: Storage) -> None:
    store = CheckpointStore(any_storage, "ck")
    m = await store.write(1, objects_for(1))
    got = b"".join([bytes(c) async for c in store.open_read(m, "model")])
    assert got == objects_for(1)["model"]
    assert b"".join([bytes(c) async for c in store.open_read(m, "empty")]) == b""
    key = m.objects["model"].key
    for damaged in (got[:-1] + bytes([got[-1] ^ 1]), got[:-1], got + b"x"):
        await any_storage.put(key, damaged)
        seen: list[int] = []

        async def drain() -> None:
            async for chunk in store.open_read(m, "model"):
                seen.append(len(chunk))   # noqa: B023 (awaited at once, in this iteration)
        with pytest.raises(CorruptObjectError, match="does not match its manifest digest") as info:
            await drain()
        assert info.value.key == key
        assert sum(seen) <= len(got)     # never more bytes than the manifest's size
        if len(damaged) == len(got):   # a consumer that stopped early (a decoder's refusal)
            stream = store.open_read(m, "model")       # learns the same from the rest
            await anext(stream)
            with pytest.raises(CorruptObjectError):
                await store.verify_rest(stream)
    with pytest.raises(ObjectNotFoundError, match="no object 'nope'"):
        await anext(store.open_read(m, "nope"))


async def test_bad_arguments_change_nothing(any_storage: Storage) -> None:
    store = CheckpointStore(any_storage, "ck")
    for step in (-1, True, "3", 1.5, 10**20):
        with pytest.raises(ConfigError):
            await store.write(step, {"a": b"x"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        await store.write(1, {})
    with pytest.raises(ConfigError):
        await store.write(1, {"a": "text"})  # type: ignore[dict-item]
    for name in ("", "../x", "a//b", "/abs"):
        with pytest.raises(InvalidKeyError):
            await store.write(1, {"ok": b"x", name: b"y"})
    for meta in ({"x": {1, 2}}, {"x": float("nan")}, {1: "int key"}):
        with pytest.raises(ConfigError):
            await store.write(1, {"a": b"x"}, meta)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        await store.prune(0)
    assert await keys(any_storage) == []


async def test_rewrite_is_idempotent_and_conflicts_are_refused(any_storage: Storage) -> None:
    store = CheckpointStore(any_storage, "ck")
    first = await store.write(5, objects_for(5), {"v": [1, 2]})
    again = await store.write(5, objects_for(5), {"v": (1, 2)})  # a retry after a lost answer
    assert again.objects == first.objects
    with pytest.raises(PreconditionFailedError):
        await store.write(5, objects_for(6), {"v": [1, 2]})
    with pytest.raises(PreconditionFailedError):
        await store.write(5, objects_for(5), {"v": "other"})
    latest = await store.latest()
    assert latest is not None
    assert await store.read(latest, "model") == objects_for(5)["model"]


async def test_concurrent_writers_of_one_step_one_wins(any_storage: Storage) -> None:
    store = CheckpointStore(any_storage, "ck")

    async def write(i: int) -> Manifest | None:
        try:
            return await store.write(7, {"model": payload(i, "m", 20_000)}, {"writer": i})
        except PreconditionFailedError:
            return None

    results = await asyncio.gather(*(write(i) for i in range(4)))
    winners = [m for m in results if m is not None]
    assert len(winners) == 1
    latest = await store.latest()
    assert latest is not None
    assert latest.meta["writer"] == winners[0].meta["writer"]
    assert await store.read(latest, "model") == payload(int(latest.meta["writer"]), "m", 20_000)
    await store.prune(1)  # the losers' data objects are orphans: gone
    assert await keys(any_storage, "ck/data/") == [latest.objects["model"].key]


async def test_corruption_is_detected(any_storage: Storage) -> None:
    store = CheckpointStore(any_storage, "ck")
    await store.write(1, objects_for(1))
    m2 = await store.write(2, objects_for(2))
    model = m2.objects["model"]
    flipped = bytearray(objects_for(2)["model"])
    flipped[123] ^= 1
    await any_storage.put(model.key, bytes(flipped))  # same size, different bytes
    with pytest.raises(CorruptObjectError) as info:
        await store.read(m2, "model")
    assert info.value.key == model.key
    await any_storage.put(model.key, bytes(flipped[:-1]))  # truncated: step 2 is no longer complete
    latest = await store.latest()
    assert latest is not None
    assert latest.step == 1
    await any_storage.put(store.manifest_key(1), b'{"format": "vcasync.checkpoint/1"')  # torn JSON
    assert await store.latest() is None
    with pytest.raises(CorruptObjectError):
        await store.load(1)
    doc = json.loads((await any_storage.get(store.manifest_key(2))).decode())
    doc["meta"] = {"tampered": True}
    await any_storage.put(store.manifest_key(2), json.dumps(doc).encode())
    with pytest.raises(CorruptObjectError, match="checksum"):
        await store.load(2)


async def test_crash_between_data_and_manifest(any_storage: Storage) -> None:
    store = CheckpointStore(any_storage, "ck")
    await store.write(1, objects_for(1))
    crashing = CheckpointStore(FaultyStorage(any_storage, trigger=lambda op, key: op == "put" and
                                             key is not None and "/manifests/" in key), "ck")
    with pytest.raises(InjectedFault):
        await crashing.write(2, objects_for(2))
    latest = await store.latest()
    assert latest is not None
    assert latest.step == 1  # the half-written step 2 is invisible
    assert await store.read(latest, "model") == objects_for(1)["model"]
    assert await store.steps() == [1]
    orphans = await keys(any_storage, "ck/data/00000000000000000002/")
    assert len(orphans) == 3
    report = await store.prune(1)
    assert report.deleted_objects == 0  # newer than the newest complete: may be a write in progress
    await store.write(2, {"model": b"different contents"})
    report = await store.prune(1)
    assert report.kept == [2]
    assert report.deleted_steps == [1]
    latest = await store.latest()
    assert latest is not None
    assert await keys(any_storage, "ck/data/") == sorted(r.key for r in latest.objects.values())


async def test_prune_keeps_the_newest_complete(any_storage: Storage) -> None:
    store = CheckpointStore(any_storage, "ck")
    for step in range(1, 6):
        await store.write(step, objects_for(step))
    m5 = await store.load(5)
    await any_storage.delete(m5.objects["model"].key)  # step 5 is now incomplete
    report = await store.prune(2)
    assert report.kept == [3, 4]
    assert report.deleted_steps == [1, 2]
    assert await store.steps() == [3, 4, 5]
    latest = await store.latest()
    assert latest is not None
    assert latest.step == 4
    assert await store.read(latest, "model") == objects_for(4)["model"]
    remaining = set(await keys(any_storage, "ck/data/"))
    for step in (3, 4):
        assert {r.key for r in (await store.load(step)).objects.values()} <= remaining
    assert not any(k.startswith("ck/data/00000000000000000001/") for k in remaining)
    assert (await store.prune(1)).kept == [4]  # never below the newest complete one
    assert (await store.latest()) == latest


async def test_a_streamed_object_is_written_from_its_chunks(any_storage: Storage) -> None:
    """A Streamed object is read twice (hashed, then written), never joined into one bytes."""
    data = payload(1, "model", 3 << 20)
    readings = []

    def chunks() -> Iterator[memoryview]:
        readings.append(1)
        view = memoryview(data)
        for i in range(0, len(data), 100_000):
            yield view[i:i + 100_000]

    store = CheckpointStore(any_storage, "run/ckpt")
    manifest = await store.write(1, {"model": Streamed(chunks), "small": b"abc"}, {"v": 1})
    assert len(readings) == 2
    assert manifest.objects["model"].size == len(data)
    assert manifest.objects["model"].sha256 == hashlib.sha256(data).hexdigest()
    latest = await store.latest()
    assert latest == manifest
    assert await store.read(latest, "model") == data
    assert await store.read(latest, "small") == b"abc"
    # the same checkpoint again: idempotent, as with bytes
    assert await store.write(1, {"model": data, "small": b"abc"}, {"v": 1}) == manifest


async def test_a_streamed_object_that_changes_between_its_readings_is_never_published(
        any_storage: Storage) -> None:
    readings = []

    def chunks() -> Iterator[bytes]:
        readings.append(1)
        yield payload(len(readings), "model", 50_000)

    store = CheckpointStore(any_storage, "run/ckpt")
    with pytest.raises(CorruptObjectError, match="came out differently"):
        await store.write(1, {"model": Streamed(chunks)}, {})
    assert await store.steps() == []
    assert await store.latest() is None
