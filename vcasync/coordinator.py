"""The asyncio core: join, lease, heartbeat, submit, release, and one merge loop that owns the model.

No HTTP here (the server is a thin skin over this). A result travels::

    submit: ledger check -> decode (wire, spec, limits) -> validate (finite, norm)   [any task]
        -> merge queue -> merge loop: ledger re-check -> staleness / base -> journal (durable)
        -> policy.merge into the private working model -> publish an immutable version -> receipt

Decoding, validation, the merge and the copies run in worker threads, so heartbeats and leases keep
being answered during a 100M-parameter merge. The merge loop is the only writer of the model, the
policy state and unit completion, so a unit can never be closed twice. Bad input raises before it
reaches the queue and changes nothing; a valid result that cannot be used (too stale, refused by the
policy) gets a ``rejected`` receipt and its unit goes back to the queue.

Durability (see :mod:`vcasync.journal`): ``"journal"`` writes each result to storage before it is
merged and acknowledged, and replays the journal on start; ``"snapshot"`` only writes periodic
snapshots (a crash loses what came after the last one, and versions jump forward past anything that
may have been served); ``"none"`` keeps nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ._results import ResultMeta, check_tensors, parse_result_meta
from ._units import LeaseGrant, Receipt, WorkUnit, make_units
from ._versions import Version, VersionStore, copy_tensors
from .errors import (
    ClosedError,
    ConfigError,
    LedgerError,
    PolicyError,
    UpdateRejectedError,
    ValidationError,
    VCAsyncError,
    VersionNotFoundError,
    WireError,
)
from .journal import Captured, Journal
from .ledger import Ledger, LedgerConfig
from .metrics import Metrics
from .policy import MergePolicy, PolicyState
from .storage import Storage
from .tensors import ModelState, Update
from .wire import Limits, aencode_payload, decode_payload, resolve_codec

__all__ = ["Coordinator", "CoordinatorConfig", "Durability", "LeaseGrant", "Receipt", "WorkUnit",
           "make_units"]

log = logging.getLogger("vcasync.coordinator")
Durability = Literal["journal", "snapshot", "none"]
GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Everything a coordinator is told; validated here so a typo fails before anything starts."""

    max_staleness: int = 16               # results based on older versions are refused
    durability: Durability = "journal"
    snapshot_every: int = 100             # results between snapshots ...
    snapshot_interval_s: float = 60.0     # ... and at most this long when something changed
    keep_snapshots: int = 2
    lease_timeout_s: float = 60.0
    heartbeat_interval_s: float | None = None
    max_attempts: int = 5
    deadline_slack: float = 3.0
    require_finite: bool = True
    max_update_norm: float | None = None
    limits: Limits = field(default_factory=Limits)
    model_codec: str = "raw"              # how model downloads are encoded (unless asked otherwise)
    journal_codec: str = "raw"            # how journal entries and snapshots are encoded
    max_retained_bytes: int | None = 4 * GiB   # old versions kept for deltas and downloads
    max_concurrent_decodes: int = 2       # uploads decoded at once (each holds one update in memory)
    state_prefix: str = "vcasync"         # where on the storage the coordinator keeps its state
    expiry_interval_s: float = 1.0

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise ConfigError(f"CoordinatorConfig.{name} {what}, got {getattr(self, name)!r}")

        def count(name: str, minimum: int) -> None:
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= minimum, name,
                 f"must be an int >= {minimum}")

        count("max_staleness", 0)
        count("snapshot_every", 1)
        count("keep_snapshots", 1)
        count("max_concurrent_decodes", 1)
        need(self.durability in ("journal", "snapshot", "none"), "durability",
             "must be 'journal', 'snapshot' or 'none'")
        need(self.snapshot_interval_s > 0, "snapshot_interval_s", "must be > 0")
        need(self.expiry_interval_s > 0, "expiry_interval_s", "must be > 0")
        need(self.max_update_norm is None or self.max_update_norm > 0, "max_update_norm",
             "must be > 0 or None")
        need(self.max_retained_bytes is None or self.max_retained_bytes >= 0, "max_retained_bytes",
             "must be >= 0 or None")
        need(isinstance(self.limits, Limits), "limits", "must be a vcasync.wire.Limits")
        need(isinstance(self.state_prefix, str) and bool(self.state_prefix.strip("/")),
             "state_prefix", "must be a non-empty key prefix")
        for name in ("model_codec", "journal_codec"):
            try:
                resolve_codec(getattr(self, name))
            except (ConfigError, ValueError, TypeError) as exc:
                raise ConfigError(f"CoordinatorConfig.{name}: {exc}") from None
        self.ledger_config()   # lease settings are checked by the ledger's own config

    def ledger_config(self) -> LedgerConfig:
        return LedgerConfig(lease_timeout_s=self.lease_timeout_s,
                            heartbeat_interval_s=self.heartbeat_interval_s,
                            max_attempts=self.max_attempts, deadline_slack=self.deadline_slack)


class _Control(enum.Enum):
    STOP = "stop"
    CAPTURE = "capture"


@dataclass(slots=True)
class _Job:
    worker_id: str
    lease_id: str
    unit: WorkUnit
    meta: ResultMeta
    tensors: dict[str, torch.Tensor]
    future: asyncio.Future[Receipt]


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return reason
    name = type(exc).__name__.removesuffix("Error")
    snake = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    return f"wire_{snake}" if isinstance(exc, WireError) else snake


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()    # mark it retrieved: the submitter may have gone away


class Coordinator:
    """Holds the global model and the ledger; merges results as they arrive. ``async with`` it."""

    def __init__(self, model: ModelState, units: Sequence[WorkUnit], *, policy: MergePolicy,
                 storage: Storage | None, config: CoordinatorConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or CoordinatorConfig()
        if not isinstance(policy, MergePolicy):
            raise ConfigError(f"policy {policy!r} does not implement MergePolicy")
        if storage is None and self.config.durability != "none":
            raise ConfigError(f"durability {self.config.durability!r} needs a storage")
        if model.version < 0 or not len(model):
            raise ConfigError("the model needs at least one tensor and a version >= 0")
        self._model_in = model
        self._units_in = list(units)
        self._policy = policy
        self._needs_base = bool(getattr(policy, "needs_base", False))
        self._clock = clock
        self._spec = model.spec
        self._journal = Journal(storage, config=self.config, spec=self._spec)
        self.metrics = Metrics()
        self.metrics.bind(self._gauges)
        self._phase = "new"
        # Set in __aenter__ (recovery decides them).
        self._ledger: Ledger
        self._versions: VersionStore
        self._working: ModelState
        self._policy_state: PolicyState = {}
        self._jobs: asyncio.Queue[_Job | _Control] = asyncio.Queue()
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._decode_slots = asyncio.Semaphore(self.config.max_concurrent_decodes)
        self._finished = asyncio.Event()
        self._closed = asyncio.Event()
        self._stop = asyncio.Event()
        # Taken by the merge loop, written by the snapshot loop; holds its version until written.
        self._captured: tuple[Captured, Version] | None = None
        self._captured_ready = asyncio.Event()
        self._capture_queued = False
        self._runner: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._busy = False
        self._since_snapshot = 0

    # -- lifetime ---------------------------------------------------------------------------------
    async def __aenter__(self) -> Coordinator:
        if self._phase != "new":
            raise ClosedError("a Coordinator is entered once; make a new one")
        self._phase = "starting"
        try:
            await self._recover()
        except BaseException:
            self._phase = "closed"
            self._closed.set()
            raise
        self._runner = asyncio.create_task(self._run(), name="vcasync-coordinator")
        self._phase = "running"
        self._check_finished()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Finish the merge in progress, refuse what is queued, write a last snapshot. Idempotent."""
        if self._phase in ("new", "closed"):
            self._phase = "closed"
            self._closed.set()
            return
        if self._phase == "closing":
            await self._closed.wait()
            return
        self._phase = "closing"
        try:
            self._stop.set()
            self._jobs.put_nowait(_Control.STOP)
            if self._runner is not None:
                with contextlib.suppress(Exception):
                    await self._runner
            self._fail_queued(ClosedError("the coordinator is closing; send the result again"))
            if self._failure is None and self.config.durability != "none":
                try:    # nothing merges any more: capture and write what the last snapshot lacks
                    if self._since_snapshot:
                        await self._capture()
                    await self._write_captured()
                except (VCAsyncError, OSError) as exc:
                    log.warning("final snapshot failed: %s", exc)
            self._drop_captured()
        finally:
            self._phase = "closed"
            self._closed.set()

    def _check_running(self) -> None:
        if self._phase != "running":
            if self._failure is not None:
                raise ClosedError(f"the coordinator stopped after an error: {self._failure!r}")
            raise ClosedError(f"the coordinator is {self._phase}; it serves between __aenter__ "
                              "and aclose()")

    async def _run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._merge_loop(), name="vcasync-merge")
                tg.create_task(self._expiry_loop(), name="vcasync-expiry")
                if self.config.durability != "none":
                    tg.create_task(self._snapshot_loop(), name="vcasync-snapshots")
        except BaseException as exc:
            self._failure = exc
            self._phase = "failed" if self._phase == "running" else self._phase
            log.exception("coordinator loop failed; stopping")
            self._fail_queued(ClosedError(f"the coordinator stopped after an error: {exc!r}"))
            self._closed.set()

    def _fail_queued(self, exc: Exception) -> None:
        while not self._jobs.empty():
            job = self._jobs.get_nowait()
            if isinstance(job, _Job) and not job.future.done():
                job.future.set_exception(exc)

    # -- recovery ---------------------------------------------------------------------------------
    async def _recover(self) -> None:
        run = await self._journal.open()
        cfg = self.config.ledger_config()
        rec = await self._journal.load_snapshot()
        if rec is None:
            model = self._model_in
            self._working = ModelState(copy_tensors(model.tensors, None), model.version)
            self._policy_state = self._policy.init_state(self._working)
            self._ledger = Ledger(self._units_in, config=cfg, clock=self._clock, secret=run.secret)
        else:
            self._working = ModelState(rec.tensors, rec.version)
            self._policy_state = rec.policy_state
            self._ledger = Ledger.restore(rec.ledger, config=cfg, clock=self._clock,
                                          secret=run.secret)
            self._ledger.add_units(self._units_in)
        self._versions = VersionStore(self._working, max_bytes=self.config.max_retained_bytes)
        if rec is not None and self.config.durability == "journal":
            async for entry in self._journal.entries():
                await self._replay(entry.meta, entry.tensors)
        floor = await self._journal.version_floor()
        if floor is not None and floor >= self._working.version:
            # Snapshot mode: versions up to the floor may have been served; never reuse a number.
            jumped = ModelState(copy_tensors(self._working.tensors, None), floor + 1)
            self._working.version = floor + 1
            self._versions.publish(jumped)
            self._retain()
        await self._journal.raise_version_floor(self._working.version)
        if rec is None and self._journal.durable:
            # The first snapshot pins the initial model: replay must start from exactly it.
            await self._capture()
            await self._write_captured()

    async def _replay(self, meta: Mapping[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        kind = meta.get("type")
        if kind == "reject":
            self._ledger.record(meta["lease_id"], unit_id=meta["unit_id"],
                                worker_id=meta["worker_id"], status="rejected",
                                version=self.version, reason=meta["reason"])
            return
        rm = ResultMeta(meta["lease_id"], meta["base_version"], meta["kind"], meta["steps"],
                        meta["samples"], meta["partial"], dict(meta["metrics"]))
        held: Version | None = None
        base: ModelState | None = None
        if self._needs_base and rm.kind == "delta":
            held = self._versions.acquire(rm.base_version)
            base = held.model if held is not None else await self._journal.load_base(rm.base_version)
        try:
            await self._apply(meta["worker_id"], meta["unit_id"], rm, tensors, base)
        finally:
            if held is not None:
                self._versions.release(held)

    # -- workers ----------------------------------------------------------------------------------
    async def join(self, name: str = "", info: Mapping[str, Any] | None = None) -> str:
        """Register a worker; returns its id (authentication is the server's business)."""
        self._check_running()
        return self._ledger.join(name, info)

    async def lease(self, worker_id: str) -> LeaseGrant:
        """The next unit, or :class:`NoWorkAvailableError` (``finished`` when the run is over)."""
        self._check_running()
        try:
            return self._ledger.lease(worker_id, self.version)
        finally:
            self._check_finished()      # leasing expires overdue leases, which may park the last unit

    async def resume(self, worker_id: str, lease_id: str) -> LeaseGrant:
        """Pick a lease up again after a restart (worker or coordinator)."""
        self._check_running()
        try:
            return self._ledger.resume(worker_id, lease_id)
        finally:
            self._check_finished()

    async def heartbeat(self, worker_id: str, lease_id: str, steps_done: int) -> LeaseGrant:
        """Progress report; progress extends the lease."""
        self._check_running()
        self.metrics.heartbeats += 1
        try:
            return self._ledger.heartbeat(worker_id, lease_id, steps_done)
        finally:
            self._check_finished()

    async def release(self, worker_id: str, lease_id: str, reason: str = "") -> None:
        """Give a lease up (its unit goes back to the queue)."""
        self._check_running()
        try:
            self._ledger.release(worker_id, lease_id, reason)
        finally:
            self._check_finished()

    # -- results ----------------------------------------------------------------------------------
    async def submit(self, worker_id: str, lease_id: str, body: AsyncIterable[bytes]) -> Receipt:
        """Decode, validate, merge and acknowledge one result (see the module docstring).

        The same lease again gets the first receipt back (status ``duplicate`` when it was accepted);
        the body is not read then. Malformed or invalid results raise and change nothing.
        """
        self._check_running()
        while True:
            try:
                check = self._ledger.check_result(worker_id, lease_id)
            except LedgerError as exc:
                self.metrics.reject(_reason(exc))
                raise
            if check.receipt is not None:
                return self._duplicate(check.receipt)
            pending = self._inflight.get(lease_id)
            if pending is None:
                break
            await asyncio.shield(pending)      # the same lease is being uploaded: wait for it
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[lease_id] = gate
        try:
            return await self._submit(worker_id, lease_id, check.unit, body)
        finally:
            del self._inflight[lease_id]
            gate.set_result(None)

    def _duplicate(self, receipt: Receipt) -> Receipt:
        self.metrics.results["duplicate"] += 1
        if receipt.status == "accepted":
            return Receipt(receipt.lease_id, receipt.unit_id, "duplicate", receipt.version,
                           receipt.reason)
        return receipt

    async def _count(self, body: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
        async for chunk in body:
            self.metrics.bytes_in += len(chunk)
            yield chunk

    async def _submit(self, worker_id: str, lease_id: str, unit: WorkUnit,
                      body: AsyncIterable[bytes]) -> Receipt:
        cfg = self.config
        try:
            async with self._decode_slots:
                payload = await decode_payload(self._count(body), limits=cfg.limits,
                                               spec=self._spec, expected_kind="result")
            meta = parse_result_meta(payload.meta, lease_id=lease_id, unit=unit,
                                     current_version=self.version)
            ref = None
            if cfg.max_update_norm is not None and meta.kind == "weights":
                ref = self._versions.acquire(meta.base_version) or \
                    self._versions.acquire(self.version)
            try:
                await asyncio.to_thread(check_tensors, payload.tensors, self._spec,
                                        require_finite=cfg.require_finite,
                                        max_norm=cfg.max_update_norm,
                                        reference=None if ref is None else ref.model.tensors)
            finally:
                if ref is not None:
                    self._versions.release(ref)
        except (WireError, ValidationError) as exc:
            self.metrics.reject(_reason(exc))
            raise
        self._check_running()
        future: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        self._jobs.put_nowait(_Job(worker_id, lease_id, unit, meta, payload.tensors, future))
        return await asyncio.shield(future)

    async def _merge_loop(self) -> None:
        """The one writer of the model, the policy state and unit completion."""
        while True:
            job = await self._jobs.get()
            if job is _Control.STOP:
                return
            if job is _Control.CAPTURE:
                self._capture_queued = False
                if self._since_snapshot:
                    await self._capture()
                continue
            assert isinstance(job, _Job)
            self._busy = True
            try:
                job.future.set_result(await self._process(job))
            except LedgerError as exc:
                self.metrics.reject(_reason(exc))
                job.future.set_exception(exc)
            except VCAsyncError as exc:
                job.future.set_exception(exc)
            finally:
                self._busy = False
            self._retain()
            self._check_finished()
            if self._since_snapshot >= self.config.snapshot_every and \
                    self.config.durability != "none":
                await self._capture()

    async def _process(self, job: _Job) -> Receipt:
        check = self._ledger.check_result(job.worker_id, job.lease_id)   # it may have closed since
        if check.receipt is not None:
            return self._duplicate(check.receipt)
        meta, current = job.meta, self.version
        if current - meta.base_version > self.config.max_staleness:
            return await self._reject(job, "too_stale", f"based on version {meta.base_version}, "
                                      f"{current - meta.base_version} behind the model (max "
                                      f"{self.config.max_staleness})")
        held: Version | None = None
        if self._needs_base and meta.kind == "delta":
            held = self._versions.acquire(meta.base_version)
            if held is None:
                return await self._reject(job, "base_unavailable",
                                          f"base version {meta.base_version} is no longer held")
        try:
            if self._journal.journaling:
                if held is not None:
                    await self._journal.ensure_base(held.model)
                await self._journal.append(
                    {"type": "result", "worker_id": job.worker_id, "unit_id": job.unit.unit_id,
                     **meta.to_dict()}, job.tensors)
                self.metrics.journal_writes += 1
            return await self._apply(job.worker_id, job.unit.unit_id, meta, job.tensors,
                                     None if held is None else held.model)
        finally:
            if held is not None:
                self._versions.release(held)

    async def _reject(self, job: _Job, reason: str, message: str) -> Receipt:
        if self._journal.journaling:
            await self._journal.append({"type": "reject", "lease_id": job.lease_id,
                                        "worker_id": job.worker_id, "unit_id": job.unit.unit_id,
                                        "reason": reason}, {})
            self.metrics.journal_writes += 1
        log.info("result of lease %s rejected: %s", job.lease_id, message)
        return self._record_reject(job.lease_id, job.worker_id, job.unit.unit_id, reason)

    def _record_reject(self, lease_id: str, worker_id: str, unit_id: str, reason: str) -> Receipt:
        self._since_snapshot += 1
        self._journal.note_applied()
        self.metrics.reject(reason)
        self.metrics.results["rejected"] += 1
        return self._ledger.record(lease_id, unit_id=unit_id, worker_id=worker_id,
                                   status="rejected", version=self.version, reason=reason)

    async def _apply(self, worker_id: str, unit_id: str, meta: ResultMeta,
                     tensors: dict[str, torch.Tensor], base: ModelState | None) -> Receipt:
        """Merge one result that passed every check (live, or replayed from the journal)."""
        current = self.version
        update = Update(tensors=tensors, kind=meta.kind, base_version=meta.base_version,
                        staleness=current - meta.base_version, samples=meta.samples,
                        steps=meta.steps, worker_id=worker_id, unit_id=unit_id,
                        metrics=dict(meta.metrics), base=base)
        await self._journal.raise_version_floor(current + 1)   # before anyone can see it
        started = time.perf_counter()
        buffer = self._versions.take_buffer()
        try:
            published = await asyncio.to_thread(self._merge_sync, update, buffer, current)
        except (UpdateRejectedError, ValidationError, PolicyError) as exc:
            return self._record_reject(meta.lease_id, worker_id, unit_id, _reason(exc))
        if published is not None:
            self._versions.publish(published)
        elif buffer is not None:
            self._versions.give_back(buffer)
        self.metrics.merge_seconds.observe(time.perf_counter() - started)
        self.metrics.staleness.observe(update.staleness)
        self.metrics.merges += 1
        self.metrics.results["accepted"] += 1
        self._since_snapshot += 1
        self._journal.note_applied()
        return self._ledger.record(meta.lease_id, unit_id=unit_id, worker_id=worker_id,
                                   status="accepted", version=self.version,
                                   steps_done=meta.steps, partial=meta.partial,
                                   base_version=meta.base_version)

    def _merge_sync(self, update: Update, buffer: dict[str, torch.Tensor] | None,
                    current: int) -> ModelState | None:
        """In a worker thread: the policy merges into the working model; publish a copy if changed."""
        working = self._working
        try:
            out = self._policy.merge(working, update, self._policy_state)
            if out is not None and out is not working:
                self._spec.check(out.tensors)
                copy_tensors(out.tensors, working.tensors)
        except Exception as exc:
            # Whatever the policy did to the working copy is undone from the published version.
            copy_tensors(self._versions.current.model.tensors, working.tensors)
            if isinstance(exc, UpdateRejectedError | ValidationError):
                raise
            log.exception("merge policy %s failed on unit %s", self._policy.name, update.unit_id)
            raise PolicyError(f"merge policy {self._policy.name!r} failed: {exc!r}"[:300]) from exc
        if out is None:
            return None
        working.version = current + 1
        return ModelState(copy_tensors(working.tensors, buffer), current + 1)

    # -- versions and background loops -------------------------------------------------------------
    def _retain(self) -> None:
        floor = self.version - self.config.max_staleness
        if self._needs_base:
            self._versions.retain(lambda n: n >= floor)
        else:
            bases = self._ledger.active_base_versions()
            self._versions.retain(lambda n: n >= floor and n in bases)

    def _check_finished(self) -> None:
        if self._ledger.finished and self._jobs.empty() and not self._busy:
            self._finished.set()

    async def _expiry_loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.expiry_interval_s):
                    await self._stop.wait()
            if self._ledger.expire():
                self._retain()
                self._check_finished()

    async def _snapshot_loop(self) -> None:
        """Writes what the merge loop captured; asks for a capture when the interval passes."""
        while not self._stop.is_set():
            try:
                async with asyncio.timeout(self.config.snapshot_interval_s):
                    await self._captured_ready.wait()
            except TimeoutError:
                if self._since_snapshot and not self._capture_queued:
                    self._capture_queued = True
                    self._jobs.put_nowait(_Control.CAPTURE)
                continue
            try:
                await self._write_captured()
            except (VCAsyncError, OSError) as exc:
                self.metrics.snapshot_failures += 1
                log.warning("snapshot failed (the next one retries): %s", exc)

    async def _capture(self) -> None:
        """Between two merges: hold the current version, pack the policy state, copy the ledger."""
        version = self._versions.acquire(self.version)
        assert version is not None
        try:
            state = await self._journal.pack_state(self._policy_state)
        except BaseException:
            self._versions.release(version)
            raise
        self._drop_captured()      # an older capture the writer has not taken yet
        self._captured = (self._journal.capture(version.model, state, self._ledger.snapshot()),
                          version)
        self._since_snapshot = 0
        self._captured_ready.set()

    def _drop_captured(self) -> None:
        if self._captured is not None:
            self._versions.release(self._captured[1])
        self._captured = None
        self._captured_ready.clear()

    async def _write_captured(self) -> None:
        """Write the pending capture; it keeps its version held until written or replaced."""
        taken, self._captured = self._captured, None
        self._captured_ready.clear()
        if taken is None:
            return
        try:
            await self._journal.write_snapshot(taken[0])
            self.metrics.snapshots += 1
        except BaseException:
            self._requeue_capture(taken)
            raise
        self._versions.release(taken[1])

    def _requeue_capture(self, taken: tuple[Captured, Version]) -> None:
        """A write failed: retry it next time unless the merge loop captured something newer."""
        if self._captured is None:
            self._captured = taken
        else:
            self._versions.release(taken[1])

    # -- views ------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._versions.current.number

    @property
    def spec(self) -> Any:
        return self._spec

    def model_etag(self, version: int) -> str:
        """An opaque, strong ETag for a held version (quote it in the header yourself)."""
        if self._versions.get(version) is None:
            raise VersionNotFoundError(f"model version {version} is not held (current: "
                                       f"{self.version})", version=version)
        return f"{self._journal.run_id}-{version}"

    def model_payload(self, version: int | None = None,
                      codec: str | None = None) -> AsyncIterator[bytes]:
        """The wire payload (kind ``model``, meta ``{version, digest}``) of a held version."""
        self._check_running()
        number = self.version if version is None else version
        if self._versions.get(number) is None:
            raise VersionNotFoundError(f"model version {number} is not held (current: "
                                       f"{self.version}); fetch the latest", version=number)
        resolve_codec(codec or self.config.model_codec)
        return self._stream_model(number, codec or self.config.model_codec)

    async def _stream_model(self, number: int, codec: str) -> AsyncIterator[bytes]:
        v = self._versions.acquire(number)
        if v is None:
            raise VersionNotFoundError(f"model version {number} was dropped", version=number)
        try:
            meta = {"version": number, "digest": await v.digest()}
            async for chunk in aencode_payload("model", meta, v.model.tensors, codec=codec):
                self.metrics.bytes_out += len(chunk)
                yield chunk
        finally:
            self._versions.release(v)

    def model(self, version: int | None = None) -> ModelState:
        """A private copy of a held version (for the embedding program, tests and evaluation)."""
        number = self.version if version is None else version
        v = self._versions.get(number)
        if v is None:
            raise VersionNotFoundError(f"model version {number} is not held", version=number)
        return v.model.clone()

    async def wait_finished(self) -> None:
        """Return when every unit is done or parked and every accepted result merged."""
        finished = asyncio.ensure_future(self._finished.wait())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({finished, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            finished.cancel()
            closed.cancel()
        if not self._finished.is_set():
            raise ClosedError("the coordinator closed before the run finished")

    def _gauges(self) -> dict[str, float]:
        if self._phase in ("new", "starting"):
            return {}
        stats = self._ledger.stats
        counts = self._ledger.counts()
        return {"version": self.version, "workers_alive": self._ledger.workers_alive(),
                "workers_known": self._ledger.num_workers,
                "leases_issued_total": stats["issued"], "leases_expired_total": stats["expired"],
                "leases_reissued_total": stats["reissued"],
                "leases_released_total": stats["released"],
                **{f"units_{k}": v for k, v in counts.items()},
                "merge_queue": self._jobs.qsize(),
                "retained_versions": len(self._versions.numbers())}

    def status(self) -> dict[str, Any]:
        """A JSON-able summary for ``GET /v1/status``."""
        out: dict[str, Any] = {"phase": self._phase, "durability": self.config.durability,
                               "policy": self._policy.name}
        if self._phase in ("new", "starting"):
            return out
        parked = self._ledger.parked()
        out.update({
            "run_id": self._journal.run_id, "version": self.version,
            "finished": self._finished.is_set(), "units": self._ledger.counts(),
            "parked": dict(list(parked.items())[:100]),
            "workers": {"known": self._ledger.num_workers, "alive": self._ledger.workers_alive()},
            "leases": dict(self._ledger.stats), "retained_versions": self._versions.numbers(),
            "journal": self._journal.status(), "metrics": self.metrics.as_dict(),
        })
        return out
