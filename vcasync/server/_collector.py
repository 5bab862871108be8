"""Keep Python's cyclic garbage collector from stalling a busy coordinator's event loop.

A coordinator with thousands of connected workers holds hundreds of thousands of container objects
(each kept-alive connection's handler, parser and timers; each worker's ledger records), and each
request leaves objects that live until the same worker's next request, a heartbeat interval later.
CPython's collector walks every object of the generations it collects in one pass while the loop
waits. Measured with ``bench.scale`` (10,000 workers, each on its own connection, heartbeating every
10 s while results merge; 2 shared cores): full passes of 100-340 ms and middle-generation passes
(70-120 thousand objects that outlived one young pass) of 45-115 ms, every one a loop stall;
together they made the p99 of lease and heartbeat latency 50-180 ms. Under the guard: 5.7-8.4 ms
(TLS 9-14 ms) over five runs, the longest pass 13-20 ms.

:class:`CollectorGuard` freezes (``gc.freeze``) what has outlived a pass, so that later passes walk
only what was allocated since:

- on entry, everything allocated so far (torch, the model, the ledger);
- after every pass of generation ``freeze_from`` (default 0: every pass) or older, the objects that
  survived it.

Freezing does not keep anything alive: an object whose last reference goes is freed by reference
counting as usual, frozen or not. What it defers is the reclaiming of *reference cycles* that
became garbage after they were frozen; they show as memory. So the guard runs one full pass of its
own (unfreeze, collect, freeze again) when the process's resident memory has grown by ``regrow``
(a fraction) since the last one, at most once every ``full_every_s``: one pause as long as an
unguarded full pass, when memory says it is worth it, instead of passes every few seconds. (The
size of the frozen set is no guide: ``gc.get_freeze_count()`` walks it, 80 ms at half a million
objects.) Where resident memory cannot be read (not Linux), a full pass runs every
``full_every_s``. ``passes`` counts each kind; ``last_full_ms`` is the last full pass's pause.

The collector is process-wide: ``vcasync coordinator`` enters a guard for its whole run; a program
that embeds a coordinator may enter one around its server (``async with CollectorGuard():``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from types import TracebackType
from typing import Any

from ..errors import ConfigError

__all__ = ["CollectorGuard"]

log = logging.getLogger("vcasync.server")


def resident_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc/self/statm``), or None where unknown."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class CollectorGuard:
    """Freeze what survives the collector's passes; reclaim frozen cycles rarely (see above).

    ``freeze_from``: the youngest generation whose survivors are frozen (0, 1 or 2). ``regrow``:
    growth of resident memory since the last full pass, as a fraction, that calls for a full pass;
    ``full_every_s``: the least time between two full passes; ``check_s``: how often memory is
    looked at.
    """

    def __init__(self, *, freeze_from: int = 0, regrow: float = 0.25, full_every_s: float = 600.0,
                 check_s: float = 10.0) -> None:
        if freeze_from not in (0, 1, 2):
            raise ConfigError(f"freeze_from must be 0, 1 or 2, got {freeze_from}")
        if not (regrow > 0 and full_every_s >= 0 and check_s > 0):
            raise ConfigError("regrow and check_s must be > 0, full_every_s >= 0")
        self.freeze_from, self.regrow = freeze_from, regrow
        self.full_every_s, self.check_s = full_every_s, check_s
        self.passes = {"frozen_after": 0, "full": 0}
        self.last_full_ms = 0.0
        self._base: int | None = None
        self._last_full = 0.0
        self._task: asyncio.Task[None] | None = None
        self._installed = False

    async def __aenter__(self) -> CollectorGuard:
        self.install()
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="vcasync-gc")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.uninstall()

    def install(self) -> None:
        """Freeze what exists now and start freezing what survives passes (idempotent)."""
        if self._installed:
            return
        gc.collect()
        gc.freeze()
        self._base = resident_bytes()
        self._last_full = time.monotonic()
        gc.callbacks.append(self._after_pass)
        self._installed = True

    def uninstall(self) -> None:
        """Stop freezing; what is frozen is handed back to the collector's oldest generation."""
        if not self._installed:
            return
        gc.callbacks.remove(self._after_pass)
        gc.unfreeze()
        self._installed = False

    def _after_pass(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collector, on whichever thread triggered it: only an O(1) list move here.
        if phase == "stop" and info["generation"] >= self.freeze_from:
            gc.freeze()
            self.passes["frozen_after"] += 1

    def due(self) -> bool:
        """True when enough time has gone by since the last full pass and memory has grown (or
        cannot be read)."""
        if time.monotonic() - self._last_full < self.full_every_s:
            return False
        rss = resident_bytes()
        return rss is None or self._base is None or rss > self._base * (1.0 + self.regrow)

    def full_pass(self) -> int:
        """Unfreeze, collect everything, freeze again; the number of unreachable objects found."""
        t0 = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        self.last_full_ms = (time.perf_counter() - t0) * 1000.0
        self._base = resident_bytes()
        self._last_full = time.monotonic()
        self.passes["full"] += 1
        log.info("full garbage collection: %d unreachable objects, %.0f ms", found,
                 self.last_full_ms)
        return found

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            if self.due():
                self.full_pass()
