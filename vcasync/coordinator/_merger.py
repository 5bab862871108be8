"""The merge loop: the one writer of the model, the policy state and unit completion.

Jobs (validated results) arrive on a queue. For each, in order: the ledger is checked again (the
unit may have closed meanwhile), staleness and the delta's base are checked, the policy merges the
result into the private working model in a worker thread, and (durability "journal") the result is
made durable meanwhile (its bytes as received finish their write, then the record that names them
is appended); only then is the new version published and the result recorded in the ledger (a
failed write undoes the merge); its receipt resolves the submitter's future. Replay after a restart runs
the same :meth:`Merger.apply`. Snapshots are captured here, between two jobs, and so is the
end-of-run flush (:meth:`Merger.flush`: a buffering policy applies what it still holds, journaled
as a step of its own).

The coordinator drives the loop through a small interface and never touches its state: it submits
jobs (:meth:`~Merger.submit`), asks for a snapshot (:meth:`~Merger.request_capture`), reads
:attr:`~Merger.idle` and stops it (:meth:`~Merger.stop`). The merger owns the :class:`SnapshotSlot` (it
is the only one that captures); the coordinator's snapshot writer takes what it leaves there through
:attr:`~Merger.snapshots`.

A storage write a result needs (journal entry, base, version floor) that fails marks the storage
unavailable (:mod:`vcasync.coordinator._storage_health`): the sender gets :class:`StorageUnavailableError`
(nothing was merged, the unit stays leased to it) and keeps its result for later, and so does every
sender after it until a probe write finds the storage back.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..errors import (
    ClosedError,
    CorruptObjectError,
    FrameError,
    LedgerError,
    PolicyError,
    PolicyFailedError,
    PreconditionFailedError,
    PrefixTakenError,
    StorageError,
    StorageUnavailableError,
    UpdateRejectedError,
    ValidationError,
    VCAsyncError,
)
from ..ledger import CAPTURED_WALL, Ledger
from ..ledger._units import Receipt, WorkUnit
from ..metrics import Metrics
from ..protocol._bodies import JournalFlush, JournalReject, JournalResult, journal_record, to_body
from ..tensors import ModelState, Update
from ._config import POLICY_REFUSAL_LIMIT
from ._journal import Journal
from ._model_owner import ModelOwner
from ._result_checks import ResultMeta, reject_reason
from ._snapshots import SnapshotSlot
from ._statistics import LEFT_OUT, STATISTICS_KEY, VALUES
from ._storage_health import StorageHealth
from ._versions import Version

__all__ = ["INCREMENTS", "METRICS_KEY", "Control", "Job", "Merger"]

#: Key of a snapshot's ledger map holding the merge histograms (:meth:`Metrics.histograms`) as of
#: the capture: a restart continues them instead of counting the replayed merges again.
METRICS_KEY = "metrics"

#: Marks a journaled result whose integer tensors are increments (every entry written since the
#: counter rule; older full-weights entries carry values, replayed by the old maximum rule).
INCREMENTS = "increment"

log = logging.getLogger("vcasync.coordinator")


class Control(enum.Enum):
    STOP = "stop"
    CAPTURE = "capture"
    FLUSH = "flush"


@dataclass(slots=True)
class Job:
    worker_id: str
    lease_id: str
    unit: WorkUnit
    meta: ResultMeta
    tensors: dict[str, torch.Tensor]
    future: asyncio.Future[Receipt]
    #: Journal mode: the key of the result's bytes as received; kept when a record names them.
    blob: str | None = None
    blob_named: bool = False
    #: Journal mode: the write of those bytes, which may still be finishing (see ``_ingest``)
    written: asyncio.Future[None] | None = None
    #: Its running statistics were made values (``Statistics.to_values``), else they are left out
    statistics: bool = False


def retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()    # mark it retrieved: the submitter may have gone away


#: After this many results in a row that the merge policy failed on (it raised, broke the model's
#: spec or made it non-finite), the merge loop stops the coordinator with PolicyFailedError: a
#: broken policy would otherwise have the fleet retrain the same units forever.
POLICY_FAILURE_LIMIT = 3


#: Distinct workers whose results the refusals in a row must come from: one worker alone (an
#: attacker the policy rightly refuses) never stops a run.
POLICY_REFUSAL_WORKERS = 2

#: Up to this many leases, the merge loop scans them for bases after every merge (see retain).
SCAN_PER_MERGE = 1000

#: A flush whose journal entry could not be written is tried again after this many seconds.
FLUSH_RETRY_S = 1.0


class Merger:
    """Runs the merge loop (:meth:`run`) for a coordinator; see the module docstring."""

    def __init__(self, *, owner: ModelOwner, ledger: Ledger, journal: Journal, metrics: Metrics,
                 snapshot_every: int, max_staleness: int, settled: Callable[[], None],
                 health: StorageHealth, refusal_limit: int | None = POLICY_REFUSAL_LIMIT,
                 recycle: Callable[[dict[str, torch.Tensor]], object] | None = None,
                 guard: Callable[[], Awaitable[None]] | None = None) -> None:
        self._owner = owner
        #: Called before a result is journaled or acknowledged: raises PrefixTakenError once another
        #: coordinator took the run over (the coordinator's owner lease), which stops the loop.
        self._guard = guard
        self._health = health
        self._ledger = ledger
        self._journal = journal
        self._slot = SnapshotSlot(journal, owner)
        self._metrics = metrics
        self._snapshot_every = snapshot_every
        self._max_staleness = max_staleness
        self._settled = settled       # called after anything that may have finished the run
        self._recycle = recycle       # takes a handled result's tensors back for reuse
        self._jobs: asyncio.Queue[Job | Control] = asyncio.Queue()
        self._busy = False
        self._since_snapshot = 0      # results applied since the last capture
        #: the ledger's counts at the last capture: a change without a result (a release, an
        #: expiry, a quarantine, a parked or requeued unit, a join) is worth a snapshot too
        self._ledger_seen: tuple[int, ...] | None = None
        self._capture_queued = False
        self._flush_queued = False
        self._bases_scan: tuple[int, set[int]] | None = None   # (version, bases) of the last scan
        #: after a takeover from a crash: every version from this one on is kept (within the
        #: staleness window), since leases no snapshot knew may be based on them; None: no such
        self.keep_from: int | None = None
        self._policy_failures: list[PolicyFailedError] = []     # live merges it broke, in a row
        self._refusal_limit = refusal_limit
        #: live results the policy refused since the last accepted one: the last refusal, their
        #: count and their workers
        self._refusals: tuple[UpdateRejectedError, int, set[str]] | None = None

    # -- the merge-loop interface ----------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue a validated result; its receipt (or error) resolves ``job.future``."""
        self._jobs.put_nowait(job)

    def request_capture(self) -> None:
        """Ask for a snapshot capture between two jobs, if anything was applied since the last one
        (at most one request is queued at a time)."""
        if self._changed() and not self._capture_queued:
            self._capture_queued = True
            self._jobs.put_nowait(Control.CAPTURE)

    def _ledger_counts(self) -> tuple[int, ...]:
        return (*self._ledger.stats.values(), self._ledger.num_workers)

    def _changed(self) -> bool:
        """Anything applied since the last capture: a result, or a change the ledger counts (a
        lease released, expired or refused, a worker backed off or quarantined, a unit parked or
        requeued, a worker joined): until 2026-12-07 only a result was, and a crash lost the
        others however long ago they happened."""
        return bool(self._since_snapshot) or self._ledger_counts() != self._ledger_seen

    def request_flush(self) -> None:
        """Ask for the end-of-run flush (see :meth:`flush`) between two jobs (at most one request
        is queued at a time)."""
        if not self._flush_queued:
            self._flush_queued = True
            self._jobs.put_nowait(Control.FLUSH)

    def stop(self) -> None:
        """End :meth:`run` once what is queued before this call is handled."""
        self._jobs.put_nowait(Control.STOP)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing being merged."""
        return self._jobs.empty() and not self._busy

    @property
    def queued(self) -> int:
        """Jobs (and requests) waiting in the queue."""
        return self._jobs.qsize()

    @property
    def snapshots(self) -> SnapshotSlot:
        """Where captures wait for the snapshot writer (which takes them; only the merger captures)."""
        return self._slot

    def fail_queued(self, exc: Exception) -> None:
        while not self._jobs.empty():
            job = self._jobs.get_nowait()
            if isinstance(job, Job):
                if not job.future.done():
                    job.future.set_exception(exc)
                self._done_with(job)

    async def run(self) -> None:
        """The one writer of the model, the policy state and unit completion."""
        while True:
            job = await self._jobs.get()
            if job is Control.STOP:
                return
            if job is Control.CAPTURE:
                self._capture_queued = False
                if self._changed():
                    await self.capture()
                continue
            if job is Control.FLUSH:
                self._flush_queued = False
                self._busy = True
                try:
                    deferred = not await self.flush()
                finally:
                    self._busy = False
                if not deferred:       # else it is asked again later: settling would ask at once
                    self._settled()
                continue
            assert isinstance(job, Job)
            self._busy = True
            try:
                job.future.set_result(await self._process(job))
            except LedgerError as exc:
                self._metrics.reject(reject_reason(exc))
                job.future.set_exception(exc)
            except PrefixTakenError:
                # two coordinators on one run: acknowledging more would lose results; the sender
                # keeps its result for whichever coordinator serves the run
                job.future.set_exception(ClosedError("the coordinator stopped: another one writes "
                                                     "this run; send the result again"))
                raise
            except StorageError as exc:
                job.future.set_exception(self.storage_failed(exc))
            except VCAsyncError as exc:
                job.future.set_exception(exc)
            except BaseException:
                if not job.future.done():     # cancelled or broken: its sender must not hang
                    job.future.set_exception(ClosedError("the coordinator stopped during the "
                                                         "merge; send the result again"))
                raise
            finally:
                self._busy = False
                self._done_with(job)
            self.retain()
            if len(self._policy_failures) >= POLICY_FAILURE_LIMIT:
                raise self._policy_stop()
            if self._refused_too_often():
                raise self._refusal_stop()
            self._settled()
            if self._since_snapshot >= self._snapshot_every and self._journal.durable:
                await self.capture()

    def _policy_stop(self) -> PolicyFailedError:
        """What stops the coordinator after POLICY_FAILURE_LIMIT policy failures in a row."""
        last = self._policy_failures[-1]
        stop = PolicyFailedError(
            f"merge policy {last.policy!r} failed on {len(self._policy_failures)} results in a row; "
            f"the last: {last}. The coordinator stopped: fix or replace the policy and start it "
            f"again (the model, v{self._owner.version}, and every merged result are kept; the "
            "refused units are trained again)", policy=last.policy)
        stop.__cause__ = last
        return stop

    def _refused_too_often(self) -> bool:
        if self._refusal_limit is None or self._refusals is None:
            return False
        _, count, workers = self._refusals
        return count >= self._refusal_limit and len(workers) >= POLICY_REFUSAL_WORKERS

    def _refusal_stop(self) -> PolicyFailedError:
        """What stops the coordinator once the policy refused ``refusal_limit`` results in a row
        (from at least two workers): the fleet is locked out, the model no longer changes."""
        assert self._refusals is not None
        last, count, workers = self._refusals
        policy = self._owner.policy.name
        stop = PolicyFailedError(
            f"merge policy {policy!r} refused {count} results in a row from {len(workers)} "
            f"workers and accepted none (the last: {last.reason}: {last}); the model, "
            f"v{self._owner.version}, no longer changes, so the same results would be refused for "
            "ever. The coordinator stopped: loosen the policy (gate: a larger z or warmup, or "
            "max_norm/min_cosine alone), start again with --reset-policy to relearn its "
            "statistics, or use another policy; raise policy_refusal_limit ([coordinator] in "
            "run.toml) if such a streak is expected. The model and every merged result are kept; "
            "the refused units are trained again", policy=policy)
        stop.__cause__ = last
        return stop

    def storage_failed(self, exc: StorageError) -> StorageError:
        """What the sender of a result whose write failed is told."""
        if isinstance(exc, StorageUnavailableError | PreconditionFailedError):
            return exc     # refused before any write / another coordinator: not a new outage
        self._health.write_failed(exc, needed=True)
        refusal = self._health.refusal()
        refusal.__cause__ = exc
        return refusal

    def _done_with(self, job: Job) -> None:
        """The job's tensors are merged (or refused) and journaled: offer them for reuse."""
        if job.blob is not None and not job.blob_named:
            self._journal.discard_later(job.blob, after=job.written)
        self._give_back(job)

    def _give_back(self, job: Job) -> None:
        """Offer the job's tensors for reuse (once: the job holds none afterwards)."""
        tensors, job.tensors = job.tensors, {}
        if self._recycle is not None and tensors:
            self._recycle(tensors)

    async def capture(self) -> None:
        """Capture a consistent state now: from the loop between two jobs, or while it is not
        running (start-up, close)."""
        self._since_snapshot = 0
        self._ledger_seen = self._ledger_counts()
        # with this machine's wall clock: a restore counts the time the run was down since (the
        # ledger's times are relative to the capture, on a clock only this process reads)
        ledger = {**self._ledger.snapshot(), CAPTURED_WALL: time.time(),
                  METRICS_KEY: self._metrics.histograms()}
        if self._owner.statistics.pending:    # values of results the policy holds unapplied
            ledger[STATISTICS_KEY] = self._owner.statistics.pack()
        await self._slot.capture(ledger, self.keep_from)

    async def flush(self) -> bool:
        """The end of the run, live: every unit is settled and the policy still holds accepted
        results it has not applied (a buffer not full). It is journaled as a step of its own before
        the policy's ``flush`` applies them, so replay applies it once, at the same point; in
        snapshot mode the run is finished only once a snapshot holds it (the coordinator's
        finish loop). A journal write that fails is tried again (the storage is unavailable
        meanwhile); results that reopen the run (a requeue) make it wait for the next end.
        False when it was put off (to be asked again in ``FLUSH_RETRY_S``)."""
        if not (self._ledger.finished and self._owner.flush_due):
            return True
        if self._journal.journaling:
            if self._health.refusing:
                return self._flush_later()
            if self._guard is not None:
                await self._guard()        # another coordinator took the run over: write nothing
            try:
                await self._journal.append(to_body(JournalFlush("flush", self._owner.held)), {})
            except PreconditionFailedError:
                raise                      # another coordinator writes this run: stop
            except StorageError as exc:
                self.storage_failed(exc)
                log.warning("the end-of-run flush could not be journaled (%s); it is tried again "
                            "once the storage takes writes", exc)
                return self._flush_later()
            self._metrics.journal_writes += 1
        await self.apply_flush()
        return True

    def _flush_later(self) -> bool:
        asyncio.get_running_loop().call_later(FLUSH_RETRY_S, self.request_flush)
        return False

    async def apply_flush(self) -> None:
        """Apply the end-of-run flush (live, or replayed from its journal entry): the policy's
        ``flush`` on the model and its state, one more version when it applies anything."""
        held = self._owner.held
        await self._journal.raise_version_floor(self._owner.version + 1)  # before anyone sees it
        try:
            changed = await self._owner.flush()
        except (UpdateRejectedError, ValidationError, PolicyError) as exc:
            # a broken flush was logged by the owner (a refusal is not): the model is as it was
            if not isinstance(exc, PolicyFailedError):
                log.error("merge policy %r refused its end-of-run flush (%s): the %d result(s) it "
                          "holds are not applied", self._owner.policy.name, exc, held)
            changed = False
        if changed:
            log.info("merge policy %r applied the %d result(s) it held at the end of the run: v%d",
                     self._owner.policy.name, held, self._owner.version)
        self._since_snapshot += 1
        self._journal.note_applied()

    async def _process(self, job: Job) -> Receipt:
        check = self._ledger.check_result(job.worker_id, job.lease_id)   # it may have closed since
        if check.receipt is not None:
            return self.duplicate(check.receipt)
        self._health.check()       # queued before the outage began: do not try every write again
        if self._guard is not None:
            await self._guard()    # another coordinator took the run over: acknowledge nothing
        # a result on the version a snapshot-mode restart recovered is on the same weights under
        # their new number: its staleness, base and lag are those of the new number
        renumbered = self._owner.renumbered(job.meta.base_version)
        if renumbered != job.meta.base_version:
            job.meta = replace(job.meta, base_version=renumbered)
        meta, current = job.meta, self._owner.version
        if current - meta.base_version > self._max_staleness:
            return await self._reject(job, "too_stale", f"based on version {meta.base_version}, "
                                      f"{current - meta.base_version} behind the model (max "
                                      f"{self._max_staleness})")
        # Counters travel as increments (the policy contract): full weights carry values, so
        # subtract the base version's before the result is journaled, and replay needs no base.
        if meta.kind == "weights" and not self._owner.counters.to_increments(job.tensors,
                                                                            meta.base_version):
            return await self._reject(job, "base_unavailable",
                                      f"the integer tensors of base version {meta.base_version} "
                                      f"are no longer held; lease again")
        negative = self._owner.counters.first_negative(job.tensors)
        if negative is not None:
            return await self._reject(job, "negative_increment",
                                      f"integer tensor {negative!r} would go down: counters only "
                                      "count up (an increment below zero)")
        overflow = self._owner.counters.first_overflow(job.tensors)
        if overflow is not None:
            name, value, inc = overflow
            dtype = str(job.tensors[name].dtype).removeprefix("torch.")
            return await self._reject(job, "counter_overflow",
                                      f"integer tensor {name!r} would overflow: {value} plus the "
                                      f"increment {inc} is past the largest {dtype} "
                                      f"({torch.iinfo(job.tensors[name].dtype).max}); integer "
                                      "addition would wrap")
        # Running statistics become values (a delta's plus its base's): they merge by a rule of
        # their own (see _statistics), and the journal keeps the values, so replay needs no base.
        job.statistics = self._owner.statistics.to_values(job.tensors, meta.kind, meta.base_version)
        held: Version | None = None
        if self._owner.needs_base and meta.kind == "delta":
            held = self._owner.hold(meta.base_version)
            if held is None:
                return await self._reject(job, "base_unavailable",
                                          f"base version {meta.base_version} is no longer held")
        try:
            return await self.apply(job.worker_id, job.unit.unit_id, meta, job.tensors,
                                     None if held is None else held.model, live=True,
                                     statistics=job.statistics,
                                     release=functools.partial(self._give_back, job),
                                     alongside=(functools.partial(self._journaled, job, held)
                                                if self._journal.journaling else None))
        finally:
            if held is not None:
                self._owner.release(held)

    async def _journaled(self, job: Job, held: Version | None) -> None:
        """Journal mode: make the result durable (its delta's base, its bytes as received, the
        record that names them). Runs while the policy merges it into the working model, which is
        published only once this is done."""
        if held is not None:
            await self._journal.ensure_base(held.model)
        meta = job.meta
        # The bytes as received stand for the result unless its counters were changed into
        # increments (full weights) or its statistics into values (a delta) above: then the
        # tensors go inline, as format 1 wrote them.
        changed = (not self._owner.counters.empty if meta.kind == "weights" else job.statistics)
        by_ref = job.blob is not None and not changed
        if by_ref and job.written is not None:
            await job.written         # the last of them, and the storage's fsync
        stats = VALUES if job.statistics else None if self._owner.statistics.empty else LEFT_OUT
        record = JournalResult.of(meta, worker_id=job.worker_id, unit_id=job.unit.unit_id,
                                  ints=INCREMENTS, stats=stats)
        await self._journal.append(to_body(record), {} if by_ref else job.tensors,
                                   blob=job.blob if by_ref else None)
        job.blob_named = by_ref
        self._metrics.journal_writes += 1
        self._health.durable_write_ok()

    async def _reject(self, job: Job, reason: str, message: str) -> Receipt:
        if self._journal.journaling:
            await self._journal.append(to_body(JournalReject("reject", job.lease_id, job.worker_id,
                                                             job.unit.unit_id, reason)), {})
            self._metrics.journal_writes += 1
        log.info("result of lease %s rejected: %s", job.lease_id, message)
        return self.record_reject(job.lease_id, job.worker_id, job.unit.unit_id, reason)

    def record_reject(self, lease_id: str, worker_id: str, unit_id: str, reason: str) -> Receipt:
        self._since_snapshot += 1
        self._journal.note_applied()
        self._metrics.reject(reason, worker_id)
        self._metrics.results["rejected"] += 1
        return self._ledger.record(lease_id, unit_id=unit_id, worker_id=worker_id,
                                   status="rejected", version=self._owner.version, reason=reason)

    async def apply(self, worker_id: str, unit_id: str, meta: ResultMeta,
                     tensors: dict[str, torch.Tensor], base: ModelState | None, *,
                     live: bool = False, release: Callable[[], None] | None = None,
                     alongside: Callable[[], Awaitable[None]] | None = None,
                     statistics: bool = False, own_rule: bool = True) -> Receipt:
        """Merge one result that passed every check (live, or replayed from the journal). A merge
        the policy broke is refused (reason ``policy``) as it was live; live ones are counted.
        ``release``: gives ``tensors`` back to the buffer pool once the policy is done with them
        (see :meth:`ModelOwner.merge`); ``tensors`` must not be used after the merge then.
        ``alongside``: what must be done before the merge is published (see there).
        ``statistics``: the running statistics in ``tensors`` are values (else left out); the
        policy sees what the result changes of them, and the version takes the coordinator's rule
        (see :mod:`._statistics`), unless ``own_rule`` is False (a journal entry from before the
        rule: the policy merges them as it did then)."""
        current = self._owner.version
        staleness = current - meta.base_version
        await self._journal.raise_version_floor(current + 1)   # before anyone can see it
        if not own_rule:
            self._owner.statistics.note_legacy()
        values: dict[str, torch.Tensor] = {}
        try:
            # The policy sees its own mapping: one it kept (against the contract) holds the
            # tensors, so they are never recycled under it. No reference to the Update or its
            # mapping stays here, so once the policy is done with it the new version can go into
            # its tensors.
            await self._owner.merge(Update(tensors=self._policy_view(tensors, meta.kind, base, values,
                                                                     statistics and own_rule),
                                           kind=meta.kind,
                                           base_version=meta.base_version, staleness=staleness,
                                           samples=meta.samples, steps=meta.steps,
                                           worker_id=worker_id, unit_id=unit_id,
                                           metrics=dict(meta.metrics), base=base), release,
                                    alongside=alongside, statistics=values if statistics else None)
        except (UpdateRejectedError, ValidationError, PolicyError) as exc:
            if live and isinstance(exc, PolicyFailedError):
                self._policy_failures.append(exc)
            if live and isinstance(exc, UpdateRejectedError):
                _, count, workers = self._refusals or (exc, 0, set())
                workers.add(worker_id)
                self._refusals = (exc, count + 1, workers)
            return self.record_reject(meta.lease_id, worker_id, unit_id, reject_reason(exc))
        self._policy_failures.clear()
        self._refusals = None
        self._metrics.merge_seconds.observe(self._owner.last_merge_s)
        self._metrics.staleness.observe(staleness)
        self._metrics.merges += 1
        self._metrics.results["accepted"] += 1
        self._since_snapshot += 1
        self._journal.note_applied()
        return self._ledger.record(meta.lease_id, unit_id=unit_id, worker_id=worker_id,
                                   status="accepted", version=self._owner.version,
                                   steps_done=meta.steps, partial=meta.partial,
                                   base_version=meta.base_version)

    def _policy_view(self, tensors: dict[str, torch.Tensor], kind: str, base: ModelState | None,
                     values: dict[str, torch.Tensor], rule: bool) -> dict[str, torch.Tensor]:
        """The policy's own mapping of a result's tensors. With ``rule`` (its running statistics
        are values), they are given as what the result changes of them (``Statistics.for_policy``)
        and their values (copies) go into ``values``."""
        view = dict(tensors)
        if rule and not self._owner.statistics.empty:
            values.update(self._owner.statistics.for_policy(view, kind,
                                                            self._owner.versions.current.model, base))
        return view

    def retain(self, *, rescan: bool = False) -> None:
        """Drop the versions nothing can be based on any more: a policy that applies a delta to
        its base keeps the bases of results that may still come, any other what open leases may
        still download. The current version always stays; one outside the staleness window goes.

        Finding those bases scans every open lease (active, expired, released: about one a
        worker, whatever the length of the run), ~1 us each (10 ms at 10,000 workers, against
        ~1 ms to merge a 1M-parameter result). Below ``SCAN_PER_MERGE`` open leases the scan runs
        at every call; above, only when ``rescan`` asks (the coordinator's expiry loop, once a second), and
        meanwhile every version since the last scan is kept too: a lease granted after it is based
        on one of them. While only the current version is held there is nothing to scan for.
        """
        version = self._owner.version
        if self._owner.versions.numbers() == [version]:
            self._owner.retain(self._max_staleness, ())   # nothing to drop: no scan
            return
        if rescan or self._bases_scan is None or self._ledger.num_open_leases < SCAN_PER_MERGE:
            bases = (self._ledger.open_base_versions() if self._owner.needs_base
                     else self._ledger.active_base_versions())
            # a lease on the version a snapshot-mode restart recovered needs it under its new number
            self._bases_scan = (version, {self._owner.renumbered(n) for n in bases})
        at, scanned = self._bases_scan
        if self.keep_from is not None:
            at = min(at, self.keep_from)
        self._owner.retain(self._max_staleness, scanned | set(range(at, version + 1)))

    async def replay(self, meta: Mapping[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        """Apply one journal entry again, exactly as it was applied live."""
        try:
            record = journal_record(meta)
        except FrameError as exc:
            raise CorruptObjectError(f"journal entry {meta.get('seq')} is malformed: {exc}",
                                     key=str(meta.get("seq"))) from None
        if isinstance(record, JournalReject):
            self.record_reject(record.lease_id, record.worker_id, record.unit_id, record.reason)
            return
        if isinstance(record, JournalFlush):
            await self.apply_flush()
            return
        if not self._ledger.granted_here(record.lease_id):
            # every result this run journaled came under a lease it signed: an entry that did not
            # is another run's (an object copied or restored into this prefix), never merged
            raise CorruptObjectError(
                f"journal entry {meta.get('seq')} holds a result of lease "
                f"{str(record.lease_id)[:80]!r}, which this run never granted (an entry of another "
                "run's journal?); restore this run's own journal entry, or start a new run "
                "(--new-run, or another state_prefix)", key=str(meta.get("seq")))
        rm, worker_id, unit_id = record.meta(), record.worker_id, record.unit_id
        if rm.kind == "weights" and record.ints != INCREMENTS:   # written before increments
            self._owner.counters.legacy_increments(tensors, self._owner.versions.current.model)
        held: Version | None = None
        base: ModelState | None = None
        if self._owner.needs_base and rm.kind == "delta":
            held = self._owner.hold(rm.base_version)
            base = held.model if held is not None else await self._journal.load_base(rm.base_version)
        try:
            await self.apply(worker_id, unit_id, rm, tensors, base, statistics=record.stats == VALUES,
                             own_rule=record.stats is not None)
        finally:
            if held is not None:
                self._owner.release(held)

    def duplicate(self, receipt: Receipt) -> Receipt:
        self._metrics.results["duplicate"] += 1
        if receipt.status == "accepted":
            return Receipt(receipt.lease_id, receipt.unit_id, "duplicate", receipt.version,
                           receipt.reason)
        return receipt

