"""The longest wait the server tells a worker, so that a waiting worker still hears the run's end.

A finished run is served ``linger_s`` more (``vcasync coordinator --linger``) so that every worker
hears ``410 run_finished`` and exits. A worker that was told to wait (``503 no_work``, ``429
worker_backoff``, ``503 storage_unavailable``, each with ``retry_after``) asks nothing until that
wait is over: told 10 s by a coordinator that lingers 5 s, it woke to find nothing listening and
retried for its ``--give-up-after`` (an hour by default) on a billed machine. So no wait is longer
than half of ``linger_s``: a worker sleeps at most 1.1 times the hint (its jitter) and its next
request still has time to arrive while the run is served.

Two ends of the scale: a wait is never capped under :data:`MIN_WAIT_S` (asking more often gains a
waiting worker nothing, and a fleet asking that often is load); and ``linger_s = 0`` (or no linger
known, as for an embedded :class:`~vcasync.server.Server`) caps nothing, since no waiting worker can
hear an end that is not served. :func:`linger_warning` says so at start.

A wait told is said once, in the same words whether capped or not (:func:`told_wait`): a message
saying "retry in 5s" beside a ``retry_after`` of 1 told the operator reading the worker's log
something else than the worker was told.

A worker training a unit asks nothing between two heartbeats, so the heartbeat interval a lease
grant tells is capped the same way (``LeaseGrant.heartbeat_at_most``, in the lease routes): a
worker whose lease the run no longer needs (its unit was delivered by another worker after the
lease expired) hears ``410 run_finished`` at its next heartbeat, while the run is still served,
instead of finding nothing listening when its trainer is done.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["MIN_WAIT_S", "cap_wait", "linger_warning", "longest_wait", "told_wait"]

#: The shortest cap on a wait: a linger under twice this cannot promise that a waiting worker hears.
MIN_WAIT_S: Final = 1.0


def longest_wait(linger_s: float | None) -> float:
    """The longest ``retry_after`` to tell a worker when the run is served ``linger_s`` seconds after
    it finishes: half of it, never under :data:`MIN_WAIT_S`; ``inf`` (no cap) for None or 0."""
    if linger_s is None or linger_s <= 0:
        return math.inf
    return max(linger_s / 2, MIN_WAIT_S)


def cap_wait(retry_after: float, longest: float) -> tuple[float, int]:
    """``retry_after`` at most ``longest`` seconds, and the whole seconds a ``Retry-After`` header
    says for it: rounded, but never past the cap (3.5 s is 3, not 4) and never under 1."""
    wait = min(retry_after, longest)
    whole = round(wait)
    if whole > longest:
        whole = math.floor(longest)
    return wait, max(1, whole)


def told_wait(message: str, wait: float) -> str:
    """``message`` with the wait the answer tells (``retry_after``, capped) said at its end: the
    messages themselves say why, never when to ask again, so the two cannot disagree."""
    return f"{message}; retry in {wait:g}s"


def linger_warning(linger_s: float) -> str | None:
    """What an operator should know about a linger too short for every waiting worker to hear the
    end of the run (None when it is long enough)."""
    if linger_s >= 2 * MIN_WAIT_S:
        return None
    if linger_s <= 0:
        return ("--linger 0 (run.linger_s): the coordinator exits as soon as the run is finished "
                "and the workers it told to ask again have asked, so workers it told nothing (one "
                "training a unit another delivered, one backed off) never hear the end and "
                "retry for their --give-up-after (an hour by default). Give at least "
                f"{2 * MIN_WAIT_S:g} s for every worker to hear the end")
    return (f"--linger {linger_s:g} (run.linger_s) is under {2 * MIN_WAIT_S:g} s: a worker told to "
            f"wait (never less than {MIN_WAIT_S:g} s) may ask again only after the coordinator "
            "exited, and retry for its --give-up-after (an hour by default)")
