"""How the coordinator's storage is doing, as one small state machine the rest of it asks.

::

    ok ──snapshot write failed──> degraded ──a write succeeded──> ok
     │                               │
     └──────a write results need (journal entry, base, version floor) failed──────> unavailable
                                                       │          │
                        probe write succeeded <────────┘          └── unavailable past
                        (back to ok)                                  ``limit_s``: failed

*Degraded*: a background write (a snapshot) failed; results are still made durable, so work goes
on, but the operator should look. *Unavailable*: nothing can be made durable, so the coordinator
takes nothing in: lease and result requests are answered ``503 storage_unavailable`` with a
``Retry-After`` (:meth:`StorageHealth.check`), workers wait with their results in hand, and probe
writes find out when storage is back: the first one after 0.1 s (a one-off failure costs the
fleet a blink, not a pause), then at doubling intervals up to ``probe_interval_s``. Unavailable
for longer than ``limit_s`` is *failed*: the coordinator stops and ``vcasync coordinator`` exits
with ``ExitCode.STORAGE``.

A probe that goes through proves only that a small write fits: a disk that is almost full, or a
quota that is almost spent, takes the probe and refuses the next result. So storage back after a
probe is *on probation* until a write results need succeeds (:meth:`StorageHealth.durable_write_ok`).
A needed write that fails on probation (within ``RELAPSE_WINDOW_S`` of the probe) is a *relapse*:
the same outage goes on, with its start, its probe back-off and its ``limit_s`` clock, instead of a
new one every probe (which flapped the state several times a second, logged an ERROR each time and
never reached ``limit_s``). The first relapse of an outage is logged once at WARNING; relapsing past
``limit_s`` is *failed* too, however many probes went through.

Each change of state is logged once (WARNING or ERROR), never once per refused request.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
from collections.abc import Callable
from typing import Any

from ..errors import StorageFailedError, StorageUnavailableError

__all__ = ["FIRST_PROBE_S", "RELAPSE_WINDOW_S", "StorageHealth", "StorageState"]

FIRST_PROBE_S = 0.1
RELAPSE_WINDOW_S = 60.0     # a needed write failing this soon after a probe continues the outage

log = logging.getLogger("vcasync.coordinator")


class StorageState(enum.IntEnum):
    """The value is the ``vcasync_storage_state`` gauge."""

    OK = 0
    DEGRADED = 1
    UNAVAILABLE = 2
    FAILED = 3


class StorageHealth:
    """Tracks the storage's state for one coordinator; see the module docstring."""

    def __init__(self, *, probe_interval_s: float, limit_s: float,
                 clock: Callable[[], float], journaled: bool = True) -> None:
        self.probe_interval_s = probe_interval_s
        #: results are journaled before they are acknowledged (durability ``journal``): a failed
        #: snapshot loses nothing; otherwise the snapshots are the results' only durability
        self.journaled = journaled
        self.limit_s = limit_s
        self._clock = clock
        self.state = StorageState.OK
        self.since: float | None = None     # when the current degraded/unavailable spell began
        self.last_error = ""
        self.write_failures = 0             # writes that failed (after the backend's own retries)
        self.outages = 0                    # spells of unavailability
        self.probes = 0                     # probe writes tried while unavailable
        self._probe_delay = min(FIRST_PROBE_S, probe_interval_s)
        self.unavailable = asyncio.Event()  # set while unavailable: wakes the probe loop
        # on probation after a probe: (when it went through, the outage's start, its probe delay)
        self._probation: tuple[float, float | None, float] | None = None
        self.relapses = 0                   # needed writes that failed on probation, this outage

    # -- what the coordinator reports ---------------------------------------------------------
    def write_failed(self, exc: BaseException, *, needed: bool, finishing: bool = False) -> None:
        """A storage write failed. ``needed``: results cannot be made durable without it.
        ``finishing``: it is the final snapshot of a run whose every unit is done, so workers are
        told the run is finishing (not to wait for the storage), and what is said says so."""
        self.write_failures += 1
        self.last_error = _describe(exc)
        if self.state >= StorageState.UNAVAILABLE:
            return
        if needed and self._relapse(exc):
            return
        if needed:
            self.state, self.since = StorageState.UNAVAILABLE, self._clock()
            self.relapses = 0
            self.outages += 1
            self._probe_delay = min(FIRST_PROBE_S, self.probe_interval_s)
            self.unavailable.set()
            told = ("Every unit is done: workers are told the run is finishing (503 no_work) until "
                    "the final snapshot is written" if finishing else
                    "Workers are told to wait (503 storage_unavailable)")
            log.error("storage unavailable: %s. %s; probing it (every %.3gs at most), giving up "
                      "after %.0fs", self.last_error, told, self.probe_interval_s, self.limit_s)
        elif self.state is StorageState.OK:
            self.state, self.since = StorageState.DEGRADED, self._clock()
            log.warning("storage degraded: %s (%s; the next write retries)", self.last_error,
                        "results are still made durable" if self.journaled else
                        "the results merged since the last snapshot are in memory only until one "
                        "is written")

    def _relapse(self, exc: BaseException) -> bool:
        """A needed write failed on probation: the outage the probe seemed to end goes on."""
        probation, self._probation = self._probation, None
        if probation is None or self._clock() - probation[0] > RELAPSE_WINDOW_S:
            return False
        _, since, delay = probation
        self.state, self.since, self._probe_delay = StorageState.UNAVAILABLE, since, delay
        self.unavailable.set()
        self.relapses += 1
        if self.relapses == 1:
            log.warning("storage failed again right after a probe write went through: %s. The "
                        "outage goes on (%.0fs so far; %s); giving up after %.0fs", self.last_error,
                        self.down_for(), _relapse_hint(exc), self.limit_s)
        return True

    def durable_write_ok(self) -> None:
        """A write results need succeeded: storage back after a probe is off probation."""
        if self._probation is not None:
            self._probation = None
            if self.relapses:
                log.warning("storage takes results again (after %d relapse(s) of the outage)",
                            self.relapses)

    def write_ok(self) -> None:
        """A background write succeeded: a degraded storage is fine again."""
        if self.state is StorageState.DEGRADED:
            log.warning("storage is healthy again after %.1fs", self._clock() - (self.since or 0))
            self.state, self.since = StorageState.OK, None

    def next_probe_delay(self) -> float:
        """Seconds until the next probe: doubling from ``FIRST_PROBE_S`` up to the interval."""
        delay = self._probe_delay
        self._probe_delay = min(self.probe_interval_s, delay * 2)
        return delay

    def probe_failed(self, exc: BaseException) -> None:
        self.probes += 1
        self.last_error = _describe(exc)
        log.debug("storage probe failed: %s", self.last_error)

    def probe_ok(self) -> None:
        """The probe write went through: storage is back; take results again."""
        self.probes += 1
        now = self._clock()
        if not self.relapses:
            log.warning("storage is back after %.1fs unavailable; taking results again",
                        now - (self.since or now))
        else:
            log.debug("storage probe went through again (%d relapse(s) so far)", self.relapses)
        self._probation = (now, self.since, self._probe_delay)
        self.state, self.since = StorageState.OK, None
        self.unavailable.clear()

    def give_up(self) -> StorageFailedError:
        """Unavailable past the limit: the error the coordinator stops with."""
        self.state = StorageState.FAILED
        exc = StorageFailedError(f"storage has been unavailable for {self.down_for():.0f}s (limit "
                                 f"{self.limit_s:g}s, storage_outage_limit_s); last error: "
                                 f"{self.last_error}")
        log.error("%s; stopping the coordinator", exc)
        return exc

    # -- what the coordinator asks ------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`StorageUnavailableError` while nothing can be made durable."""
        if self.refusing:
            raise self.refusal()

    def refusal(self, exc: BaseException | None = None) -> StorageUnavailableError:
        """The answer for a refused request (about ``exc``, or the last error seen)."""
        why = _describe(exc) if exc is not None else self.last_error
        # The wait is retry_after, said by whoever answers (the server caps it at half the run's
        # linger): a number in the message could disagree with the wait the worker is told.
        return StorageUnavailableError(
            f"the coordinator's storage is unavailable ({why}); nothing was taken in: keep the "
            "result", retry_after=self.retry_after)

    @property
    def retry_after(self) -> float:
        """What workers are told to wait: until about the next probe."""
        return self._probe_delay

    def down_for(self) -> float:
        """Seconds in the current unavailable spell (0 when not unavailable)."""
        if self.state < StorageState.UNAVAILABLE or self.since is None:
            return 0.0
        return max(0.0, self._clock() - self.since)

    def over_limit(self) -> bool:
        return self.down_for() > self.limit_s

    def left_s(self) -> float:
        """Seconds left of ``limit_s`` in the current unavailable spell (``limit_s`` when none)."""
        return max(0.0, self.limit_s - self.down_for())

    @property
    def refusing(self) -> bool:
        """True while results cannot be made durable (unavailable, or failed)."""
        return self.state >= StorageState.UNAVAILABLE

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state.name.lower(), "write_failures": self.write_failures,
                               "outages": self.outages}
        if self.state is not StorageState.OK:
            out["since_s"] = round(self._clock() - (self.since or self._clock()), 3)
            out["last_error"] = self.last_error
        if self.state is StorageState.UNAVAILABLE:
            out["retry_after_s"] = self.retry_after
            out["gives_up_in_s"] = round(max(0.0, self.limit_s - self.down_for()), 3)
        return out

    def gauges(self) -> dict[str, float]:
        return {"storage_state": int(self.state), "storage_unavailable_seconds": self.down_for(),
                "storage_write_failures_total": self.write_failures,
                "storage_outages_total": self.outages, "storage_probes_total": self.probes}


def _relapse_hint(exc: BaseException) -> str:
    """What a needed write failing where a probe's small one went through suggests: a full disk
    or a spent quota when the error says so; otherwise only that (a permission refused on one
    path, say, is no full disk)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _FULL_ERRNOS:
            return "a small write fits, results do not: the disk is full or the quota spent"
        seen = seen.__cause__ or seen.__context__
    text = str(exc).lower()
    if any(word in text for word in _FULL_WORDS):
        return "a small write fits, results do not: the disk is full or the quota spent"
    return "the probe's small write went through where this write did not"


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_FULL_WORDS = ("no space left", "quota", "insufficient storage", "disk full")


def _describe(exc: BaseException) -> str:
    """One line for logs and answers: the error's class and message (storage URLs carry no
    secrets: backends refuse them in URLs)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:500]
