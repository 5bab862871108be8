"""Work units, leases and deadlines: a pure state machine with an injected clock.

No asyncio and no IO: every method runs to completion and reads the time only through ``clock``, so
lease expiry is tested in virtual time and the coordinator can snapshot and replay it.

Each unit is always in exactly one state::

    queued --lease--> leased --result--> done
       ^                 |
       +--expire/release-+--(max_attempts failures)--> parked --late result--> done

* A lease's **deadline** is a *progress* deadline: the next heartbeat that reports progress (or the
  result) must arrive before it. Its length adapts to the worker's measured speed, an EWMA of seconds
  per step: ``max(lease_timeout_s, deadline_slack * seconds_per_step)``, so a slow machine is not
  reissued for being slow and a dead fast one is noticed within ``lease_timeout_s``.
* An expired or released lease puts its unit back at the *front* of the queue. Its result, if it comes
  late while the unit is still open, is still accepted (it is useful work); whoever holds the unit then
  is told the unit closed. A heartbeat on an expired lease revives it only when it reports progress
  and nobody took the unit yet: a hung trainer that keeps heartbeating must not keep its unit from
  the idle workers.
* Failures (an expired lease, a release marked as a failure, an upload refused as invalid, a result
  rejected for counters its training broke: ``BLAMED_REASONS``) are
  attributed to the worker that held the lease; a valid result the coordinator could not use (too
  stale, refused by the policy) counts against the unit only. A worker with failures in a row is backed off
  (:class:`WorkerBackoffError`, ``worker_backoff_s * 2**(n-1)``) and after ``quarantine_after`` in a
  row quarantined for ``quarantine_s`` (:class:`WorkerQuarantinedError`); an accepted result resets
  its count. A unit is
  offered first to workers that have not failed it, and parked only after ``max_attempts`` failures
  on at least ``park_after_workers`` distinct workers. An operator can :meth:`Ledger.requeue` it.
* A partial result (preemption: fewer steps than asked) closes its unit and queues a *remainder* unit
  for the steps left (:meth:`WorkUnit.remainder`), so every unit id is merged at most once.
* Lease ids are signed with ``secret``: after a coordinator restart a lease the restored state does
  not know (granted after the last snapshot) is *adopted* instead of refused, so the work is not lost.
"""

from __future__ import annotations

import heapq
import math
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import attrgetter
from typing import Any

from .._redact import one_line
from ..errors import (
    ConfigError,
    FrameError,
    LeaseExpiredError,
    LeaseLimitError,
    LeaseNotFoundError,
    LedgerError,
    NotLeaseHolderError,
    NoWorkAvailableError,
    UnitClosedError,
    ValidationError,
    WorkerBackoffError,
    WorkerQuarantinedError,
    WorkersFullError,
)
from ._columns import (
    LeaseArchive,
    UnitSpecs,
    UnitStates,
    lease_records,
    restore_unit_states,
    unit_specs,
    worker_flag,
    worker_table,
    worker_table_rows,
)
from ._lease_id import LeaseIdSigner
from ._types import (
    LeaseRecord,
    LeaseState,
    LedgerConfig,
    ResultCheck,
    UnitRecord,
    UnitState,
    WorkerRecord,
    worker_info,
    worker_name,
)
from ._units import (
    BLAMED_REASONS,
    LeaseGrant,
    Receipt,
    ReceiptStatus,
    WorkUnit,
    check_user_params,
    make_units,
)

__all__ = ["CAPTURED_WALL", "LeaseGrant", "LeaseState", "Ledger", "LedgerConfig", "Receipt", "ResultCheck",
           "UnitState", "WorkUnit", "make_units"]

Clock = Callable[[], float]
#: 2: columns (:mod:`._columns`); 1, rows, is still read.
SNAPSHOT_FORMAT = 2
#: Optional key of a snapshot: the wall clock (``time.time()``) when it was captured, which the
#: coordinator adds (:meth:`Ledger.snapshot` itself stays a function of the ledger alone).
CAPTURED_WALL = "captured_wall"


def down_since_capture(data: Mapping[str, Any]) -> float:
    """Seconds since ``data`` (a snapshot) was captured, by this machine's wall clock against the
    capturing one's: 0 when it says nothing, and never negative (a restarting machine whose clock
    is behind counts none)."""
    wall = data.get(CAPTURED_WALL)
    if not isinstance(wall, int | float) or isinstance(wall, bool) or not math.isfinite(wall):
        return 0.0
    return max(0.0, time.time() - wall)
#: A token issued this long before a snapshot's capture still counts as joined after it (the two
#: are stamped by different clocks a moment apart).
RECALL_SLACK_S = 5.0
#: How far into the queue :meth:`Ledger.lease` looks for a unit the worker has not failed yet.
_PICK_WINDOW = 256
#: "The rest of the run" as a finite number of seconds (snapshots and JSON hold it).
_FOREVER = 1e12
#: A join when ``max_workers`` records are held looks for records to forget (one pass over them
#: all) at most this often: a join flood must not cost a pass per refused join.
_FULL_SWEEP_S = 1.0
#: How long a join refused for ``max_workers`` is told to wait (the coordinator forgets silent
#: workers once a minute).
FULL_RETRY_S = 30.0


def _printable(text: str, limit: int = 200) -> str:
    """A worker's words as they may appear in the coordinator's log and status: one line, no
    control characters (a worker must not forge log lines), bounded."""
    return one_line(text, limit)


#: Lease states whose result may still arrive and be merged: the *open* leases. The others
#: (closed, superseded) are over and never change again.
_MAY_DELIVER = frozenset({LeaseState.ACTIVE, LeaseState.EXPIRED, LeaseState.RELEASED})

#: Rejections for the coordinator's own reasons (the model moved on, a base is gone): training the
#: unit again fixes them, so they never count toward parking it. Any other rejection (the policy
#: refused the result itself) is a failure of the unit on that worker.
COORDINATOR_REASONS = frozenset({"too_stale", "base_unavailable"})


#: How many expiries :meth:`Ledger.take_expired` keeps between two calls (the status page's event
#: ring holds 200 events).
EXPIRED_KEPT = 1024


class Ledger:
    """Which unit is where, who holds which lease until when, and what every result came to."""

    def __init__(self, units: Iterable[WorkUnit], *, config: LedgerConfig | None = None,
                 clock: Clock, secret: bytes | None = None) -> None:
        self.config = config or LedgerConfig()
        self._clock = clock
        self._signer = LeaseIdSigner(secret if secret is not None else secrets.token_bytes(32))
        self._units: dict[str, UnitRecord] = {}
        self._order: list[UnitRecord] = []
        self._queue: deque[str] = deque()
        self._leases: dict[str, LeaseRecord] = {}     # every lease ever granted or adopted
        self._open: dict[str, LeaseRecord] = {}       # those whose result may still come
        self._archive = LeaseArchive()                # the others, as snapshot columns
        self._specs = UnitSpecs()
        self._states = UnitStates()                   # kept as columns: touch a unit you change
        self._parked: dict[int, UnitRecord] = {}      # by unit index (status reads them often)
        self._workers: dict[str, WorkerRecord] = {}
        # worker id -> ids of the leases it was given or resumed that may still be active (pruned
        # when read: see _active_leases), for max_leases_per_worker without a pass over every lease
        self._held: dict[str, set[str]] = {}
        self._swept_at = -math.inf     # when a full join last looked for records to forget
        self._heap: list[tuple[float, str]] = []   # (deadline, lease id); stale entries are skipped
        # (lease id, worker id, unit id) of the leases expired since take_expired(), wherever found:
        # a lease request or a heartbeat expires leases too, and the coordinator's status events
        # missed those; bounded, for a ledger nobody drains (the simulator)
        self._expired_since: deque[tuple[str, str, str]] = deque(maxlen=EXPIRED_KEPT)
        self._count: dict[UnitState, int] = dict.fromkeys(UnitState, 0)
        self.stats: dict[str, int] = dict.fromkeys(
            ("issued", "reissued", "expired", "released", "revived", "adopted", "parked",
             "accepted", "rejected", "refused", "requeued", "backoffs", "quarantined", "left"), 0)
        for unit in units:
            self._add_unit(unit, front=False)
        if not self._order:
            raise ConfigError("a ledger needs at least one work unit")

    # -- workers ----------------------------------------------------------------------------------
    def join(self, name: str = "", info: Mapping[str, Any] | None = None) -> str:
        """Register a worker and return its new id; :class:`WorkersFullError` when ``max_workers``
        records are held and none can be forgotten (nothing changes then)."""
        self._make_room()
        record = WorkerRecord("w-" + secrets.token_hex(8), worker_name(name),
                              worker_info(dict(info or {})), self._clock())
        self._workers[record.worker_id] = record
        return record.worker_id

    def _make_room(self) -> None:
        """Below ``max_workers`` records, forgetting those :meth:`forget_workers` would (at most
        once a :data:`_FULL_SWEEP_S`), or :class:`WorkersFullError`."""
        cap = self.config.max_workers
        if cap is None or len(self._workers) < cap:
            return
        now = self._clock()
        if self.config.forget_workers_s is not None and now - self._swept_at >= _FULL_SWEEP_S:
            self._swept_at = now
            if self.forget_workers() and len(self._workers) < cap:
                return
        raise WorkersFullError(
            f"the coordinator holds {len(self._workers)} worker records, its max_workers ({cap}), "
            "and none can be forgotten yet: no new worker is registered now; join again later "
            "(workers that joined are not affected)",
            retry_after=FULL_RETRY_S, limit=int(cap), held=len(self._workers))

    def _touch(self, worker_id: str, *, heard: bool = True) -> WorkerRecord:
        # Workers that joined after the last snapshot are unknown after a restart; the server has
        # already authenticated them, so they are re-registered rather than refused. ``heard``
        # False (a result's upload): a preempted worker delivering on its way out stays preempted.
        if not isinstance(worker_id, str) or not 0 < len(worker_id) <= 128:
            raise ValidationError("worker id must be a non-empty string of at most 128 chars",
                                  reason="bad_worker_id")
        now = self._clock()
        w = self._workers.get(worker_id)
        if w is None:
            w = self._workers[worker_id] = WorkerRecord(worker_id, "", {}, now)
        w.last_seen = now
        if heard:
            w.preempted = w.left = False
        return w

    def leave(self, worker_id: str) -> bool:
        """The worker says it exits (a clean exit: the run finished, a SIGTERM, its ``max_units``):
        shown ``left`` and no longer counted alive, until it is heard from again. Its leases stay as
        they are: a preempted worker keeps its lease and checkpoint for a restart to resume, and an
        open lease of a worker that left still expires at its deadline. True when it was not
        ``left`` already (a second leave changes nothing)."""
        w = self._touch(worker_id, heard=False)
        if w.left:
            return False
        w.left = True
        self.stats["left"] += 1
        return True

    def _window(self, w: WorkerRecord) -> float:
        cfg = self.config
        return cfg.lease_timeout_s if w.spw is None else max(cfg.lease_timeout_s,
                                                              cfg.deadline_slack * w.spw)

    def _measure(self, w: WorkerRecord, lease: LeaseRecord, steps_done: int, now: float) -> None:
        steps = steps_done - lease.steps_done
        if steps > 0:
            sample = max(now - lease.progress_at, 0.0) / steps
            a = self.config.speed_smoothing
            w.spw = sample if w.spw is None else (1 - a) * w.spw + a * sample
            lease.steps_done = steps_done
            lease.progress_at = now

    # -- leases -----------------------------------------------------------------------------------
    def lease(self, worker_id: str, base_version: int) -> LeaseGrant:
        """Grant the next queued unit, or raise :class:`NoWorkAvailableError`."""
        w = self._touch(worker_id)
        self.expire()
        if not self._queue:
            raise self._no_work()
        self._admit(w)
        self._within_cap(w)
        u = self._units[self._pick(worker_id)]
        lease_id = self._signer.make(u.index, u.unit.unit_id, base_version)
        now = self._clock()
        lease = LeaseRecord(lease_id, u.unit.unit_id, worker_id, base_version, now + self._window(w), now)
        self._keep(lease)
        self._activate(u, lease)
        self._count_issue(u)
        return self._grant(lease, resumed=False)

    def _count_issue(self, u: UnitRecord) -> None:
        self.stats["issued"] += 1
        if u.issued:
            self.stats["reissued"] += 1
        self._states.touch(u)
        u.issued += 1

    def _admit(self, w: WorkerRecord) -> None:
        """Refuse a lease to a quarantined or backed-off worker, with a typed answer it can obey."""
        wait = w.backoff_until - self._clock()
        if w.quarantined is not None and wait > 0:
            until = "for the rest of the run" if self.config.quarantine_s is None \
                else f"for {wait:.0f}s more"
            raise WorkerQuarantinedError(
                f"worker {w.worker_id} is quarantined {until}: it failed {w.streak} units in a row "
                f"(last: {w.quarantined}). Fix the machine or the trainer",
                retry_after=None if self.config.quarantine_s is None else round(wait, 3))
        if w.quarantined is not None:     # served its time: one more try (one failure re-quarantines)
            w.quarantined = None
        if wait > 0:
            raise WorkerBackoffError(
                f"worker {w.worker_id} failed its last {w.streak} unit(s) (last: {w.last_failure}); "
                f"backing off: no lease for {wait:.3g}s more", retry_after=round(wait, 3))

    def _within_cap(self, w: WorkerRecord) -> None:
        """Refuse a lease to a worker holding ``max_leases_per_worker`` active leases already
        (:class:`LeaseLimitError`), told to ask again when the first of them is due to expire."""
        cap = self.config.max_leases_per_worker
        if cap is None:
            return
        held = self._active_leases(w.worker_id)
        if len(held) < cap:
            return
        first = min(lse.deadline for lse in held)
        wait = min(max(first - self._clock(), 0.1), self.config.heartbeat_s)
        raise LeaseLimitError(
            f"worker {w.worker_id} holds {len(held)} active leases, the coordinator's "
            f"max_leases_per_worker ({cap}): no other until one of them ends (a result, a release "
            "or its expiry)", retry_after=round(wait, 3), limit=int(cap), held=len(held))

    def _active_leases(self, worker_id: str) -> list[LeaseRecord]:
        """The active leases ``worker_id`` holds; drops the ids that are not any more."""
        ids = self._held.get(worker_id)
        if not ids:
            return []
        live = [lse for lid in ids if (lse := self._open.get(lid)) is not None
                and lse.state is LeaseState.ACTIVE and lse.worker_id == worker_id]
        if live:
            self._held[worker_id] = {lse.lease_id for lse in live}
        else:
            del self._held[worker_id]
        return live

    def _note_held(self, lease: LeaseRecord) -> None:
        """``lease`` is active for its worker now (granted, revived, resumed or restored)."""
        ids = self._held.setdefault(lease.worker_id, set())
        ids.add(lease.lease_id)
        if len(ids) > 16:     # a worker that only resumes and heartbeats: keep its set small
            self._active_leases(lease.worker_id)

    def _pick(self, worker_id: str) -> str:
        """The first queued unit this worker has not failed (near the front), else the first."""
        for i, unit_id in enumerate(self._queue):
            if i >= _PICK_WINDOW:
                break
            if worker_id not in self._units[unit_id].failed_by:
                del self._queue[i]
                return unit_id
        return self._queue.popleft()

    def _no_work(self) -> NoWorkAvailableError:
        leased = self._count[UnitState.LEASED]
        if not leased:
            return NoWorkAvailableError("every work unit is done or parked; the run is finished",
                                        retry_after=self.config.heartbeat_s, finished=True)
        # The earliest deadline (possibly stale, which only makes the hint a little early).
        first = self._heap[0][0] if self._heap else self._clock()
        wait = min(max(first - self._clock(), 0.1), self.config.heartbeat_s)
        return NoWorkAvailableError(f"no queued work; {leased} units are leased",
                                    retry_after=round(wait, 3))

    def _set(self, u: UnitRecord, state: UnitState) -> None:
        self._count[u.state] -= 1
        self._count[state] += 1
        self._states.touch(u)
        if u.state is UnitState.PARKED:
            del self._parked[u.index]
        if state is UnitState.PARKED:
            self._parked[u.index] = u
        u.state = state

    def _activate(self, u: UnitRecord, lease: LeaseRecord) -> None:
        self._set(u, UnitState.LEASED)
        u.lease_id = lease.lease_id
        lease.state = LeaseState.ACTIVE
        heapq.heappush(self._heap, (lease.deadline, lease.lease_id))
        self._note_held(lease)

    def _grant(self, lease: LeaseRecord, *, resumed: bool) -> LeaseGrant:
        return LeaseGrant(lease.lease_id, self._units[lease.unit_id].unit, lease.base_version,
                          max(lease.deadline - self._clock(), 0.0), self.config.heartbeat_s, resumed)

    def granted_here(self, lease_id: str) -> bool:
        """Whether ``lease_id`` was signed with this run's secret for one of its units (a journal
        entry copied in from another run's storage is not)."""
        return self._signer.parse(lease_id, lambda i: self._order[i].unit.unit_id
                                  if 0 <= i < len(self._order) else None) is not None

    def _find(self, lease_id: str, worker_id: str) -> LeaseRecord:
        """The lease, adopting a validly signed one the ledger does not know (lost in a restart)."""
        lease = self._leases.get(lease_id)
        if lease is not None:
            return lease
        parsed = self._signer.parse(lease_id, lambda i: self._order[i].unit.unit_id
                                    if 0 <= i < len(self._order) else None)
        if parsed is None:
            raise LeaseNotFoundError(f"no lease {lease_id[:80]!r}: it was never issued here",
                                     lease_id=lease_id)
        index, base_version = parsed
        u = self._order[index]
        now = self._clock()
        lease = LeaseRecord(lease_id, u.unit.unit_id, worker_id, base_version, now, now,
                       state=LeaseState.EXPIRED)
        self._keep(lease)
        self.stats["adopted"] += 1
        self._count_issue(u)      # granted after the last snapshot: the counters must include it
        if u.state is UnitState.DONE:
            self._end(lease, LeaseState.SUPERSEDED)
        elif u.state is UnitState.QUEUED:
            self._revive(u, lease)
        return lease

    def _revive(self, u: UnitRecord, lease: LeaseRecord) -> None:
        self._queue.remove(u.unit.unit_id)
        lease.deadline = self._clock() + self._window(self._touch(lease.worker_id))
        self._activate(u, lease)
        self.stats["revived"] += 1

    def _live(self, lease: LeaseRecord, *, action: str, revive: bool = True) -> UnitRecord:
        """The lease's unit when the lease is (or can be made) active again, else a clear error.

        ``revive``: an expired lease whose unit nobody took yet may become active again.
        """
        u = self._units[lease.unit_id]
        if lease.state is LeaseState.ACTIVE and lease.deadline < self._clock():
            self.expire()
        if revive and lease.state is LeaseState.EXPIRED and u.state is UnitState.QUEUED:
            self._revive(u, lease)
        if lease.state is LeaseState.ACTIVE:
            return u
        if lease.state in (LeaseState.CLOSED, LeaseState.SUPERSEDED) or u.state is UnitState.DONE:
            raise UnitClosedError(f"cannot {action}: unit {u.unit.unit_id!r} already has a result; "
                                  "lease new work", unit_id=u.unit.unit_id, lease_id=lease.lease_id)
        if lease.state is LeaseState.RELEASED:
            raise LeaseNotFoundError(f"cannot {action}: lease {lease.lease_id!r} was released by its "
                                     "holder; lease new work", unit_id=u.unit.unit_id,
                                     lease_id=lease.lease_id)
        raise LeaseExpiredError(f"cannot {action}: lease {lease.lease_id!r} expired and unit "
                                f"{u.unit.unit_id!r} is {u.state}; a result sent before it closes is "
                                "still accepted", unit_id=u.unit.unit_id, lease_id=lease.lease_id)

    def _holder(self, lease: LeaseRecord, worker_id: str) -> None:
        if lease.worker_id != worker_id:
            raise NotLeaseHolderError(f"lease {lease.lease_id!r} belongs to another worker",
                                      unit_id=lease.unit_id, lease_id=lease.lease_id)

    def resume(self, worker_id: str, lease_id: str) -> LeaseGrant:
        """Pick up a lease again after a worker restart; the caller becomes its holder.

        Another worker's lease is taken over only once it is no longer live (expired, or unknown
        after a restart and adopted): a live lease stays its holder's, whoever knows its id.
        """
        w = self._touch(worker_id)
        lease = self._find(lease_id, worker_id)
        if lease.worker_id != worker_id and lease.state is LeaseState.ACTIVE \
                and lease.deadline >= self._clock():
            self._holder(lease, worker_id)
        self._live(lease, action="resume")
        lease.worker_id = worker_id
        lease.deadline = max(lease.deadline, self._clock() + self._window(w))
        heapq.heappush(self._heap, (lease.deadline, lease.lease_id))
        self._note_held(lease)
        return self._grant(lease, resumed=True)

    def heartbeat(self, worker_id: str, lease_id: str, steps_done: int, *,
                  stopping: bool = False) -> LeaseGrant:
        """Record progress; progress pushes the deadline out by the worker's window. ``stopping``:
        the worker is preempted and keeps the lease for a restart to resume: it is ``preempted``
        until it is heard from again, as one that released its lease without fault is."""
        w = self._touch(worker_id)
        lease = self._find(lease_id, worker_id)
        self._holder(lease, worker_id)
        steps = self._units[lease.unit_id].unit.steps
        if isinstance(steps_done, bool) or not isinstance(steps_done, int) \
                or not 0 <= steps_done <= steps:
            raise ValidationError(f"steps_done must be an int in [0, {steps}], got {steps_done!r}",
                                  reason="bad_progress")
        # Only progress revives an expired lease: a hung trainer's heartbeats must not hold the unit.
        self._live(lease, action="heartbeat", revive=steps_done > lease.steps_done)
        now = self._clock()
        if steps_done > lease.steps_done:
            self._measure(w, lease, steps_done, now)
            lease.deadline = max(lease.deadline, now + self._window(w))
            heapq.heappush(self._heap, (lease.deadline, lease.lease_id))
        elif steps_done < lease.steps_done:   # restarted from an older checkpoint: no extension
            lease.steps_done, lease.progress_at = steps_done, now
        w.preempted = stopping
        return self._grant(lease, resumed=False)

    def release(self, worker_id: str, lease_id: str, reason: str = "", *, failed: bool = True,
                preempted: bool = True) -> None:
        """The holder gives the lease up; its unit goes back to the queue. Idempotent.

        ``failed``: the unit failed on this worker (a trainer error), which counts against both;
        False for a release that is nobody's fault (preemption, a base model no longer served).
        """
        self._touch(worker_id)
        lease = self._find(lease_id, worker_id)
        self._holder(lease, worker_id)
        if lease.state is LeaseState.ACTIVE:
            lease.state = LeaseState.RELEASED
            self.stats["released"] += 1
            why = f"released: {_printable(reason)}" if reason else "released"
            u = self._units[lease.unit_id]
            if failed:
                self._fail(u, lease, why)
                return
            self._workers[worker_id].preempted = preempted   # until it is heard from again
            if u.state is UnitState.LEASED and u.lease_id == lease.lease_id:
                u.lease_id = None
                self._set(u, UnitState.QUEUED)
                self._queue.appendleft(u.unit.unit_id)

    def refuse(self, worker_id: str, lease_id: str, reason: str) -> bool:
        """The holder's upload was refused (not finite, wrong spec, malformed): free the unit for
        reissue now rather than at the deadline. A corrected re-send is still welcome while the
        unit is open. True when a live lease was freed."""
        lease = self._leases.get(lease_id)
        if lease is None or lease.worker_id != worker_id or lease.state is not LeaseState.ACTIVE:
            return False
        lease.state = LeaseState.RELEASED
        self.stats["refused"] += 1
        self._fail(self._units[lease.unit_id], lease, f"result refused: {_printable(reason)}")
        return True

    def expire(self) -> list[str]:
        """Expire every active lease past its deadline; returns their ids."""
        now = self._clock()
        out: list[str] = []
        while self._heap and self._heap[0][0] < now:
            _, lease_id = heapq.heappop(self._heap)
            lease = self._leases.get(lease_id)
            if lease is None or lease.state is not LeaseState.ACTIVE or lease.deadline >= now:
                continue
            lease.state = LeaseState.EXPIRED
            self.stats["expired"] += 1
            self._fail(self._units[lease.unit_id], lease, "lease expired")
            out.append(lease_id)
            self._expired_since.append((lease_id, lease.worker_id, lease.unit_id))
        return out

    def take_expired(self) -> list[tuple[str, str, str]]:
        """``(lease id, worker id, unit id)`` of every lease expired since the last call (at most
        :data:`EXPIRED_KEPT`, the newest), whichever call expired it: :meth:`expire`, a lease
        request or a heartbeat."""
        out = list(self._expired_since)
        self._expired_since.clear()
        return out

    def _blame(self, worker_id: str, why: str) -> None:
        """A failure of ``worker_id``: back it off, and quarantine it after too many in a row."""
        w = self._workers.get(worker_id)
        if w is None:
            return
        w.streak += 1
        w.failures += 1
        w.last_failure = why[:300]
        w.backoff_until = self._clock() + self.config.backoff_s(w.streak)
        self.stats["backoffs"] += 1
        if w.streak >= self.config.quarantine_after and w.quarantined is None:
            w.quarantined = w.last_failure
            w.backoff_until = self._clock() + (_FOREVER if self.config.quarantine_s is None
                                               else self.config.quarantine_s)
            self.stats["quarantined"] += 1

    def _fail(self, u: UnitRecord, lease: LeaseRecord, why: str, *, blame: bool = True,
              on_worker: bool = False) -> None:
        """One failed attempt at ``u`` by the lease's worker; requeue or park ``u`` unless another
        lease holds it now. Parking needs ``max_attempts`` failures on ``park_workers`` workers.

        ``blame``: the worker broke it (expired, released as failed, refused upload, a rejection
        in ``BLAMED_REASONS``), which backs the worker off; a valid result the coordinator could
        not use (stale, refused by the policy) counts against the unit only. ``on_worker``
        (without blame): still a failure of the unit on this worker for parking (the policy
        refused what it trained: a unit refused on every worker is parked, not trained again for
        ever).
        """
        if u.state is UnitState.DONE:
            return
        self._states.touch(u)
        u.attempts += 1
        u.last_failure = f"{why[:300]} (worker {lease.worker_id}, lease {lease.lease_id})"
        if blame or on_worker:
            u.failed_by.add(lease.worker_id)
        if blame:
            self._blame(lease.worker_id, why)
        if u.state is UnitState.LEASED and u.lease_id != lease.lease_id:
            return                                  # someone else is on it; judge them on their own
        if u.state is UnitState.QUEUED:
            self._queue.remove(u.unit.unit_id)
        u.lease_id = None
        if u.attempts >= self.config.max_attempts and len(u.failed_by) >= self.config.park_workers:
            if u.state is not UnitState.PARKED:
                self.stats["parked"] += 1
            self._set(u, UnitState.PARKED)
            u.reason = (f"failed {u.attempts} times on {len(u.failed_by)} workers; last: "
                        f"{u.last_failure}")
        elif u.state is not UnitState.PARKED:
            self._set(u, UnitState.QUEUED)
            self._queue.appendleft(u.unit.unit_id)
            if on_worker and not blame and u.attempts >= self.config.max_attempts:
                # refused by the policy past max_attempts, and too few workers failed it to park:
                # nothing else slows its worker, which was leased it again at once, for ever
                self._hold_off(lease.worker_id, u.attempts - self.config.max_attempts + 1)

    def _hold_off(self, worker_id: str, times: int) -> None:
        """Back ``worker_id`` off as a failing worker is after ``times`` failures in a row, without
        counting a failure of its own (no quarantine): the policy refused what it trained."""
        w = self._workers.get(worker_id)
        if w is None:
            return
        w.backoff_until = max(w.backoff_until, self._clock() + self.config.backoff_s(times))
        self.stats["backoffs"] += 1

    # -- results ----------------------------------------------------------------------------------
    def check_result(self, worker_id: str, lease_id: str) -> ResultCheck:
        """May this lease's result be merged? An earlier receipt comes back instead of merging twice."""
        self._touch(worker_id, heard=False)
        lease = self._find(lease_id, worker_id)
        self._holder(lease, worker_id)
        u = self._units[lease.unit_id]
        if lease.receipt is not None:
            return ResultCheck(u.unit, lease.base_version, lease.receipt)
        if u.state is UnitState.DONE or lease.state is LeaseState.SUPERSEDED:
            raise UnitClosedError(f"unit {u.unit.unit_id!r} already has a merged result (from lease "
                                  f"{u.done_by}); this one is not merged", unit_id=u.unit.unit_id,
                                  lease_id=lease_id)
        return ResultCheck(u.unit, lease.base_version, None)

    def receipt(self, lease_id: str) -> Receipt | None:
        lease = self._leases.get(lease_id)
        return None if lease is None else lease.receipt

    def record(self, lease_id: str, *, unit_id: str, worker_id: str, status: ReceiptStatus,
               version: int, reason: str | None = None, steps_done: int = 0,
               partial: bool = False, base_version: int = 0) -> Receipt:
        """Record what a result came to. Accepted: the unit is done (plus a remainder when partial).

        Works for leases the ledger never saw (journal replay after a restart). Raises
        :class:`UnitClosedError` when the unit already has a result: nothing is recorded twice.
        """
        lease = self._leases.get(lease_id)
        if lease is not None and lease.receipt is not None:
            return lease.receipt
        u = self._units.get(unit_id)
        if u is None or (lease is not None and lease.unit_id != unit_id):
            raise LedgerError(f"lease {lease_id!r} does not belong to unit {unit_id!r}",
                              unit_id=unit_id, lease_id=lease_id)
        if u.state is UnitState.DONE:
            raise UnitClosedError(f"unit {unit_id!r} already has a merged result",
                                  unit_id=unit_id, lease_id=lease_id)
        now = self._clock()
        if lease is None:   # replay, or granted after the last snapshot: it was issued all the same
            lease = LeaseRecord(lease_id, unit_id, worker_id, base_version, now, now,
                                state=LeaseState.EXPIRED)
            self._keep(lease)
            self._count_issue(u)
        receipt = Receipt(lease_id, unit_id, status, version, reason)
        if status == "rejected":
            self.stats["rejected"] += 1
            self._fail(u, lease, f"result rejected: {reason}", blame=reason in BLAMED_REASONS,
                       on_worker=reason not in COORDINATOR_REASONS)
        else:
            self.stats["accepted"] += 1
            w = self._workers.get(worker_id)
            if w is not None:
                w.done += 1
                w.streak, w.backoff_until = 0, 0.0     # it works again: no more back-off
                if lease.state is LeaseState.ACTIVE:
                    self._measure(w, lease, steps_done, now)
            if u.state is UnitState.QUEUED:
                self._queue.remove(unit_id)
            elif u.state is UnitState.LEASED and u.lease_id != lease_id and u.lease_id is not None:
                self._end(self._leases[u.lease_id], LeaseState.SUPERSEDED)
            self._set(u, UnitState.DONE)
            u.lease_id, u.done_by = None, lease_id
            if partial and 0 < steps_done < u.unit.steps:
                self._add_unit(u.unit.remainder(steps_done), front=True)
        lease.receipt = receipt
        self._end(lease, LeaseState.CLOSED)
        return receipt

    def _keep(self, lease: LeaseRecord) -> None:
        self._leases[lease.lease_id] = lease
        if lease.state is LeaseState.CLOSED or lease.state is LeaseState.SUPERSEDED:
            self._archive.append(lease)    # (identity tests: an enum's hash is Python code)
        else:
            self._open[lease.lease_id] = lease

    def _end(self, lease: LeaseRecord, state: LeaseState) -> None:
        """The lease is over (closed or superseded): it never changes again."""
        del self._open[lease.lease_id]
        lease.state = state
        self._archive.append(lease)

    def _add_unit(self, unit: WorkUnit, *, front: bool) -> None:
        if unit.unit_id in self._units:
            if front:    # a remainder id taken by a user's unit: make it unique, deterministically
                n = 1
                while f"{unit.unit_id}.{n}" in self._units:
                    n += 1
                unit = WorkUnit(f"{unit.unit_id}.{n}", unit.shard, unit.num_shards, unit.epoch,
                                unit.steps, unit.params)
            else:
                raise ConfigError(f"duplicate work unit id {unit.unit_id!r}")
        u = UnitRecord(unit, len(self._order))
        self._specs.append(u.index, unit)
        self._count[UnitState.QUEUED] += 1
        self._units[unit.unit_id] = u
        self._order.append(u)
        if front:
            self._queue.appendleft(unit.unit_id)
        else:
            self._queue.append(unit.unit_id)

    def add_units(self, units: Iterable[WorkUnit]) -> int:
        """Queue the units whose ids the ledger does not know yet (a restarted run grows). A
        unit whose params hold a key only remainders carry is refused, and none is added."""
        fresh = [u for u in units if u.unit_id not in self._units]
        for unit in fresh:
            check_user_params(unit.params, f"work unit {unit.unit_id!r}")
        for unit in fresh:
            self._add_unit(unit, front=False)
        return len(fresh)

    # -- operator actions and views ------------------------------------------------------------------
    def unpark(self, unit_id: str) -> None:
        """Give a parked unit a fresh set of attempts (an operator fixed whatever broke it)."""
        self.requeue([unit_id])

    def requeue(self, unit_ids: Iterable[str] | None = None) -> list[str]:
        """Queue parked units again with fresh attempts: every parked unit, or the named ones.

        All or nothing: a named unit that is unknown or not parked raises :class:`LedgerError` and
        nothing changes. Returns the ids requeued (in unit order).
        """
        if unit_ids is None:
            chosen = [self._parked[i] for i in sorted(self._parked)]
        else:
            chosen = []
            for unit_id in dict.fromkeys(unit_ids):
                u = self._units.get(unit_id) if isinstance(unit_id, str) else None
                if u is None:
                    raise LedgerError(f"no work unit {str(unit_id)[:80]!r}", unit_id=str(unit_id)[:256])
                if u.state is not UnitState.PARKED:
                    raise LedgerError(f"unit {unit_id!r} is {u.state}, not parked; nothing was "
                                      "requeued", unit_id=unit_id)
                chosen.append(u)
        for u in chosen:
            self._set(u, UnitState.QUEUED)
            u.attempts, u.reason, u.last_failure = 0, None, None
            u.failed_by.clear()
            self._queue.append(u.unit.unit_id)
        self.stats["requeued"] += len(chosen)
        return [u.unit.unit_id for u in chosen]

    @property
    def finished(self) -> bool:
        return not self._count[UnitState.QUEUED] and not self._count[UnitState.LEASED]

    def counts(self) -> dict[str, int]:
        return {state.value: n for state, n in self._count.items()}

    def unit_state(self, unit_id: str) -> UnitState:
        return self._units[unit_id].state

    def units(self) -> list[tuple[WorkUnit, UnitState]]:
        return [(u.unit, u.state) for u in self._order]

    def receipts(self) -> list[Receipt]:
        """What every recorded result came to (accepted or rejected), in no particular order."""
        return [x.receipt for x in self._leases.values() if x.receipt is not None]

    def parked(self) -> dict[str, str]:
        return {self._parked[i].unit.unit_id: self._parked[i].reason or ""
                for i in sorted(self._parked)}

    def worker_health(self) -> dict[str, dict[str, Any]]:
        """Workers that failed: id -> failures, failures in a row, back-off left, quarantine reason."""
        now = self._clock()
        return {w.worker_id: {"name": _printable(w.name), "failures": w.failures, "streak": w.streak,
                              "backoff_s": round(max(w.backoff_until - now, 0.0), 3),
                              "quarantined": w.quarantined, "last_failure": w.last_failure}
                for w in self._workers.values() if w.failures}

    def workers_quarantined(self) -> int:
        now = self._clock()
        return sum(1 for w in self._workers.values()
                   if w.quarantined is not None and w.backoff_until > now)

    def lease_state(self, lease_id: str) -> LeaseState | None:
        lease = self._leases.get(lease_id)
        return None if lease is None else lease.state

    def lease_holder(self, lease_id: str) -> str | None:
        lease = self._leases.get(lease_id)
        return None if lease is None else lease.worker_id

    def lease_unit(self, lease_id: str) -> str | None:
        lease = self._leases.get(lease_id)
        return None if lease is None else lease.unit_id

    def active_base_versions(self) -> set[int]:
        """Base versions of active leases: what their holders may still download."""
        return {lse.base_version for lse in self._open.values() if lse.state is LeaseState.ACTIVE}

    def open_base_versions(self) -> set[int]:
        """Base versions of leases whose result may still be merged: active, expired or released
        (a late result is still welcome), with no receipt yet and their unit not done."""
        return {lse.base_version for lse in self._open.values()
                if self._units[lse.unit_id].state is not UnitState.DONE}

    def worker_state(self, w: WorkerRecord, now: float) -> str:
        """``quarantined``, ``left`` (it said it exits, and keeps no lease for a restart: not
        preempted), ``backed_off``, ``preempted``, ``alive`` or ``gone`` (not seen within the alive
        window), the first that applies."""
        if w.backoff_until > now and w.quarantined is not None:
            return "quarantined"
        if w.left and not w.preempted:
            return "left"
        if w.backoff_until > now:
            return "backed_off"
        if w.preempted:
            return "preempted"
        return "alive" if w.last_seen >= now - self.config.alive_s else "gone"

    def worker_rows(self, limit: int = 200) -> tuple[dict[str, int], list[dict[str, Any]]]:
        """Workers by state (all of them), and the ``limit`` seen most recently: id, name, state,
        seconds since last seen, units done, failures."""
        now = self._clock()
        counts = dict.fromkeys(("alive", "preempted", "backed_off", "quarantined", "left", "gone"), 0)
        for w in self._workers.values():
            counts[self.worker_state(w, now)] += 1
        # rows only for the ``limit`` shown: a run's workers include every machine that ever
        # joined (100,000 rows built and sorted took ~0.3 s of the loop at each status poll)
        recent = heapq.nlargest(limit, self._workers.values(), key=_last_seen)
        return counts, [{"id": w.worker_id, "name": _printable(w.name), "state": self.worker_state(w, now),
                         "last_seen_s": round(max(now - w.last_seen, 0.0), 1),
                         "done": w.done, "failures": w.failures} for w in recent]

    def recall(self, worker_id: str, name: str, joined_s: float, *,
               since_capture_s: float | None = None) -> bool:
        """List a worker this ledger does not know that joined ``joined_s`` seconds ago (the
        coordinator's token records keep who joined; a snapshot captured before a crash does not
        hold those who joined after it): last seen at its join until it is heard again, so shown
        gone unless that was lately. ``since_capture_s``: how long ago the snapshot this ledger
        was restored from was captured: a worker that joined before it and is not in it was
        forgotten, one that joined after it is listed however long ago (it may have heartbeated
        until the crash); unknown (None), one the ledger would have forgotten by now is not
        listed. A known worker without a name (re-registered when a replayed result or a call
        named it) gets this one. True when listed."""
        try:
            kept = worker_name(name)
        except FrameError:      # a record written before names were checked: listed nameless
            kept = ""
        known = self._workers.get(worker_id)
        if known is not None:
            if not known.name:
                known.name = kept
            return False
        horizon = self.config.forget_workers_s
        if since_capture_s is not None:
            if joined_s > since_capture_s + RECALL_SLACK_S:
                return False
        elif horizon is not None and joined_s > horizon:
            return False
        self._workers[worker_id] = WorkerRecord(worker_id, kept, {}, self._clock() - max(joined_s, 0.0))
        return True

    def forget_workers(self) -> int:
        """Drop the records of workers silent for ``forget_workers_s`` that hold no open lease and
        are neither backed off nor quarantined; how many went. One pass over the workers: call it
        now and then (the coordinator: once a minute), not per request."""
        horizon = self.config.forget_workers_s
        if horizon is None:
            return 0
        now = self._clock()
        cutoff = now - horizon
        holding = {lse.worker_id for lse in self._open.values()}
        # a quarantine is a back-off until its end (for the rest of the run: ~forever)
        gone = [wid for wid, w in self._workers.items()
                if w.last_seen < cutoff and w.backoff_until <= now and wid not in holding]
        for wid in gone:
            del self._workers[wid]
            self._held.pop(wid, None)
        return len(gone)

    def workers_alive(self) -> int:
        """Workers heard from within ``alive_s`` that are neither preempted (one that said it is
        stopping was counted alive beside the status's preempted) nor quarantined (a worker told
        so stops: it was counted alive, beside the status's quarantined, for ``alive_s`` after it
        exited), nor left (one that said it exits: until 2026-12-07 it was counted alive for
        ``alive_s`` after it exited). A backed-off worker waits out its back-off running: alive."""
        now = self._clock()
        horizon = now - self.config.alive_s
        return sum(1 for w in self._workers.values() if w.last_seen >= horizon and not w.preempted
                   and not w.left and not (w.quarantined is not None and w.backoff_until > now))

    def workers_left(self) -> int:
        """Workers that said they exit and have not been heard from since (see :meth:`leave`)."""
        return sum(1 for w in self._workers.values() if w.left)

    def worker_speed(self, worker_id: str) -> float | None:
        w = self._workers.get(worker_id)
        return None if w is None else w.spw

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def num_leases(self) -> int:
        return len(self._leases)

    @property
    def num_open_leases(self) -> int:
        """Leases whose result may still come (active, expired, released): what a scan for
        bases reads, whatever the length of the run."""
        return len(self._open)

    # -- snapshot / restore ------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain data (``pack_tree``-able), units and leases as columns (:mod:`._columns`); times
        are stored relative to now. Reads only what may have changed: the units' states and the
        open leases (the units' specs and the leases that are over are kept as columns)."""
        now = self._clock()
        return {
            "format": SNAPSHOT_FORMAT,
            "units": {**self._specs.table(), **self._states.table(self._order)},
            "queue": list(self._queue),
            "leases": self._archive.table(self._open.values(), now),
            "workers": worker_table(self._workers.values(), now),
            "stats": dict(self.stats),
        }

    @classmethod
    def restore(cls, data: Mapping[str, Any], *, config: LedgerConfig | None = None, clock: Clock,
                secret: bytes | None = None, down_s: float = 0.0) -> Ledger:
        """Rebuild a ledger (from format 2 or 1); active leases get at least ``restore_grace_s``
        to reconnect. ``down_s``: how long the run was down since the capture (see
        :func:`down_since_capture`): workers were last seen that much longer ago than the snapshot
        says, so one seen just before a crash is not shown alive after an hour's outage, and a
        back-off or quarantine is served through it (one that ran out meanwhile is over)."""
        fmt = data.get("format")
        if fmt not in (1, SNAPSHOT_FORMAT):
            raise ConfigError(f"ledger snapshot format {fmt!r} is not 1 or {SNAPSHOT_FORMAT}")
        units = (unit_specs(data["units"]) if fmt == SNAPSHOT_FORMAT
                 else [WorkUnit.from_dict(row[0]) for row in data["units"]])
        self = cls(units, config=config, clock=clock, secret=secret)
        now = clock()
        if fmt == SNAPSHOT_FORMAT:
            restore_unit_states(data["units"], self._order)
            self._states.seed(data["units"])
            leases = lease_records(data["leases"], now)
        else:
            _unit_rows(data["units"], self._order)
            leases = _lease_rows(data["leases"], now)
        self._count = dict.fromkeys(UnitState, 0)
        for u in self._order:
            self._count[u.state] += 1
            if u.state is UnitState.PARKED:
                self._parked[u.index] = u
        self._queue = deque(data["queue"])
        for lease, remaining in leases:
            if lease.state is LeaseState.ACTIVE:
                lease.deadline = now + max(remaining, self.config.grace_s)
                heapq.heappush(self._heap, (lease.deadline, lease.lease_id))
            self._keep(lease)
            if lease.state is LeaseState.ACTIVE:
                self._note_held(lease)
        rows = list(worker_table_rows(data["workers"]) if fmt == SNAPSHOT_FORMAT else data["workers"])

        def flag(name: str) -> list[bool]:
            col = worker_flag(data["workers"], name) if fmt == SNAPSHOT_FORMAT else None
            return col if col is not None and len(col) == len(rows) else [False] * len(rows)

        for row, gone, stopped in zip(rows, flag("left"), flag("preempted"), strict=True):
            worker_id, name, info, since, spw = row[:5]
            w = self._workers[worker_id] = WorkerRecord(worker_id, name, info, now - since - down_s)
            w.spw = spw
            # a restart must not show a worker that left, or was preempted, alive again (until
            # 2026-12-07 a preempted one was, and one that also left showed "left")
            w.left, w.preempted = gone, stopped
            if len(row) >= 10:
                w.streak, w.failures, w.quarantined, w.last_failure = row[5], row[6], row[8], row[9]
                w.backoff_until = now + max(row[7] - down_s, 0.0)     # served through the outage
        self.stats.update(data["stats"])
        for lease in self._leases.values():     # units done per worker: not in the snapshot
            holder = self._workers.get(lease.worker_id)
            if holder is not None and lease.receipt is not None and lease.receipt.status == "accepted":
                holder.done += 1
        self._reconcile()
        return self

    def _reconcile(self) -> None:
        """Counters agree with what the ledger holds: a snapshot's stats can lag its units (older
        formats, or a snapshot captured before the leases it records were counted)."""
        issued = sum(u.issued for u in self._order)
        if self.stats["issued"] < issued:
            self.stats["issued"] = issued
        reissued = sum(max(u.issued - 1, 0) for u in self._order)
        self.stats["reissued"] = max(self.stats["reissued"], reissued)
        self.stats["parked"] = max(self.stats["parked"], self._count[UnitState.PARKED])


_last_seen = attrgetter("last_seen")


def _unit_rows(rows: Iterable[Any], order: Iterable[UnitRecord]) -> None:
    """Unit states from a format-1 snapshot (one row a unit)."""
    for u, row in zip(order, rows, strict=True):
        _, state, attempts, issued, lease_id, reason, done_by = row[:7]
        u.state = UnitState(state)
        u.attempts, u.issued = attempts, issued
        u.lease_id, u.reason, u.done_by = lease_id, reason, done_by
        if len(row) >= 9:     # older snapshots lack failure attribution
            u.failed_by, u.last_failure = set(row[7]), row[8]


def _lease_rows(rows: Iterable[Any], now: float) -> Iterator[tuple[LeaseRecord, float]]:
    """Leases and their remaining seconds from a format-1 snapshot (one row a lease)."""
    for lid, unit_id, worker_id, base, remaining, steps, state, receipt in rows:
        lease = LeaseRecord(lid, unit_id, worker_id, base, now, now, LeaseState(state))
        lease.steps_done = steps
        lease.receipt = None if receipt is None else Receipt.from_dict(receipt)
        yield lease, remaining
