"""Request bodies read against the clock: how slowly a client may send before it is cut off.

A result upload is decoded while it arrives, inside one of the coordinator's few decode slots, so a
client that sends slowly holds a slot (and the update-sized buffer behind it) for as long as it
likes unless the server cuts it off. Three limits (:class:`BodyTimeouts`) bound every body:

- **stall**: no byte at all for ``idle_s``;
- **pace**: once ``grace_s`` has passed, every window of ``window_s`` must bring at least
  ``min_rate * window_s`` bytes. The rate is judged over a *recent* window, not averaged over the
  whole body: an average lets a client that sent 99 MB at once drip the last bytes for an hour
  (about ``sent / min_rate`` seconds) while the average slowly sinks, and two such uploads block
  every honest one. A window cuts a drip within ``window_s`` whatever came before;
- **deadline**: the whole body within ``grace_s + size / min_rate``, ``size`` being the declared
  ``Content-Length`` (or the limit, for a chunked body).

The clock behind ``pace`` and ``deadline`` runs only while the server waits for the client: time
the server spends between reads (feeding a batch to the decoder, a busy event loop) is not the
sender's fault and never counts against it, so a loaded coordinator does not cut honest uploads.

A body cut off for being slow is answered 408 (:class:`BodyCutOff`) and its connection closed at
once; aiohttp would otherwise keep reading ("lingering") the rest of a drip for another 10 s.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

from ..errors import ConfigError, LimitExceededError

__all__ = ["BodyCutOff", "BodyTimeouts", "Pace", "read_body"]

Cause = Literal["stalled", "slow", "deadline"]

#: Arrivals closer together than ``window_s / _BUCKETS`` share one sample: the window's bookkeeping
#: stays a few dozen entries however many reads a fast body takes (judged up to one bucket leniently).
_BUCKETS = 32


@dataclass(frozen=True, slots=True)
class BodyTimeouts:
    """How long a request body may stall, and how slowly it may trickle, before it is cut off (408).

    Without them a slow-loris client holds a connection forever, and a slow *result* upload holds
    one of the coordinator's few decode slots (each bounds one update's memory), so two of them
    would stall every honest upload. ``min_rate = 0`` turns the pace and deadline checks off.
    """

    idle_s: float = 30.0          # no body bytes for this long
    min_rate: float = 16 * 1024   # bytes/s an upload must keep up over every recent window ...
    grace_s: float = 10.0         # ... once it has run this long ...
    window_s: float = 10.0        # ... judged over the last this many seconds

    def __post_init__(self) -> None:
        if not (self.idle_s > 0 and self.window_s > 0 and self.grace_s >= 0 and self.min_rate >= 0
                and math.isfinite(self.min_rate)):
            raise ConfigError("body timeouts: idle_s and window_s must be > 0, grace_s and a finite "
                              f"min_rate >= 0; got {self}")


class BodyCutOff(web.HTTPRequestTimeout):
    """The client sent its body too slowly (or not at all): answer 408 and close the connection."""

    def __init__(self, cause: Cause, reason: str) -> None:
        super().__init__(reason=reason)
        self.cause = cause


class Pace:
    """The arrival bookkeeping of one body, on a clock that runs only while the server waits.

    Pure (the caller measures the waits), so the rules are testable without sockets or sleeps:
    call :meth:`allowance` before each read and :meth:`arrived` after it.
    """

    __slots__ = ("_samples", "_timeouts", "deadline", "seen", "waited")

    def __init__(self, timeouts: BodyTimeouts, expected: int) -> None:
        self._timeouts = timeouts
        self.waited = 0.0           # seconds spent waiting for the client so far
        self.seen = 0               # bytes received so far
        rate = timeouts.min_rate
        self.deadline = timeouts.grace_s + max(0, expected) / rate if rate > 0 else math.inf
        # (waited, seen) after arrivals, oldest first; the first is the window's baseline.
        self._samples: deque[tuple[float, int]] = deque([(0.0, 0)])

    def arrived(self, waited: float, nbytes: int) -> None:
        """The last read waited ``waited`` seconds for ``nbytes`` bytes."""
        self.waited += max(0.0, waited)
        self.seen += nbytes
        now, width = self.waited, self._timeouts.window_s
        samples = self._samples
        if len(samples) > 1 and int(samples[-1][0] * _BUCKETS / width) == int(now * _BUCKETS / width):
            samples[-1] = (now, self.seen)
        else:
            samples.append((now, self.seen))
        while len(samples) > 1 and samples[1][0] <= now - width:
            samples.popleft()

    def _window_end(self) -> float:
        """When (client time) the last ``window_s`` would bring too few bytes if nothing more came."""
        t = self._timeouts
        floor = self.seen - t.min_rate * t.window_s
        # The first sample above ``floor`` leaves the window at its time + window_s; from then on
        # the window holds less than min_rate * window_s. The newest sample is always above it.
        first = next(ts for ts, seen in self._samples if seen > floor)
        return max(first + t.window_s, t.grace_s)

    def allowance(self) -> tuple[float, Cause]:
        """How long the next read may wait for the client, and what cuts it off then (<= 0: now)."""
        t = self._timeouts
        out: tuple[float, Cause] = (t.idle_s, "stalled")
        if t.min_rate > 0:
            out = min(out, (self._window_end() - self.waited, "slow"),
                      (self.deadline - self.waited, "deadline"))
        return out

    def explain(self, cause: Cause) -> str:
        """The reason a client sees for being cut off."""
        t = self._timeouts
        if cause == "stalled":
            return f"request body stalled: no bytes for {t.idle_s:g}s"
        if cause == "deadline":
            return (f"request body too slow: not complete after {self.deadline:.1f}s "
                    f"(its size at {t.min_rate:.0f} B/s, plus {t.grace_s:g}s)")
        base = self._samples[0][1] if self._samples[0][0] <= self.waited - t.window_s else 0
        return (f"request body too slow: {self.seen - base} bytes in the last {t.window_s:g}s, "
                f"under {t.min_rate:.0f} B/s")


async def read_body(request: web.Request, limit: int, chunk: int, timeouts: BodyTimeouts,
                    ) -> AsyncIterator[bytes]:
    """The request body in chunks, to its end: refused past ``limit`` bytes (413), and cut off
    (:class:`BodyCutOff`) when it stalls, trickles or overruns its deadline."""
    loop = asyncio.get_running_loop()
    length = request.content_length
    pace = Pace(timeouts, length if length is not None else limit)
    while True:
        budget, cause = pace.allowance()
        if budget <= 0:
            raise BodyCutOff(cause, pace.explain(cause))
        began = loop.time()
        try:
            async with asyncio.timeout(budget):
                data = await request.content.read(chunk)
        except TimeoutError:
            pace.arrived(loop.time() - began, 0)
            raise BodyCutOff(cause, pace.explain(cause)) from None
        if not data:
            return
        pace.arrived(loop.time() - began, len(data))
        if pace.seen > limit:
            raise LimitExceededError(f"request body is over {limit} bytes", field="body", limit=limit,
                                     value=pace.seen)
        yield data
