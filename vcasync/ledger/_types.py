"""The ledger's vocabulary: its config, the unit and lease states, and the records it keeps.

The records are mutable ``__slots__`` classes private to :mod:`vcasync.ledger` (thousands of them
live at once at scale, so they are kept small); everything handed out is a frozen value type.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, FrameError
from ._plain import plain_problem, text_problem
from ._units import Receipt, WorkUnit

__all__ = ["LeaseState", "LedgerConfig", "ResultCheck", "UnitState", "worker_info", "worker_name"]


class UnitState(enum.StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    PARKED = "parked"


class LeaseState(enum.StrEnum):
    ACTIVE = "active"          # the unit is leased by this lease
    EXPIRED = "expired"        # missed its deadline; a late result is still welcome
    RELEASED = "released"      # its holder gave it up; a late result is still welcome
    CLOSED = "closed"          # a result was recorded (accepted or rejected): see its receipt
    SUPERSEDED = "superseded"  # another lease's result closed the unit first


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    """Lease timing and failure handling (see the module docstring for how they combine)."""

    lease_timeout_s: float = 60.0
    heartbeat_interval_s: float | None = None    # None: lease_timeout_s / 4
    max_attempts: int = 5
    deadline_slack: float = 3.0
    speed_smoothing: float = 0.3                 # EWMA weight of the newest seconds-per-step sample
    restore_grace_s: float | None = None         # None: lease_timeout_s (time to reconnect after restart)
    alive_window_s: float | None = None          # None: 2 * lease_timeout_s
    #: A unit is parked only once this many *distinct* workers failed it (and ``max_attempts`` reached):
    #: one broken machine must not get a unit given up on.
    park_after_workers: int = 3
    #: A worker's failures in a row back it off from leasing: base * 2**(n-1) seconds, capped ...
    worker_backoff_s: float = 1.0
    worker_backoff_max_s: float = 60.0
    #: ... and after this many failures in a row it is quarantined: refused leases for
    #: ``quarantine_s`` (None, or inf, which becomes None: the rest of the run). After that it
    #: gets one more try; one more failure quarantines it again (a spot machine may have been
    #: unlucky, not broken).
    quarantine_after: int = 5
    quarantine_s: float | None = 3600.0
    #: The record of a worker not heard from for this long, holding no open lease and neither
    #: backed off nor quarantined, is dropped (None, or inf, which becomes None: every worker is
    #: kept for the whole run). Each spot machine that comes back without its state joins anew, so
    #: a long run's records would otherwise grow with every restart; a forgotten worker that does
    #: come back is registered again on its next request (its token still holds), without its name.
    forget_workers_s: float | None = 3600.0
    #: Active leases one worker may hold at once (None, or inf, which becomes None: no cap). The
    #: worker client holds one; a grant whose answer was lost on the way (the client asked again)
    #: or a crash before the worker saved its lease leaves another active until it expires. Past
    #: the cap a lease request is refused (:class:`LeaseLimitError`, ``429 lease_limit``) until one
    #: ends: one worker must not hold the units the fleet waits for. Resuming a lease is not capped.
    max_leases_per_worker: int | float | None = 4
    #: Worker records kept at most (None, or inf: no cap). A join when full first drops the records
    #: :meth:`Ledger.forget_workers` would drop; if none can go it is refused
    #: (:class:`WorkersFullError`, ``503 workers_full``). Workers that joined are never refused: a
    #: restart's re-registrations and recalls are not capped. A record with the server's token
    #: record is about 0.9 KB (a worker client's info), up to 66 KB for an info of 4 KiB of tiny
    #: nested lists: at the default cap, 90 MB, or 6.6 GB at worst (docs/limits.md).
    max_workers: int | float | None = 100_000

    def __post_init__(self) -> None:
        # NaN fails every '> 0'; inf passed them: worker_backoff_s = inf backed every failing worker
        # off for the cap, deadline_slack = inf gave leases that never expire (or a NaN deadline)
        for name in ("lease_timeout_s", "deadline_slack", "worker_backoff_s", "worker_backoff_max_s"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{name} must be a finite number > 0, got {v!r}")
        for name in ("quarantine_s", "forget_workers_s", "max_leases_per_worker", "max_workers"):
            if getattr(self, name) == math.inf:   # "never", as TOML (which has no None) can say it
                object.__setattr__(self, name, None)
        for name in ("max_leases_per_worker", "max_workers"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{name} must be an int >= 1, or None or inf (no cap), got {v!r}")
        for name in ("heartbeat_interval_s", "restore_grace_s", "alive_window_s", "quarantine_s",
                     "forget_workers_s"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                never = " (inf: never)" if name in ("quarantine_s", "forget_workers_s") else ""
                raise ConfigError(f"{name} must be a finite number > 0 or None{never}, got {v!r}")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) \
                or self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        for name in ("park_after_workers", "quarantine_after"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {v!r}")
        if not 0 < self.speed_smoothing <= 1:
            raise ConfigError(f"speed_smoothing must be in (0, 1], got {self.speed_smoothing!r}")

    @property
    def heartbeat_s(self) -> float:
        return self.heartbeat_interval_s or self.lease_timeout_s / 4

    @property
    def grace_s(self) -> float:
        return self.restore_grace_s or self.lease_timeout_s

    @property
    def alive_s(self) -> float:
        return self.alive_window_s or 2 * self.lease_timeout_s

    @property
    def park_workers(self) -> int:
        """Distinct failing workers needed to park a unit (never more than ``max_attempts``)."""
        return min(self.park_after_workers, self.max_attempts)

    def backoff_s(self, streak: int) -> float:
        """How long a worker with ``streak`` failures in a row waits before its next lease."""
        if streak <= 0:
            return 0.0
        return min(self.worker_backoff_max_s, self.worker_backoff_s * 2.0 ** min(streak - 1, 30))


@dataclass(frozen=True, slots=True)
class ResultCheck:
    """What :meth:`Ledger.check_result` found: the unit to validate against, or an earlier receipt."""

    unit: WorkUnit
    lease_base_version: int
    receipt: Receipt | None


class UnitRecord:
    __slots__ = ("attempts", "done_by", "failed_by", "index", "issued", "last_failure", "lease_id",
                 "reason", "state", "unit")

    def __init__(self, unit: WorkUnit, index: int) -> None:
        self.unit = unit
        self.index = index
        self.state = UnitState.QUEUED
        self.attempts = 0
        self.issued = 0                  # leases granted for it (reissue accounting)
        self.lease_id: str | None = None  # the ACTIVE lease while LEASED
        self.reason: str | None = None    # why it was parked
        self.done_by: str | None = None   # the lease whose result closed it
        self.failed_by: set[str] = set()  # workers that failed it (parking needs several)
        self.last_failure: str | None = None


class LeaseRecord:
    __slots__ = ("base_version", "deadline", "lease_id", "progress_at", "receipt", "state",
                 "steps_done", "unit_id", "worker_id")

    def __init__(self, lease_id: str, unit_id: str, worker_id: str, base_version: int,
                 deadline: float, now: float, state: LeaseState = LeaseState.ACTIVE) -> None:
        self.lease_id = lease_id
        self.unit_id = unit_id
        self.worker_id = worker_id
        self.base_version = base_version
        self.deadline = deadline
        self.progress_at = now
        self.steps_done = 0
        self.state = state
        self.receipt: Receipt | None = None


class WorkerRecord:
    __slots__ = ("backoff_until", "done", "failures", "info", "last_failure", "last_seen", "left",
                 "name", "preempted", "quarantined", "spw", "streak", "worker_id")

    def __init__(self, worker_id: str, name: str, info: dict[str, Any], now: float) -> None:
        self.worker_id = worker_id
        self.name = name
        self.info = info
        self.last_seen = now
        self.spw: float | None = None    # EWMA of seconds per step
        self.streak = 0                  # failures in a row (an accepted result resets it)
        self.failures = 0                # failures in all
        self.backoff_until = 0.0         # no lease before this time (the ledger's clock)
        self.quarantined: str | None = None   # why it gets no leases (until backoff_until)
        self.last_failure: str | None = None
        self.done = 0                    # units it closed with an accepted result
        self.preempted = False           # its last act was a release that was nobody's fault
        self.left = False                # it said it exits (``POST /v1/leave``), until heard again


#: How deep a worker's info may nest (``{"gpu": {"name": ...}}`` is two levels).
MAX_INFO_DEPTH = 8
#: How large a worker's info may be, as compact JSON. It is kept for as long as the worker is known
#: and in every snapshot: a 64 KiB join body of small numbers held 650 KB of Python objects.
MAX_INFO_BYTES = 4096
MAX_NAME_LENGTH = 128


def worker_name(name: object) -> str:
    """A joining worker's name as the ledger keeps it (at most 128 characters);
    :class:`FrameError` (``field="name"``) when it is not UTF-8: snapshots could not hold it."""
    text = str(name)[:MAX_NAME_LENGTH]
    problem = text_problem(text, "the worker name")
    if problem is not None:
        raise FrameError(problem, field="name")
    return text


def worker_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a joining worker's info, JSON-like (it is snapshotted and shown in status), at
    most :data:`MAX_INFO_BYTES` as compact JSON; :class:`FrameError` (``field="info"``) naming
    what is not (see :func:`plain_problem`) or its size."""
    problem = plain_problem(info, "info", noun="worker info", max_depth=MAX_INFO_DEPTH)
    if problem is not None:
        raise FrameError(f"worker {problem}", field="info")
    kept = {k: _copy(v) for k, v in info.items()}
    size = len(json.dumps(kept, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_INFO_BYTES:
        raise FrameError(f"worker info is {size} bytes as JSON, over {MAX_INFO_BYTES}: send a few "
                         "facts about the machine (host, pid), not data", field="info")
    return kept


def _copy(value: Any) -> Any:
    """A checked value with its own lists and dicts (its depth is bounded by the check)."""
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    return value
