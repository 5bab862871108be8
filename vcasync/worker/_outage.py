"""What a worker logs while its coordinator cannot be reached: a few lines per outage, not one per try.

A fleet of a thousand workers whose coordinator restarts must not flood its log shipping: each
worker said ``coordinator unreachable ... retry N`` at WARNING before every try, some 800 lines an
hour, and said nothing at all while its heartbeats failed (DEBUG), so a lease that ran out during
a network blackout was lost without a word. Two trackers, both fed ``time.monotonic()`` readings:

- :class:`CallOutage`, for one call retried until the coordinator answers (``Worker._call``): one
  WARNING at the first failure (what failed, why, the retry policy), then at most one summary line
  every :data:`OUTAGE_LOG_S` while the outage lasts (every try still at DEBUG), and one INFO line
  when the coordinator answers again.
- :class:`HeartbeatSilence`, for the heartbeats beside a training unit: one WARNING when they start
  failing (the lease, and how long until it would expire at the coordinator), one WARNING when the
  lease has probably expired meanwhile, one INFO when they get through again.
"""

from __future__ import annotations

import logging
import math
from typing import Final

from ..errors import RequestTimeoutError
from ..ledger._units import LeaseGrant
from ..retry import RetryPolicy

__all__ = ["OUTAGE_LOG_S", "CallOutage", "HeartbeatSilence", "failure_name"]

log = logging.getLogger("vcasync.worker")

#: While the coordinator stays unreachable, a call says so again at most this often (seconds).
OUTAGE_LOG_S: Final = 60.0


def failure_name(exc: BaseException) -> str:
    """What failed, for the retry line: the class, with the status of an HTTP answer that was not
    the coordinator's (a proxy's 502 or 429 said "ClientResponseError" and nothing more)."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return f"{type(exc).__name__}: HTTP {status}, not from vcasync (a proxy?)"
    return type(exc).__name__


def _policy_text(backoff: RetryPolicy, give_up_after_s: float) -> str:
    give_up = ("never giving up (--give-up-after inf)" if math.isinf(give_up_after_s) else
               f"giving up after {give_up_after_s:g} s without an answer (--give-up-after)")
    return f"then at most {backoff.max_delay_s:g} s apart, {give_up}"


class CallOutage:
    """The failed tries in a row of one call (``what``: "lease", "upload", ...) and what they logged."""

    def __init__(self, what: str, backoff: RetryPolicy, give_up_after_s: float) -> None:
        self.what = what
        self._policy = _policy_text(backoff, give_up_after_s)
        self.tries = 0                  # failed in a row, 0 while the coordinator answers
        self._since = self._said_at = 0.0

    def failed(self, exc: BaseException, now: float, delay: float, hint: str = "") -> None:
        """A try failed for a transient reason and the next comes in ``delay`` seconds; ``hint`` ends
        the first line (a coordinator serving TLS on a plain HTTP URL)."""
        self.tries += 1
        if self.tries == 1:
            self._since = self._said_at = now
            if isinstance(exc, RequestTimeoutError):
                # it answered, so "unreachable" would mislead: the link is slow or stalled
                log.warning("%s: the coordinator cut the request off (%s): a slow or stalled link; "
                            "retry 1 in %.2fs, %s", self.what, exc, delay, self._policy)
            else:
                log.warning("%s: coordinator unreachable (%s); retry 1 in %.2fs, %s%s", self.what,
                            failure_name(exc), delay, self._policy, hint)
            return
        log.debug("%s: coordinator unreachable (%s); retry %d in %.2fs", self.what,
                  failure_name(exc), self.tries, delay)
        if now - self._said_at >= OUTAGE_LOG_S:
            self._said_at = now
            log.warning("%s: coordinator still unreachable after %d tries over %.0f s (%s); next "
                        "retry in %.2fs", self.what, self.tries, now - self._since,
                        failure_name(exc), delay)

    def answered(self, now: float) -> None:
        """The coordinator answered (a result or a refusal): the outage, if any, is over."""
        if self.tries:
            log.info("%s: coordinator reachable again after %.0f s, %d failed tries", self.what,
                     now - self._since, self.tries)
        self.tries = 0


class HeartbeatSilence:
    """The heartbeats of one lease that failed in a row, and when the lease would expire."""

    def __init__(self, grant: LeaseGrant, granted_at: float) -> None:
        self.lease_id = grant.lease_id
        self.unit_id = grant.unit.unit_id
        #: When the coordinator lets the lease expire unless a heartbeat reports progress first: the
        #: last answer's ``deadline_s`` from when it came (a little late, by the answer's trip).
        self.expires_at = granted_at + grant.deadline_s
        self.failures = 0
        self._since = 0.0
        self._heard_at = granted_at     # the last answer from the coordinator (or the grant)
        self._said_expired = False

    def failed(self, why: str, now: float, interval: float) -> None:
        """A heartbeat got no answer (``why``); the next is tried ``interval`` seconds later."""
        self.failures += 1
        left = self.expires_at - now
        if self.failures == 1:
            self._since = now
            if left > 0:
                log.warning("heartbeat for lease %s (unit %s) failed (%s): the coordinator expires the "
                            "lease in about %.0f s unless a heartbeat gets through; training goes on, "
                            "a heartbeat every %.1f s", self.lease_id, self.unit_id, why, left, interval)
                return
            log.warning("heartbeat for lease %s (unit %s) failed (%s); training goes on, a heartbeat "
                        "every %.1f s", self.lease_id, self.unit_id, why, interval)
        else:
            log.debug("heartbeat for lease %s failed again (%s)", self.lease_id, why)
        if left <= 0 and not self._said_expired:
            self._said_expired = True
            log.warning("lease %s has probably expired at the coordinator: no heartbeat got through "
                        "for %.0f s; it may give unit %s to another worker (training goes on: a "
                        "heartbeat with progress revives the lease if nobody took the unit, and a late "
                        "result may still count)", self.lease_id, now - self._heard_at, self.unit_id)

    def answered(self, now: float, grant: LeaseGrant | None = None) -> None:
        """The coordinator answered a heartbeat (``grant``: it renewed the lease)."""
        if self.failures:
            log.info("heartbeats for lease %s get through again after %.0f s (%d failed)",
                     self.lease_id, now - self._since, self.failures)
        self.failures = 0
        self._said_expired = False
        self._heard_at = now
        if grant is not None:
            self.expires_at = now + grant.deadline_s
