"""The storage conformance suite: the laws every backend must keep, as tests to mix in.

Subclass :class:`StorageConformance` in a test module and give it a ``storage`` fixture that
yields a fresh, empty, open :class:`~vcasync.storage.Storage` (and closes it afterwards)::

    class TestMyBackend(StorageConformance):
        @pytest.fixture
        async def storage(self, tmp_path):
            async with open_storage(f"mine://{tmp_path}") as st:
                yield st

        async def open_peer(self, storage):          # only if open_storage(storage.url) can't
            return open_storage(storage.url, secret=...)

Class attributes tune it: ``large_size`` (the big streamed object, 100 MiB and a bit by default),
``many_keys`` (enough to cross a listing page), ``holds_object_and_prefix`` (False for file
systems, which cannot hold ``a`` and ``a/b`` at once), ``race_writers``.

The suite also runs :func:`vcasync.storage.probe_storage`, the check a coordinator makes before it
trusts a store: a conforming backend passes its own preflight and honours if-absent, and the probe
leaves nothing behind. :class:`IgnoringPreconditions` wraps a store so that it does not (as some
S3-compatible stores and the stock GCS emulator do), for tests of what happens then.
Needs pytest with pytest-asyncio in auto mode; in its default strict mode, mark the subclass
``pytest.mark.asyncio`` and declare the ``storage`` fixture with ``pytest_asyncio.fixture``.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterable, AsyncIterator
from typing import ClassVar

import pytest

from vcasync.errors import (
    ClosedError,
    InvalidKeyError,
    ObjectNotFoundError,
    PreconditionFailedError,
)
from vcasync.storage import BytesLike, ObjectInfo, Storage, open_storage, probe_storage
from vcasync.testing.faults import ForwardingStorage

__all__ = ["ODD_KEYS", "IgnoringPreconditions", "StorageConformance", "pattern_stream"]

MiB = 1 << 20

ODD_KEYS: tuple[str, ...] = (
    "sp ace/with  two  spaces ",
    "ünïcödé/日本語/ключ",
    "emoji 🙂/😀.bin",
    "deep/" + "/".join(f"d{i}" for i in range(24)) + "/leaf",
    "punct/!$&'()*+,;=@:~-_",
    "punct/#hash?query[brackets]{braces}",
    "punct/percent%2Fslash%20space%",
    "punct/plus+sign and quote\"",
    "dots/a.b..c...d",
    "dots/trailing.dot.",
    "-leading-dash",
    ".hidden/.file",
)

INVALID_KEYS: tuple[object, ...] = (
    "", "/abs", "a//b", "a/", "a/../b", "..", ".", "./a", "a/.", "nul\x00byte", "new\nline",
    "tab\tkey", "back\\slash", "del\x7f", "x" * 1025, "\ud800lone", b"bytes-key", 7, None,
)


class _Recorder:
    """An async byte stream of a given size with a known digest, in irregular chunks."""

    def __init__(self, size: int, seed: int, chunk: int = MiB + 4099) -> None:
        self.size = size
        self.seed = seed
        self.chunk = chunk
        self.digest = hashlib.sha256()
        self.fail_after: int | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        base = random.Random(self.seed).randbytes(self.chunk + 64)
        sent = index = 0
        while sent < self.size:
            n = min(self.chunk - (index % 7) * 613, self.size - sent)
            piece = index.to_bytes(8, "little") + base[8 + index % 64: n + index % 64]
            piece = piece[:n]
            if self.fail_after is not None and sent + n > self.fail_after:
                raise RuntimeError("the input stream broke (injected by the conformance suite)")
            self.digest.update(piece)
            sent += n
            index += 1
            yield piece
            await asyncio.sleep(0)


def pattern_stream(size: int, seed: int = 0) -> _Recorder:
    """A deterministic stream of ``size`` bytes; ``.digest`` hashes what was consumed."""
    return _Recorder(size, seed)


async def _collect(it: AsyncIterator[str]) -> list[str]:
    return [key async for key in it]


async def _read_all(storage: Storage, key: str, chunk_size: int = MiB) -> bytes:
    return b"".join([chunk async for chunk in storage.open_read(key, chunk_size=chunk_size)])


class IgnoringPreconditions(ForwardingStorage):
    """A store that takes ``if_absent=True`` and ignores it: every put replaces. Everything else is
    forwarded to ``inner``. For tests of the start-up probe (never use it for real data)."""

    async def put(self, key: str, data: BytesLike, *, if_absent: bool = False) -> None:
        await self.inner.put(key, data)

    async def put_stream(self, key: str, chunks: AsyncIterable[BytesLike], *,
                         if_absent: bool = False) -> None:
        await self.inner.put_stream(key, chunks)


class StorageConformance:
    """Mixin of storage laws; see the module docstring for how to use it."""

    large_size: ClassVar[int] = 100 * MiB + 12_345
    many_keys: ClassVar[int] = 1_050
    holds_object_and_prefix: ClassVar[bool] = True
    race_writers: ClassVar[int] = 6

    async def open_peer(self, storage: Storage) -> Storage:
        """A second, independent handle on the objects of ``storage``, as another process has."""
        return open_storage(storage.url)

    # --- round trips ------------------------------------------------------------------------

    async def test_empty_object_round_trip(self, storage: Storage) -> None:
        await storage.put("empty", b"")
        assert await storage.get("empty") == b""
        assert await storage.exists("empty")
        assert (await storage.stat("empty")).size == 0
        assert await _read_all(storage, "empty") == b""
        assert await _collect(storage.list()) == ["empty"]

    async def test_small_object_round_trip(self, storage: Storage) -> None:
        data = bytes(range(256)) * 3
        await storage.put("small/bin", data)
        assert await storage.get("small/bin") == data
        info = await storage.stat("small/bin")
        assert isinstance(info, ObjectInfo)
        assert (info.key, info.size) == ("small/bin", len(data))
        source = bytearray(b"mutable")
        await storage.put("small/bytearray", source)
        source[:] = b"changed"
        assert await storage.get("small/bytearray") == b"mutable"
        await storage.put("small/view", memoryview(data)[10:20])
        assert await storage.get("small/view") == data[10:20]

    async def test_reads_return_bytes(self, storage: Storage) -> None:
        # The contract types get and open_read as bytes, and callers rely on it: json.loads refuses
        # a memoryview, so a coordinator on such a store took its own run record for a corrupt one.
        await storage.put("typed/get", b"some bytes")
        got = await storage.get("typed/get")
        assert isinstance(got, bytes), (
            f"{type(storage).__name__}.get must return bytes (the Storage contract), "
            f"got {type(got).__name__}")
        for chunk in [c async for c in storage.open_read("typed/get", chunk_size=4)]:
            assert isinstance(chunk, bytes), (
                f"{type(storage).__name__}.open_read must yield bytes (the Storage contract), "
                f"got {type(chunk).__name__}")

    async def test_put_replaces_atomically(self, storage: Storage) -> None:
        await storage.put("k", b"first")
        before = await storage.stat("k")
        await storage.put("k", b"second, longer")
        assert await storage.get("k") == b"second, longer"
        after = await storage.stat("k")
        assert after.size == len(b"second, longer")
        if before.etag is not None:
            assert after.etag != before.etag

    async def test_large_object_streamed(self, storage: Storage) -> None:
        source = pattern_stream(self.large_size, seed=1)
        await storage.put_stream("large/streamed", source)
        assert (await storage.stat("large/streamed")).size == self.large_size
        digest, total = hashlib.sha256(), 0
        async for chunk in storage.open_read("large/streamed", chunk_size=4 * MiB):
            assert 0 < len(chunk) <= 4 * MiB
            digest.update(chunk)
            total += len(chunk)
        assert total == self.large_size
        assert digest.hexdigest() == source.digest.hexdigest()

    async def test_large_object_put_and_get(self, storage: Storage) -> None:
        data = b"".join([chunk async for chunk in pattern_stream(self.large_size, seed=2)])
        await storage.put("large/bytes", data)
        got = await storage.get("large/bytes")
        assert len(got) == len(data)
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()

    async def test_open_read_chunks(self, storage: Storage) -> None:
        data = random.Random(3).randbytes(10_000)
        await storage.put("chunks", data)
        chunks = [c async for c in storage.open_read("chunks", chunk_size=999)]
        assert all(0 < len(c) <= 999 for c in chunks)
        assert b"".join(chunks) == data
        reader = storage.open_read("chunks", chunk_size=100)
        assert len(await anext(reader)) <= 100
        close = getattr(reader, "aclose", None)
        if close is not None:
            await close()  # stopping early releases the stream
        assert await storage.get("chunks") == data

    # --- missing keys and deletes ---------------------------------------------------------------

    async def test_missing_key(self, storage: Storage) -> None:
        for call in (storage.get, storage.stat):
            with pytest.raises(ObjectNotFoundError) as info:
                await call("no/such/key")
            assert info.value.key == "no/such/key"
            assert "no/such/key" in str(info.value)
        with pytest.raises(ObjectNotFoundError):
            await _read_all(storage, "no/such/key")
        assert not await storage.exists("no/such/key")
        await storage.delete("no/such/key")  # a no-op, not an error

    async def test_delete(self, storage: Storage) -> None:
        await storage.put("d/one", b"1")
        await storage.put("d/two", b"2")
        await storage.delete("d/one")
        assert not await storage.exists("d/one")
        with pytest.raises(ObjectNotFoundError):
            await storage.get("d/one")
        assert await _collect(storage.list("d/")) == ["d/two"]
        await storage.delete("d/one")
        await storage.delete("d/two")
        assert await _collect(storage.list()) == []
        await storage.put("d/one", b"again")  # a deleted key can be written again
        assert await storage.get("d/one") == b"again"

    # --- listing ------------------------------------------------------------------------------

    async def test_list_prefix_semantics(self, storage: Storage) -> None:
        keys = ["a/1", "a/2", "a/b/3", "ab", "a.x", "b", "c/d/e/f"]
        await asyncio.gather(*(storage.put(k, k.encode()) for k in keys))
        assert await _collect(storage.list()) == sorted(keys)
        assert await _collect(storage.list("")) == sorted(keys)
        assert await _collect(storage.list("a")) == ["a.x", "a/1", "a/2", "a/b/3", "ab"]
        assert await _collect(storage.list("a/")) == ["a/1", "a/2", "a/b/3"]
        assert await _collect(storage.list("a/b")) == ["a/b/3"]
        assert await _collect(storage.list("c/d/")) == ["c/d/e/f"]
        assert await _collect(storage.list("c/d/e/f")) == ["c/d/e/f"]
        assert await _collect(storage.list("zz")) == []
        assert await _collect(storage.list("a/b/3/")) == []
        with pytest.raises(InvalidKeyError):
            await _collect(storage.list("../"))

    async def test_list_many_keys(self, storage: Storage) -> None:
        keys = [f"many/{i:05d}" for i in range(self.many_keys)]
        gate = asyncio.Semaphore(32)

        async def put(key: str) -> None:
            async with gate:
                await storage.put(key, b"")

        await asyncio.gather(*(put(k) for k in keys))
        assert await _collect(storage.list("many/")) == keys
        assert await _collect(storage.list("many/0000")) == keys[:10]

    async def test_object_and_prefix_share_a_name(self, storage: Storage) -> None:
        await storage.put("x", b"object")
        if self.holds_object_and_prefix:
            await storage.put("x/y", b"below")
            assert await _collect(storage.list("x")) == ["x", "x/y"]
            assert await storage.get("x") == b"object"
            await storage.delete("x")
            assert await storage.get("x/y") == b"below"
        else:
            with pytest.raises(InvalidKeyError):
                await storage.put("x/y", b"below")
            await storage.put("p/q", b"below")
            with pytest.raises(InvalidKeyError):
                await storage.put("p", b"object")
            assert await storage.get("x") == b"object"
            assert await _collect(storage.list()) == ["p/q", "x"]

    # --- conditional creates ------------------------------------------------------------------

    async def test_if_absent(self, storage: Storage) -> None:
        await storage.put("once", b"first", if_absent=True)
        with pytest.raises(PreconditionFailedError) as info:
            await storage.put("once", b"second", if_absent=True)
        assert info.value.key == "once"
        with pytest.raises(PreconditionFailedError):
            await storage.put_stream("once", pattern_stream(1000), if_absent=True)
        assert await storage.get("once") == b"first"
        await storage.put_stream("streamed-once", pattern_stream(3000), if_absent=True)
        with pytest.raises(PreconditionFailedError):
            await storage.put("streamed-once", b"", if_absent=True)
        assert (await storage.stat("streamed-once")).size == 3000

    async def test_if_absent_race_has_one_winner(self, storage: Storage) -> None:
        peer = await self.open_peer(storage)
        try:
            for round_ in range(4):
                key = f"race/{round_}"

                async def write(i: int, key: str = key) -> bytes | None:
                    payload = f"writer {i} ".encode() * (i + 1)
                    target = peer if i % 2 else storage
                    try:
                        if i % 3 == 2:
                            async def one(p: bytes = payload) -> AsyncIterator[bytes]:
                                yield p
                            await target.put_stream(key, one(), if_absent=True)
                        else:
                            await target.put(key, payload, if_absent=True)
                    except PreconditionFailedError:
                        return None
                    return payload

                results = await asyncio.gather(*(write(i) for i in range(self.race_writers)))
                winners = [r for r in results if r is not None]
                assert len(winners) == 1, f"{len(winners)} writers won {key!r}"
                assert await storage.get(key) == winners[0]
                assert await peer.get(key) == winners[0]
        finally:
            await peer.aclose()

    async def test_probe_finds_if_absent_honoured(self, storage: Storage) -> None:
        await storage.put("probed/kept", b"x")
        result = await probe_storage(storage, "probed")
        assert result.conditional_writes, f"{storage.url} does not honour if_absent"
        assert result.url == storage.url
        assert await _collect(storage.list()) == ["probed/kept"]    # the probe cleans up

    async def test_probe_catches_a_store_that_ignores_if_absent(self, storage: Storage) -> None:
        result = await probe_storage(IgnoringPreconditions(storage), "probed")
        assert not result.conditional_writes
        assert await _collect(storage.list()) == []

    # --- odd and invalid keys -------------------------------------------------------------------

    async def test_odd_key_names(self, storage: Storage) -> None:
        for i, key in enumerate(ODD_KEYS):
            await storage.put(key, f"{i}".encode())
        assert await _collect(storage.list()) == sorted(ODD_KEYS)
        for i, key in enumerate(ODD_KEYS):
            assert await storage.get(key) == f"{i}".encode(), key
            assert (await storage.stat(key)).key == key
            assert await _collect(storage.list(key)) == [key]
        assert await _collect(storage.list("punct/")) == sorted(k for k in ODD_KEYS
                                                                if k.startswith("punct/"))
        for key in ODD_KEYS:
            await storage.delete(key)
            assert not await storage.exists(key)

    async def test_invalid_keys_are_refused(self, storage: Storage) -> None:
        for key in INVALID_KEYS:
            for call in (storage.get, storage.stat, storage.exists, storage.delete):
                with pytest.raises(InvalidKeyError):
                    await call(key)  # type: ignore[arg-type]
            with pytest.raises(InvalidKeyError):
                await storage.put(key, b"x")  # type: ignore[arg-type]
            with pytest.raises(InvalidKeyError):
                await storage.put_stream(key, pattern_stream(10))  # type: ignore[arg-type]
            with pytest.raises(InvalidKeyError):
                await _read_all(storage, key)  # type: ignore[arg-type]
        assert await _collect(storage.list()) == []

    async def test_data_must_be_bytes(self, storage: Storage) -> None:
        with pytest.raises(TypeError):
            await storage.put("typed", "text is not bytes")  # type: ignore[arg-type]
        assert not await storage.exists("typed")

    # --- failures, concurrency, lifecycle -------------------------------------------------------

    async def test_broken_stream_leaves_nothing(self, storage: Storage) -> None:
        await storage.put("kept", b"the old value")
        for key in ("fresh", "kept"):
            for size in (1000, 40 * MiB):  # one part, and past any multipart threshold
                source = pattern_stream(size + MiB, seed=4)
                source.fail_after = size
                with pytest.raises(RuntimeError, match="broke"):
                    await storage.put_stream(key, source)
        assert not await storage.exists("fresh")
        assert await storage.get("kept") == b"the old value"
        assert await _collect(storage.list()) == ["kept"]

    async def test_stream_is_published_only_when_complete(self, storage: Storage) -> None:
        # While put_stream takes its input, readers see what was there before: no object under a
        # fresh key, the old bytes under a kept one (a store that published part by part passed
        # every other test, as long as it cleaned up when the stream broke).
        await storage.put("kept", b"the old value")
        seen: list[str] = []

        async def watched(key: str, size: int) -> AsyncIterator[bytes]:
            async for chunk in pattern_stream(size, seed=7):
                yield chunk
                # the writer asked for the next chunk: it holds this one and every one before
                if key == "fresh" and await storage.exists("fresh"):
                    seen.append("'fresh' exists while its put_stream is still reading input")
                elif key == "kept" and (got := await storage.get("kept")) != b"the old value":
                    seen.append(f"'kept' reads {len(got)} byte(s) that are not its old value while "
                                f"its put_stream is still reading input")
                if await _collect(storage.list()) != ["kept"]:
                    seen.append(f"list() shows {await _collect(storage.list())} while a "
                                f"put_stream to {key!r} is still reading input")
                if seen:
                    return

        for key in ("fresh", "kept"):
            for size in (3000, 20 * MiB):   # one part, and past the object stores' thresholds
                await storage.put_stream(key, watched(key, size))
                assert not seen, (f"{type(storage).__name__}.put_stream publishes before its input "
                                  f"is complete ({size} bytes to {key!r}): {seen[0]}")
                await storage.delete("fresh")
                await storage.put("kept", b"the old value")

    async def test_cancelled_stream_leaves_nothing(self, storage: Storage) -> None:
        reached = asyncio.Event()

        async def stalls() -> AsyncIterator[bytes]:
            async for chunk in pattern_stream(36 * MiB, seed=6):
                yield chunk
            reached.set()
            await asyncio.Event().wait()  # never set: the writer is cancelled here
            yield b""

        writer = asyncio.create_task(storage.put_stream("cancelled", stalls()))
        await reached.wait()
        await asyncio.sleep(0.01)  # let any part uploads get under way
        writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writer
        assert not await storage.exists("cancelled")
        assert await _collect(storage.list()) == []
        await storage.put("cancelled", b"still usable")
        assert await storage.get("cancelled") == b"still usable"

    async def test_concurrent_use(self, storage: Storage) -> None:
        async def worker(i: int) -> None:
            key = f"conc/{i:03d}"
            data = random.Random(i).randbytes(i * 37)
            await storage.put(key, data)
            assert await storage.get(key) == data
            assert (await storage.stat(key)).size == len(data)
            if i % 2:
                await storage.delete(key)

        await asyncio.gather(*(worker(i) for i in range(48)))
        assert await _collect(storage.list("conc/")) == [f"conc/{i:03d}" for i in range(0, 48, 2)]

    async def test_peer_sees_writes(self, storage: Storage) -> None:
        peer = await self.open_peer(storage)
        async with peer:
            await storage.put("shared", b"from the first handle")
            assert await peer.get("shared") == b"from the first handle"
            await peer.delete("shared")
            assert not await storage.exists("shared")

    async def test_close_is_idempotent_and_final(self, storage: Storage) -> None:
        await storage.put("before-close", b"x")
        await storage.aclose()
        await storage.aclose()
        for call in (storage.get, storage.stat, storage.exists, storage.delete):
            with pytest.raises(ClosedError):
                await call("before-close")
        with pytest.raises(ClosedError):
            await storage.put("after-close", b"x")
        with pytest.raises(ClosedError):
            await storage.put_stream("after-close", pattern_stream(10))
        with pytest.raises(ClosedError):
            await _collect(storage.list())
        with pytest.raises(ClosedError):
            await _read_all(storage, "before-close")
        with pytest.raises(ClosedError):
            async with storage:
                pass

    async def test_async_context_manager(self, storage: Storage) -> None:
        peer = await self.open_peer(storage)
        async with peer as entered:
            assert entered is peer
            await peer.put("cm", b"x")
        with pytest.raises(ClosedError):
            await peer.get("cm")
        assert await storage.get("cm") == b"x"
