"""Worker state anywhere: identity, lease and checkpoints kept in a :class:`~vcasync.storage.Storage`.

A preempted spot VM usually comes back as a *different* machine with an empty disk. With
``Worker(..., state="s3://bucket/workers/w7")`` (``vcasync worker --state URL``) the worker keeps what a
restart needs in object storage, and a replacement given the same URL resumes the same lease from its
last checkpoint::

    identity.json                        {coordinator, run_id, worker_id, token, finished}: the
                                         token is a credential, so the state URL must be as
                                         private as the join secret
    lease.json                           the lease being worked on
    checkpoints/<lease>/<seq:012d>-<sha256:16>.pt
                                         the trainer's checkpoints, newest ``keep`` kept; a restore
                                         takes the newest whose digest matches
    owner/<epoch:012d>.json              who holds the state now (see :mod:`vcasync._owner_lease`)

That owner lease stands on create-if-absent, so the store is probed first, as a coordinator probes
its own (:func:`~vcasync.storage.probe_storage`, a scratch object under ``probe/``): one that ignores
conditional writes is refused with a :class:`~vcasync.errors.ConfigError` unless ``allow_unsafe_store``.

The local :class:`~vcasync.worker._state_dir.StateDir` stays the working copy (model cache, spooled
results, the receipts audit trail), and this class mirrors its writes: the worker calls the state's
methods through :func:`asyncio.to_thread`, so each mirrored write blocks that thread until the object
is stored, and "saved" means "saved remotely" when the call returns. The same goes for a synchronous
trainer's ``ctx.save_checkpoint``: a SIGKILL after it returns loses nothing. Spooled results are not
mirrored: one lost with its machine was either acknowledged (the lease is then closed and the
replacement starts a fresh unit) or not (the replacement resumes the lease from its checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from .._aio import first_error
from .._owner_lease import OwnerLease
from ..errors import ConfigError, FrameError, ObjectNotFoundError, StateInUseError, StorageError
from ..ledger._units import LeaseGrant
from ..protocol import _messages as P
from ..storage import Storage, open_storage, probe_storage
from ._state_dir import Identity, StateDir, _atomic_write, _safe

__all__ = ["RemoteStateDir"]

log = logging.getLogger("vcasync.worker")

_IDENTITY = "identity.json"
_LEASE = "lease.json"
_CKPT = "checkpoints/"
_PROBE = "probe"


def state_lease(storage: Storage, ttl_s: float, **kw: Any) -> OwnerLease:
    """The owner lease of a worker state: one live worker per state URL (``kw``: test clocks)."""
    def refused(message: str, holder: str | None) -> StateInUseError:
        return StateInUseError(message, url=storage.url, holder=holder)

    return OwnerLease(storage, error=refused, prefix="owner/", ttl_s=ttl_s,
                      subject=f"the worker state at {storage.url}", role="worker",
                      hint="give each worker its own --state URL", logger=log, **kw)


def check_state_url(url: str) -> None:
    """Refuse a worker state URL as the worker's session would when it opens it (no backend for the
    scheme, an unknown option, a secret in the query, a relative or hosted ``file://`` path): the
    same :func:`~vcasync.storage.open_storage`, so one set of rules; nothing is read or written, a
    backend's ``from_url`` only parses (the storage is never entered)."""
    open_storage(url)


class RemoteStateDir(StateDir):
    """A :class:`StateDir` at ``root`` whose identity, lease and checkpoints live in ``state``.

    ``state`` is a storage URL (opened and closed here; ``options`` go to
    :func:`~vcasync.storage.open_storage`) or an open :class:`Storage` (the caller closes it). Use it
    inside :meth:`session`, which holds the state's owner lease. ``temporary``: ``root`` is a cache
    made for this worker (no ``--state-dir``), removed when each session ends: it holds the worker's
    token, and nothing there outlives the process anyway (the next start makes another).
    """

    def __init__(self, root: Path, state: str | Storage, *, keep_checkpoints: int = 2,
                 lease_ttl_s: float = 30.0, options: Mapping[str, Any] | None = None,
                 temporary: bool = False, allow_unsafe_store: bool = False,
                 lock_wait_s: float = 30.0) -> None:
        if keep_checkpoints < 1:
            raise ConfigError("keep_checkpoints must be at least 1")
        if lease_ttl_s <= 0:
            raise ConfigError("the state lease TTL must be positive")
        super().__init__(root, lock_wait_s=lock_wait_s)
        self._spec = state
        self._options = dict(options or {})
        self.temporary = temporary
        self.allow_unsafe_store = allow_unsafe_store
        self.keep_checkpoints = keep_checkpoints
        self.lease_ttl_s = lease_ttl_s
        self._storage: Storage | None = None
        self._lease: OwnerLease | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seq: dict[str, int] = {}
        self._uploads: set[asyncio.Task[None]] = set()
        #: One checkpoint upload at a time, in the order saved (an async trainer can save faster
        #: than storage takes them): numbering and pruning stay in order.
        self._upload_lock: asyncio.Lock | None = None

    @property
    def url(self) -> str:
        return self._spec if isinstance(self._spec, str) else self._spec.url

    @property
    def where(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemoteStateDir({self.url!r}, local={str(self.root)!r})"

    # -- the session -------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def session(self, on_lost: Callable[[], Any]) -> AsyncIterator[None]:
        """Hold the state (refusing a second live worker), bring the local copy up to date from it,
        and renew the hold until the block ends; ``on_lost()`` is called if the state is taken over."""
        async with contextlib.AsyncExitStack() as stack:
            if self.temporary:
                await asyncio.to_thread(self._make_dirs)    # a second session: the last removed it
                stack.callback(shutil.rmtree, self.root, ignore_errors=True)
            else:   # a --state-dir cache is one worker's too, whichever --state it mirrors
                await stack.enter_async_context(self.locked())
            if isinstance(self._spec, str):
                storage = await stack.enter_async_context(open_storage(self._spec, **self._options))
            else:
                storage = self._spec
            await self._check_store(storage)
            lease = state_lease(storage, self.lease_ttl_s)
            await lease.acquire()
            self._storage, self._lease, self._loop = storage, lease, asyncio.get_running_loop()
            self._upload_lock = asyncio.Lock()
            failure: BaseException | None = None
            try:
                await self._restore()
                try:
                    async with asyncio.TaskGroup() as tg:
                        renewer = tg.create_task(lease.keep_renewed(on_lost), name="state-lease")
                        try:
                            yield
                        finally:
                            renewer.cancel()
                            await self._settle_uploads()
                except BaseExceptionGroup as group:
                    # The group wraps the worker's own error (its grace TimeoutError, an AuthError,
                    # a TrainerError): callers catch those, so it must leave as it came, the same
                    # as with a local state dir. Raised outside this handler: no group as context.
                    failure = first_error(group)
                if failure is not None:
                    raise failure
            finally:
                await lease.release()
                self._storage = self._lease = self._loop = None

    async def _check_store(self, storage: Storage) -> None:
        """Refuse a store that ignores if-absent writes (the owner lease needs them), unless allowed."""
        probe = await probe_storage(storage, _PROBE)
        if probe.conditional_writes:
            return
        what = (f"{probe.url} does not honour conditional writes (a second if-absent write of one key "
                "succeeded), so the worker state's owner lease cannot keep a second worker on it from "
                "writing over the first one's lease and checkpoints")
        if not self.allow_unsafe_store:
            raise ConfigError(f"{what}; use a store that honours them (see docs/runs.md) or pass "
                              "--allow-unsafe-store (WorkerConfig(allow_unsafe_store=True)) to run "
                              "anyway, one worker per state URL")
        log.warning("UNSAFE STORE: %s. Running anyway (--allow-unsafe-store): never start two workers "
                    "on this state URL.", what)

    async def _settle_uploads(self) -> None:
        if self._uploads:
            await asyncio.gather(*self._uploads, return_exceptions=True)

    async def _restore(self) -> None:
        """The remote state is the truth: copy it over the local one (or clear what it lacks). An
        empty remote state takes the local one instead (see :meth:`_migrate`)."""
        st = self._st()
        ident = await _get_json(st, _IDENTITY)
        body = await _get_json(st, _LEASE)
        if ident is None and body is None and await self._migrate():
            return
        local_ident = await asyncio.to_thread(StateDir.stored_identity, self)
        saved: Identity | None = None
        if ident is not None:
            try:
                saved = Identity.from_json(ident)
            except (KeyError, TypeError):
                log.warning("identity in %s is unreadable; the worker will join again", self.url)
        if local_ident is not None and (saved is None or saved.worker_id != local_ident.worker_id):
            log.warning("the local identity in %s (worker %s) is replaced by %s's", self.root,
                        local_ident.worker_id, self.url)
        if saved is not None:
            await asyncio.to_thread(StateDir.save_identity, self, saved)
        else:
            await asyncio.to_thread(StateDir.forget_identity, self)
        grant = None
        if body is not None:
            try:
                grant = P.grant_from_body(body)
            except FrameError:
                log.warning("lease record in %s is unreadable; starting fresh", self.url)
        local = await asyncio.to_thread(StateDir.load_lease, self)
        if local is not None and (grant is None or local.lease_id != grant.lease_id):
            log.warning("dropping the local lease %s (and its checkpoint) in %s: the state in %s holds %s",
                        local.lease_id, self.root, self.url,
                        f"lease {grant.lease_id}" if grant is not None else "no lease")
            await asyncio.to_thread(StateDir.finish_lease, self, local.lease_id)
        if grant is None:
            return
        await asyncio.to_thread(StateDir.save_lease, self, grant)
        step = await self._restore_checkpoint(grant.lease_id)
        log.info("restored lease %s from %s%s", grant.lease_id, self.url,
                 f" with checkpoint #{step}" if step else " (no checkpoint yet)")

    async def _migrate(self) -> bool:
        """The remote state holds no identity and no lease but the local dir does (a worker that ran
        with ``--state-dir`` alone, restarted with ``--state`` added): store the local identity, lease
        and checkpoint there instead of dropping them. False when there was nothing to move.

        Safe because the owner lease is held (no other worker writes there) and the remote state
        had nothing to lose; a write that fails leaves the local copy as it is, for this run.
        """
        ident = await asyncio.to_thread(StateDir.stored_identity, self)
        grant = await asyncio.to_thread(StateDir.load_lease, self)
        if ident is None and grant is None:
            return False
        ckpt = None
        if grant is not None:
            path = self.checkpoint_path(grant.lease_id)
            ckpt = await asyncio.to_thread(lambda: path.read_bytes() if path.exists() else None)
        try:
            if ident is not None:
                await self._write(_IDENTITY, ident.to_json())
            if grant is not None:
                await self._write(_LEASE, json.dumps(P.grant_to_body(grant)).encode())
                if ckpt is not None:
                    await self._upload_checkpoint(grant.lease_id, ckpt)
        except StorageError as exc:
            log.warning("could not move the local state in %s into the empty %s (%s); working from "
                        "the local copy", self.root, self.url, type(exc).__name__)
            return True
        parts = ([f"worker {ident.worker_id}"] if ident is not None else []) + (
            [f"lease {grant.lease_id} " + ("with its checkpoint" if ckpt is not None else "(no checkpoint)")]
            if grant is not None else [])
        log.info("the worker state at %s was empty: moved the local state in %s into it (%s)",
                    self.url, self.root, ", ".join(parts))
        return True

    async def _restore_checkpoint(self, lease_id: str) -> int:
        """Copy the newest intact checkpoint of ``lease_id`` to its local path; its number, or 0."""
        st = self._st()
        keys = [k async for k in st.list(f"{_CKPT}{_safe(lease_id)}/")]
        # The next checkpoint is numbered past every one stored, a corrupt one skipped here too:
        # numbered from the one restored, it took the corrupt one's number, and the pruning (which
        # keeps the last keys) could then delete it and keep the corrupt one.
        seqs = [s for k in keys if (s := _parse_ckpt(k)[0]) is not None]
        self._seq[lease_id] = max([self._seq.get(lease_id, 0), *seqs])
        for key in reversed(keys):
            seq, digest = _parse_ckpt(key)
            if seq is None:
                continue
            try:
                data = await st.get(key)
            except ObjectNotFoundError:
                continue
            if hashlib.sha256(data).hexdigest()[:16] != digest:
                log.warning("checkpoint %s in %s does not match its digest; trying an older one "
                            "(and removing it: it can never be restored)", key, self.url)
                # it would hold one of the --keep-checkpoints places, pruning a good one instead
                with contextlib.suppress(StorageError):
                    await self._lease_checked_delete(key)
                continue
            await asyncio.to_thread(_atomic_write, self.checkpoint_path(lease_id), data)
            return seq
        return 0

    async def _lease_checked_delete(self, key: str) -> None:
        assert self._lease is not None
        await self._lease.check()
        with contextlib.suppress(ObjectNotFoundError):
            await self._st().delete(key)

    def _st(self) -> Storage:
        if self._storage is None:
            raise ConfigError(f"the worker state at {self.url} is used outside its session")
        return self._storage

    # -- the bridge from the worker's threads ------------------------------------------------------
    def _blocking(self, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``make()`` on the session's loop and wait for it: called from a worker thread."""
        loop = self._loop
        if loop is None:
            raise ConfigError(f"the worker state at {self.url} is used outside its session")
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:
                raise RuntimeError("RemoteStateDir writes block: call them via asyncio.to_thread")
        asyncio.run_coroutine_threadsafe(make(), loop).result()

    async def _write(self, key: str, data: bytes) -> None:
        assert self._lease is not None
        await self._lease.check()
        await self._st().put(key, data)

    async def _delete(self, keys: Callable[[Storage], Awaitable[list[str]]]) -> None:
        assert self._lease is not None
        await self._lease.check()
        st = self._st()
        for key in await keys(st):
            with contextlib.suppress(ObjectNotFoundError):
                await st.delete(key)

    def _mirror(self, what: str, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """A mirrored write that storage trouble does not turn into a dead worker: the local copy
        stands and the unit goes on; only a replacement machine would start it over. A takeover
        (:class:`StateInUseError`, a ConfigError) still propagates: the worker must stop."""
        try:
            self._blocking(make)
        except StorageError as exc:
            log.warning("could not store the %s in %s (%s); kept locally, a replacement machine "
                        "would not see it", what, self.url, type(exc).__name__)

    # -- mirrored writes ---------------------------------------------------------------------------
    def save_identity(self, ident: Identity) -> None:
        super().save_identity(ident)
        data = ident.to_json()
        self._mirror("identity", lambda: self._write(_IDENTITY, data))

    def forget_identity(self) -> None:
        super().forget_identity()

        async def keys(_: Storage) -> list[str]:
            return [_IDENTITY]

        self._mirror("forgotten identity", lambda: self._delete(keys))

    def save_lease(self, grant: LeaseGrant) -> None:
        super().save_lease(grant)
        data = json.dumps(P.grant_to_body(grant)).encode()
        self._mirror("lease", lambda: self._write(_LEASE, data))

    def finish_lease(self, lease_id: str) -> None:
        super().finish_lease(lease_id)
        prefix = f"{_CKPT}{_safe(lease_id)}/"

        async def keys(st: Storage) -> list[str]:
            body = await _get_json(st, _LEASE)
            current = body.get("lease_id") if isinstance(body, dict) else None
            return [k async for k in st.list(prefix)] + ([_LEASE] if current == lease_id else [])

        async def finish() -> None:
            assert self._upload_lock is not None
            async with self._upload_lock:  # after any upload still queued, so none outlives this
                await self._delete(keys)
                self._seq.pop(lease_id, None)

        self._mirror("finished lease", finish)

    def checkpoint_saved(self, lease_id: str) -> None:
        """The trainer saved ``checkpoint_path(lease_id)``: store it as the newest checkpoint.

        From a trainer thread this returns once the checkpoint is stored; from the loop (an async
        trainer) it is stored in the background, and the session waits for it before it ends.
        """
        path = self.checkpoint_path(lease_id)
        loop = self._loop
        on_loop = False
        with contextlib.suppress(RuntimeError):
            on_loop = loop is not None and asyncio.get_running_loop() is loop
        if on_loop:
            task = asyncio.ensure_future(self._upload_checkpoint(lease_id, path.read_bytes()))
            self._uploads.add(task)
            task.add_done_callback(self._upload_done)
            return
        data = path.read_bytes()
        self._mirror("checkpoint", lambda: self._upload_checkpoint(lease_id, data))

    def _upload_done(self, task: asyncio.Task[None]) -> None:
        self._uploads.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("storing a checkpoint in %s failed: %r", self.url, exc)

    async def _upload_checkpoint(self, lease_id: str, data: bytes) -> None:
        assert self._upload_lock is not None
        async with self._upload_lock:
            await self._upload_checkpoint_now(lease_id, data)

    async def _upload_checkpoint_now(self, lease_id: str, data: bytes) -> None:
        st = self._st()
        prefix = f"{_CKPT}{_safe(lease_id)}/"
        if lease_id not in self._seq:
            seqs = [s for k in [k async for k in st.list(prefix)] if (s := _parse_ckpt(k)[0]) is not None]
            self._seq[lease_id] = max(seqs, default=0)
        seq = self._seq[lease_id] + 1
        self._seq[lease_id] = seq
        digest = hashlib.sha256(data).hexdigest()[:16]
        await self._write(f"{prefix}{seq:012d}-{digest}.pt", data)
        # Bounded: the new one is stored before the old ones go, so there is always one to restore.
        keep = self.keep_checkpoints

        async def old(st: Storage) -> list[str]:
            keys = [k async for k in st.list(prefix) if _parse_ckpt(k)[0] is not None]
            return keys[:-keep] if len(keys) > keep else []

        with contextlib.suppress(StorageError):
            await self._delete(old)


def _parse_ckpt(key: str) -> tuple[int | None, str]:
    name = key.rsplit("/", 1)[-1]
    stem, _, digest = name.removesuffix(".pt").partition("-")
    if not name.endswith(".pt") or len(stem) != 12 or not stem.isdigit() or len(digest) != 16:
        return None, ""
    return int(stem), digest


async def _get_json(st: Storage, key: str) -> Any:
    try:
        return json.loads(await st.get(key))
    except ObjectNotFoundError:
        return None
    except ValueError:
        log.warning("%s in %s is not JSON; ignoring it", key, st.url)
        return None
