"""Connections closed for stalling before their request head: counted, and logged a line a minute.

A client (or a proxy) that connects and sends nothing, or part of a request line or of its headers,
holds a connection until ``idle_timeout_s`` (:class:`~._server.ServerConfig`, 75 s by default) from
its connect or its last answer, and is then closed without an answer. Until 2026-12-07 that left no
trace at all: no log line, no metric. Each such close is now counted
(``vcasync_http_stalled_connections_total{sent}``: ``nothing``, or ``partial_head``) and the
``vcasync.server`` log says so at most once per ``window_s``: the first at once, the ones after it
within the window summed up in one line when the window ends (how many, what they sent, from which
peers), so a thousand silent connections cost one line, not a thousand. A kept-alive connection
left idle after its answers (a client's connection pool) is closed the same way, and is neither.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from ._http_metrics import HttpMetrics

__all__ = ["StallLog"]

log = logging.getLogger("vcasync.server")

#: Peers named in one line; the others are counted.
_PEERS_SHOWN = 5


class StallLog:
    """Counts and logs connections closed for not sending a whole request head in time."""

    def __init__(self, idle_timeout_s: float, *, metrics: HttpMetrics | None = None,
                 window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.window_s = window_s
        self._metrics = metrics
        self._clock = clock
        self._sent: Counter[str] = Counter()     # since the last line
        self._peers: Counter[str] = Counter()
        self._logged_at: float | None = None
        self._flush: asyncio.TimerHandle | None = None
        #: Lines logged (each summing up one or more connections).
        self.lines = 0

    def note(self, sent: str, peer: str | None) -> None:
        """A connection from ``peer`` was closed having sent ``sent`` (``nothing`` or
        ``partial_head``) within the idle timeout; called on the server's event loop."""
        if self._metrics is not None:
            self._metrics.note_stalled(sent)
        self._sent[sent] += 1
        self._peers[peer or "?"] += 1
        now = self._clock()
        if self._logged_at is None or now - self._logged_at >= self.window_s:
            self._log(now)
        elif self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(
                self._logged_at + self.window_s - now, self._on_window_end)

    def _on_window_end(self) -> None:
        self._flush = None
        self._log(self._clock())

    def _log(self, now: float) -> None:
        total = sum(self._sent.values())
        if not total:
            return
        what = ", ".join(f"{n} {'sent nothing' if sent == 'nothing' else 'part of a request head'}"
                         for sent, n in sorted(self._sent.items()))
        peers = ", ".join(f"{peer} ({n})" for peer, n in self._peers.most_common(_PEERS_SHOWN))
        others = len(self._peers) - _PEERS_SHOWN
        if others > 0:
            peers += f" and {others} more"
        since = "" if self._logged_at is None else f" in the last {now - self._logged_at:.0f}s"
        log.warning("closed %d connection(s)%s that sent no whole request within idle_timeout_s "
                    "(%gs): %s; from %s", total, since, self.idle_timeout_s, what, peers)
        self.lines += 1
        self._logged_at = now
        self._sent.clear()
        self._peers.clear()

    def close(self) -> None:
        """Log what the current window holds now (the server is closing)."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self._log(self._clock())
