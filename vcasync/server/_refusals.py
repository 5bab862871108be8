"""Refused requests (4xx answers) on the ``vcasync.server`` log, each kind once per window.

Every refusal is worth one line an operator can act on: the reason code, the route, the worker (or,
before authentication, the peer address) and the lease, never a credential. A broken or hostile
worker repeats the same refusal many times a second, so each (code, route, caller) logs its first
refusal at once and then at most one line per ``window_s`` that counts what was left out; past
``max_keys`` callers tracked, the table starts over, so memory stays bounded. What the client chose
(the lease id and path it sent, decoded: ``%0a`` is a line break) is written on one line, its control
characters escaped (``\\n``), so a client cannot forge a log line.

A flood from many fresh addresses (each its own caller) would still cost a line per address, so on
top of that the whole log holds at most ``max_lines`` refusal lines per ``window_s``: past them,
refusals are only counted, by reason code, and the first refusal after the window ends logs one
summary line first (``K more refusals suppressed (over 50 lines in 60s): by reason unauthorized
9950, not_found 3``). The counters (:attr:`RefusalLog.logged`,
:attr:`~RefusalLog.left_out`, :attr:`~RefusalLog.suppressed`) and the HTTP metrics, which count every
answer by route and status apart from this log, lose nothing.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .._redact import one_line

__all__ = ["RefusalLog"]

log = logging.getLogger("vcasync.server")

#: Answers that are part of the protocol's normal flow (a finished run, a dropped version, a worker
#: told to back off), logged at INFO; every other 4xx at WARNING.
ROUTINE = frozenset({"run_finished", "version_not_found", "worker_backoff", "lease_expired",
                     "unit_closed", "client_disconnected"})


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` (cut to ``limit`` characters) with each character that is not printable (a line
    break, an escape, a NUL) written as its escape (``\\n``, ``\\x1b``): one line, and a client
    cannot forge log lines through what it sent."""
    return one_line(text, limit, escape=True)


@dataclass(slots=True)
class _Seen:
    logged_at: float
    left_out: int = 0


class RefusalLog:
    """Logs 4xx answers, rate-limited per (code, route, caller); see the module docstring."""

    def __init__(self, *, window_s: float = 60.0, max_keys: int = 10_000, max_lines: int = 50,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self.max_lines = max_lines
        self._clock = clock
        self._seen: dict[tuple[str, str, str], _Seen] = {}
        self._window_start = clock()
        self._lines = 0                                 # refusal lines logged in this window
        self._suppressed: Counter[str] = Counter()      # code -> refusals over max_lines, this window
        #: Refusal lines logged; refusals left out by the per-caller limit; refusals left out by the
        #: global ``max_lines`` limit (each counted in exactly one of the three).
        self.logged = 0
        self.left_out = 0
        self.suppressed = 0

    def note(self, *, status: int, code: str, message: str, route: str, worker: str | None,
             peer: str | None, lease: str | None, routine: bool = False) -> None:
        """Log (or count) one refusal; ``routine``: at INFO, whatever its code."""
        caller = f"worker {worker}" if worker else f"peer {peer or '?'}"
        key = (code, route, caller)
        now = self._clock()
        if now - self._window_start >= self.window_s:
            self._end_window(now)
        seen = self._seen.get(key)
        if seen is not None and now - seen.logged_at < self.window_s:
            seen.left_out += 1
            self.left_out += 1
            return
        if self._lines >= self.max_lines:
            # counted, not logged (nor remembered: this caller's next refusal may get a line)
            self._suppressed[code] += 1
            self.suppressed += 1
            return
        self._lines += 1
        if seen is None and len(self._seen) >= self.max_keys:
            self._seen.clear()
        left_out = 0 if seen is None else seen.left_out
        self._seen[key] = _Seen(now)
        self.logged += 1
        level = logging.INFO if routine or code in ROUTINE else logging.WARNING
        more = (f" ({left_out} more like it in the last {self.window_s:.0f}s not logged)"
                if left_out else "")
        log.log(level, "refused %s from %s%s: %d %s: %s%s", _one_line(route), caller,
                f" (lease {_one_line(lease, 128)})" if lease else "", status, code,
                _one_line(message), more)

    def _end_window(self, now: float) -> None:
        """Start a new window of ``max_lines``, after one summary line of what the last one left out."""
        if self._suppressed:
            total = sum(self._suppressed.values())
            reasons = ", ".join(f"{code} {n}" for code, n in self._suppressed.most_common())
            log.warning("%d more refusals suppressed (over %d lines in %.0fs): by reason %s",
                        total, self.max_lines, self.window_s, reasons)
            self._suppressed.clear()
        self._window_start = now
        self._lines = 0
