"""Checkpoints on any :class:`~vcasync.storage.Storage`: complete or invisible, verified on read.

A checkpoint is a set of named byte objects plus JSON metadata, written for one ``step``::

    store = CheckpointStore(storage, "run-1/ckpt")
    manifest = await store.write(42, {"model": model_bytes, "policy": state_bytes}, {"version": 42})
    latest = await store.latest()                  # the newest complete checkpoint, or None
    model = await store.read(latest, "model")      # bytes, SHA-256 checked
    async for chunk in store.open_read(latest, "model"):   # or streamed, checked before it ends
        ...

Layout under the prefix (steps zero-padded so that key order is step order)::

    data/<step:020d>/<name>.<sha256>      every object, written first, if-absent
    manifests/<step:020d>.json            then the manifest, published if-absent: the commit point

An object may also be :class:`Streamed`: chunks made on demand (an encoder over tensors, say), so
a model-sized object is never held whole in memory. It is read twice, once to learn its SHA-256 and
size (the key names the digest) and once to write it, and the second reading is hashed too: bytes
that came out differently are refused (:class:`CorruptObjectError`) before any manifest names them.

A crash before the manifest leaves only unreferenced data objects (``prune`` removes them); a
manifest is only ever written after all its objects, and in one atomic if-absent put, so a reader
never sees a half-written checkpoint. ``latest()`` also checks that every object a manifest names
still exists with the right size, and skips (with a warning) manifests that are corrupt or
incomplete. ``prune(keep_last)`` keeps the newest ``keep_last`` complete checkpoints and never the
newest complete one. It assumes steps are written in increasing order: it leaves alone data newer
than the newest complete checkpoint, which may belong to a write in progress.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import time
import types
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._aio import run_all
from .errors import (
    ConfigError,
    CorruptObjectError,
    InvalidKeyError,
    ObjectNotFoundError,
    PreconditionFailedError,
)
from .storage import Storage, validate_key, validate_prefix

__all__ = ["CheckpointStore", "Manifest", "ObjectRef", "PruneReport", "Streamed"]

log = logging.getLogger("vcasync.checkpoint")

FORMAT = "vcasync.checkpoint/1"
MAX_STEP = 10**20 - 1
_STEP_DIGITS = 20
_THREAD_HASH_BYTES = 1 << 20  # hash bigger objects in a thread, keeping the event loop free
_PARALLEL = 4
_STREAM_BATCH = 4 << 20  # a Streamed object is hashed and handed on about this much per thread hop

Chunk = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One object of a checkpoint: where it is, how big, and its SHA-256 (hex)."""

    key: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Manifest:
    """A published checkpoint. ``objects`` and ``meta`` are read-only views."""

    step: int
    objects: Mapping[str, ObjectRef]
    meta: Mapping[str, Any]
    created_unix: float
    key: str

    @property
    def names(self) -> list[str]:
        return sorted(self.objects)

    @property
    def total_bytes(self) -> int:
        return sum(ref.size for ref in self.objects.values())


class Streamed:
    """A checkpoint object given as chunks instead of one bytes object: ``chunks`` makes a fresh
    iterator over the same bytes at each call (it is called twice, see the module docstring), so
    the whole object is never in memory at once. Its chunks are produced in worker threads."""

    __slots__ = ("_chunks",)

    def __init__(self, chunks: Callable[[], Iterable[Chunk]]) -> None:
        self._chunks = chunks

    def chunks(self) -> Iterator[Chunk]:
        return iter(self._chunks())


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What :meth:`CheckpointStore.prune` kept and removed."""

    kept: list[int] = field(default_factory=list)
    deleted_steps: list[int] = field(default_factory=list)
    deleted_objects: int = 0


def _hash_chunks(obj: Streamed) -> tuple[str, int]:
    """The SHA-256 (hex) and size of a streamed object: one reading, nothing kept."""
    h, size = hashlib.sha256(), 0
    for chunk in obj.chunks():
        h.update(chunk)
        size += memoryview(chunk).nbytes
    return h.hexdigest(), size


async def _verified(obj: Streamed, ref: ObjectRef) -> AsyncIterator[Chunk]:
    """A second reading of ``obj``, in worker threads, checked against ``ref`` (taken from the
    first reading) before the stream ends: bytes that differ never end as a complete object."""
    chunks, h = obj.chunks(), hashlib.sha256()
    size = 0

    def take() -> list[Chunk]:
        nonlocal size
        batch: list[Chunk] = []
        got = 0
        for chunk in chunks:
            h.update(chunk)
            n = memoryview(chunk).nbytes
            size, got = size + n, got + n
            batch.append(chunk)
            if got >= _STREAM_BATCH:
                break
        return batch

    while batch := await asyncio.to_thread(take):
        for chunk in batch:
            yield chunk
    if size != ref.size or h.hexdigest() != ref.sha256:
        raise CorruptObjectError(f"checkpoint object {ref.key!r} came out differently when it was "
                                 "written than when it was hashed (its source changed)", key=ref.key)


async def _digest_and_size(data: memoryview | Streamed) -> tuple[str, int]:
    if isinstance(data, Streamed):
        return await asyncio.to_thread(_hash_chunks, data)
    return await _sha256(data), len(data)


async def _sha256(data: bytes | memoryview) -> str:
    if len(data) >= _THREAD_HASH_BYTES:
        return await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
    return hashlib.sha256(data).hexdigest()


def _check_json(value: object, path: str) -> None:
    """JSON without surprises: str keys only (json.dumps would turn 1 into "1"), finite numbers."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{path} has a non-str key {k!r}")
            _check_json(v, f"{path}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_json(v, f"{path}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path} is {value!r}")
    elif not isinstance(value, str | int | float | bool) and value is not None:
        raise TypeError(f"{path} is a {type(value).__name__}")


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


class CheckpointStore:
    """Checkpoints under ``prefix`` of ``storage``; see the module docstring."""

    def __init__(self, storage: Storage, prefix: str = "checkpoints") -> None:
        validate_prefix(prefix)
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        self.storage = storage
        self.prefix = prefix
        root = f"{prefix}/" if prefix else ""
        self._manifests = f"{root}manifests/"
        self._data = f"{root}data/"

    def __repr__(self) -> str:
        return f"<CheckpointStore {self.storage.url} prefix={self.prefix!r}>"

    # --- keys -----------------------------------------------------------------------------------

    @staticmethod
    def _check_step(step: object) -> int:
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
            raise ConfigError(f"a checkpoint step must be an int in 0..{MAX_STEP}, got {step!r}")
        return step

    def manifest_key(self, step: int) -> str:
        return f"{self._manifests}{self._check_step(step):0{_STEP_DIGITS}d}.json"

    def _data_key(self, step: int, name: str, digest: str) -> str:
        return f"{self._data}{step:0{_STEP_DIGITS}d}/{name}.{digest}"

    def _step_of(self, key: str, head: str, tail: str = "") -> int | None:
        body = key[len(head):]
        digits = body[:_STEP_DIGITS]
        if (not key.startswith(head) or len(digits) != _STEP_DIGITS or not digits.isdigit()
                or not body[_STEP_DIGITS:].startswith(tail)):
            return None
        if tail == ".json" and body != f"{digits}.json":
            return None
        return int(digits)

    # --- writing --------------------------------------------------------------------------------

    async def write(self, step: int, objects: Mapping[str, bytes | bytearray | memoryview | Streamed],
                    meta: Mapping[str, Any] | None = None) -> Manifest:
        """Write the objects, then publish the manifest; returns it. Every argument is checked
        before anything is written. Idempotent: writing the same checkpoint again (after a crash
        or a lost answer) returns the published one; a *different* checkpoint for a published
        ``step`` (or one a concurrent writer publishes first) raises
        :class:`PreconditionFailedError`."""
        self._check_step(step)
        if not isinstance(objects, Mapping) or not objects:
            raise ConfigError("a checkpoint needs at least one object (a mapping name -> bytes)")
        views: dict[str, memoryview | Streamed] = {}
        for name, data in objects.items():
            try:
                validate_key(name)
            except InvalidKeyError as exc:
                raise InvalidKeyError(f"checkpoint object name: {exc}", key=exc.key) from None
            if isinstance(data, Streamed):
                views[name] = data
                continue
            if not isinstance(data, bytes | bytearray | memoryview):
                raise ConfigError(f"checkpoint object {name!r} must be bytes-like (or Streamed), "
                                  f"got {type(data).__name__}")
            views[name] = memoryview(data).cast("B")
        try:
            _check_json(dict(meta or {}), "meta")
            meta_dict = json.loads(_canonical(dict(meta or {})))  # as a reader will see it
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"checkpoint meta must be JSON (finite numbers, str keys): {exc}") from None
        sums = await asyncio.gather(*(_digest_and_size(v) for v in views.values()))
        refs = {name: ObjectRef(key=self._data_key(step, name, digest), size=size, sha256=digest)
                for name, (digest, size) in zip(views, sums, strict=True)}
        manifest_key = self.manifest_key(step)
        if await self.storage.exists(manifest_key):
            return await self._same_or_refuse(step, refs, meta_dict)

        gate = asyncio.Semaphore(_PARALLEL)

        async def put(ref: ObjectRef, view: memoryview | Streamed) -> None:
            async with gate:
                try:
                    if isinstance(view, Streamed):
                        await self.storage.put_stream(ref.key, _verified(view, ref), if_absent=True)
                    else:
                        await self.storage.put(ref.key, view, if_absent=True)
                except PreconditionFailedError:
                    # The key names the content: an earlier attempt's (or a twin's) identical object.
                    if (await self.storage.stat(ref.key)).size != ref.size:
                        raise CorruptObjectError(f"{ref.key!r} exists with the wrong size",
                                                 key=ref.key) from None

        await run_all(put(refs[name], view) for name, view in views.items())

        created = time.time()
        body = {"format": FORMAT, "step": step, "created_unix": created, "meta": meta_dict,
                "objects": {n: {"key": r.key, "size": r.size, "sha256": r.sha256}
                            for n, r in sorted(refs.items())}}
        document = {**body, "checksum": hashlib.sha256(_canonical(body)).hexdigest()}
        try:
            await self.storage.put(manifest_key, _canonical(document), if_absent=True)
        except PreconditionFailedError:
            return await self._same_or_refuse(step, refs, meta_dict)
        return self._manifest(manifest_key, step, refs, meta_dict, created)

    async def _same_or_refuse(self, step: int, refs: Mapping[str, ObjectRef],
                              meta: Mapping[str, Any]) -> Manifest:
        """``step`` is already published. If it is this very checkpoint (a retry after a lost
        answer, or a crash after the commit), that is success; otherwise someone else won."""
        try:
            existing = await self.load(step)
        except CorruptObjectError:
            existing = None
        if (existing is not None and dict(existing.objects) == dict(refs)
                and _canonical(dict(existing.meta)) == _canonical(meta)):
            return existing
        raise PreconditionFailedError(f"checkpoint step {step} already exists with other contents",
                                      key=self.manifest_key(step))

    @staticmethod
    def _manifest(key: str, step: int, refs: Mapping[str, ObjectRef], meta: Mapping[str, Any],
                  created: float) -> Manifest:
        return Manifest(step=step, objects=types.MappingProxyType(dict(refs)),
                        meta=types.MappingProxyType(dict(meta)), created_unix=created, key=key)

    # --- reading --------------------------------------------------------------------------------

    async def steps(self) -> list[int]:
        """Steps that have a published manifest, ascending (complete or not)."""
        found = []
        async for key in self.storage.list(self._manifests):
            step = self._step_of(key, self._manifests, ".json")
            if step is not None:
                found.append(step)
        return sorted(found)

    async def load(self, step: int) -> Manifest:
        """The manifest of ``step``: :class:`ObjectNotFoundError` if there is none,
        :class:`CorruptObjectError` if it does not parse or its checksum does not match."""
        key = self.manifest_key(step)
        raw = await self.storage.get(key)
        try:
            doc = json.loads(raw.decode("utf-8"))
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError(f"not a {FORMAT} manifest")
            checksum = doc.pop("checksum")
            if hashlib.sha256(_canonical(doc)).hexdigest() != checksum:
                raise ValueError("checksum mismatch")
            if doc["step"] != step:
                raise ValueError(f"it says step {doc['step']}")
            refs = {}
            for name, ref in doc["objects"].items():
                refs[name] = ObjectRef(key=str(ref["key"]), size=int(ref["size"]), sha256=str(ref["sha256"]))
                validate_key(refs[name].key)
            meta = doc["meta"]
            created = float(doc["created_unix"])
            if not isinstance(meta, dict) or not math.isfinite(created):
                raise ValueError("bad meta or time")
        except (ValueError, KeyError, TypeError, AttributeError, InvalidKeyError) as exc:
            raise CorruptObjectError(f"checkpoint manifest {key!r} is corrupt: {exc}", key=key) from None
        return self._manifest(key, step, refs, meta, created)

    async def _is_complete(self, manifest: Manifest) -> bool:
        async def present(ref: ObjectRef) -> bool:
            try:
                return (await self.storage.stat(ref.key)).size == ref.size
            except ObjectNotFoundError:
                return False

        checks = await asyncio.gather(*(present(r) for r in manifest.objects.values()))
        return all(checks)

    async def _complete(self, step: int) -> Manifest | None:
        try:
            manifest = await self.load(step)
        except (CorruptObjectError, ObjectNotFoundError) as exc:
            log.warning("skipping checkpoint %d: %s", step, exc)
            return None
        if not await self._is_complete(manifest):
            log.warning("skipping checkpoint %d: some of its objects are missing or truncated", step)
            return None
        return manifest

    async def latest(self) -> Manifest | None:
        """The newest complete checkpoint (manifest intact, every object present), or None."""
        async for manifest in self.newest_first():
            return manifest
        return None

    async def newest_first(self) -> AsyncIterator[Manifest]:
        """The complete checkpoints (manifest intact, every object present), newest first: a
        reader whose newest one turns out corrupt when its bytes are read may go on to the next."""
        for step in reversed(await self.steps()):
            manifest = await self._complete(step)
            if manifest is not None:
                yield manifest

    async def read(self, manifest: Manifest, name: str) -> bytes:
        """The bytes of object ``name``, verified against the manifest's size and SHA-256."""
        ref = manifest.objects.get(name)
        if ref is None:
            raise ObjectNotFoundError(f"checkpoint {manifest.step} has no object {name!r}; it has "
                                      f"{manifest.names}", key=name)
        data = await self.storage.get(ref.key)
        if len(data) != ref.size or await _sha256(data) != ref.sha256:
            raise CorruptObjectError(f"checkpoint {manifest.step} object {name!r} ({ref.key!r}) does "
                                     f"not match its manifest digest", key=ref.key)
        return data

    async def open_read(self, manifest: Manifest, name: str) -> AsyncGenerator[bytes, None]:
        """The bytes of object ``name`` as a stream, never whole in memory, verified against the
        manifest as they pass: :class:`CorruptObjectError` as soon as there are more bytes than its
        size, or at the end (before the stream ends) when the size or SHA-256 differs. A consumer
        that stops early (a decoder that refused the bytes) can let :meth:`verify_rest` say
        whether the object was corrupt."""
        ref = manifest.objects.get(name)
        if ref is None:
            raise ObjectNotFoundError(f"checkpoint {manifest.step} has no object {name!r}; it has "
                                      f"{manifest.names}", key=name)
        h, size = hashlib.sha256(), 0

        def corrupt() -> CorruptObjectError:
            return CorruptObjectError(f"checkpoint {manifest.step} object {name!r} ({ref.key!r}) "
                                      "does not match its manifest digest", key=ref.key)

        async for chunk in self.storage.open_read(ref.key):
            size += len(chunk)
            if size > ref.size:
                raise corrupt()
            if len(chunk) >= _THREAD_HASH_BYTES:
                await asyncio.to_thread(h.update, chunk)
            else:
                h.update(chunk)
            yield chunk
        if size != ref.size or h.hexdigest() != ref.sha256:
            raise corrupt()

    @staticmethod
    async def verify_rest(stream: AsyncIterator[bytes]) -> None:
        """Read what is left of an :meth:`open_read` stream, keeping nothing: raises its
        :class:`CorruptObjectError` when the object does not match its manifest."""
        async for _ in stream:
            pass

    # --- retention ------------------------------------------------------------------------------

    async def prune(self, keep_last: int) -> PruneReport:
        """Keep the newest ``keep_last`` (>= 1) complete checkpoints; delete older manifests, then
        every data object no remaining manifest names, up to the newest complete step."""
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ConfigError(f"keep_last must be an int >= 1 (the newest complete checkpoint is "
                              f"always kept), got {keep_last!r}")
        steps = await self.steps()
        kept: list[Manifest] = []
        for step in reversed(steps):
            manifest = await self._complete(step)
            if manifest is not None:
                kept.append(manifest)
                if len(kept) == keep_last:
                    break
        if not kept:
            return PruneReport()
        newest, oldest_kept = kept[0].step, kept[-1].step
        doomed = [s for s in steps if s < oldest_kept]
        for step in doomed:  # manifests first: no manifest ever names a deleted object
            await self.storage.delete(self.manifest_key(step))
        referenced: set[str] = set()
        for step in steps:
            if step >= oldest_kept:
                try:
                    referenced.update(r.key for r in (await self.load(step)).objects.values())
                except (CorruptObjectError, ObjectNotFoundError):
                    continue
        orphans = []
        async for key in self.storage.list(self._data):
            data_step = self._step_of(key, self._data, "/")
            if data_step is not None and data_step <= newest and key not in referenced:
                orphans.append(key)
        for key in orphans:
            await self.storage.delete(key)
        return PruneReport(kept=sorted(m.step for m in kept), deleted_steps=doomed,
                           deleted_objects=len(orphans))
