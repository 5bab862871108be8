"""Refused requests (4xx answers) on the ``vcasync.server`` log, each kind once per window.

Every refusal is worth one line an operator can act on: the reason code, the route, the worker (or,
before authentication, the peer address) and the lease, never a credential. A broken or hostile
worker repeats the same refusal many times a second, so each (code, route, caller) logs its first
refusal at once and then at most one line per ``window_s`` that counts what was left out; past
``max_keys`` callers tracked, the table starts over (a flood of fresh addresses costs a line each
window at most per key, and memory stays bounded).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RefusalLog"]

log = logging.getLogger("vcasync.server")

#: Answers that are part of the protocol's normal flow (a finished run, a dropped version, a worker
#: told to back off), logged at INFO; every other 4xx at WARNING.
ROUTINE = frozenset({"run_finished", "version_not_found", "worker_backoff", "lease_expired",
                     "unit_closed"})


@dataclass(slots=True)
class _Seen:
    logged_at: float
    left_out: int = 0


class RefusalLog:
    """Logs 4xx answers, rate-limited per (code, route, caller); see the module docstring."""

    def __init__(self, *, window_s: float = 60.0, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self._clock = clock
        self._seen: dict[tuple[str, str, str], _Seen] = {}
        self.logged = 0
        self.left_out = 0

    def note(self, *, status: int, code: str, message: str, route: str, worker: str | None,
             peer: str | None, lease: str | None) -> None:
        caller = f"worker {worker}" if worker else f"peer {peer or '?'}"
        key = (code, route, caller)
        now = self._clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen.logged_at < self.window_s:
            seen.left_out += 1
            self.left_out += 1
            return
        if seen is None and len(self._seen) >= self.max_keys:
            self._seen.clear()
        left_out = 0 if seen is None else seen.left_out
        self._seen[key] = _Seen(now)
        self.logged += 1
        level = logging.INFO if code in ROUTINE else logging.WARNING
        more = (f" ({left_out} more like it in the last {self.window_s:.0f}s not logged)"
                if left_out else "")
        log.log(level, "refused %s from %s%s: %d %s: %s%s", route, caller,
                f" (lease {lease})" if lease else "", status, code, message[:300], more)
