"""The asyncio core: join, lease, heartbeat, submit, release, and one merge loop that owns the model.

No HTTP here (the server is a thin skin over this). A result travels::

    submit: ledger check -> decode (wire, spec, limits) -> validate (finite, norm)   [any task]
            (journal mode: the same chunks written to storage as they arrive, vcasync.coordinator._ingest)
        -> merge queue -> merge loop: ledger re-check -> staleness / base -> journal record
        -> policy.merge into the private working model -> publish an immutable version -> receipt

Decoding, validation, the merge and the copies run in worker threads, so heartbeats and leases keep
being answered during a 100M-parameter merge. The merge loop is the only writer of the model, the
policy state and unit completion, so a unit can never be closed twice. Bad input raises before it
reaches the queue and changes nothing but the lease: a well-formed upload from the holder that does
not fit the model (not finite, wrong spec, norm bound) frees its unit for reissue at once and counts
as that worker's failure (a corrected re-send is still accepted while the unit is open). A valid
result that cannot be used (too stale, refused by the policy) gets a ``rejected`` receipt and its
unit goes back to the queue.
A unit parked after failing on several workers is logged at ERROR with its last failure, shown in
:meth:`Coordinator.status`, and can be queued again by an operator (:meth:`Coordinator.requeue`).

Durability (see :mod:`vcasync.coordinator._journal`): ``"journal"`` writes each result to storage before it is
merged and acknowledged, and replays the journal on start; ``"snapshot"`` only writes periodic
snapshots (a crash loses what came after the last one, and versions jump forward past anything that
may have been served); ``"none"`` keeps nothing.

One live coordinator per run (durable state; docs/runs.md): before anything of the run is read, the
coordinator takes the run's owner lease under the state prefix (:mod:`vcasync._owner_lease`), or is
refused with :class:`~vcasync.errors.PrefixTakenError` naming the live holder; it renews it while
it runs, checks it before each acknowledgement and snapshot, stops if another took the run over,
and releases it when it closes.

Storage outages (see :mod:`vcasync.coordinator._storage_health`): when a write that results need fails, the
coordinator takes nothing in (leases and results are refused with
:class:`~vcasync.errors.StorageUnavailableError`, which workers wait out with their results in hand)
and probes the storage until it is back; lease deadlines are not enforced meanwhile. Unavailable past
``storage_outage_limit_s``, it stops with :class:`~vcasync.errors.StorageFailedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from torch import Tensor

from .._aio import first_error
from .._owner_lease import OwnerLease
from ..errors import (
    ClosedError,
    ConfigError,
    CorruptObjectError,
    FrameError,
    LedgerError,
    NoWorkAvailableError,
    PolicyFailedError,
    PrefixTakenError,
    StorageError,
    StorageFailedError,
    StorageUnavailableError,
    ValidationError,
    WireError,
    WorkerBackoffError,
    WorkerQuarantinedError,
)
from ..ledger import CAPTURED_WALL, Ledger
from ..ledger._ledger import down_since_capture
from ..ledger._units import LeaseGrant, Receipt, WorkUnit
from ..metrics import Metrics
from ..policy import MergePolicy, available_policies, build_policy
from ..retry import Retrier, RetryPolicy
from ..storage import StaleTemp, Storage, shown_url
from ..tensors import ModelSpec, ModelState
from ..wire import resolve_codec
from ._activity import Activity
from ._args import check_arguments, check_initial_state
from ._buffers import BufferPool
from ._config import CoordinatorConfig, Durability
from ._identity import RunIdentity
from ._ingest import tee
from ._journal import Journal, Recovered
from ._merger import METRICS_KEY, Job, Merger, retrieve
from ._model_owner import ModelOwner
from ._result_checks import ResultMeta, read_result, reject_reason, split_ties
from ._run_record import OWNER, StartOptions, check_store, exposed_record
from ._statistics import restored_pending
from ._storage_health import StorageHealth

__all__ = ["Coordinator", "CoordinatorConfig", "Durability", "StartOptions"]

log = logging.getLogger("vcasync.coordinator")

#: Start-up (probe, run record, snapshot, journal, first snapshot) is retried as a whole on a
#: transient storage error, like every other storage call: a hiccup must not end the process.
STARTUP_RETRY = RetryPolicy(attempts=6, base_delay_s=0.2, max_delay_s=5.0)
#: How often the expiry loop drops the records of long-silent workers (LedgerConfig.forget_workers_s).
FORGET_EVERY_S = 60.0
#: The wait told to a worker asking while the run finishes (every unit done or parked, its flush or
#: last snapshot not yet done): usually well under a second, a snapshot's write at most.
FINISHING_RETRY_S = 1.0
#: A storage's temporary files (``file://``: ``.vcasync-tmp/``) no write has touched for this long
#: were left by a writer killed mid-write, and are deleted at start and this often. Every live
#: writer touches its file far more often: an upload's body is cut off after
#: ``body_idle_timeout_s`` (30 s) without a byte, and a snapshot streams without pause.
STALE_TEMP_AGE_S = 600.0
STALE_TEMP_EVERY_S = 600.0


class Coordinator:
    """Holds the global model and the ledger; merges results as they arrive. ``async with`` it."""

    def __init__(self, model: ModelState, units: Sequence[WorkUnit], *, policy: MergePolicy,
                 storage: Storage | None, config: CoordinatorConfig | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 policy_params: Mapping[str, Any] | None = None,
                 start: StartOptions | None = None,
                 startup_retry: RetryPolicy = STARTUP_RETRY, adopt_model: bool = False,
                 model_origin: Mapping[str, Any] | None = None,
                 policy_ref: str | None = None,
                 load_policy: Callable[[str], object] | None = None) -> None:
        """``policy_params`` (what ``policy`` was built with, defaults included) are recorded with
        the run so a restart with other parameters is refused; None records the name only.
        ``model_origin`` (JSON values: where ``model``'s weights came from, such as ``{"factory":
        "pkg.mod:fn", "seed": 0}``; ``vcasync coordinator`` passes its ``--model`` and ``--seed``)
        is recorded the same way, so a restart from another initial model with the same tensors is
        refused; None records nothing of it, and only the tensors' names, dtypes and shapes tell
        one initial model from another.
        ``policy_ref`` (``"module:Class"``: where ``policy``'s class was imported from) is recorded
        with the run, not compared; ``load_policy(ref)`` imports and registers the class a recorded
        reference names when ``start.reset_policy`` switches away from a policy that is not
        registered here (the journal is replayed with it first). ``vcasync coordinator --policy
        module:Class`` passes both.
        ``start`` holds the one-shot start-up choices (new run, policy reset, unsafe store).
        ``adopt_model``: the caller hands ``model`` over and never uses its tensors again: a new
        run merges into them instead of a copy (CPU, contiguous tensors without grad; others are
        copied still), one model-sized set less at start-up. Either way the coordinator lets go
        of ``model`` once it has started, and before it decodes a stored run's snapshot."""
        units_in = check_arguments(model, units, policy, storage, config, clock)
        # before anything is stored: a state the first snapshot cannot hold failed there, after the
        # run record and owner lease were written
        check_initial_state(policy, model)
        self.config = config or CoordinatorConfig()
        if storage is None and self.config.durability != "none":
            raise ConfigError(f"durability {self.config.durability!r} needs a storage")
        if model.version < 0 or not len(model):
            raise ConfigError("the model needs at least one tensor and a version >= 0")
        for first, other in split_ties(model.tensors, model.ties)[:1]:
            raise ConfigError(f"the model's tied tensors {first!r} and {other!r} hold different "
                              "values: give them one (ModelState.from_module does)")
        #: The caller's model until recovery has copied it (into the working model and the first
        #: version, or not at all when a stored run is resumed); then let go of, so the process
        #: does not keep one more model-sized copy for the whole run when the caller drops its own.
        self._model_in: ModelState | None = model
        #: The names of the model's running statistics (a rule of their own: _statistics)
        self._statistics = model.statistics
        #: The model's tied names (ModelState.ties), from the model this start was given (the
        #: factory's, at every start): a result must hold one value under each group's names
        self._ties = model.ties
        self._adopt_model = adopt_model
        self._units_in = units_in
        self._policy = policy
        self._clock = clock
        self.spec: ModelSpec = model.spec
        self._storage = storage
        #: the file modes of the run's secrets were looked at (a file:// store: exposed_record)
        self._modes_checked = False
        self._start = start or StartOptions()
        self._startup_retry = startup_retry
        self.identity = RunIdentity.of(self.spec, self._units_in, policy.name, policy_params,
                                       model_origin, policy_ref, model.statistics)
        self._load_policy = load_policy
        self._journal = Journal(storage, config=self.config.journal_config(), spec=self.spec)
        self.metrics = Metrics()
        self.metrics.bind(self._gauges)
        #: Recent events, merge rate and evaluation curve, for the live status page.
        self.activity = Activity()
        self._health = StorageHealth(probe_interval_s=self.config.storage_probe_interval_s,
                                     limit_s=self.config.storage_outage_limit_s, clock=clock,
                                     journaled=self.config.durability == "journal")
        self._final_error: BaseException | None = None   # the last snapshot could not be written
        self._phase = "new"
        self._recovered = False           # _ledger, _owner and _merger exist (set by _recover)
        self._ledger: Ledger              # both decided by recovery in __aenter__
        self._owner: ModelOwner
        self._merger: Merger
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._decode_slots = asyncio.Semaphore(self.config.max_concurrent_decodes)
        # Spare model-sized tensor sets, kept mapped: uploads decode into them, a merged result's
        # set becomes the next version (ModelOwner.merge) and a dropped version's comes back here.
        # One per decode slot, and one for the version a merge publishes.
        self._update_buffers = BufferPool(self.spec, self.config.max_concurrent_decodes + 1)
        self._finished = asyncio.Event()
        self._finish_wanted = asyncio.Event()    # settled, waiting for a snapshot (snapshot mode)
        self._touched = False        # a worker or operator call came: the ledger may have changed
        self._grace_handed_on = False   # the snapshot it started from said a restart grace was open
        self._replayed = False       # recovery applied journal entries no snapshot holds
        self._closed = asyncio.Event()
        self._stop = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._parked_logged: set[str] = set()
        #: The run's owner lease (durable state only): taken before anything is read, renewed by
        #: ``_renewer`` until aclose() released it; lost, ``_prefix_lost`` stops the coordinator.
        self._prefix_lease: OwnerLease | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._prefix_lost = asyncio.Event()
        #: no new leases before this (clock) time: set when the run was taken over from a crash
        self._grace_until: float | None = None
        self._answers_owed_until = 0.0       # see answers_owed_s
        self._final_failing = False          # the final snapshot (durability snapshot) failed
        self._captured_at: float | None = None   # (clock) capture of the snapshot restored from
        #: the start wrote under the prefix (the run record, a replayed version floor, a sweep, a
        #: snapshot): a start that fails then releases its owner lease instead of withdrawing it
        self._wrote = False

    # -- lifetime ---------------------------------------------------------------------------------
    async def __aenter__(self) -> Coordinator:
        if self._phase != "new":
            raise ClosedError("a Coordinator is entered once; make a new one")
        self._phase = "starting"
        try:
            retrier = Retrier(self._startup_retry)
            await retrier.call(self._take_prefix, describe="coordinator start-up")
            await retrier.call(self._recover, describe="coordinator start-up")
            self._model_in = None             # copied (or superseded by the stored run): let go
            await self._ensure_prefix()       # still this run's coordinator after the recovery
        except BaseException:
            self._phase = "closed"
            self._closed.set()
            # refused before it wrote anything (another run's identity, a snapshot of another
            # model...): nothing but the owner record was written, and it goes too. One that took
            # the run over from a crash and failed hands that on: it served nobody, so the leases
            # the crash left unknown are as unknown as they were
            lease = self._prefix_lease
            await self._let_go_of_prefix(withdraw=not self._wrote,
                                         clean=lease is None or not lease.took_over)
            raise
        if self._prefix_lease is not None:
            await self._prefix_lease.prune()   # the start stands: older owner records go
        self._runner = asyncio.create_task(self._run(), name="vcasync-coordinator")
        self._phase = "running"
        self._check_finished()
        return self

    def _join_ties(self, tensors: Mapping[str, Tensor]) -> None:
        """A snapshot written before ties were checked may hold a tie split (a result that sent
        two values for one tensor): each tied name gets the value of the group's last name, the
        one ``load_state_dict`` left in every module that loaded it (a worker's, the user's)."""
        for last, name in split_ties(tensors, tuple(group[::-1] for group in self._ties)):
            tensors[name].copy_(tensors[last])
            log.warning("the snapshot holds different values for the tied tensors %r and %r: "
                        "%r takes %r's (what a module loading it got)", name, last, name, last)

    def _let_go_of_model_in(self) -> None:
        self._model_in = None

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
        saved = False       # the final snapshot holds what this coordinator knew (leases too)
        try:
            self._stop.set()
            self._merger.snapshots.ready.set()     # wakes the snapshot writer so it can stop
            self._merger.stop()
            if self._runner is not None:
                await asyncio.gather(self._runner, return_exceptions=True)
            self._merger.fail_queued(ClosedError("the coordinator is closing; send the result "
                                                 "again"))
            # a broken policy stops the merge loop between two results: what it merged before is
            # whole, and kept like at a clean stop
            if (self._failure is None or isinstance(self._failure, PolicyFailedError)) \
                    and self._journal.durable:
                await self._final_snapshot()
                if isinstance(self._final_error, PrefixTakenError):
                    self._failure = self._final_error    # taken over: this stop was no clean one
                saved = self._final_error is None
            self._merger.snapshots.drop()
        finally:
            self._phase = "closed"
            self._closed.set()
            # Unsaved (storage gave out: exit 4; the final snapshot failed), the leases granted
            # since the last snapshot are known to nobody: released as clean, the next start
            # handed their units out at once and refused their results as base_unavailable
            await self._let_go_of_prefix(clean=saved)

    # -- the run's owner lease ------------------------------------------------------------------------
    async def _take_prefix(self) -> None:
        """Before anything of the run is read: probe the store (the lease stands on if-absent
        writes), then take the run's owner lease, or raise :class:`PrefixTakenError` naming the live
        coordinator that holds it. Waits up to ``owner_ttl_s`` for one that may be dead."""
        storage = self._storage
        if storage is None or self.config.durability == "none" or self._prefix_lease is not None:
            return
        prefix = self.config.state_prefix.strip("/")
        await check_store(storage, prefix, self._start.allow_unsafe_store)

        def taken(message: str, holder: str | None) -> PrefixTakenError:
            return PrefixTakenError(message, key=f"{prefix}/{OWNER}")

        lease = OwnerLease(storage, error=taken, prefix=f"{prefix}/{OWNER}",
                           ttl_s=self.config.owner_ttl_s,
                           subject=f"the run under {prefix!r} on {storage.url}", role="coordinator",
                           hint="stop that one first, or give this coordinator its own state "
                                "prefix (another storage URL or [coordinator] state_prefix)",
                           logger=log)
        await lease.acquire(prune=False)      # pruned once the start stands: a refused one
        self._prefix_lease = lease              # changes nothing (see __aenter__)
        self._renewer = asyncio.create_task(lease.keep_renewed(self._prefix_lost.set),
                                            name="vcasync-owner-lease")

    async def _ensure_prefix(self) -> None:
        """Raise :class:`PrefixTakenError` if another coordinator took the run over (this one
        stalled past ``owner_ttl_s``): called before each acknowledgement and snapshot. Free while
        the lease was renewed recently (see :meth:`vcasync._owner_lease.OwnerLease.ensure`), except
        while closing: then a read of the owner records each time. A coordinator that stalled (its
        renewer stopped, the process was SIGSTOPped) may still believe in a recent renewal, and
        a stop's writes (final snapshot, open bases, version floor, prune) would overwrite or
        delete the state of the coordinator that took the run over."""
        if self._prefix_lease is None:
            return
        if self._phase == "closing":
            await self._prefix_lease.check()
        else:
            await self._prefix_lease.ensure()

    async def _watch_prefix(self) -> None:
        """Stop the coordinator's loops once the renewer found the run taken over."""
        await _first_of(self._prefix_lost.wait(), self._stop.wait())
        if not self._prefix_lost.is_set():
            return
        lease = self._prefix_lease
        assert lease is not None
        assert lease.error is not None
        raise lease.error

    async def _let_go_of_prefix(self, *, withdraw: bool = False, clean: bool = True) -> None:
        """Stop renewing and release the lease (a successor starts at once; not ``clean``: one
        that takes over as from a crash), or with ``withdraw`` delete its record (a start that
        wrote nothing under it). Idempotent."""
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
        lease, self._prefix_lease = self._prefix_lease, None
        if lease is not None:
            await (lease.withdraw(clean=clean) if withdraw else lease.release(clean=clean))

    def _abandon_prefix(self) -> None:
        """What SIGKILL does to the owner lease: no more renewals, no release (the tests' crash)."""
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        if self._prefix_lease is not None:
            self._prefix_lease.abandon()
            self._prefix_lease = None

    async def _final_snapshot(self) -> None:
        """Nothing merges any more: write what the last snapshot lacks, then drop the journal
        entries it covers. A failure is an error the operator must hear of (``storage_error``)."""
        try:
            # leases and failures change the ledger without any merge: a snapshot whenever a call
            # came, not only after results; also when the start replayed journal entries (its
            # workers may have left before it came up: without one, every later start replays
            # them again and the newest snapshot lacks acknowledged results); also when the
            # snapshot it started from handed a restart grace on (else one that ran out is handed
            # on again at every start); none when neither
            # (a finished run started again and stopped must leave its storage as it was)
            # each write below is preceded by a read of the owner records (see _ensure_prefix):
            # once the run was taken over, this coordinator writes and deletes nothing of it
            await self._ensure_prefix()
            self._grace_left()      # one still open is handed on in the snapshot (unknown_from)
            if (self._touched or self._replayed or self._merger.keep_from is not None
                    or self._grace_handed_on
                    or self._merger.snapshots.written_version < self.version):
                await self._merger.capture()
                await self._store_open_bases()
                await self._write_snapshot()
            # every version served is in that snapshot now: the next start need not jump past any
            await self._ensure_prefix()
            await self._journal.settle_version_floor(self.version)
        except Exception as exc:
            self._final_error = exc
            if isinstance(exc, PrefixTakenError):
                log.error("final snapshot refused: %s", exc)
                return
            lost = ("the journal still holds every acknowledged result; the next start replays it"
                    if self._journal.journaling else "results merged since the last snapshot are lost")
            log.error("final snapshot failed (%r): %s", exc, lost)
            return
        try:
            await self._ensure_prefix()
            await self._journal.prune_final()
        except PrefixTakenError as exc:
            self._final_error = exc
            log.error("final prune refused: %s", exc)
        except Exception as exc:   # the snapshot is written: what is left over is only clutter
            log.warning("pruning the journal after the final snapshot failed (the next start "
                        "skips what the snapshot covers): %r", exc)

    async def _store_open_bases(self) -> None:
        """A clean stop: the older versions still held (the bases of leases whose results may
        come) go to storage, so the next start holds them again and those results are merged, not
        refused as ``base_unavailable`` (runs.md: every lease in flight at a restart stays valid)."""
        current = self.version
        for number in self._owner.versions.numbers():
            held = self._owner.hold(number) if number != current else None
            if held is None:
                continue
            try:
                await self._ensure_prefix()
                await self._journal.ensure_base(held.model)
            finally:
                self._owner.release(held)

    async def _adopt_open_bases(self) -> None:
        """Start-up: hold again the stored bases that open leases (within the window) need."""
        current = self.version
        wanted = set(self._ledger.open_base_versions() if self._owner.needs_base
                     else self._ledger.active_base_versions())
        if self._merger.keep_from is not None:     # leases no snapshot knows may be based on these
            wanted.update(range(self._merger.keep_from, current))
        for number in sorted(wanted):
            if (number < current and current - number <= self.config.max_staleness
                    and self._journal.has_base(number)):
                self._owner.adopt(await self._journal.load_base(number))

    async def _remove_stale_temp(self) -> None:
        """Delete the storage's temporary files left by writers killed mid-write (a coordinator
        killed during a large upload left a partial copy of it for good); best effort."""
        storage: object = self._storage
        if self._storage is None or not isinstance(storage, StaleTemp):
            return
        where = shown_url(self._storage.url)
        try:
            removed = await storage.remove_stale_temp(STALE_TEMP_AGE_S)
        except StorageError as exc:
            log.warning("could not remove stale temporary files from %s: %s", where, exc)
            return
        if removed:
            log.info("removed %d temporary file(s) left on %s by writes that never finished",
                     removed, where)

    def report_storage_failure(self, exc: BaseException) -> StorageUnavailableError:
        """A storage write outside the merge loop failed (the server calls this, e.g. when a join
        token could not be stored): mark the storage unavailable; the answer for the caller.
        Without durable state nothing probes the storage, so the state is left alone then."""
        if self._journal.durable:
            self._health.write_failed(exc, needed=True)
            refusal = self._health.refusal()
        else:
            refusal = self._health.refusal(exc)
        refusal.__cause__ = exc
        return refusal

    @property
    def failure(self) -> BaseException | None:
        """What stopped the coordinator's loops, if anything did (None while it runs normally)."""
        return self._failure

    @property
    def storage_error(self) -> BaseException | None:
        """The storage failure that ended the run (:class:`StorageFailedError`), or that kept its
        final snapshot from being written; None when storage did its job."""
        if isinstance(self._failure, StorageError):
            return self._failure
        return self._final_error

    def _check_running(self) -> None:
        self._touched = True         # a call that may change the ledger: the final snapshot is due
        if self._phase != "running":
            if self._failure is not None:
                raise ClosedError(f"the coordinator stopped after an error: {self._failure!r}")
            raise ClosedError(f"the coordinator is {self._phase}; it serves between __aenter__ "
                              "and aclose()")

    def _check_recovered(self) -> None:
        """The views of the model and ledger exist once ``__aenter__`` recovered them (and stay
        readable after ``aclose()``); before that, say so instead of an AttributeError."""
        if not self._recovered:
            raise ClosedError(f"the coordinator is {self._phase} and holds no model yet: enter it "
                              "(async with Coordinator(...) as coord) first")

    async def _run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._merger.run(), name="vcasync-merge")
                tg.create_task(self._expiry_loop(), name="vcasync-expiry")
                storage: object = self._storage        # a Storage that may also be a StaleTemp
                if isinstance(storage, StaleTemp):
                    tg.create_task(self._stale_temp_loop(), name="vcasync-stale-temp")
                if self._journal.durable:
                    tg.create_task(self._snapshot_loop(), name="vcasync-snapshots")
                    tg.create_task(self._storage_probe_loop(), name="vcasync-storage-probe")
                if self._journal.durable and not self._journal.journaling:
                    tg.create_task(self._finish_loop(), name="vcasync-finish")
                if self._prefix_lease is not None:
                    tg.create_task(self._watch_prefix(), name="vcasync-owner-watch")
        except asyncio.CancelledError:
            self._failure = ClosedError("the coordinator's loops were cancelled")
            self._merger.fail_queued(self._failure)
            raise
        except BaseException as exc:
            failure = first_error(exc) if isinstance(exc, BaseExceptionGroup) else exc
            self._failure = failure
            self._phase = "failed" if self._phase == "running" else self._phase
            if isinstance(failure, PrefixTakenError | PolicyFailedError):
                log.error("%s", failure)     # said once; a policy's first failure had its traceback
                self.activity.note("stopped", detail=str(failure)[:200])
            elif not isinstance(failure, StorageFailedError):    # that one was logged, and why
                log.exception("coordinator loop failed; stopping")
            self._merger.fail_queued(ClosedError(f"the coordinator stopped after an error: "
                                                 f"{exc!r}"))
            self._closed.set()

    # -- recovery ---------------------------------------------------------------------------------
    async def _recover(self) -> None:
        """Read the run, load its newest snapshot, replay the journal after it. Runs again from the
        top (a fresh journal handle) when a transient storage error interrupts it."""
        self._journal = Journal(self._storage, config=self.config.journal_config(), spec=self.spec)
        lease = self._prefix_lease
        if lease is not None and lease.epoch is not None:
            # the snapshot writer's fencing token: checked before a write, the lease can be taken
            # over before the write lands (see Journal.fence)
            self._journal.fence(lease.epoch, self._ensure_prefix)
        prefix = self.config.state_prefix.strip("/")
        if self.config.durability == "none" and self._storage is not None:
            # durability none takes no owner lease and keeps nothing: beside a stored run (live or
            # not) it would start a new run whose results last nowhere, and its workers' tokens or
            # uploads would land in the stored run's state; checked before anything is written
            if self._start.new_run:
                raise ConfigError("--new-run (StartOptions(new_run=True)) with durability 'none': "
                                  "durability none deletes nothing and keeps nothing, so --new-run "
                                  "would do nothing; drop --new-run, or use durability journal or "
                                  "snapshot to start the stored run over")
            if await self._holds_state(prefix):
                raise ConfigError(f"{self._storage.url} holds a run under {prefix!r}; durability "
                                  "'none' would ignore it: resume it with durability journal or "
                                  "snapshot, or use another state_prefix or storage")
        run = await self._journal.open(self.identity, self._start,
                                       probed=self._prefix_lease is not None)
        self._wrote |= run.wrote
        if self._storage is not None and not self._modes_checked:
            self._modes_checked = True        # once, not again at each retried recovery
            if (loose := await asyncio.to_thread(exposed_record, self._storage, prefix)) is not None:
                # written 0644 by a build before 2026-12-07 (or chmod'ed since): a store keeps
                # the mode of a file it finds, so it stayed readable to every local user
                log.warning("the run record %s holds the secret that signs this run's leases, but "
                            "other local users can read it: run %s", *loose)
        reset = run.recorded is not None and not run.recorded.same_policy(self.identity)
        cfg = self.config.ledger_config()
        # a stored run supersedes the caller's model: let go of it before the snapshot is decoded
        # (with the caller's own reference dropped, one model-sized set less at resume)
        rec = await self._journal.load_snapshot(found=self._let_go_of_model_in)
        if rec is None and run.recorded is not None and self._journal.durable:
            lost = await self._journal.lost_state()
            if lost is not None:       # starting over would silently drop every merged result
                raise CorruptObjectError(
                    f"run {run.run_id} on {self._storage.url if self._storage else '?'} cannot be "
                    f"recovered: {lost}. Restore its snapshots, or start a new run (--new-run, or "
                    "another state_prefix)", key=self.config.state_prefix)
        if rec is None:
            if self._model_in is None:   # a retried start found a snapshot, and now none
                raise CorruptObjectError(
                    f"the snapshot of run {run.run_id} that this start found is gone; start "
                    "again once the storage is consistent", key=self.config.state_prefix)
            self._owner = ModelOwner(self._policy, self._model_in,
                                     max_retained_bytes=self.config.max_retained_bytes,
                                     pool=self._update_buffers, adopt=self._adopt_model,
                                     statistics=self._statistics, ties=self._ties)
            self._ledger = Ledger(self._units_in, config=cfg, clock=self._clock, secret=run.secret)
        else:
            # The stored state belongs to the run's policy: replay with it, switch afterwards.
            replaying = self._recorded_policy(run.recorded) if reset else self._policy
            # the snapshot's tensors, decoded for this and held nowhere else, become the working
            # model: copying them held a third model-sized set at resume
            self._join_ties(rec.tensors)
            self._owner = ModelOwner(replaying, ModelState(rec.tensors, rec.version),
                                     max_retained_bytes=self.config.max_retained_bytes,
                                     policy_state=rec.policy_state, pool=self._update_buffers,
                                     adopt=True, held=rec.held, renumbered=rec.renumbered,
                                     statistics=self._statistics,
                                     pending_statistics=restored_pending(rec.ledger),
                                     ties=self._ties)
            rec.tensors = {}
            down_s = down_since_capture(rec.ledger)
            self._ledger = Ledger.restore(rec.ledger, config=cfg, clock=self._clock,
                                          secret=run.secret, down_s=down_s)
            if CAPTURED_WALL in rec.ledger:      # when the snapshot restored was captured
                self._captured_at = self._clock() - down_s
            self._ledger.add_units(self._units_in)
        # merges count the run, not this process: from the ledger's count (the snapshot's, or 0)
        # on, each replayed entry adding itself, so journal and snapshot mode say the same
        self.metrics.resume_results(accepted=self._ledger.stats["accepted"],
                                    rejected=self._ledger.stats["rejected"])
        if rec is not None:     # the histograms too, as of the snapshot; replay adds the rest
            self.metrics.resume_histograms(rec.ledger.get(METRICS_KEY))
        self._merger = Merger(owner=self._owner, ledger=self._ledger, journal=self._journal,
                              metrics=self.metrics, snapshot_every=self.config.snapshot_every,
                              max_staleness=self.config.max_staleness,
                              settled=self._check_finished, health=self._health,
                              refusal_limit=self.config.policy_refusal_limit,
                              recycle=self._update_buffers.give, guard=self._ensure_prefix)
        self._recovered = True
        lease = self._prefix_lease
        # a snapshot written within a grace still open (a clean stop soon after a takeover) knows
        # no more of those leases than the crash did: wait for them again, from the versions then
        unknown_from = None if rec is None else rec.unknown_from
        taken_over = (rec is not None and self.config.restart_grace() > 0
                      and ((lease is not None and lease.took_over) or unknown_from is not None))
        if taken_over:       # leases granted after the snapshot may be based on any version since
            self._merger.keep_from = self.version if unknown_from is None else unknown_from
        # that snapshot says a grace is open: the clean stop writes one that says how it ended
        self._grace_handed_on = unknown_from is not None
        self._wrote = True     # replay, the sweep and what follows write under the prefix
        # read before the replay, which raises it in snapshot mode as it recreates versions that
        # were served (with these very weights) by a start in journal mode
        floor = await self._journal.version_floor()
        async for entry in self._journal.entries():
            await self._merger.replay(entry.meta, entry.tensors)
            self._replayed = True     # the snapshot lacks it: the clean stop writes one that has it
        await self._journal.sweep()     # received bytes no entry names: refused or cut off
        await self._remove_stale_temp()
        await self._adopt_open_bases()
        finished = floor is not None and floor > self.version and self._recovered_finished(rec)
        jumped = floor is not None and floor > self.version and not finished
        if finished:
            # Snapshot mode, a run the snapshot holds finished (its coordinator died while it
            # lingered): no version above it was ever served, so its number stays and the floor
            # comes down to it, as a clean stop's does (else each crash added FLOOR_BLOCK)
            await self._journal.settle_version_floor(self.version)
        elif jumped and floor is not None:
            # Snapshot mode: versions up to the floor may have been served; never reuse a number
            # (the floor's own number is the snapshot's version when a clean stop settled it).
            self._owner.jump(floor + 1)
            self._merger.retain()
        await self._journal.raise_version_floor(self.version)
        # What the other durability mode left (a start may change it): journal entries replayed
        # in snapshot mode, a floor jumped past in journal mode. A snapshot of it at once, so no
        # later start reads them again by this mode's rules (journal mode would replay its entries
        # on the snapshot from before the jump, under numbers served since).
        switched = self._replayed if not self._journal.journaling else jumped
        if reset and self._ledger.finished:
            # nothing is left to merge: the switch only rewrote the run record and wrote a
            # snapshot of a run whose start only reports (until 2026-12-07), and the status named
            # a policy the run never merged with
            assert run.recorded is not None
            log.warning("--reset-policy: run %s is finished at v%d, so nothing is switched: it "
                        "keeps its policy %s and nothing is written", run.run_id, self.version,
                        run.recorded.policy)
            self._policy = self._owner.policy
            reset = False
        if reset:
            assert run.recorded is not None
            if self._owner.flush_due:
                # accepted results the recorded policy holds go with its state: it applies them
                # first (its end-of-run flush), so no acknowledged result is dropped by the switch.
                # Not journaled: the snapshot written below holds it, and a start that dies before
                # that snapshot does the same reset, and the same flush, again
                await self._merger.apply_flush()
            if self._owner.held:
                log.warning("policy reset: the %d accepted result(s) that merge policy %r holds "
                            "unapplied are dropped with its state (it has no flush, or its flush "
                            "applied nothing)", self._owner.held, self._owner.policy.name)
            log.warning("policy reset: run %s switches from %s to %s at v%d; the policy state "
                        "starts afresh", run.run_id, run.recorded.policy, self._policy.name,
                        self.version)
            self._owner.switch_policy(self._policy)
        if (rec is None or reset or switched) and self._journal.durable:
            # The first snapshot pins the initial model: replay must start from exactly it. After a
            # reset it holds the new policy's state, so nothing is ever replayed with the old state.
            await self._merger.capture()
            await self._write_snapshot()
            if rec is None:
                await self._journal.mark_started()
        if reset:       # the new policy; the origin as the run knows it (this start may not)
            assert run.recorded is not None
            await self._journal.record_identity(self.identity.with_origin_of(run.recorded))
        self._merger.snapshots.written_version = self.version     # what was recovered is stored
        if taken_over and self._recovered_finished(rec):
            # every unit done: no lease can be out that a worker still trains, so there is nothing
            # to wait for ("new leases wait 20s for the workers it leased units to" misled)
            self._merger.keep_from = None
        elif taken_over:
            self._grace_until = self._clock() + self.config.restart_grace()
            log.info("took run %s over from a coordinator that stopped uncleanly: new leases wait "
                     "%.3gs for the workers it leased units to since its last snapshot to call in",
                     run.run_id, self.config.restart_grace())

    def _recovered_finished(self, rec: Recovered | None) -> bool:
        """The state recovered is a finished run that nothing can have gone on from: every unit
        done (none parked: an operator may have requeued one after the snapshot and merged its
        result) and no end-of-run flush still due (one may have been applied and served)."""
        return (rec is not None and self._ledger.finished and not self._ledger.counts()["parked"]
                and not self._owner.flush_due)

    async def _holds_state(self, prefix: str) -> bool:
        """Whether anything is stored under the run's prefix (a run record, owner records, tokens)."""
        assert self._storage is not None
        async for _ in self._storage.list(f"{prefix}/"):
            return True
        return await self._storage.exists(f"{prefix}/run")

    def _recorded_policy(self, recorded: RunIdentity | None) -> MergePolicy:
        assert recorded is not None
        ref = recorded.policy_ref
        try:
            if ref is not None and recorded.policy not in available_policies():
                if self._load_policy is None:
                    raise ConfigError(f"it was imported from {ref!r}, and this coordinator was "
                                      "given no way to import it (load_policy)")
                self._load_policy(ref)
            return build_policy(recorded.policy, recorded.policy_params or {})
        except Exception as exc:
            how = (f"make {ref!r} importable here (run from the directory that holds its module, "
                   "or pass --app-dir DIR)" if ref is not None else
                   "install the package that provides it; if it is a module:Class policy, start "
                   "once without --reset-policy with --policy module:Class (its class), which "
                   "records where it comes from, then switch")
            raise ConfigError(f"--reset-policy: the run's policy {recorded.policy!r} is needed to "
                              f"replay its journal before the switch, and cannot be built here: "
                              f"{exc}; {how}") from exc

    async def _write_snapshot(self) -> None:
        await self._ensure_prefix()       # a coordinator taken over must not write the run's state
        if await self._merger.snapshots.write():
            self.metrics.snapshots += 1

    # -- workers ----------------------------------------------------------------------------------
    async def join(self, name: str = "", info: Mapping[str, Any] | None = None) -> str:
        """Register a worker; returns its id (authentication is the server's business).
        :class:`NoWorkAvailableError` (``finished``, ``410 run_finished``) once the run is finished:
        said before anything is written (the server writes a joining worker's token), so a worker
        joining while a finished run lingers hears it even with the storage down."""
        self._check_running()
        self._refuse_if_finished("join")
        worker_id = self._ledger.join(name, info)
        self.activity.note("join", worker=worker_id, detail=name)
        return worker_id

    def recall_workers(self, joined: Iterable[tuple[str, str, float]]) -> int:
        """List the workers of ``joined`` (``(worker id, name, seconds since it joined)``, from the
        server's token records) that the ledger does not know: after a crash, those who joined
        since the last snapshot, shown gone (last seen at their join) until heard again, instead
        of missing from the status until they call in, and then nameless. How many were listed."""
        since_capture = None if self._captured_at is None else self._clock() - self._captured_at
        return sum(self._ledger.recall(worker_id, name, since, since_capture_s=since_capture)
                   for worker_id, name, since in joined)

    async def lease(self, worker_id: str) -> LeaseGrant:
        """The next unit, or :class:`NoWorkAvailableError` (``finished`` when the run is over);
        :class:`StorageUnavailableError` while its result could not be made durable."""
        self._check_running()
        if not self._ledger.finished:
            # A finished run says so (410) with no write: told to wait for the storage instead, a
            # worker would still be waiting when the coordinator stopped lingering and exited.
            self._health.check()
        self._restart_grace()
        try:
            return self._ledger.lease(worker_id, self.version)
        except (WorkerBackoffError, WorkerQuarantinedError) as exc:
            self.activity.note("lease_refused", worker=worker_id, detail=exc)
            raise
        except NoWorkAvailableError as exc:
            if exc.finished and not self._over():
                raise self._finishing("lease") from None
            if not exc.finished and exc.retry_after is not None:
                self._owe_answer(exc.retry_after)      # "no queued work; N units are leased"
            raise
        finally:
            self._check_finished()      # leasing expires overdue leases, which may park the last unit

    def _over(self) -> bool:
        """The run is finished as workers are told it (``410 run_finished``, after which they
        leave): every unit done or parked *and* what the coordinator does after the last one
        done: the policy's end-of-run flush merged, and (durability ``snapshot``) a snapshot
        holding the last results written. The ledger alone says the first; a worker told then
        exited while a buffering policy still held the results (the model downloaded next had
        none of them), or before the snapshot, so a crash then lost acknowledged results with
        nobody left to train their units again."""
        self._check_finished()
        return self._finished.is_set()

    def _finishing(self, action: str) -> NoWorkAvailableError:
        """Every unit is done or parked but the run is not finished yet (:meth:`_over`): ask
        again soon (not ``finished``: the worker stays until the run is)."""
        wait = round(min(FINISHING_RETRY_S, self._ledger.config.heartbeat_s), 3)
        self._owe_answer(wait)
        return NoWorkAvailableError(
            f"cannot {action}: every work unit is done or parked and the run is finishing (its last "
            f"results are being merged and made durable); ask again", retry_after=wait)

    def _owe_answer(self, wait: float) -> None:
        """A worker was told "no work now, ask again in ``wait`` s": see :attr:`answers_owed_s`."""
        self._answers_owed_until = max(self._answers_owed_until, self._clock() + wait + 1.0)

    @property
    def answers_owed_s(self) -> float:
        """Seconds until every worker told "no work now, ask again" (the run finishing, or every
        unit leased out) has asked again: its wait and a second more. A server that stops serving
        once the run is finished serves at least this long, so those workers hear the end (with
        ``--linger 0`` they asked again of a coordinator that had exited, and retried for their
        ``--give-up-after``)."""
        return max(0.0, self._answers_owed_until - self._clock())

    def _refuse_if_finished(self, action: str) -> None:
        """:class:`NoWorkAvailableError` (``finished``: ``410 run_finished``) once the run is
        finished (:meth:`_over`), as a lease request is answered; it needs no write."""
        if self._ledger.finished and self._over():
            raise self._run_over(action)

    def _run_over(self, action: str, why: BaseException | None = None) -> NoWorkAvailableError:
        lease = f" (and this lease: {why})" if why is not None else ""
        return NoWorkAvailableError(f"cannot {action}: every work unit is done or parked; the run is "
                                    f"finished{lease}", retry_after=self._ledger.config.heartbeat_s,
                                    finished=True)

    def _grace_left(self) -> float:
        """Seconds left of the restart grace (0 once it is over, and it is then ended)."""
        if self._grace_until is None:
            return 0.0
        wait = self._grace_until - self._clock()
        if wait <= 0 or not self._ledger.counts()["queued"]:
            self._grace_until = None
            self._merger.keep_from = None    # the unknown leases have called in (adopted) by now
            return 0.0
        return wait

    def _restart_grace(self) -> None:
        """Taken over from a crashed coordinator: no new lease until the workers training units
        it granted after its last snapshot had time to call in (their leases are adopted then)."""
        wait = self._grace_left()
        if wait <= 0:
            return
        raise NoWorkAvailableError(
            f"the coordinator took this run over from one that stopped uncleanly; leases it granted "
            f"since its last snapshot are adopted as their workers call in: new work in "
            f"{wait:.3g}s", retry_after=round(min(wait, self._ledger.config.heartbeat_s), 3))

    async def resume(self, worker_id: str, lease_id: str) -> LeaseGrant:
        """Pick a lease up again after a restart (worker or coordinator)."""
        self._check_running()
        try:
            return self._ledger.resume(worker_id, lease_id)
        finally:
            self._check_finished()

    async def heartbeat(self, worker_id: str, lease_id: str, steps_done: int, *,
                        stopping: bool = False) -> LeaseGrant:
        """Progress report; progress extends the lease. In a finished run (no lease is live: this
        one's unit was delivered by another worker after it expired, or parked), the ledger's
        refusal is :class:`NoWorkAvailableError` (``finished``, ``410 run_finished``): the worker
        stops its trainer and exits, instead of training on and delivering to a coordinator that
        has stopped lingering. ``stopping``: the worker is preempted: it keeps the lease and its
        checkpoint for a restart to resume, or delivers a partial result on its way out (shown
        ``preempted``, and an event says so)."""
        self._check_running()
        self.metrics.heartbeats += 1
        try:
            grant = self._ledger.heartbeat(worker_id, lease_id, steps_done, stopping=stopping)
            if stopping:
                self.activity.note("preempted", worker=worker_id, unit=grant.unit.unit_id,
                                   detail=f"stopping after {steps_done} step(s); its lease {lease_id} "
                                          "stays until a restart resumes it, it delivers, or it "
                                          "times out")
            return grant
        except LedgerError as exc:
            if self._ledger.finished and self._over():
                raise self._run_over("heartbeat", exc) from exc
            raise
        finally:
            self._check_finished()

    async def release(self, worker_id: str, lease_id: str, reason: str = "", *,
                      failed: bool = True, preempted: bool = True) -> None:
        """Give a lease up (its unit goes back to the queue); ``failed``: the unit failed on this
        worker (counts against both), False when it is nobody's fault: a preemption, or with
        ``preempted`` False another cause (a lost base, the machine's configuration), which is
        not shown as a preemption."""
        self._check_running()
        try:
            self._ledger.release(worker_id, lease_id, reason, failed=failed, preempted=preempted)
            self.activity.note("preempted" if not failed and preempted else "released",
                               worker=worker_id, unit=self._ledger.lease_unit(lease_id), detail=reason)
        finally:
            self._check_finished()

    async def leave(self, worker_id: str, reason: str = "") -> None:
        """The worker says it exits cleanly (``reason``: why, e.g. ``finished`` or ``preempted``):
        shown ``left`` and no longer counted alive, until it is heard from again. Its leases stay
        as they are (a preempted worker keeps its lease for a restart to resume). Kept in the
        ledger's snapshots like every worker row, so a restart does not show it alive again.
        Answered in a finished run too (the worker hears ``410 run_finished`` and then leaves)."""
        self._check_running()
        if self._ledger.leave(worker_id):
            self.activity.note("left", worker=worker_id, detail=reason)

    async def requeue(self, unit_ids: Sequence[str] | None = None) -> list[str]:
        """Queue parked units again (all, or the named ones; all or nothing): the operator's action
        once whatever broke them is fixed. The run goes on without a restart."""
        self._check_running()
        done = self._ledger.requeue(unit_ids)
        for unit_id in done:
            self._parked_logged.discard(unit_id)
        if done:
            self.activity.note("requeued", detail=f"{len(done)} unit(s): {', '.join(done[:5])}")
            log.warning("operator requeued %d parked unit(s): %s", len(done), ", ".join(done[:20]))
        if not self._ledger.finished:
            self._finished.clear()
            self._finish_wanted.clear()
        return done

    def parked(self) -> dict[str, str]:
        """Parked unit id -> why (its failures and the last one)."""
        self._check_recovered()
        return self._ledger.parked()

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
                self.metrics.reject(reject_reason(exc), worker_id)
                self.activity.note("result_refused", worker=worker_id, detail=reject_reason(exc))
                raise
            if check.receipt is not None:
                return self._merger.duplicate(check.receipt)
            self._health.check()               # before a byte of the body is read
            pending = self._inflight.get(lease_id)
            if pending is None:
                break
            await asyncio.shield(pending)      # the same lease is being uploaded: wait for it
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[lease_id] = gate
        try:
            receipt = await self._submit(worker_id, lease_id, check.unit, body)
        finally:
            del self._inflight[lease_id]
            gate.set_result(None)
        if receipt.status == "accepted":
            self.activity.merged()
        elif receipt.status == "rejected":
            self.activity.note("result_rejected", worker=worker_id, unit=receipt.unit_id,
                               detail=receipt.reason or "")
        return receipt

    async def _count(self, body: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
        async for chunk in body:
            self.metrics.bytes_in += len(chunk)
            yield chunk

    async def _submit(self, worker_id: str, lease_id: str, unit: WorkUnit,
                      body: AsyncIterable[bytes]) -> Receipt:
        # Journal mode: the bytes are written as they arrive, while they are decoded (one pass);
        # the merge loop owns them once the job is queued (it journals them or deletes them).
        blob = self._journal.incoming_key() if self._journal.journaling else None
        if blob is not None:
            # the bytes go to the run's incoming/ as they arrive: not from a coordinator taken over
            # (one woken from a stall past owner_ttl_s; free while the lease was renewed recently)
            try:
                await self._ensure_prefix()
            except PrefixTakenError as exc:
                self._prefix_lost.set()      # this coordinator stops, as when the merge loop finds it
                raise ClosedError("the coordinator stopped: another one writes this run; send the "
                                  "result again") from exc

        def read(chunks: AsyncIterable[bytes]) -> Awaitable[tuple[ResultMeta, dict[str, Tensor]]]:
            return read_result(chunks, lease_id=lease_id, unit=unit, spec=self.spec,
                               limits=self.config.limits, require_finite=self.config.require_finite,
                               max_norm=self.config.max_update_norm, current_version=self.version,
                               hold=lambda n: self._owner.hold(self._owner.renumbered(n)),
                               release=self._owner.release,
                               out=self._update_buffers.take(), recycle=self._update_buffers.give,
                               ties=self._ties)
        written: asyncio.Future[None] | None = None     # the bytes' write, maybe still finishing
        try:
            async with self._decode_slots:
                if blob is None:
                    meta, tensors = await read(self._count(body))
                else:
                    (meta, tensors), written = await tee(
                        self._count(body), functools.partial(self._journal.stage, blob), read)
            self._check_running()
        except BaseException as exc:
            if blob is not None:
                self._journal.discard_later(blob, after=written)
            if isinstance(exc, StorageError):    # writing the bytes failed
                raise self._merger.storage_failed(exc) from exc
            if isinstance(exc, WireError | ValidationError):
                self._refused(worker_id, lease_id, exc, unit_id=unit.unit_id)
            raise
        future: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        future.add_done_callback(retrieve)
        self._merger.submit(Job(worker_id, lease_id, unit, meta, tensors, future, blob,
                                written=written))
        return await asyncio.shield(future)

    def _refused(self, worker_id: str, lease_id: str, exc: WireError | ValidationError, *,
                 unit_id: str) -> None:
        self.metrics.reject(reject_reason(exc), worker_id)
        self.activity.note("result_refused", worker=worker_id, unit=unit_id, detail=reject_reason(exc))
        # A well-formed upload that cannot fit the model (not finite, wrong spec, norm): the unit
        # goes to another worker now, not at the deadline. Malformed bytes may be transport
        # damage that a re-send fixes, so those change nothing.
        if isinstance(exc, ValidationError) and self._ledger.refuse(worker_id, lease_id,
                                                                    reject_reason(exc)):
            self._merger.retain()
            self._check_finished()

    def _check_finished(self) -> None:
        if self._ledger.counts()["parked"] > len(self._parked_logged):
            self._log_parked()
        merger = getattr(self, "_merger", None)
        if self._ledger.finished and (merger is None or merger.idle):
            if merger is not None and self._owner.flush_due:
                merger.request_flush()     # the policy applies what it holds first: one more version
                return
            journal = getattr(self, "_journal", None)
            if (journal is not None and journal.durable and not journal.journaling and merger is not None
                    and merger.snapshots.written_version < self.version):
                self._finish_wanted.set()      # the last results are in no journal: snapshot first
            else:
                self._set_finished()

    def _set_finished(self) -> None:
        """The run is finished; say so at WARNING if the policy still holds accepted results it
        never applied: a policy that buffers without a ``flush`` (or whose flush applied nothing
        or failed). They are acknowledged to their workers but missing from the final model, and
        nothing else would tell. (A built-in buffering policy flushes its buffer first.)"""
        if not self._finished.is_set() and self._owner.held:
            has_flush = callable(getattr(self._owner.policy, "flush", None))
            why = ("its end-of-run flush applied nothing" if has_flush else
                   "it has no flush(model, state) method to apply them at the end of the run")
            log.warning(
                "the run finished with %d accepted result(s) that merge policy %r holds without "
                "having applied them to the model (its merge returned None for each since version "
                "%d, and %s): the final model does not include them. See 'A buffer at the end of "
                "the run' in docs/policies.md", self._owner.held, self._owner.policy.name,
                self.version, why)
        self._finished.set()

    def _log_parked(self) -> None:
        """Every newly parked unit, once, at ERROR: a unit is never given up on silently."""
        for unit_id, why in self._ledger.parked().items():
            if unit_id not in self._parked_logged:
                self._parked_logged.add(unit_id)
                self.activity.note("parked", unit=unit_id, detail=why)
                log.error("unit %s parked: %s", unit_id, why)

    async def _expiry_loop(self) -> None:
        next_forget = self._clock() + FORGET_EVERY_S
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.expiry_interval_s):
                    await self._stop.wait()
            if self._health.refusing:
                continue    # workers were told to wait: their leases must not run out for it
            self._grace_left()      # a grace run out ends here too, not only at a lease request
            expired = self._ledger.expire()
            # also those a lease request or a heartbeat expired since the last pass: only this
            # pass's were noted, and the status page's events missed a lease that ran out while
            # its worker stalled, then heartbeated (revived) or lost its unit to another worker
            for lease_id, worker_id, unit_id in self._ledger.take_expired():
                self.activity.note("expired", worker=worker_id, unit=unit_id, detail=f"lease {lease_id}")
            self._merger.retain(rescan=True)   # with many leases, the merges do not scan them
            if expired:
                self._check_finished()
            if self._clock() >= next_forget:
                next_forget = self._clock() + FORGET_EVERY_S
                forgotten = self._ledger.forget_workers()
                if forgotten:
                    log.debug("forgot %d worker(s) silent for %.0fs (they register again if they "
                              "come back)", forgotten, self.config.forget_workers_s or 0.0)

    async def _stale_temp_loop(self) -> None:
        """:meth:`_remove_stale_temp` every ``STALE_TEMP_EVERY_S``, in a loop of its own: a file
        system that hangs in it (a hung NFS mount) stalls only this loop, not the leases' expiry,
        and the coordinator's close does not wait for it."""
        due = self._clock() + STALE_TEMP_EVERY_S
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.expiry_interval_s):
                    await self._stop.wait()
            if self._clock() >= due and not self._stop.is_set():
                due = self._clock() + STALE_TEMP_EVERY_S
                await _first_of(self._remove_stale_temp(), self._stop.wait())

    async def _finish_loop(self) -> None:
        """Durability ``snapshot``: the run is finished (and workers told so, and they leave) only
        once a snapshot holds its last results. Those are in no journal: a crash before would lose
        them, and with every worker gone nobody would train their units again, so a restarted run
        would stop short and call itself finished."""
        slot = self._merger.snapshots
        while not self._stop.is_set():
            await _first_of(self._finish_wanted.wait(), self._stop.wait())
            if self._stop.is_set():
                return
            if not (self._ledger.finished and self._merger.idle):
                self._finish_wanted.clear()       # requeued meanwhile: not finished after all
                continue
            if slot.written_version >= self.version:
                self._finish_wanted.clear()
                self._set_finished()
                continue
            slot.written.clear()
            self._merger.request_capture()        # a capture of the last merge, unless one waits
            slot.retry()                          # or a failed write of it, tried again
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await _first_of(slot.written.wait(), self._stop.wait())

    async def _snapshot_loop(self) -> None:
        """Writes what the merge loop captured; asks for a capture when the interval passes."""
        while not self._stop.is_set():
            try:
                async with asyncio.timeout(self.config.snapshot_interval_s):
                    await self._merger.snapshots.ready.wait()
            except TimeoutError:
                self._merger.request_capture()
                continue
            if self._stop.is_set():
                return        # aclose() writes what is left
            try:
                await self._write_snapshot()
            except PrefixTakenError:
                raise                   # another coordinator writes this run: this one stops
            except Exception as exc:    # a failed snapshot must never stop the coordinator
                self.metrics.snapshot_failures += 1
                # durability snapshot, every unit done: the run finishes only once a snapshot
                # holds its last results, so this write is needed (an outage: bounded by
                # storage_outage_limit_s, then exit 4) rather than one a later snapshot makes good
                final = self._finish_wanted.is_set()
                if not final:
                    log.warning("snapshot failed (the next one retries): %r", exc)
                elif not self._final_failing:
                    log.error("the final snapshot failed: %r. The run cannot finish until a snapshot "
                              "holds its last results (they are in no journal): retrying; workers "
                              "are told the run is finishing", exc)
                self._final_failing = final
                self._health.write_failed(exc, needed=final, finishing=final)
            else:
                self._final_failing = False
                self._health.write_ok()

    async def _storage_probe_loop(self) -> None:
        """While storage is unavailable: probe it; back, take results again (and snapshot soon, so
        what the storage may have lost is whole again); unavailable too long, stop the run."""
        health = self._health
        while not self._stop.is_set():
            if not health.unavailable.is_set():
                await _first_of(health.unavailable.wait(), self._stop.wait())
                continue
            # never sleep past the limit: the stop came one probe interval late (15 s for 10)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(health.next_probe_delay(), health.left_s() + 0.01)):
                    await self._stop.wait()
            if self._stop.is_set():
                return
            if health.relapses and health.over_limit():    # probes go through, results do not
                raise health.give_up()
            try:
                await self._journal.probe()
            except Exception as exc:
                health.probe_failed(exc)
                if health.over_limit():
                    raise health.give_up() from exc
                continue
            health.probe_ok()
            self._merger.request_capture()

    # -- views ------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        self._check_recovered()
        return self._owner.version

    @property
    def run_id(self) -> str:
        """The run this coordinator serves (kept across restarts on its storage): what a worker's
        saved identity belongs to, whichever address reaches the coordinator."""
        return self._journal.run_id

    @property
    def finished(self) -> bool:
        """Every unit is done or parked and every accepted result merged (possibly at start-up:
        a restart of a finished run)."""
        return self._finished.is_set()

    @property
    def took_over(self) -> bool:
        """This start took the run over from a coordinator that stopped uncleanly (killed, its
        machine lost): workers may still be waiting on that one, for leases and receipts."""
        lease = self._prefix_lease
        return lease is not None and lease.took_over

    def model_etag(self, version: int) -> str:
        """An opaque, strong ETag for a held version (quote it in the header yourself)."""
        self._check_recovered()
        return self._owner.etag(self._journal.run_id, version)

    def model_payload(self, version: int | None = None,
                      codec: str | None = None) -> AsyncIterator[bytes]:
        """The wire payload (kind ``model``, meta ``{version, digest}``) of a held version;
        :class:`VersionNotFoundError` (now, not when iterated) for one that is not held."""
        self._check_running()
        codec = codec or self.config.model_codec
        resolve_codec(codec)

        def count(n: int) -> None:
            self.metrics.bytes_out += n

        return self._owner.payload(self.version if version is None else version, codec, count)

    def model(self, version: int | None = None) -> ModelState:
        """A private copy of a held version (for the embedding program, tests and evaluation)."""
        self._check_recovered()
        return self._owner.copy(version)

    async def wait_finished(self) -> None:
        """Return when every unit is done or parked and every accepted result merged."""
        self._check_recovered()         # not entered: nothing would ever finish (or close) it
        finished = asyncio.ensure_future(self._finished.wait())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({finished, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            finished.cancel()
            closed.cancel()
        if not self._finished.is_set():
            if isinstance(self._failure, PolicyFailedError):
                raise self._failure    # the configuration's fault: ``vcasync coordinator`` exits 2
            raise ClosedError("the coordinator closed before the run finished")

    def record_eval(self, version: int, values: Mapping[str, float]) -> None:
        """An evaluation of model ``version`` (e.g. ``{"accuracy": 0.91, "loss": 0.3}``), shown as a
        curve on the status page. The hook for a run's evaluator: call it in-process, or let a client send
        it (:meth:`vcasync.worker._client.CoordinatorClient.report_eval`). Bad names or values raise
        :class:`~vcasync.errors.FrameError`; at most eight names per run."""
        self._check_recovered()
        if version > self.version:
            raise FrameError(f"model version {version} does not exist yet (latest {self.version})",
                             field="version")
        self.activity.record_eval(version, values)

    def live_status(self, *, workers: int = 200, events: int = 50) -> dict[str, Any]:
        """What the status page shows beyond :meth:`status`: workers by state and the ``workers``
        most recently seen, the newest ``events``, merges per second and evaluation curves."""
        if self._phase in ("new", "starting"):
            return {"worker_states": {}, "worker_rows": [], **self.activity.view(events)}
        states, rows = self._ledger.worker_rows(workers)
        return {"worker_states": states, "worker_rows": rows, **self.activity.view(events)}

    def _gauges(self) -> dict[str, float]:
        if self._phase in ("new", "starting"):
            return self._health.gauges()
        stats = self._ledger.stats
        return {"version": self.version, "workers_alive": self._ledger.workers_alive(),
                "workers_known": self._ledger.num_workers,
                "leases_issued_total": stats["issued"], "leases_expired_total": stats["expired"],
                "leases_reissued_total": stats["reissued"],
                "leases_released_total": stats["released"],
                "leases_refused_total": stats["refused"],
                "units_requeued_total": stats["requeued"],
                "worker_backoffs_total": stats["backoffs"],
                "workers_quarantined": self._ledger.workers_quarantined(),
                **{f"units_{k}": v for k, v in self._ledger.counts().items()},
                "merge_queue": self._merger.queued,
                "retained_versions": len(self._owner.versions.numbers()),
                "process_cpu_seconds_total": time.process_time(),
                **self._health.gauges()}

    def status(self) -> dict[str, Any]:
        """A JSON-able summary for ``GET /v1/status``."""
        phase = self._phase
        if phase == "running" and self._finished.is_set():
            phase = "finished"       # still serving (lingering) so workers hear it
        out: dict[str, Any] = {"phase": phase, "durability": self.config.durability,
                               "policy": self._policy.name, "storage": self._health.status(),
                               # who holds the run (host, pid, since, renewal age); null without
                               # an owner lease (durability "none"; before it is taken, once released)
                               "owner": None if self._prefix_lease is None else self._prefix_lease.info()}
        if self._failure is not None:
            out["error"] = f"{type(self._failure).__name__}: {self._failure}"
        if self._phase in ("new", "starting") or not self._recovered:   # (or its start failed)
            return out
        out.update({
            "run_id": self._journal.run_id, "version": self.version,
            "finished": self._finished.is_set(), "units": self._ledger.counts(),
            # accepted results merged without changing the model since the last version (a
            # buffering policy's buffer); 0 at the end once the policy's flush applied them
            "held_results": self._owner.held,
            "parked": dict(list(self._ledger.parked().items())[:100]),
            "workers": {"known": self._ledger.num_workers, "alive": self._ledger.workers_alive(),
                        "quarantined": self._ledger.workers_quarantined(),
                        "left": self._ledger.workers_left()},
            "failing_workers": dict(list(self._ledger.worker_health().items())[:100]),
            "leases": dict(self._ledger.stats), "retained_versions": self._owner.versions.numbers(),
            "journal": self._journal.status(), "metrics": self.metrics.as_dict(),
            "suspects": self.metrics.suspects(),
        })
        return out


async def _first_of(*aws: Any) -> None:
    """Wait until the first of ``aws`` is done; cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
